"""Stopping a sweep gracefully when its store fails (disk full, read-only, I/O error).

A full or read-only store makes the trial-file write, the Optuna record or the MLflow
sync raise ``OSError`` (or SQLite's "database or disk is full" / "attempt to write a
readonly database" through SQLAlchemy and Optuna). :func:`store_failures` turns that into
a sweep-level :class:`~sweeps.run.stores.StoreError` naming the path and the cause, after
recording what can still be recorded: in-flight trials are torn down and recorded
interrupted (their configs re-queued) where the store still takes writes, and the MLflow
parent run is closed. The driver then exits non-zero with the message, no traceback; the
same command resumes once the store is fixed (a trial left RUNNING is recovered then).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import optuna

from sweeps.errors import SweepError
from sweeps.run.cluster import RayUnavailable
from sweeps.run.stores import StoreError, free_reserve
from sweeps.store.retry import StoreWriteError, brief, budget
from sweeps.store.study import recover_stale

log = logging.getLogger("servesweep")
#: failure class of the trials, and stop reason of the parent run, of a sweep stopped because
#: its store stopped taking writes (locked past the retry budget, full, read-only)
STORE_UNAVAILABLE = "store_unavailable"
#: how long (s) each of a stopping sweep's last writes waits out a lock: the budget was spent already
FINAL_RETRY_S = 10.0
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
            return brief(cur)  # the database's words, no SQL
        cur = cur.__cause__ or cur.__context__
    return None


class Stoppable(Protocol):
    """What :func:`store_failures` stops (a :class:`sweeps.search.loop.SweepLoop`)."""

    @property
    def store_dir(self) -> Path:
        """The sweep's store directory (named in the error)."""
        ...

    def open_study(self) -> optuna.Study | None:
        """The sweep's study, or None before it is open."""
        ...

    def cancel_inflight(self) -> None:
        """Cancel the in-flight trials' tasks (their servers are torn down) and forget them."""
        ...

    def close_parent(self, status: str, tags: Mapping[str, str]) -> None:
        """Tag and close the MLflow parent run with ``status`` (nothing without one)."""
        ...


def finalise(drv: Stoppable, cause: str) -> None:
    """Close a sweep whose store stopped taking writes: cancel the in-flight trials (their tasks
    tear their servers down), record every RUNNING trial FAIL with class
    :data:`STORE_UNAVAILABLE` and re-queue its config, tag the MLflow parent run
    (``stop_reason``) and close it KILLED. The store's reserve is freed first (room for these
    writes on a full disk); each write waits out a lock for :data:`FINAL_RETRY_S` only. Never
    raises: what cannot be written stays RUNNING, and the next run recovers it. Failures are
    logged at DEBUG (the driver's log file), not on the console."""
    try:
        drv.cancel_inflight()
    except Exception as e:  # noqa: BLE001 - stopping anyway
        log.debug("could not cancel the trial tasks: %s", e)
    free_reserve(drv.store_dir)
    with budget(FINAL_RETRY_S):
        study = drv.open_study()
        if study is not None:
            try:
                recover_stale(study, STORE_UNAVAILABLE, f"the store stopped taking writes: {cause}")
            except Exception as e:  # noqa: BLE001 - the next run recovers what stays RUNNING
                log.debug("could not finalise the running trials: %s", e, exc_info=True)
        try:
            drv.close_parent("KILLED", {"stop_reason": f"{STORE_UNAVAILABLE}: {cause}"})
        except Exception as e:  # noqa: BLE001
            log.debug("could not close the parent run: %s", e, exc_info=True)


@contextlib.contextmanager
def store_failures(drv: Stoppable) -> Iterator[None]:
    """Run the driver's loop; on a store failure record what can be recorded (:func:`finalise`) and raise.

    Raises:
        StoreError: the store path (``drv.store_dir``) and the cause (full, read-only).
        StoreWriteError: the store stayed locked past the retry budget (after :func:`finalise`).
        Other errors pass.
    """
    try:
        yield
    except StoreWriteError as e:  # before SweepError: it is one, and it still needs finalising
        log.debug("store locked past the retry budget", exc_info=True)
        finalise(drv, brief(e))
        raise
    except (SweepError, RayUnavailable):
        raise  # already a sweep-level stop with its own message (ensure_writable's, ray.address's)
    except Exception as e:
        from sweeps.store.tracking import MlflowStoreBroken

        cause = str(e) if isinstance(e, MlflowStoreBroken) else store_cause(e)
        if cause is None:
            raise
        log.debug("store failure (%s): stopping the sweep", cause, exc_info=True)
        finalise(drv, cause)
        raise StoreError(f"the sweep's store {drv.store_dir} failed ({cause}); the sweep stopped. Trials "
                         f"recorded so far are kept. Free space or make the store writable, then run the same "
                         f"command again to resume.") from None
