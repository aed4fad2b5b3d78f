"""Starting or joining Ray for a sweep (idempotent, one ``ray.init`` per process)."""

from __future__ import annotations

import os

from sweeps.config.spec import SweepSpec
from sweeps.errors import SweepError
from sweeps.run.ray_auth import auth_warnings_filtered, code_runtime_env, explain_init_error

# Ray's own settings for a quiet, small local instance (DESIGN.md § Known traps).
# Not RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper: it makes workers ignore
# SIGCHLD, so Popen.poll() reads every server exit as 0 (measured); tasks.reaper kills the
# TP ranks a dead worker leaves behind instead.
_LOCAL_ENV = {
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


class RayUnavailable(SweepError):
    """Ray could not be started or reached (names the address and the fix)."""


PROBE_TIMEOUT_S = 5.0  # a reachable GCS accepts a TCP connection in ms; ray.init itself retries for minutes


def _probe(address: str) -> None:
    """Fail fast on an unreachable ``host:port`` (``ray.init`` would retry for minutes).

    ``auto`` / ``local`` are resolved by Ray itself and not probed.

    Raises:
        RayUnavailable: nothing accepts a TCP connection at the address.
    """
    import socket

    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RayUnavailable(f"ray.address={address!r} is not host:port (or auto)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        raise RayUnavailable(
            f"cannot reach Ray at ray.address={address!r} ({e.strerror or e}); start the head node "
            f"(`ray start --head`), check host/port and firewalls, or drop ray.address to run locally"
        ) from None


def start_ray(spec: SweepSpec) -> None:
    """Connect to ``ray.address`` or start a local Ray with ``node.gpus`` logical GPUs.

    Local Ray: logical GPUs (``ray.num_gpus``, default ``node.gpus``; the emulated node
    needs no real GPU), a small object store (``object_store_memory_mb``), no dashboard,
    worker logs not streamed to the driver (the progress display stays readable).

    Joining ``ray.address``: the job's ``runtime_env`` ships this checkout (``working_dir``,
    :func:`sweeps.run.ray_auth.code_runtime_env`), so a node needs Python, Ray, the engine and
    :data:`sweeps.run.ray_auth.TRIAL_REQUIREMENTS`, not servesweep.

    Raises:
        RayUnavailable: the address is unreachable, or token authentication rejected this
            driver (the message names ``RAY_AUTH_MODE`` and the fix).
    """
    import ray

    if ray.is_initialized():
        return
    for k, v in _LOCAL_ENV.items():
        os.environ.setdefault(k, v)
    r = spec.ray
    common = dict(log_to_driver=False, ignore_reinit_error=True, configure_logging=False,
                  runtime_env={"env_vars": {k: v for k, v in _LOCAL_ENV.items()}})
    if r.address:
        _probe(r.address)
    try:
        if r.address:  # a shared cluster: ship this checkout's code to its nodes (sweeps.run.ray_auth)
            with auth_warnings_filtered(r.address):  # the fix line at the first token warning, not ten warnings
                ray.init(address=r.address, **{**common, "runtime_env": {**code_runtime_env(), **common["runtime_env"]}})
        else:
            gpus = r.num_gpus if r.num_gpus is not None else spec.node.gpus
            res = {f"accelerator_type:{spec.node.accelerator_type}": float(gpus)} if spec.node.accelerator_type else None
            # address="local": always start our own Ray, never join another local instance
            ray.init(address="local", num_gpus=gpus, num_cpus=r.num_cpus, resources=res or None,
                     object_store_memory=r.object_store_memory_mb * 1024 * 1024, include_dashboard=False, **common)
    # Ray raises a bare Exception too ("The current node timed out during startup ... GCS has become
    # overloaded", ray._private.node, on a loaded machine): every failure of ray.init is this one stop
    except Exception as e:  # noqa: BLE001 - AuthenticationError, ConnectionError, RuntimeError, bare Exception
        msg = explain_init_error(e, r.address)  # token auth (RAY_AUTH_MODE) mismatch: say so
        if msg is not None:
            raise RayUnavailable(msg) from None
        if r.address:
            raise RayUnavailable(
                f"cannot reach Ray at ray.address={r.address!r}: {e}. "
                f"Check the address (ray status on the head node) or drop ray.address to run locally"
            ) from None
        raise RayUnavailable(
            f"could not start a local Ray: {e}. Ray gives its processes a fixed time to come up, "
            f"which a heavily loaded machine can miss: run the same command again when the load is lower "
            f"(the study resumes where it stopped)"
        ) from None


def trial_requirements(spec: SweepSpec) -> dict[str, float]:
    """Resources one trial task asks Ray for: ``GPU`` (= TP × DP) plus the custom resources
    of ``ray.resources`` and, when ``node.accelerator_type`` pins trials, Ray's
    ``accelerator_type:<type>`` resource (Ray asks 0.001 of it per task: any amount > 0 fits).
    """
    need: dict[str, float] = {"GPU": float(spec.gpus_per_trial)}
    need.update({str(k): float(v) for k, v in dict(spec.ray.resources).items()})
    if spec.node.accelerator_type:
        need[f"accelerator_type:{spec.node.accelerator_type}"] = 0.001
    return need


def trial_slots(spec: SweepSpec, nodes: list[dict] | None = None) -> tuple[int, dict[str, int]]:
    """How many trials fit on the cluster at once, node by node (packing, not a global sum).

    A node holds ``min(GPU // per_trial_GPUs, resource // per_trial_amount ...)`` trials, so
    TP=4 trials pack two per 8-GPU node, TP=8 trials never straddle two 4-GPU nodes, and a
    pinned sweep counts only the nodes carrying its resource / accelerator type.

    Args:
        nodes: ``ray.nodes()`` (default: asked from the connected Ray).
    Returns:
        (total slots, {node id (first 12 hex): slots}) over alive nodes.
    """
    import ray

    need = trial_requirements(spec)
    per_node: dict[str, int] = {}
    for n in nodes if nodes is not None else ray.nodes():
        if not n.get("Alive", n.get("alive", False)):
            continue
        res = n.get("Resources") or {}
        k = min(int(res.get(r, 0.0) // amt + 1e-9) if amt >= 1 else (1 << 30 if res.get(r, 0.0) > 0 else 0)
                for r, amt in need.items())
        per_node[str(n.get("NodeID", ""))[:12]] = k
    return sum(per_node.values()), per_node


def explain_no_slots(spec: SweepSpec, nodes: list[dict] | None = None) -> str:
    """Why no node can take a trial: what a trial needs and what each node has."""
    import ray

    need = trial_requirements(spec)
    have = []
    for n in nodes if nodes is not None else ray.nodes():
        if n.get("Alive", n.get("alive", False)):
            res = n.get("Resources") or {}
            have.append(f"{str(n.get('NodeID', ''))[:12]}: GPU={res.get('GPU', 0):g}"
                        + "".join(f", {r}={res.get(r, 0):g}" for r in need if r != "GPU"))
    return (f"no node of the Ray cluster can run a trial: a trial needs "
            f"{', '.join(f'{k}={v:g}' for k, v in need.items())}; nodes have [{'; '.join(have) or 'none alive'}]. "
            f"Lower backend.tp_size, set ray.num_gpus (local Ray), or fix ray.resources / node.accelerator_type")
