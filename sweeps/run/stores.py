"""Creating a sweep's local stores safely, and unique run names.

Two drivers started together on a fresh store race on schema creation: MLflow's alembic
migrations copy tables through ``_alembic_tmp_<table>``; a second process migrating at the
same time fails half-way and leaves those tables behind, after which every MLflow call
fails. A driver killed while the migrations run leaves an intermediate ``alembic_version``
and a hot journal, which no rerun repairs. :func:`prepare` therefore creates the Optuna,
rules and MLflow schemas once, under a file lock on ``<store>/locks/create.lock`` (a second
driver waits for the first), each in a temporary file next to its target that is renamed
into place when complete (:func:`create_atomically`): a kill at any instant leaves no store
or a complete one. A half-made store found (made by an older version, or copied) is rebuilt
when it holds no results, else refused with the repair command (:class:`StoreError`, exit 2).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout

from sweeps.config.spec import SweepSpec
from sweeps.errors import ConfigurationError, SweepError
from sweeps.store.sqlite import sqlite_path

log = logging.getLogger("servesweep")

#: how long (s) a driver waits for another one creating the same store's schemas; MLflow's
#: full migration chain on SQLite takes a few seconds on our 2-core machines
CREATE_LOCK_TIMEOUT_S = 300.0


class StoreError(ConfigurationError, SweepError):
    """A store that cannot be used as it is (half-created schema, unreachable); exit code 2."""


def leftover_alembic_tables(url: str) -> list[str]:
    """``_alembic_tmp_*`` tables of a SQLite MLflow store (an interrupted schema migration)."""
    p = sqlite_path(url)
    if p is None or not p.exists():
        return []
    # read-write, never creating: a writer SIGKILLed mid-transaction leaves a hot journal that
    # the next reader must roll back, which a read-only connection cannot ("readonly database")
    con = sqlite3.connect(f"file:{p}?mode=rw", uri=True, timeout=30)
    try:
        rows = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE '\\_alembic\\_tmp\\_%' "
                           "ESCAPE '\\'").fetchall()
    finally:
        con.close()
    return sorted(r[0] for r in rows)


def check_mlflow_schema(url: str) -> None:
    """Refuse an MLflow store whose schema creation was interrupted.

    Raises:
        StoreError: names the leftover tables, the file, and the fix.
    """
    left = leftover_alembic_tables(url)
    if left:
        p = sqlite_path(url)
        raise StoreError(
            f"the MLflow store {p} is half-created: its schema migration was interrupted and left "
            f"{', '.join(left)} (every MLflow call would fail). Fix: stop every driver using it, move it aside "
            f"(mv {p} {p}.broken) and run the same command again: MLflow recreates it, and the Optuna study "
            f"(optuna.db) re-syncs every trial to the new store.")


#: bytes kept free in every store (``<store>/locks/reserve``) and freed when it fills up, so the
#: running trials and the MLflow parent run can still be closed (a few SQLite pages each)
RESERVE_BYTES = 256 * 1024
#: how a store file is named while its schema is being created next to it (see :func:`create_atomically`)
CREATING = ".creating-"


def reserve_path(store_dir: Path) -> Path:
    """The store's reserve file (see :data:`RESERVE_BYTES`)."""
    return store_dir / "locks" / "reserve"


def ensure_reserve(store_dir: Path) -> None:
    """Set :data:`RESERVE_BYTES` aside in the store (no-op when it is there or the disk is full)."""
    p = reserve_path(store_dir)
    if p.exists() and p.stat().st_size >= RESERVE_BYTES:
        return
    try:
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError as e:
        log.debug("no store reserve %s (%s)", p, e)
        with contextlib.suppress(OSError):
            p.unlink()


def free_reserve(store_dir: Path) -> None:
    """Delete the store's reserve (its room goes to the last writes of a sweep on a full disk)."""
    with contextlib.suppress(OSError):
        reserve_path(store_dir).unlink()


def _sidecars(p: Path) -> list[Path]:
    return [p.with_name(p.name + s) for s in ("-journal", "-wal", "-shm")]


def _remove(p: Path) -> None:
    for f in (p, *_sidecars(p)):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _self_contained(p: Path) -> None:
    """Fold a just-created SQLite file's WAL into it and switch it to a rollback journal, so the
    file alone is the whole database (its ``-wal``/``-shm`` are not renamed with it); the next
    connection puts it back in WAL mode (:func:`sweeps.store.sqlite.use_wal`)."""
    con = sqlite3.connect(str(p), timeout=30, isolation_level=None)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
    finally:
        con.close()
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_atomically(target: Path, create: Callable[[str], None]) -> bool:
    """Create a SQLite store whole or not at all: ``create(url)`` builds the schema in
    ``<target>.creating-<pid>-<hex>`` next to ``target``, which is then made self-contained and
    renamed into place (``rename(2)`` is atomic on one filesystem). A kill at any instant leaves
    no ``target`` or a complete one; the temporary file left by a kill is removed by the next
    call (callers hold the store's creation lock). No-op when ``target`` exists.

    Returns:
        True when ``target`` was created now.
    """
    for left in target.parent.glob(f"{target.name}{CREATING}*"):
        with contextlib.suppress(FileNotFoundError):
            left.unlink()  # a creation killed half-way (its -wal/-shm/-journal included)
    if target.exists():
        return False
    # unique per creation: MLflow caches its store per URI in a process, schema check included
    tmp = target.with_name(f"{target.name}{CREATING}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        create(f"sqlite:///{tmp}")
        _self_contained(tmp)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        _remove(tmp)
    return True


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _count(con: sqlite3.Connection, table: str) -> int:
    return int(con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]) if table in _tables(con) else 0


def _version(con: sqlite3.Connection) -> str | None:
    if "alembic_version" not in _tables(con):
        return None
    row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


def _mlflow_head() -> str | None:
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision

        return str(_get_latest_schema_revision())
    except Exception:  # noqa: BLE001 - another MLflow layout: the revision is not checked
        return None


def _missing_mlflow(con: sqlite3.Connection) -> str | None:
    tables = _tables(con)
    left = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if left:
        return f"an interrupted schema migration left {', '.join(left)}"
    v = _version(con)
    if v is None:
        return "its tables have no schema version (alembic_version)" if tables else "it has no tables"
    if {"experiments", "runs"} - tables:
        return "it lacks the experiments/runs tables"
    head = _mlflow_head()
    if head is not None and v != head:
        return f"its schema stopped at revision {v} (MLflow's is {head})"
    return None


def _missing_optuna(con: sqlite3.Connection) -> str | None:
    tables = _tables(con)
    if {"studies", "trials", "version_info"} - tables:
        return "it lacks Optuna's tables" if tables else "it has no tables"
    if _version(con) is None or con.execute("SELECT count(*) FROM version_info").fetchone()[0] == 0:
        return "its tables have no schema version"
    return None


def _missing_rules(con: sqlite3.Connection) -> str | None:
    from sweeps.rules.store import _rules

    return None if _rules.name in _tables(con) else "it lacks the rules table"


#: per store kind: (what it is, the table that holds its results, what is missing from a half-made one)
_KINDS: dict[str, tuple[str, str, Callable[[sqlite3.Connection], str | None]]] = {
    "mlflow": ("MLflow store", "runs", _missing_mlflow),
    "optuna": ("Optuna study store", "trials", _missing_optuna),
    "rules": ("failure-rules store", "rules", _missing_rules),
}


#: the smallest SQLite file that can hold a table's row: a schema page and a table page of the
#: smallest page size, 512 bytes (sqlite.org/fileformat.html, "Page Size"); a shorter unreadable
#: file is a torn header left by a killed creation
_MIN_TABLE_BYTES = 2 * 512


def check_existing(path: Path, kind: str) -> bool:
    """Judge a SQLite store file that exists: complete (True), or half-made (its creation was
    killed: a hot journal, an intermediate ``alembic_version``, tables without their version,
    ``_alembic_tmp_*`` tables) and holding no results, then moved aside to
    ``<file>.half-made`` so it is rebuilt (False).

    Raises:
        StoreError: a half-made store that holds results (runs, trials, rules), or a file that
            is not a readable SQLite database (it may hold them): exit 2, naming the file and
            the repair command; the file is left untouched. A file this process cannot open
            for writing (permissions, ``chattr +i``, a read-only mount): found before the
            start, as a read-only store found mid-sweep would stop it (nothing was started).
    """
    name, results, missing = _KINDS[kind]
    try:  # a real open for writing: os.access passes root on a file that refuses writes
        with open(path, "r+b"):
            pass
    except OSError as e:
        raise StoreError(f"the {name} {path} cannot be written ({e.strerror}); make it writable (permissions, "
                         f"`chattr -i`, a read-write mount) or set tracking.store_dir to a writable directory, "
                         f"then run the same command again (nothing was started)") from None
    hot = any(f.exists() and f.stat().st_size > 0 for f in _sidecars(path)[:1])
    # read-write, never creating: a writer SIGKILLed mid-transaction leaves a hot journal that
    # the next reader must roll back, which a read-only connection cannot ("readonly database")
    con = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=30)
    try:
        why = missing(con)
        held = _count(con, results) if why else 0
    except sqlite3.DatabaseError as e:  # not a database at all (a corrupted or truncated file)
        if path.stat().st_size < _MIN_TABLE_BYTES:  # a torn header: too short to have held a row
            why, held = f"it is not a readable SQLite database ({e})", 0
        else:  # it may be a store that held results: never set aside unasked
            raise StoreError(f"the {name} {path} is not a readable SQLite database ({e}); it may hold {results}, "
                             f"so it is left as it is. Repair: restore it from a backup (`sqlite3 {path} .recover` "
                             f"can save what is readable), or `mv {path} {path}.broken` to start it afresh, then "
                             f"run the same command again.") from None
    finally:
        con.close()
    if why is None:
        return True
    if hot:
        why += " (a writer was killed mid-transaction: hot journal)"
    if held == 0:
        aside = path.with_name(path.name + ".half-made")
        n = 1
        while aside.exists():  # an earlier one is kept: each is evidence of a different creation
            aside, n = path.with_name(f"{path.name}.half-made.{n}"), n + 1
        os.replace(path, aside)
        for side in _sidecars(path):
            with contextlib.suppress(FileNotFoundError):
                side.unlink()
        log.warning("the %s %s was half-made (%s) and held no %s: moved to %s, creating it again", name, path,
                    why, results, aside)
        return False
    if kind == "mlflow" and "stopped at revision" in why:
        fix = f"mlflow db upgrade sqlite:///{path}"
    else:
        fix = f"mv {path} {path}.broken"
    resync = {"mlflow": " MLflow's runs are synced again from the Optuna study (optuna.db).",
              "optuna": " The MLflow runs keep the trials' results.", "rules": " Rules are learned again."}[kind]
    raise StoreError(f"the {name} {path} is half-made ({why}) and holds {held} {results}: it cannot be rebuilt "
                     f"without losing them. Repair: stop every driver using it, run `{fix}`, then run the same "
                     f"command again.{resync}")


def _create_all(spec: SweepSpec, track: bool) -> None:
    """Create (atomically) or check each local SQLite store; other databases create their own schemas."""
    from sweeps.rules.store import RuleStore
    from sweeps.store.study import optuna_storage

    def optuna_schema(url: str) -> None:
        optuna_storage(spec, url).engine.dispose()

    def rules_schema(url: str) -> None:
        RuleStore(url).engine.dispose()

    def mlflow_schema(url: str) -> None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(url)
        client.search_experiments(max_results=1)  # creates / migrates the schema
        with contextlib.suppress(Exception):  # its engine must let go of the file before the rename
            client._tracking_client.store.engine.dispose()

    stores = [("optuna", spec.optuna_storage, optuna_schema), ("rules", spec.rules_db, rules_schema)]
    if track:
        stores.append(("mlflow", spec.mlflow_uri, mlflow_schema))
    # every existing store is judged before any is created: a refusal leaves the others untouched
    todo = [(kind, url, create) for kind, url, create in stores
            if not ((path := sqlite_path(url)) is not None and path.exists() and check_existing(path, kind))]
    for kind, url, create in todo:
        path = sqlite_path(url)
        if path is None:  # PostgreSQL, an MLflow server: the database handles its own schema creation
            if kind != "mlflow":
                create(url)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        create_atomically(path, create)


def prepare(spec: SweepSpec, track: bool = True) -> None:
    """Create the Optuna, rules and (``track``) local MLflow stores under the store's creation
    lock, each atomically (:func:`create_atomically`); an existing one is checked first
    (:func:`check_existing`: a half-made store without results is rebuilt). Sets the store's
    reserve aside (:func:`ensure_reserve`).

    Raises:
        StoreError: a half-made store holding results, or another driver holding the creation
            lock for :data:`CREATE_LOCK_TIMEOUT_S`.
    """
    d = spec.store_dir / "locks"
    d.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(d / "create.lock"), timeout=CREATE_LOCK_TIMEOUT_S)
    try:
        with lock:
            _create_all(spec, track)
            ensure_reserve(spec.store_dir)
    except Timeout:
        raise StoreError(f"another driver has been creating the stores in {spec.store_dir} for "
                         f"{CREATE_LOCK_TIMEOUT_S:.0f} s (lock {d / 'create.lock'}); is it hung?") from None


def new_study_name(sweep_name: str) -> str:
    """A fresh study name: ``<sweep>-<YYYYmmdd-HHMMSS>-<pid>-<8 hex>``; two sweeps started in the
    same second (even by one process) get different names."""
    return f"{sweep_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}"
