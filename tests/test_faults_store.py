"""Store faults: a long lock on the Optuna DB while a trial finishes.

Another process's ``BEGIN EXCLUSIVE`` on ``optuna.db`` outlasting SQLite's busy timeout
(shortened here to 0.3 s so the test is quick) must neither drop part of a trial's outcome
nor crash the sweep: the one-record write is retried with backoff and, after the lock is
released, the record is complete. A lock outlasting the whole retry budget stops the sweep
with a clear error and leaves no half-recorded trial (a resume recovers it).
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from optuna.trial import TrialState

from sweeps.app.inprocess import InProcessDriver, run_in_process
from sweeps.config.spec import load_spec
from sweeps.errors import exit_code
from sweeps.store import records
from sweeps.store import retry as store_retry
from sweeps.store import sqlite as sqlite_tuning
from sweeps.store.record_io import OutcomeRecord
from sweeps.store.retry import StoreWriteError
from tests.conftest import compose_cfg


def _spec(store, trials=2):
    return load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  f"sweep.budget.trials={trials}", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))


class Locker:
    """Holds ``BEGIN EXCLUSIVE`` on a SQLite file for ``hold_s`` seconds in a thread."""

    def __init__(self, db, hold_s: float):
        self.db, self.hold_s = db, hold_s
        self.held = threading.Event()
        self.released_at: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        con = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        self.held.set()
        time.sleep(self.hold_s)
        con.execute("ROLLBACK")
        con.close()
        self.released_at = time.monotonic()

    def start(self):
        self.thread.start()
        assert self.held.wait(10), "could not take the exclusive lock"


def _hook_locking(db, hold_s, on_trial=0):
    """A task hook that locks the DB while trial ``on_trial`` runs (so its record write waits)."""
    lockers = []

    def hook(args):
        if args[0].trial_number == on_trial and not lockers:
            lk = Locker(db, hold_s)
            lk.start()
            lockers.append(lk)
        return None

    return hook, lockers


@pytest.fixture
def short_busy(monkeypatch):
    monkeypatch.setattr(sqlite_tuning, "BUSY_TIMEOUT_MS", 300)


def test_record_survives_a_lock_past_the_busy_timeout(tmp_path, short_busy):
    spec = _spec(tmp_path / "s", trials=3)
    hook, lockers = _hook_locking(spec.store_dir / "optuna.db", hold_s=3.0, on_trial=0)
    drv = run_in_process(spec, task_hook=hook)
    assert lockers and lockers[0].released_at is not None  # the lock really was held during trial 1
    trials = drv.study.get_trials(deepcopy=False)
    launched = [t for t in trials if records.record_from_trial(t).launched]
    assert len(launched) >= 3  # the budget counts full launches (a probe spends none of it)
    for t in trials:
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL), t
        rec = OutcomeRecord.model_validate(t.user_attrs[records.A_RECORD])  # the whole outcome, one attribute
        assert t.user_attrs[records.A_STATUS] == rec.status  # derived attr written with it
    one = next(t for t in trials if t.number == 0)
    rec = records.record_from_trial(one)
    assert rec.status == "ok" and rec.metrics.get("decode_tok_s", 0) > 0 and rec.launch_command
    assert rec.timings.get("wall_s") is not None and rec.attempts == 1


def test_lock_past_the_retry_budget_stops_the_sweep_cleanly(tmp_path, short_busy, monkeypatch):
    monkeypatch.setattr(store_retry, "RETRY_S", 1.0)
    spec = _spec(tmp_path / "s", trials=2)
    hook, lockers = _hook_locking(spec.store_dir / "optuna.db", hold_s=4.0, on_trial=0)
    drv = InProcessDriver(spec, task_hook=hook)
    drv.setup()
    try:
        with pytest.raises(StoreWriteError, match=r"trial 0.*locked for 1 s"):
            drv.loop()
    finally:
        lockers[0].thread.join(10)  # the lease row can be deleted once the lock is gone
        drv.release()
    # nothing half-written: the trial has no record and no status (still RUNNING in storage)
    t0 = next(t for t in drv.study.get_trials(deepcopy=False) if t.number == 0)
    assert t0.state == TrialState.RUNNING and records.A_RECORD not in t0.user_attrs and records.A_STATUS not in t0.user_attrs
    # the same command resumes: the stale trial is recovered and its config (the baseline) measured
    monkeypatch.setattr(store_retry, "RETRY_S", 120.0)
    again = run_in_process(spec)
    recs = records.load_records(again.study)
    assert any(r.is_baseline and r.status == "ok" for r in recs), recs
    assert all(r.state != "RUNNING" for r in recs)


def test_old_studies_without_a_record_still_load(tmp_path):
    import optuna

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", study_name="old")
    t = study.ask({"x": optuna.distributions.IntDistribution(0, 3)})
    for k, v in {records.A_STATUS: "ok", records.A_METRICS: {"decode_tok_s": 7.0}, records.A_PHASE: "bench",
                 records.A_TIMINGS: {"bench_s": 1.0}}.items():
        t.set_user_attr(k, v)
    study.tell(t, 7.0)
    rec = records.load_records(study)[0]
    assert rec.status == "ok" and rec.metrics == {"decode_tok_s": 7.0} and rec.timings == {"bench_s": 1.0}


def test_busy_errors_are_recognised_through_wrappers():
    import sqlalchemy.exc

    raw = sqlite3.OperationalError("database is locked")
    wrapped = sqlalchemy.exc.OperationalError("UPDATE ...", {}, raw)
    assert store_retry.is_busy(raw) and store_retry.is_busy(wrapped)
    assert not store_retry.is_busy(sqlite3.OperationalError("no such table: trials"))
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise wrapped
        return "done"

    assert store_retry.retrying(flaky, "w", retry_s=10) == "done" and len(calls) == 3
    with pytest.raises(ValueError):
        store_retry.retrying(lambda: (_ for _ in ()).throw(ValueError("bad")), "w")


def test_resume_runs_the_interrupted_baseline_first(tmp_path):
    """A driver dies while its baseline runs (the trial stays RUNNING in storage, every seed is
    still waiting): the resumed sweep's first launch is the baseline, even with a budget of one."""
    spec = _spec(tmp_path / "s", trials=1)
    dead = InProcessDriver(spec)
    dead.setup()
    trial, params = dead.searcher.ask()
    assert trial.user_attrs.get(records.A_BASELINE) and trial.number == 0
    waiting_before = [t.number for t in dead.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    assert waiting_before  # seeds enqueued after the baseline, ahead of any re-queue
    dead.release()  # what a SIGKILL leaves: the lock and lease gone, trial 0 RUNNING
    again = run_in_process(spec)
    recs = records.load_records(again.study)
    assert recs[0].status == "interrupted" and recs[0].failure_class == "node_lost"
    ran = [r for r in recs if r.launched and r.status == "ok"]
    assert len(ran) == 1 and ran[0].is_baseline and ran[0].params == params, ran
    assert ran[0].metrics.get("speedup_vs_baseline") == 1.0
    assert all(r.state != "RUNNING" for r in recs)


def test_rule_write_survives_a_lock_past_the_busy_timeout(tmp_path, monkeypatch):
    import sweeps.rules.store as rules_store

    monkeypatch.setattr(rules_store, "BUSY_TIMEOUT_S", 0.3)
    db = tmp_path / "rules.db"
    store = rules_store.RuleStore(f"sqlite:///{db}")
    lk = Locker(db, hold_s=2.0)
    lk.start()
    fp = {"gpu_arch": "sm_120", "driver": "1", "cuda": "13", "nccl": "2", "torch": "2", "sglang": "0.5"}
    rule = store.learn(fp, "m", {"allreduce": "custom"}, "server_args_incompatible", "bad", {"sweep": "s", "trial_number": 1})
    lk.thread.join(5)
    assert lk.released_at is not None and rule is not None and store.list()[0].failure_class == "server_args_incompatible"


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_a_local_mlflow_store_that_fails_every_call_stops_the_sweep(tmp_path, monkeypatch):
    """A local MLflow store whose every write fails (its tables gone mid-sweep) is an error
    (exit 2 with the store and the fix), not a warning the sweep shrugs off; Optuna keeps the trials."""
    import sweeps.store.tracking as tracking
    from sweeps.app.lifecycle import execute
    from sweeps.run.stores import StoreError

    monkeypatch.setattr(tracking, "OUTAGE_BACKOFF_S", 0.0)  # every flush attempts a sync
    store = tmp_path / "store"
    spec = load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.trials=5", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'f'}"]))
    drv = InProcessDriver(spec, track=True)
    real_flush = drv.publisher.flush
    broke = {"done": False}

    def flush_then_break(*a, **k):
        if not broke["done"]:  # the parent run exists; now the store loses its tables
            broke["done"] = True
            with sqlite3.connect(str(store / "mlflow.db")) as c:
                c.execute("DROP TABLE tags")
                c.execute("DROP TABLE metrics")
        return real_flush(*a, **k)

    monkeypatch.setattr(drv.publisher, "flush", flush_then_break)
    with pytest.raises(StoreError) as e:
        execute(drv)
    assert "MLflow store" in str(e.value) and "mlflow.db.broken" in str(e.value), str(e.value)
    assert exit_code(e.value) == 2
    finished = [r for r in records.load_records(drv.study) if r.state not in ("RUNNING", "WAITING")]
    assert finished, "the trials measured before the stop are kept in Optuna"


def test_stale_recovery_rewrites_a_record_the_killed_driver_left_before_its_tell():
    """A driver killed between writing a trial's record and telling Optuna leaves the trial
    RUNNING with a finished-looking record; recovery must rewrite the record, not only the
    legacy attributes (records are read from the record first)."""
    import optuna

    from sweeps.store import study as study_store
    from sweeps.store.record_io import write_outcome

    study = optuna.create_study()
    t = study.ask()
    t.suggest_categorical("allreduce", ["custom"])
    write_outcome(t, {records.A_STATUS: "ok", records.A_FAILURE_CLASS: "allreduce_path_degraded",
                      records.A_FAILURE_KIND: "perf"}, "t0")
    assert study_store.recover_stale(study) == 1
    r = next(r for r in records.load_records(study) if r.number == 0)
    assert (r.state, r.status, r.failure_class, r.failure_kind) == ("FAIL", "interrupted", "node_lost", "infra"), r


def test_a_queued_trial_killed_before_it_took_its_params_is_queued_again():
    """The driver asked for a queued trial (RUNNING, its config only in fixed_params) and was
    killed before suggesting: recovery re-queues that config, not nothing."""
    import optuna

    from sweeps.store import study as study_store

    study = optuna.create_study()
    cfg = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 512}
    study.enqueue_trial(cfg, user_attrs={"untried_draw": True, "enqueue_attrs": {"untried_draw": True}})
    t = study.ask()
    assert t.params == {} and study.trials[0].state == TrialState.RUNNING
    assert study_store.recover_stale(study) == 1
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [w.system_attrs["fixed_params"] for w in waiting] == [cfg]
    assert waiting[0].user_attrs[records.A_REQUEUED] and waiting[0].user_attrs["untried_draw"]


def test_a_draw_killed_half_way_is_failed_and_not_queued_as_a_partial_config():
    """A sampler draw killed between two suggests (no config_key yet) ran nothing: it is failed,
    and no partial config (which would pin a knob on the next trial) is queued; a whole drawn
    config is queued again."""
    import optuna

    from sweeps.store import study as study_store

    study = optuna.create_study()
    half = study.ask()
    half.suggest_categorical("speculative", ["none"])
    whole = study.ask()
    whole.suggest_categorical("speculative", ["none"])
    whole.suggest_categorical("allreduce", ["nccl"])
    whole.set_user_attr(records.A_CONFIG_KEY, records.config_key(whole.params))
    assert study_store.recover_stale(study) == 2
    assert [t.state for t in study.trials[:2]] == [TrialState.FAIL, TrialState.FAIL]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [w.system_attrs["fixed_params"] for w in waiting] == [{"speculative": "none", "allreduce": "nccl"}]


def test_mlflow_writes_ride_out_a_lock_longer_than_their_attempts(monkeypatch):
    """MLflow writes get the store's busy budget: a lock outlasting tracking.retry's 5 attempts
    is waited out; an unreachable server still fails after its attempts."""
    from sweeps.store import tracking

    monkeypatch.setattr(store_retry, "RETRY_S", 5.0)
    monkeypatch.setattr(tracking.time, "sleep", lambda s: None)
    calls = {"n": 0}

    def locked_8_times():
        calls["n"] += 1
        if calls["n"] <= 8:
            raise sqlite3.OperationalError("database is locked")
        return "written"

    assert tracking.retry(locked_8_times, "log a run", attempts=5, base_delay_s=0.0) == "written"
    down = {"n": 0}

    def unreachable():
        down["n"] += 1
        raise ConnectionError("connection refused")

    with pytest.raises(ConnectionError):
        tracking.retry(unreachable, "log a run", attempts=3, base_delay_s=0.0)
    assert down["n"] == 3
