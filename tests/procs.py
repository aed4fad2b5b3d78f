"""Finding the processes a test's trials started (server + TP-rank children)."""

from __future__ import annotations

from pathlib import Path

import psutil


def trial_processes(marker: str | Path) -> list[psutil.Process]:
    """Live (non-zombie) processes whose ``SERVESWEEP_EMULATOR_PROFILE`` names a path under
    ``marker``: the emulated servers of a test's store/trial dir and the TP ranks they
    spawned (children inherit the environment), wherever they were reparented."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if str(marker) in p.environ().get("SERVESWEEP_EMULATOR_PROFILE", "") and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out
