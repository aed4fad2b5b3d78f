"""Retries for store writes (Optuna, MLflow, failure rules) on lock/busy errors.

Lock/busy errors (``sqlite3.OperationalError: database is locked``, SQLAlchemy's
``OperationalError`` wrapping it, PostgreSQL lock timeouts) are retried with exponential
backoff for :data:`RETRY_S` seconds (tenacity); a write that still fails raises
:class:`StoreWriteError` (a sweep-level error: the driver stops with its message).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

log = logging.getLogger("servesweep")
T = TypeVar("T")

#: how long (s) a lock/busy error is retried before the write is declared failed: 4x SQLite's
#: 30 s busy timeout, so a backup or a long transaction of another process is ridden out
RETRY_S = 120.0
_BUSY_WORDS = ("database is locked", "database table is locked", "busy", "lock timeout", "could not obtain lock",
               "deadlock detected")


class StoreWriteError(RuntimeError):
    """A store write that kept failing on lock/busy errors for the whole retry budget."""


def is_busy(e: BaseException) -> bool:
    """True for a lock/busy error of SQLite or another RDB (also when wrapped, e.g. by SQLAlchemy
    or Optuna's StorageInternalError: the ``__cause__``/``__context__`` chain is searched)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        name = type(cur).__name__
        if isinstance(cur, sqlite3.OperationalError) or name in ("OperationalError", "StorageInternalError"):
            if any(w in str(cur).lower() for w in _BUSY_WORDS):
                return True
        cur = cur.__cause__ or cur.__context__
    return False


def retrying(fn: Callable[[], T], what: str, retry_s: float | None = None) -> T:
    """Run ``fn()``, retrying lock/busy errors (:func:`is_busy`) with backoff (0.2 s doubling to
    5 s) for ``retry_s`` seconds (default :data:`RETRY_S`); other errors propagate at once.

    Raises:
        StoreWriteError: still busy when the budget is spent (message names ``what``).
    """
    budget = RETRY_S if retry_s is None else retry_s
    try:
        for attempt in Retrying(retry=retry_if_exception(is_busy), stop=stop_after_delay(budget),
                                wait=wait_exponential(multiplier=0.2, max=5.0), reraise=True,
                                before_sleep=lambda rs: log.warning("%s: store busy (%s); retrying", what,
                                                                    rs.outcome.exception() if rs.outcome else "?")):
            with attempt:
                return fn()
    except Exception as e:
        if is_busy(e):
            raise StoreWriteError(f"{what}: the store stayed locked for {budget:.0f} s ({e})") from e
        raise
    raise AssertionError("unreachable")  # pragma: no cover


