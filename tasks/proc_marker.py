"""Finding a trial's processes by an environment marker.

The server is launched with ``SERVESWEEP_TRIAL=<trial dir>#<nonce>`` in its environment;
every process it starts inherits it, including helpers that leave its process tree and
session (``setsid`` + double fork, reparented to PID 1), which neither the process group
nor ``children(recursive=True)`` reach. Teardown scans for the marker (:func:`marked`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

import psutil

MARKER_ENV = "SERVESWEEP_TRIAL"


def new_marker(trial_dir: Path | str) -> str:
    """A marker unique to one launch: ``<trial dir>#<12 hex>`` (the dir lets tests match by path)."""
    return f"{trial_dir}#{secrets.token_hex(6)}"


def marked(marker: str) -> list[psutil.Process]:
    """Live, non-zombie processes (other than this one) whose environment has ``MARKER_ENV ==
    marker``. Processes of other users are skipped (their environment is not readable)."""
    out = []
    me = os.getpid()
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if p.environ().get(MARKER_ENV) == marker and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out
