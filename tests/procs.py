"""Finding the processes a test's trials started (server + TP-rank children)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


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


@contextlib.contextmanager
def small_tmpfs_at(mnt: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"4m"``) mounted at ``mnt`` (created, parents too) for a full-disk
    case, read-only with ``read_only``; skips the test without root or ``mount``. Unmounted
    lazily on exit."""
    mnt.mkdir(parents=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
