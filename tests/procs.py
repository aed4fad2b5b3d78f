"""Finding the processes a test's trials started (server + TP-rank children)."""

from __future__ import annotations

from pathlib import Path

import psutil


def trial_processes(marker: str | Path) -> list[psutil.Process]:
    """Live (non-zombie) processes whose ``SERVESWEEP_EMULATOR_PROFILE`` names a path under
    ``marker``, or whose ``SERVESWEEP_TRIAL`` (set by ``tasks.server.launch``: the trial dir
    + a nonce) does: the servers of a test's store/trial dir, the TP ranks they spawned and
    helpers that left the tree and session (the environment is inherited), wherever they
    were reparented."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            hit = str(marker) in env.get("SERVESWEEP_EMULATOR_PROFILE", "") or str(marker) in env.get("SERVESWEEP_TRIAL", "")
            if hit and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out
