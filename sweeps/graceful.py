"""Stopping a sweep gracefully when its store fails (disk full, read-only, I/O error).

A full or read-only store makes the trial-file write, the Optuna record or the MLflow
sync raise ``OSError`` (or SQLite's "database or disk is full" / "attempt to write a
readonly database" through SQLAlchemy and Optuna). :func:`store_failures` turns that into
a sweep-level :class:`~sweeps.stores.StoreError` naming the path and the cause, after
recording what can still be recorded: in-flight trials are torn down and recorded
interrupted (their configs re-queued) where the store still takes writes, and the MLflow
parent run is closed. The driver then exits non-zero with the message, no traceback; the
same command resumes once the store is fixed (a trial left RUNNING is recovered then).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from sweeps.cluster import RayUnavailable
from sweeps.stores import StoreError
from sweeps.study import SweepError

log = logging.getLogger("servesweep")
_DB_WORDS = ("disk is full", "readonly database", "read-only", "disk i/o error", "no space left")


def store_cause(e: BaseException) -> str | None:
    """``"<path>: <cause>"`` when ``e`` (or its cause chain) is a store failure, else None."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        # a socket that refused or reset (Ray, an MLflow server) is not the store's file
        if isinstance(cur, OSError) and not isinstance(cur, ConnectionError) and cur.errno is not None:
            return f"{cur.filename or '?'}: {cur.strerror or cur}"
        if any(w in str(cur).lower() for w in _DB_WORDS):
            return str(cur).splitlines()[0][:300]
        cur = cur.__cause__ or cur.__context__
    return None


@contextlib.contextmanager
def store_failures(drv: Any) -> Iterator[None]:
    """Run the driver's loop; on a store failure record what can be recorded and raise.

    Raises:
        StoreError: the store path (``drv.spec.store_dir``) and the cause; other errors pass.
    """
    try:
        yield
    except (SweepError, RayUnavailable):
        raise  # already a sweep-level stop with its own message (ensure_writable's, ray.address's)
    except Exception as e:
        from sweeps.tracking import MlflowStoreBroken

        cause = str(e) if isinstance(e, MlflowStoreBroken) else store_cause(e)
        if cause is None:
            raise
        log.error("store failure (%s): stopping the sweep", cause)
        with contextlib.suppress(Exception):
            drv.interrupt()  # tear in-flight trials down, record them interrupted where possible
        with contextlib.suppress(Exception):
            drv.publisher.close_failed()
        raise StoreError(f"the sweep's store {drv.spec.store_dir} failed ({cause}); the sweep stopped. Trials "
                         f"recorded so far are kept. Free space or make the store writable, then run the same "
                         f"command again to resume.") from None
