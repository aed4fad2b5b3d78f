"""Cheap commits for the local SQLite stores (Optuna, MLflow, failure rules).

Every Optuna ``set_user_attr`` / ``tell`` and every MLflow call is its own transaction;
with SQLite's defaults (rollback journal, ``synchronous=FULL``) each commit fsyncs:
measured 16.5 ms per commit on our 2-core VMs, which capped the driver at ~2 instant
trials/s (14 user attributes + params + MLflow per trial). In WAL mode with
``synchronous=NORMAL`` a commit costs 0.02 ms (same machine): the WAL is fsynced at
checkpoints only. Durability trade-off (SQLite docs, "WAL mode"): a process crash
(driver SIGKILL) loses nothing committed; a power loss may lose the last transactions,
never corrupts the file. WAL needs a local filesystem (not NFS): a team uses PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random

from sweeps.store.retry import is_busy

_installed = False
BUSY_TIMEOUT_MS = 30_000  # wait for another process's write lock instead of failing at once


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for other databases or in-memory SQLite)."""
    if not url.startswith("sqlite:///"):
        return None
    p = url[len("sqlite:///"):]
    return Path(p) if p and p != ":memory:" else None


def use_wal(dbapi_connection: sqlite3.Connection, timeout_s: float | None = None) -> str:
    """Put a SQLite file in WAL mode with ``synchronous=NORMAL`` and a busy timeout.

    Switching a rollback-journal file to WAL needs its exclusive lock, and SQLite answers
    ``SQLITE_BUSY`` at once, without calling the busy handler, while another connection
    holds the write lock (two processes creating the same store race exactly there). So
    the switch is retried until ``timeout_s`` has passed. A file already in WAL mode stays
    so (the mode is stored in the file) and takes no lock.

    Args:
        dbapi_connection: an open pysqlite connection.
        timeout_s: how long to wait for other writers, s; default :data:`BUSY_TIMEOUT_MS`.
    Returns:
        The journal mode now in force (``"wal"``, or ``"memory"`` for an in-memory database).
    Raises:
        sqlite3.OperationalError: still locked after ``timeout_s``, or the file is read-only.
    """
    timeout_s = BUSY_TIMEOUT_MS / 1000 if timeout_s is None else timeout_s
    cur = dbapi_connection.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        for attempt in Retrying(retry=retry_if_exception(is_busy), stop=stop_after_delay(timeout_s),
                                wait=wait_random(0.005, 0.05), reraise=True):
            with attempt:
                mode = cur.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        cur.execute("PRAGMA synchronous=NORMAL")
        return str(mode)
    finally:
        cur.close()


def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    try:
        use_wal(dbapi_connection)
    except sqlite3.Error:  # read-only database: keep its defaults
        pass


def tune_sqlite_engines() -> None:
    """Make every SQLAlchemy SQLite connection opened from now on in this process use WAL
    + ``synchronous=NORMAL`` + a 30 s busy timeout (idempotent; other databases untouched)."""
    global _installed
    if _installed:
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    event.listen(Engine, "connect", _on_connect)
    _installed = True
