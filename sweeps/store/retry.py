"""Retries for store writes (Optuna, MLflow, failure rules) on lock/busy errors.

Lock/busy errors (``sqlite3.OperationalError: database is locked``, SQLAlchemy's
``OperationalError`` wrapping it, PostgreSQL lock timeouts) are retried with exponential
backoff for :data:`RETRY_S` seconds (tenacity); a write that still fails raises
:class:`StoreWriteError` (a sweep-level error: the driver stops with its message).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from sweeps.errors import SweepError

log = logging.getLogger("servesweep")
T = TypeVar("T")

#: how long (s) a lock/busy error is retried before the write is declared failed: 4x SQLite's
#: 30 s busy timeout, so a backup or a long transaction of another process is ridden out
RETRY_S = 120.0
_BUSY_WORDS = ("database is locked", "database table is locked", "busy", "lock timeout", "could not obtain lock",
               "deadlock detected")


class StoreWriteError(SweepError):
    """A store write that kept failing on lock/busy errors for the whole retry budget.

    Its message names the write (``what``), the budget (``limit_s``, s) and the database's own
    words (``cause``: ``database is locked``), never the SQL statement or its parameters."""

    def __init__(self, what: str, limit_s: float, cause: str):
        self.what, self.limit_s, self.cause = what, limit_s, cause
        super().__init__(f"{what}: the store stayed locked for {limit_s:.0f} s ({cause}). Trials recorded so far "
                         f"are kept: run the same command again once the lock is gone")


_local = threading.local()


@contextlib.contextmanager
def budget(retry_s: float) -> Iterator[None]:
    """Within the block, this thread's :func:`retrying` calls without an explicit ``retry_s``
    give up after ``retry_s`` seconds (e.g. the last writes of a sweep whose store stayed
    locked: they must not wait the whole :data:`RETRY_S` again)."""
    old = getattr(_local, "retry_s", None)
    _local.retry_s = retry_s
    try:
        yield
    finally:
        _local.retry_s = old


def brief(e: BaseException) -> str:
    """The database's own words for ``e`` (``database is locked``), without SQLAlchemy's
    ``[SQL: ...]``/``[parameters: ...]`` dump or its background link: the first line of the
    innermost DB-API error in the cause chain, else of ``e``."""
    seen: set[int] = set()
    cur: BaseException | None = e
    inner: BaseException = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        orig = getattr(cur, "orig", None)  # SQLAlchemy's DBAPIError keeps the driver's exception
        if isinstance(orig, BaseException):
            inner = orig
            break
        if isinstance(cur, sqlite3.Error):
            inner = cur
            break
        cur = cur.__cause__ or cur.__context__
    text = (str(inner) or type(inner).__name__).splitlines()[0]
    return text.split("[SQL:")[0].strip()[:300] or type(inner).__name__


def is_busy(e: BaseException) -> bool:
    """True for a lock/busy error of SQLite or another RDB (also when wrapped, e.g. by SQLAlchemy
    or Optuna's StorageInternalError: the ``__cause__``/``__context__`` chain is searched)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, StoreWriteError):  # its budget is spent: an outer retry must not start another
            return False
        name = type(cur).__name__
        if isinstance(cur, sqlite3.OperationalError) or name in ("OperationalError", "StorageInternalError"):
            if any(w in str(cur).lower() for w in _BUSY_WORDS):
                return True
        cur = cur.__cause__ or cur.__context__
    return False


def _said_busy(what: str, attempt: int, outcome: object, limit: float) -> None:
    """Log a busy write: once as a warning (the user learns why the sweep waits), then at DEBUG."""
    exc = outcome.exception() if outcome is not None else None  # type: ignore[attr-defined]
    log.log(logging.WARNING if attempt == 1 else logging.DEBUG, "%s: store busy (%s); retrying for up to %.0f s",
            what, brief(exc) if exc else "?", limit)


def retrying(fn: Callable[[], T], what: str, retry_s: float | None = None) -> T:
    """Run ``fn()``, retrying lock/busy errors (:func:`is_busy`) with backoff (0.2 s doubling to
    5 s) for ``retry_s`` seconds (default: the thread's :func:`budget`, else :data:`RETRY_S`);
    other errors propagate at once. The first retry is logged as a warning, later ones at DEBUG.

    Raises:
        StoreWriteError: still busy when the budget is spent (message names ``what``; no SQL).
    """
    limit = retry_s if retry_s is not None else getattr(_local, "retry_s", None)
    limit = RETRY_S if limit is None else limit
    try:
        for attempt in Retrying(retry=retry_if_exception(is_busy), stop=stop_after_delay(limit),
                                wait=wait_exponential(multiplier=0.2, max=5.0), reraise=True,
                                before_sleep=lambda rs: _said_busy(what, rs.attempt_number, rs.outcome, limit)):
            with attempt:
                return fn()
    except StoreWriteError as e:  # an inner write spent its budget: named by this, the outer write
        raise StoreWriteError(what, e.limit_s, e.cause) from e.__cause__
    except Exception as e:
        if is_busy(e):
            raise StoreWriteError(what, limit, brief(e)) from e
        raise
    raise AssertionError("unreachable")  # pragma: no cover


