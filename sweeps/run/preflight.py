"""Checks and inputs a sweep needs before its first trial: writable stores, a launcher
that exists, and the emulator profile of an emulated backend."""

from __future__ import annotations

import errno
import shutil
import sys
from typing import Any

from sweeps.config.spec import SweepSpec, backend_dict
from sweeps.errors import SweepError
from sweeps.run.stores import StoreError
from tasks.backends import get_backend


def emulator_profile(spec: SweepSpec) -> dict[str, Any] | None:
    """The ``{"node", "model", "emulator"}`` profile the emulated server / instant model read
    (``Backend.profile``); None for a real engine."""
    return get_backend(spec.backend.kind).profile(spec.node.model_dump(), spec.model.model_dump(),
                                                  backend_dict(spec))


def launch_profile(profile: dict[str, Any] | None, launch_key: str) -> dict[str, Any] | None:
    """The emulator profile for ONE launch: its run-to-run noise seed drawn from ``launch_key``
    (study, trial, attempt or confirmation round and repeat), so every launch draws fresh noise
    like a real node's -- a re-measurement never replays an earlier one -- and the same launch
    replays identically (deterministic tests). None (a real engine) stays None."""
    if profile is None:
        return None
    import copy
    import zlib

    prof = copy.deepcopy(profile)
    base = int(prof["emulator"].get("seed") or 0)
    prof["emulator"]["seed"] = (base + zlib.crc32(launch_key.encode())) % 2**31
    return prof


def ensure_writable(spec: SweepSpec) -> None:
    """Check, before anything is started, that the store and findings directories take a write.

    Raises:
        StoreError (exit 2, like a store found full or read-only mid-sweep): the directory cannot
            be created or written; the message names it, the cause and the fix for that cause
            (free space for a full disk, permissions or another directory otherwise).
    """
    for d in (spec.store_dir, spec.findings_path.parent):
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / ".servesweep-write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            fix = ("free space on it" if e.errno in (errno.ENOSPC, errno.EDQUOT) else
                   "remount it read-write" if e.errno == errno.EROFS else "fix its permissions")
            raise StoreError(f"cannot write to {d} ({e.strerror}); {fix}, or set tracking.store_dir / "
                             f"tracking.findings_dir to a writable directory (nothing was started)") from None


def check_launcher(spec: SweepSpec) -> None:
    """A launcher that does not exist is a config error, not a failure of every config (it
    would teach a ``cli_arg_error`` rule per config). Checked here for a local Ray only: on a
    cluster the launcher lives on the GPU nodes.

    Raises:
        SweepError: ``backend.launcher[0]`` is not an executable on PATH.
    """
    if not get_backend(spec.backend.kind).launches_server or spec.ray.address or not spec.backend.launcher:
        return
    exe = sys.executable if spec.backend.launcher[0] == "{python}" else spec.backend.launcher[0]
    if shutil.which(exe) is None:
        raise SweepError(f"backend.launcher: {exe!r} is not an executable on PATH (nothing was launched); "
                         f"install it or point backend.launcher at it")


