"""Preflight of a real engine before any trial: the driver's side of
:mod:`tasks.backends.preflight`.

Without ``ray.address`` the checks run here, before any store is touched. With a cluster they
belong on the GPU nodes (that is where the engine and the GPUs live): one GPU-less Ray task per
alive node that offers GPUs (any alive node for a CPU node profile), pinned to it, after Ray is
up and before the study or any run exists. Any error stops the sweep with exit 2, naming the
field and the fix; warnings (a hub model id) are printed and the sweep goes on.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from sweeps.config.spec import SweepSpec, backend_dict
from sweeps.errors import ConfigurationError, SweepError
from tasks.backends import get_backend
from tasks.backends.preflight import PreflightReport, is_real_engine, run_preflight

log = logging.getLogger("servesweep")

#: seconds a node's preflight may take (an engine import of SGLang/vLLM takes 10-60 s)
NODE_TIMEOUT_S = 300.0


class PreflightFailed(ConfigurationError, SweepError):
    """The engine cannot run the sweep's trials here (exit 2: a configuration problem)."""


def _args(spec: SweepSpec) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]:
    return spec.backend.kind, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec)


def _raise_on(reports: list[tuple[str, PreflightReport]]) -> None:
    errors = []
    for where, rep in reports:
        for w in rep.warnings:
            print(f"servesweep: warning{where}: {w}", file=sys.stderr)
        errors += [f"  {e}{where}" for e in rep.errors]
    if errors:
        raise PreflightFailed("preflight failed, nothing was launched or recorded:\n" + "\n".join(errors))


def check_here(spec: SweepSpec) -> None:
    """Run the preflight in this process when trials run on this machine (no ``ray.address``).

    Raises:
        PreflightFailed: any check failed (the message lists every ``<field>: <problem> (<fix>)``).
    """
    if spec.ray.address:
        return
    rep = run_preflight(*_args(spec))
    if rep is not None:
        _raise_on([("", rep)])


def check_on_nodes(spec: SweepSpec, ray: Any) -> None:
    """Run the preflight on every alive node that can hold a trial of a Ray cluster
    (``ray.address`` set; Ray already initialised).

    Raises:
        PreflightFailed: a check failed on some node (each error names the node's address).
    """
    if not spec.ray.address or not is_real_engine(get_backend(spec.backend.kind)):
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cpu = spec.node.model_dump().get("device") == "cpu"
    nodes = [n for n in ray.nodes() if n.get("Alive") and (cpu or n.get("Resources", {}).get("GPU", 0) > 0)]
    task = ray.remote(num_cpus=0, max_retries=0)(run_preflight)
    refs = {n["NodeManagerAddress"]: task.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(*_args(spec))
        for n in nodes}
    reports = []
    for addr, ref in refs.items():
        rep = ray.get(ref, timeout=NODE_TIMEOUT_S)
        if rep is not None:
            reports.append((f" (on node {addr})", rep))
    _raise_on(reports)
