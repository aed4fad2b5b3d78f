"""The emulated node's runtime overrides (``backend.emulator.*``), checked with the config."""

from __future__ import annotations

from typing import Any

from tasks.backends import get_backend


def profile_problems(spec: Any) -> list[str]:
    """``field: problem`` lines for ``backend.emulator.*`` values the emulated node's profile
    refuses (:meth:`tasks.backends.base.Backend.profile`), and a noise seed that is not a whole
    number; [] for a real engine. A node or model without emulator constants is not refused
    here: a real engine needs none, and the estimate says it cannot price that config."""
    try:
        prof = get_backend(spec.backend.kind).profile(spec.node.model_dump(), spec.model.model_dump(),
                                                      spec.backend.model_dump())
    except ValueError as e:
        return [f"backend.{e}"] if str(e).startswith("emulator.") else []
    seed = (prof or {}).get("emulator", {}).get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return [f"backend.emulator.seed: must be a whole number (got {seed!r})"]
    return []
