"""Starting or joining Ray for a sweep (idempotent, one ``ray.init`` per process)."""

from __future__ import annotations

import os

from sweeps.config import SweepSpec

# Ray's own settings for a quiet, small local instance (DESIGN.md § Known traps).
_LOCAL_ENV = {
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Backstop: kill processes our trial tasks spawned if a worker exits.
    "RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true",
}


class RayUnavailable(RuntimeError):
    """Ray could not be started or reached (names the address and the fix)."""


def start_ray(spec: SweepSpec) -> None:
    """Connect to ``ray.address`` or start a local Ray with ``node.gpus`` logical GPUs.

    Local Ray: logical GPUs (``ray.num_gpus``, default ``node.gpus``; the emulated node
    needs no real GPU), a small object store (``object_store_memory_mb``), no dashboard,
    worker logs not streamed to the driver (the progress display stays readable).

    Raises:
        RayUnavailable: the address is unreachable.
    """
    import ray

    if ray.is_initialized():
        return
    for k, v in _LOCAL_ENV.items():
        os.environ.setdefault(k, v)
    r = spec.ray
    common = dict(log_to_driver=False, ignore_reinit_error=True, configure_logging=False,
                  runtime_env={"env_vars": {k: v for k, v in _LOCAL_ENV.items()}})
    try:
        if r.address:
            ray.init(address=r.address, **common)
        else:
            gpus = r.num_gpus if r.num_gpus is not None else spec.node.gpus
            res = {f"accelerator_type:{spec.node.accelerator_type}": float(gpus)} if spec.node.accelerator_type else None
            ray.init(num_gpus=gpus, num_cpus=r.num_cpus, resources=res or None,
                     object_store_memory=r.object_store_memory_mb * 1024 * 1024, include_dashboard=False, **common)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayUnavailable(
            f"cannot start or reach Ray at ray.address={r.address!r}: {e}. "
            f"Check the address (ray status on the head node) or drop ray.address to run locally"
        ) from None
