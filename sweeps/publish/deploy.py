"""The deployable command of a config and the label of the node its numbers come from.

The sweep may run on the emulated node; what a team deploys is the real engine on the
target node. :func:`deploy_command_for` renders that command from a :class:`SweepSpec`
(:meth:`tasks.backends.base.Backend.deploy_command`: the same render the dry run
validates, without the emulator's launcher, ephemeral ports or venv paths).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweeps.config.spec import SweepSpec, backend_dict
from tasks.backends import get_backend


def deploy_command_for(spec: SweepSpec, params: Mapping[str, Any]) -> str | None:
    """``python -m sglang.launch_server ... --host 0.0.0.0 --port 30000`` (or the engine's
    equivalent) for ``params`` on ``spec``'s node and model; None when the config does not
    render (a knob the engine version lacks)."""
    try:
        return get_backend(spec.backend.kind).deploy_command(
            dict(params), spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    except ValueError:  # KnobError is a ValueError
        return None


def is_emulated(spec: SweepSpec) -> bool:
    """True when the sweep's numbers come from the emulated node (``Backend.emulated``: the
    emulator's model of the node, not a measurement on it)."""
    return get_backend(spec.backend.kind).emulated


def node_label(spec: SweepSpec) -> str:
    """Where the numbers were measured: ``emulated 8×NVIDIA RTX PRO 6000 ...`` or ``8×<gpu> (real)``."""
    n = spec.node
    name = str(n.gpu_name).removeprefix("NVIDIA ").replace(" Blackwell Server Edition", "")
    gpus = f"{n.gpus}×{name}" if n.device == "gpu" else f"{n.name} (CPU)"
    return f"emulated {gpus}" if is_emulated(spec) else gpus
