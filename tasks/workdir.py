"""A worker that cannot write its trial work dir: an infrastructure error with that message.

Creating the trial directory (server log, emulator profile) is the first thing a trial
does on its node. When that fails (disk full, read-only mount, wrong permissions) the node
cannot run any trial: the result says so with the path and the OS error, instead of a
Ray task error that reads as ``node_lost`` and is retried on the same node at once.
"""

from __future__ import annotations

import time

from tasks.types import TrialResult

#: the start of such a result's failure signature (the driver's retry policy skips these)
WORKDIR_SIGNATURE = "worker cannot write its work dir"


def workdir_failure(res: TrialResult, e: OSError, t0: float) -> TrialResult:
    """Fill ``res`` as an ``infra_error`` (class ``unknown``, phase ``preflight``) naming the
    path and the cause of ``e``; ``t0`` is the trial's ``time.monotonic()`` start."""
    res.status, res.failure_class, res.failure_kind, res.phase = "infra_error", "unknown", "infra", "preflight"
    res.failure_signature = f"{WORKDIR_SIGNATURE} {e.filename or '?'}: {e.strerror or e}"
    res.wall_s = time.monotonic() - t0
    return res


def is_workdir_failure(res: TrialResult) -> bool:
    """True for a :func:`workdir_failure` result (retrying it on the same node cannot help)."""
    return (res.failure_signature or "").startswith(WORKDIR_SIGNATURE)
