"""Fresh local stores are created whole or not at all; half-made ones are rebuilt or refused.

The Optuna, rules and MLflow schemas are built in a temporary file next to their target and
renamed into place (``sweeps.run.stores.create_atomically``). A store found half-made (an
intermediate ``alembic_version``, ``_alembic_tmp_*`` tables, tables without their version, a
hot journal) is moved aside and rebuilt when it holds no results, else refused with exit 2
naming the file and the repair command.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from sweeps.config.spec import load_spec
from sweeps.errors import exit_code
from sweeps.run import stores
from sweeps.run.stores import StoreError, create_atomically, prepare
from tests.conftest import REPO, compose_cfg


def _spec(store, *extra):
    return load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  "sweep.budget.trials=1", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", *extra]))


def _tables(db):
    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}


KILLED_MID_CREATE = """
import os, sys
from pathlib import Path
from sweeps.run.stores import create_atomically
import sqlalchemy as sa

def create(url):
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.exec_driver_sql("CREATE TABLE half (x INTEGER)")
    os._exit(9)  # SIGKILL-like: no cleanup, no rename

create_atomically(Path(sys.argv[1]), create)
"""


def test_a_creation_killed_half_way_leaves_no_store_and_the_next_one_is_whole(tmp_path):
    target = tmp_path / "optuna.db"
    p = subprocess.run([sys.executable, "-c", KILLED_MID_CREATE, str(target)], cwd=REPO, timeout=120)
    assert p.returncode == 9
    assert not target.exists()
    left = list(tmp_path.glob("optuna.db.creating-*"))
    assert left, "the killed creation left no temporary file: the test did not kill mid-creation"

    def create(url):
        c = sqlite3.connect(url.removeprefix("sqlite:///"))
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("CREATE TABLE whole (x INTEGER)")
        c.execute("INSERT INTO whole VALUES (1)")
        c.commit()
        c.close()

    assert create_atomically(target, create)
    assert not list(tmp_path.glob("optuna.db.creating-*"))  # the killed creation's leftovers are gone
    assert not target.with_name("optuna.db-wal").exists()  # the file alone is the whole database
    with sqlite3.connect(target) as c:
        assert c.execute("SELECT x FROM whole").fetchall() == [(1,)]
    assert not create_atomically(target, create)  # an existing store is never recreated


def test_prepare_creates_complete_stores_that_reopen(tmp_path):
    spec = _spec(tmp_path / "s")
    prepare(spec)
    d = spec.store_dir
    assert {"studies", "trials", "version_info", "alembic_version"} <= _tables(d / "optuna.db")
    assert {"experiments", "runs", "alembic_version"} <= _tables(d / "mlflow.db")
    assert not list(d.glob("*.creating-*")) and not list(d.glob("*-journal"))
    assert stores.reserve_path(d).stat().st_size >= stores.RESERVE_BYTES
    for kind, name in (("optuna", "optuna.db"), ("mlflow", "mlflow.db"), ("rules", "servesweep.db")):
        assert stores.check_existing(d / name, kind), name
    prepare(spec)  # a second driver on the complete store changes nothing
    assert not list(d.glob("*.half-made"))


def _mlflow_store(tmp_path):
    spec = _spec(tmp_path / "s")
    prepare(spec)
    return spec, spec.store_dir / "mlflow.db"


def test_an_intermediate_mlflow_schema_without_runs_is_rebuilt(tmp_path):
    spec, db = _mlflow_store(tmp_path)
    with sqlite3.connect(db) as c:  # what a kill during MLflow's migrations leaves
        c.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
        c.execute("CREATE TABLE _alembic_tmp_datasets (x INTEGER)")
    prepare(spec)
    assert db.with_name("mlflow.db.half-made").exists()
    assert "_alembic_tmp_datasets" not in _tables(db)
    from mlflow.tracking import MlflowClient

    assert MlflowClient(spec.mlflow_uri).search_experiments()  # whole and usable
    assert stores.check_existing(db, "mlflow")


def test_mlflow_tables_without_their_version_and_no_runs_are_rebuilt(tmp_path):
    spec, db = _mlflow_store(tmp_path)
    with sqlite3.connect(db) as c:
        c.execute("DROP TABLE alembic_version")
    prepare(spec)
    assert "alembic_version" in _tables(db) and stores.check_existing(db, "mlflow")


def test_a_half_made_store_holding_runs_is_refused_with_the_file_and_the_repair(tmp_path):
    spec, db = _mlflow_store(tmp_path)
    from mlflow.tracking import MlflowClient

    c = MlflowClient(spec.mlflow_uri)
    c.create_run(c.create_experiment("x"))
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
    with pytest.raises(StoreError) as ei:
        prepare(spec)
    msg = str(ei.value)
    assert exit_code(ei.value) == 2
    assert str(db) in msg and "1 runs" in msg and f"mlflow db upgrade sqlite:///{db}" in msg, msg
    assert db.exists() and not db.with_name("mlflow.db.half-made").exists()  # nothing moved
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE _alembic_tmp_runs (x INTEGER)")
    with pytest.raises(StoreError, match=r"_alembic_tmp_runs.*mv .*mlflow\.db .*mlflow\.db\.broken"):
        prepare(spec)


def test_a_half_made_store_is_refused_before_any_other_store_is_created(tmp_path):
    spec = _spec(tmp_path / "s")
    spec.store_dir.mkdir(parents=True)
    con = sqlite3.connect(spec.store_dir / "mlflow.db")
    con.execute("CREATE TABLE runs (x INTEGER)")
    con.execute("INSERT INTO runs VALUES (1)")
    con.execute("CREATE TABLE _alembic_tmp_runs (x INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="half-made"):
        prepare(spec)
    assert not (spec.store_dir / "optuna.db").exists()


HOT_JOURNAL = """
import os, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA journal_mode=DELETE")
con.execute("BEGIN IMMEDIATE")
con.execute("DROP TABLE version_info")
con.execute("PRAGMA cache_size=0")
con.execute("CREATE TABLE filler AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
            "SELECT i, hex(randomblob(64)) AS b FROM n")
os._exit(0)  # killed mid-transaction: a hot journal, no commit, no rollback
"""


def test_a_hot_journal_is_rolled_back_and_the_complete_store_kept(tmp_path):
    spec = _spec(tmp_path / "s")
    prepare(spec)
    db = spec.store_dir / "optuna.db"
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA journal_mode=DELETE")
    subprocess.run([sys.executable, "-c", HOT_JOURNAL, str(db)], check=True, timeout=60)
    journal = db.with_name("optuna.db-journal")
    assert journal.exists() and journal.stat().st_size > 0, "no hot journal was left"
    assert stores.check_existing(db, "optuna")  # rolled back to the complete schema: kept
    assert "version_info" in _tables(db) and "filler" not in _tables(db)


def test_a_file_that_is_not_a_database_and_holds_nothing_is_rebuilt(tmp_path):
    spec = _spec(tmp_path / "s")
    spec.store_dir.mkdir(parents=True)
    (spec.store_dir / "servesweep.db").write_bytes(b"SQLite format 3\0" + b"\x07" * 50)  # a torn header
    prepare(spec)
    assert stores.check_existing(spec.store_dir / "servesweep.db", "rules")


@pytest.mark.parametrize("kind, file", [("optuna", "optuna.db"), ("rules", "servesweep.db")])
def test_a_store_that_is_not_a_database_is_refused_and_left_untouched(tmp_path, kind, file):
    """A corrupted file may be a store that held results: it is never set aside and rebuilt empty."""
    spec = _spec(tmp_path / "s")
    prepare(spec)
    db = spec.store_dir / file
    garbage = b"garbage" * 200
    with open(db, "r+b") as f:  # the header overwritten: SQLite no longer reads it
        f.write(garbage)
    before = db.read_bytes()
    with pytest.raises(StoreError) as ei:
        prepare(spec)
    msg = str(ei.value)
    assert exit_code(ei.value) == 2 and str(db) in msg and "not a readable SQLite database" in msg, msg
    assert f"mv {db} {db}.broken" in msg
    assert db.read_bytes() == before and not list(spec.store_dir.glob("*.half-made*"))


def test_a_second_half_made_store_keeps_the_first_aside(tmp_path):
    spec, db = _mlflow_store(tmp_path)
    for _ in range(2):
        with sqlite3.connect(db) as c:  # what a kill during MLflow's migrations leaves
            c.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
        prepare(spec)
    assert db.with_name("mlflow.db.half-made").exists() and db.with_name("mlflow.db.half-made.1").exists()


def test_a_rules_store_that_refuses_writes_stops_the_sweep_before_it_starts(tmp_path):
    """Rules are written only mid-sweep (best effort): an immutable file must be found at the start."""
    import shutil
    import stat

    spec = _spec(tmp_path / "s")
    prepare(spec)
    db = spec.store_dir / "servesweep.db"
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode == 0:
        undo = ["chattr", "-i", str(db)]
    else:  # no chattr here: a mode without write bits refuses writes to anyone but root
        db.chmod(stat.S_IRUSR)
        undo = []
        try:
            open(db, "r+b").close()
            pytest.skip("this user writes read-only files (root without chattr)")
        except OSError:
            pass
    try:
        with pytest.raises(StoreError) as ei:
            prepare(spec)
    finally:
        if undo:
            subprocess.run(undo, check=True)
        else:
            db.chmod(stat.S_IRUSR | stat.S_IWUSR)
    msg = str(ei.value)
    assert exit_code(ei.value) == 2 and str(db) in msg and "cannot be written" in msg, msg
    assert "\n" not in msg
    prepare(spec)  # writable again: the same store is used
