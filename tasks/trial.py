"""``run_trial``: what runs on the GPU node as one Ray task, for any backend.

The trial's backend (``spec.backend``, a module of :mod:`tasks.backends`) runs it: the
generic server lifecycle of :mod:`tasks.backends.lifecycle` (reserve ports -> launch ->
healthy -> benchmark -> teardown), or its own (``instant`` evaluates the model in-process).
Expected failures are data in the :class:`tasks.types.TrialResult`; only infrastructure
failures (node or worker death) surface as Ray exceptions.
"""

from __future__ import annotations

from typing import Any

from tasks.backends import get_backend
from tasks.backends.emulated import emulated_fingerprint
from tasks.backends.lifecycle import LOG_TAIL_LINES, PROFILE_ENV, launch_command
from tasks.types import TrialResult, TrialSpec

__all__ = ["LOG_TAIL_LINES", "PROFILE_ENV", "emulated_fingerprint", "launch_command", "node_fingerprint", "run_trial"]


def node_fingerprint(backend: str, profile: dict[str, Any] | None, gpu_indices: list[int] | None = None) -> dict[str, str]:
    """Fingerprint of this node as backend kind ``backend`` sees it: the emulator's declared
    stack, or the real one (NVML, package versions).

    Raises:
        ValueError: ``backend`` is not a backend kind.
    """
    return get_backend(backend).fingerprint(profile, gpu_indices)


def run_trial(spec: TrialSpec, profile: dict[str, Any] | None = None, workdir: str | None = None) -> TrialResult:
    """Run one trial end to end on this node and return its result (never raises for
    expected failures).

    Args:
        spec: the rendered trial (argv without host/port flags; ``spec.backend`` its kind).
        profile: emulator profile ``{"node", "model", "emulator"}`` (emulated/instant backends).
        workdir: where trial directories go (server log); default ``<tmp>/servesweep-trials``.
    Returns:
        :class:`TrialResult`; ``gpu_s`` = GPU-seconds held.
    Raises:
        ValueError: ``spec.backend`` is not a backend kind.
    """
    return get_backend(spec.backend).run_trial(spec, profile, workdir)
