"""Store creation races, half-created MLflow schemas, names that must not collide, and the
phase an interrupted trial is recorded with."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sweeps.app.inprocess import InProcessDriver
from sweeps.config.spec import load_spec
from sweeps.errors import exit_code
from sweeps.run.stores import StoreError, leftover_alembic_tables, new_study_name, prepare
from sweeps.store import records
from tasks.types import TrialResult
from tests.conftest import CONF, REPO, compose_cfg


def _spec(store, *extra):
    return load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  "sweep.budget.trials=1", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", *extra]))


def test_half_created_mlflow_schema_is_refused_with_the_fix(tmp_path):
    spec = _spec(tmp_path / "s")
    spec.store_dir.mkdir(parents=True)
    con = sqlite3.connect(spec.store_dir / "mlflow.db")
    con.execute("CREATE TABLE _alembic_tmp_runs (x INTEGER)")
    con.execute("CREATE TABLE runs (x INTEGER)")
    con.execute("INSERT INTO runs VALUES (1)")  # it holds a run: rebuilding it would lose it
    con.commit()
    con.close()
    assert leftover_alembic_tables(spec.mlflow_uri) == ["_alembic_tmp_runs"]
    drv = InProcessDriver(spec, track=True)
    with pytest.raises(StoreError) as ei:
        drv.setup()
    drv.release()
    msg = str(ei.value)
    assert "half-made" in msg and "_alembic_tmp_runs" in msg and f"mv {spec.store_dir / 'mlflow.db'}" in msg
    assert exit_code(ei.value) == 2
    assert not (spec.store_dir / "optuna.db").exists()  # refused before any store was touched


HOT_JOURNAL = """
import os, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA journal_mode=DELETE")
con.execute("BEGIN IMMEDIATE")
con.execute("INSERT INTO runs VALUES (2)")
con.execute("PRAGMA cache_size=0")  # spill the page to the file: the journal is then hot
con.execute("INSERT INTO runs SELECT x + 10 FROM runs")
os._exit(0)  # a driver SIGKILLed mid-write: no commit, no rollback
"""


def test_a_store_left_mid_write_by_a_killed_driver_is_read_again(tmp_path):
    """The next driver's schema check rolls the killed writer's hot journal back instead of
    failing 'attempt to write a readonly database'."""
    spec = _spec(tmp_path / "s")
    spec.store_dir.mkdir(parents=True)
    db = spec.store_dir / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (x INTEGER)")
    con.executemany("INSERT INTO runs VALUES (?)", [(i,) for i in range(2000)])
    con.commit()
    con.close()
    subprocess.run([sys.executable, "-c", HOT_JOURNAL, str(db)], check=True, timeout=60)
    journal = db.with_name("mlflow.db-journal")
    assert journal.exists() and journal.stat().st_size > 0, "no hot journal was left"
    assert leftover_alembic_tables(spec.mlflow_uri) == []
    assert sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone() == (2000,)  # rolled back


RACE = """
import sys, time
from sweeps.config.spec import load_spec
from sweeps.run.stores import prepare
from tests.conftest import compose_cfg
spec = load_spec(compose_cfg(["backend=instant", "sweep=smoke", "tracking.store_dir=" + sys.argv[1]]))
while time.time() < float(sys.argv[2]):
    time.sleep(0.005)
prepare(spec)
print("ok")
"""


@pytest.mark.slow  # ~15 s: two interpreters importing MLflow and migrating its schema
def test_two_drivers_racing_on_a_fresh_store_both_succeed(tmp_path):
    store = tmp_path / "fresh"
    go = time.time() + 8.0  # both start creating at the same instant, after their imports
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(store), str(go)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    spec = _spec(store)
    assert leftover_alembic_tables(spec.mlflow_uri) == []
    from mlflow.tracking import MlflowClient

    assert MlflowClient(spec.mlflow_uri).search_experiments()  # the schema is whole and usable
    prepare(spec)  # and a third driver later is fine too


def test_findings_path_is_per_store_never_per_run(tmp_path):
    default = load_spec(compose_cfg(["sweep=smoke"]))
    assert default.findings_path == REPO / "findings" / "smoke.md"
    a, b = _spec(tmp_path / "a"), _spec(tmp_path / "b")
    assert a.findings_path == tmp_path / "a" / "findings" / "smoke.md"
    assert a.findings_path != b.findings_path
    given = _spec(tmp_path / "a", f"tracking.findings_dir={tmp_path / 'f'}")
    assert given.findings_path == tmp_path / "f" / "smoke.md"


def test_two_same_second_sweeps_get_different_study_names_and_hydra_dirs():
    names = {new_study_name("smoke") for _ in range(50)}
    assert len(names) == 50
    run_dir = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"), resolve=False)["hydra"]["run"]["dir"]
    assert "%f" in run_dir  # microseconds: two runs in one second never share a dir
    from datetime import datetime

    fmt = run_dir.split("${now:")[-1].rstrip("}").split("}")[0]
    stamps = {datetime.now().strftime(fmt) for _ in range(3) if time.sleep(0.001) is None}
    assert len(stamps) == 3


def test_a_trial_interrupted_during_startup_is_recorded_in_phase_startup(tmp_path):
    """Ctrl-C while a trial is starting: its task reports back without having benchmarked
    (or never reports); the record says ``startup``, not ``bench``."""
    spec = _spec(tmp_path / "s")
    drv = InProcessDriver(spec)
    drv.setup()
    try:
        drv._propose()
        (ref, f), = drv.inflight.items()
        class Cancelled:  # the executor reports the task cancelled before it reached readiness
            slots = 1

            def cancel(self, h): ...
            def wait(self, hs, timeout): return list(hs)
            def result(self, h): return TrialResult(status="infra_error", failure_class="node_lost", phase=None)
        drv.executor = Cancelled()
        drv.interrupt()
    finally:
        drv.release()
    rec = next(r for r in records.load_records(drv.study) if r.number == f.trial.number)
    assert rec.status == "interrupted" and rec.phase == "startup"


def test_the_default_store_keeps_findings_at_the_repo_root_however_it_is_spelled():
    rel = load_spec(compose_cfg([]))
    absolute = load_spec(compose_cfg([f"tracking.store_dir={REPO / 'mlflow'}"]))  # what sweeps.report passes
    assert rel.findings_path == absolute.findings_path == REPO / "findings" / f"{rel.study}.md"
    other = load_spec(compose_cfg(["tracking.store_dir=/tmp/elsewhere"]))
    assert other.findings_path == Path("/tmp/elsewhere/findings") / f"{other.study}.md"
