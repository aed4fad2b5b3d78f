"""The SQLAlchemy engine behind :class:`sweeps.rules.store.RuleStore`: SQLite write/read transactions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from sweeps.store.sqlite import use_wal

#: execution option of a connection that only reads (its transaction takes no write lock)
READ_ONLY = "servesweep_read_only"


def make_engine(url: str, busy_timeout_s: float) -> tuple[Engine, bool]:
    """The rules store's engine for a SQLAlchemy URL, and whether it is SQLite.

    SQLite: WAL (:func:`sweeps.store.sqlite.use_wal`), a ``busy_timeout_s`` busy timeout, and
    ``BEGIN IMMEDIATE`` write transactions (two processes learning at once lose no evidence);
    a connection with the :data:`READ_ONLY` option begins a plain deferred transaction. A
    file's directory is created. Other databases lock rows with ``SELECT ... FOR UPDATE``.
    """
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True), False
    db = u.database
    if db in (None, "", ":memory:"):
        eng = create_engine(url, connect_args={"check_same_thread": False, "timeout": busy_timeout_s},
                            poolclass=StaticPool)
    else:
        Path(db).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        eng = create_engine(url, connect_args={"timeout": busy_timeout_s})

    @event.listens_for(eng, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # pysqlite must not BEGIN by itself: we BEGIN IMMEDIATE
        if db in (None, "", ":memory:"):
            dbapi_conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        else:
            use_wal(dbapi_conn, busy_timeout_s)

    @event.listens_for(eng, "begin")
    def _on_begin(conn: Connection) -> None:
        # a write takes the write lock up front (no lost updates); a read takes none, so in
        # WAL mode it never waits for a writer
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

    return eng, True
