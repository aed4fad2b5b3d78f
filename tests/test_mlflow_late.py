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
