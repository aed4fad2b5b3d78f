"""Creating a sweep's local stores safely, and unique run names.

Two drivers started together on a fresh store race on schema creation: MLflow's alembic
migrations copy tables through ``_alembic_tmp_<table>``; a second process migrating at the
same time fails half-way and leaves those tables behind, after which every MLflow call
fails. :func:`prepare` therefore creates the Optuna, rules and MLflow schemas once, under
a file lock on ``<store>/locks/create.lock`` (a second driver waits for the first), and
refuses a half-created MLflow schema with the fix (:class:`StoreError`, exit code 2).
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import time

from filelock import FileLock, Timeout

from sweeps.config import SweepSpec
from sweeps.sqlite_tuning import sqlite_path
from sweeps.study import SweepError

log = logging.getLogger("servesweep")

#: how long (s) a driver waits for another one creating the same store's schemas; MLflow's
#: full migration chain on SQLite takes a few seconds on our 2-core machines
CREATE_LOCK_TIMEOUT_S = 300.0


class StoreError(SweepError):
    """A store that cannot be used as it is (half-created schema, unreachable); exit code 2."""

    exit_code = 2


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


def _create_all(spec: SweepSpec, track: bool) -> None:
    from sweeps.rules import RuleStore
    from sweeps.study import optuna_storage

    optuna_storage(spec)
    RuleStore(spec.rules_db)
    if track and sqlite_path(spec.mlflow_uri) is not None:
        from mlflow.tracking import MlflowClient

        MlflowClient(spec.mlflow_uri).search_experiments(max_results=1)  # creates / migrates the schema


def prepare(spec: SweepSpec, track: bool = True) -> None:
    """Create the Optuna, rules and (``track``) local MLflow schemas under the store's
    creation lock, checking the MLflow schema before and after.

    Raises:
        StoreError: a half-created MLflow schema, or another driver holding the creation
            lock for :data:`CREATE_LOCK_TIMEOUT_S`.
    """
    d = spec.store_dir / "locks"
    d.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(d / "create.lock"), timeout=CREATE_LOCK_TIMEOUT_S)
    try:
        with lock:
            if track:
                check_mlflow_schema(spec.mlflow_uri)
            _create_all(spec, track)
            if track:
                check_mlflow_schema(spec.mlflow_uri)
    except Timeout:
        raise StoreError(f"another driver has been creating the stores in {spec.store_dir} for "
                         f"{CREATE_LOCK_TIMEOUT_S:.0f} s (lock {d / 'create.lock'}); is it hung?") from None


def new_study_name(sweep_name: str) -> str:
    """A fresh study name: ``<sweep>-<YYYYmmdd-HHMMSS>-<pid>-<8 hex>``; two sweeps started in the
    same second (even by one process) get different names."""
    return f"{sweep_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}"
