"""MLflow down when the sweep starts: the sweep runs, and once MLflow answers again the
same run syncs every finished trial (Optuna is the source of truth)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

import sweeps.store.tracking as tracking
from sweeps.app.inprocess import run_in_process
from sweeps.config.spec import load_spec
from tests.conftest import compose_cfg


def test_tracker_reopened_when_mlflow_comes_back(tmp_path, monkeypatch):
    store = tmp_path / "store"
    spec = load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.trials=4", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    real = tracking.Tracker
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("MLflow is down")
        return real(*a, **k)

    monkeypatch.setattr(tracking, "Tracker", flaky)
    drv = run_in_process(spec, track=True)
    assert calls["n"] >= 2, "the driver never tried MLflow again"
    c = MlflowClient(spec.mlflow_uri)
    exp = c.get_experiment_by_name("smoke")
    runs = c.search_runs([exp.experiment_id], max_results=500)
    keys = [r.data.tags["trial_key"] for r in runs if "trial_key" in r.data.tags]
    # one run per finished LAUNCHED trial; skipped proposals are counts on the parent, not runs
    from sweeps.store import records

    launched = [r for r in records.load_records(drv.study) if r.launched and r.state not in ("RUNNING", "WAITING")]
    assert launched
    assert len(keys) == len(set(keys)) == len(launched)
    assert set(keys) == {f"{drv.study_name}/{r.number}" for r in launched}


def test_a_half_written_trial_run_is_dropped_with_its_nested_runs(tmp_path):
    # a driver killed while it wrote trial 2's run: the run and its probe run stay RUNNING
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tr = tracking.Tracker(uri, "exp", str(tmp_path / "art"))
    cl = MlflowClient(uri)
    tr.parent_run_id = cl.create_run(tr.experiment_id, run_name="study").info.run_id
    done = cl.create_run(tr.experiment_id, run_name="t001", tags={"mlflow.parentRunId": tr.parent_run_id,
                                                                  "trial_key": "s/1"}).info.run_id
    cl.set_terminated(done)
    half = cl.create_run(tr.experiment_id, run_name="t002", tags={"mlflow.parentRunId": tr.parent_run_id,
                                                                  "trial_key": "s/2"}).info.run_id
    probe = cl.create_run(tr.experiment_id, run_name="t002 probe", tags={"mlflow.parentRunId": half}).info.run_id
    assert tr.synced_keys() == {"s/1"}  # trial 2 is written again by the next sync
    assert cl.get_run(half).info.lifecycle_stage == "deleted"
    assert cl.get_run(probe).info.lifecycle_stage == "deleted"  # not left RUNNING under a deleted parent
    assert cl.get_run(done).info.lifecycle_stage == "active"
