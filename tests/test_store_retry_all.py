"""One retry policy for every store write: Optuna's storage (a probe's attribute, ``ask``,
``enqueue_trial``, ``tell``), the lease renewal; no SQL in a message; a spent budget
finalises the running trial and the MLflow parent run (``store_unavailable``)."""

from __future__ import annotations

import sqlite3
import time

import pytest
import sqlalchemy.exc
from optuna.trial import TrialState

from sweeps.app.inprocess import InProcessDriver
from sweeps.app.lifecycle import execute
from sweeps.config.spec import load_spec
from sweeps.run.graceful import STORE_UNAVAILABLE
from sweeps.store import lease as study_lease
from sweeps.store import records
from sweeps.store import retry as store_retry
from sweeps.store import sqlite as sqlite_tuning
from sweeps.store.retry import StoreWriteError, brief, retrying
from sweeps.store.study import RetryingStorage, optuna_storage
from tests.conftest import compose_cfg
from tests.test_faults_store import Locker

SQL = "INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)"


def _locked() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError(SQL, (7, "probe", '{"gpu_s": 1.5}'), sqlite3.OperationalError("database is locked"))


def test_messages_carry_the_databases_words_never_the_sql():
    e = _locked()
    assert "[SQL:" in str(e) and "INSERT" in str(e)  # what SQLAlchemy prints
    assert brief(e) == "database is locked"

    def always():
        raise e

    with pytest.raises(StoreWriteError) as ei:
        retrying(always, "store the probe of trial 7", retry_s=0.3)
    msg = str(ei.value)
    assert "store the probe of trial 7" in msg and "database is locked" in msg
    assert "INSERT" not in msg and "[SQL" not in msg and "parameters" not in msg and "gpu_s" not in msg, msg
    assert "\n" not in msg


def test_a_spent_inner_budget_is_not_retried_again_by_an_outer_write():
    def always():
        raise _locked()

    t0 = time.monotonic()
    with pytest.raises(StoreWriteError) as ei:
        retrying(lambda: retrying(always, "inner", retry_s=0.5), "store the record of trial 3", retry_s=30)
    assert time.monotonic() - t0 < 5  # the outer write did not start another 30 s
    assert str(ei.value).startswith("store the record of trial 3:")  # named by the outer write


def test_a_budget_block_shortens_every_retry_inside(monkeypatch):
    def always():
        raise _locked()

    t0 = time.monotonic()
    with store_retry.budget(0.4), pytest.raises(StoreWriteError, match="locked for 0 s"):
        retrying(always, "last write")
    assert time.monotonic() - t0 < 3


@pytest.fixture
def short_busy(monkeypatch):
    monkeypatch.setattr(sqlite_tuning, "BUSY_TIMEOUT_MS", 300)


def _spec(store, trials=2, *extra):
    return load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  f"sweep.budget.trials={trials}", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}", *extra]))


def test_every_optuna_write_rides_out_a_lock_past_the_busy_timeout(tmp_path, short_busy):
    """A plain ``trial.set_user_attr`` (the probe path's write), ``ask`` and ``enqueue_trial``
    wait out a lock 10x the busy timeout: the storage itself retries."""
    import optuna

    sqlite_tuning.tune_sqlite_engines()  # WAL, as the driver runs it: a reader never waits for a writer
    spec = _spec(tmp_path / "s")
    storage = optuna_storage(spec)
    assert isinstance(storage, RetryingStorage)
    study = optuna.create_study(study_name="x", storage=storage)
    trial = study.ask()
    db = spec.store_dir / "optuna.db"
    for write in (lambda: trial.set_user_attr("probe", {"result": "ok"}), study.ask,
                  lambda: study.enqueue_trial({"x": 1})):
        lk = Locker(db, hold_s=3.0)
        lk.start()
        t0 = time.monotonic()
        write()
        assert time.monotonic() - t0 > 2.0  # it really waited for the lock (0.3 s busy timeout)
        lk.thread.join(5)
    assert study.trials[0].user_attrs["probe"] == {"result": "ok"}
    assert [t.state for t in study.trials] == [TrialState.RUNNING, TrialState.RUNNING, TrialState.WAITING]


def test_lease_renewal_rides_out_busy_errors_longer_than_its_ttl(tmp_path, monkeypatch):
    """Busy renewals are retried for the store's budget; the old rule (no renewal for ttl_s =
    lost) would have given the study up after 0.3 s here."""
    lease = study_lease.StudyLease(f"sqlite:///{tmp_path / 'o.db'}", "s", ttl_s=0.3)
    lease.acquire()
    calls = {"n": 0}
    real = lease.renew

    def busy_then_ok():
        calls["n"] += 1
        if calls["n"] <= 4:  # ~0.2+0.4+0.8+1.6 s of backoff
            raise _locked()
        return real()

    monkeypatch.setattr(lease, "renew", busy_then_ok)
    lost = []
    keeper = lease.keep_alive(interval_s=0.05, on_lost=lost.append)
    deadline = time.monotonic() + 15
    while calls["n"] < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    keeper.stop()
    assert calls["n"] >= 6 and not lost and not keeper.lost.is_set(), (calls, lost)


def test_a_lock_past_the_budget_finalises_the_trial_and_the_parent(tmp_path, short_busy, monkeypatch):
    monkeypatch.setattr(store_retry, "RETRY_S", 1.0)
    spec = _spec(tmp_path / "s")
    drv = InProcessDriver(spec, track=True)
    lockers: list[Locker] = []
    save = drv.publisher.save_files

    def lock_then_save(number, *a, **k):  # the record of trial 0 is written right after its files
        if number == 0 and not lockers:
            lockers.append(Locker(spec.store_dir / "optuna.db", hold_s=5.0))
            lockers[0].start()
        return save(number, *a, **k)

    monkeypatch.setattr(drv.publisher, "save_files", lock_then_save)
    with pytest.raises(StoreWriteError) as ei:
        execute(drv)
    assert "[SQL" not in str(ei.value) and "trial 0" in str(ei.value)
    lockers[0].thread.join(10)
    t0 = next(t for t in drv.study.get_trials(deepcopy=False) if t.number == 0)
    rec = records.record_from_trial(t0)
    assert t0.state == TrialState.FAIL and rec.failure_class == STORE_UNAVAILABLE and rec.failure_kind == "infra"
    waiting = drv.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert any(w.system_attrs.get("fixed_params") == t0.params for w in waiting)  # re-queued: runs first on resume
    from mlflow.tracking import MlflowClient

    run = MlflowClient(spec.mlflow_uri).get_run(drv.publisher.tracker.parent_run_id)
    assert run.info.status == "KILLED" and run.data.tags["stop_reason"].startswith(STORE_UNAVAILABLE), run.data.tags
