"""A small real sweep end to end (Ray + Optuna + MLflow + emulated server processes), run
as a subprocess (one ray.init per process), then resumed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO

pytestmark = pytest.mark.slow

FAST = ["sweep=smoke", "backend.emulator.time_scale=0.002", "bench.output_len=32", "bench.repeats=2",
        "bench.warmup_output_len=4", "sweep.budget.trials=4"]


def _run(store: Path, extra: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "run_sweep.py"), *FAST, f"tracking.store_dir={store}",
           f"tracking.findings_dir={store / 'findings'}", *extra]
    return subprocess.run(cmd, cwd=str(store.parent), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    store = tmp_path_factory.mktemp("e2e") / "store"
    first = _run(store, [])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return store, first


def _children(store: Path):
    c = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = c.get_experiment_by_name("smoke")
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("servesweep.role") == "study"]
    # trial runs; confirmation re-measurements and probe launches nest under their trial's run
    nested = ("confirmation", "probe")
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.data.tags.get("servesweep.role") not in nested]
    trial_runs = {k.info.run_id for k in kids}
    assert all(r.data.tags.get("mlflow.parentRunId") in trial_runs for r in runs
               if r.data.tags.get("servesweep.role") in nested)
    return c, exp, parents, kids


def test_mlflow_holds_parent_and_children(swept):
    store, first = swept
    c, exp, parents, kids = _children(store)
    assert exp.artifact_location.startswith("file:///")
    assert len(parents) == 1
    pid = parents[0].info.run_id
    assert kids and all(k.data.tags["mlflow.parentRunId"] == pid for k in kids)
    launched = [k for k in kids if k.data.tags["status"] in ("ok", "failed", "infra_error")]
    assert len(launched) >= 4
    for k in kids:
        assert k.data.tags["status"]
        assert k.data.params, k.info.run_name
        assert "decode_tok_s" in k.data.metrics or k.data.tags.get("failure_class"), k.data.tags
    # benchmarked ok runs (a level whose probe showed a silent fallback ends ok, unbenchmarked, with its class)
    ok = [k for k in kids if k.data.tags["status"] == "ok" and k.data.tags.get("failure_class") != "allreduce_path_degraded"]
    assert ok and all(k.data.metrics["decode_tok_s"] > 0 and "speedup_vs_baseline" in k.data.metrics for k in ok)
    failed = [k for k in kids if k.data.tags["status"] == "failed"]
    # smoke seeds every allreduce level: flashinfer fusion fails on SM120
    assert any(k.data.tags["failure_class"] == "flashinfer_allreduce_fusion_unsupported_arch" for k in failed)
    assert all(k.info.status == "FAILED" for k in failed)
    # the server's real exit code reached the result (SGLang's launcher SIGKILLs itself: -9)
    fus = next(k for k in failed if k.data.tags["failure_class"] == "flashinfer_allreduce_fusion_unsupported_arch")
    res = json.loads((store / "trials" / "smoke" / f"{int(fus.data.tags['trial_number']):05d}" / "result.json").read_text())
    assert res["exit_code"] == -9, res["exit_code"]
    arts = {a.path for a in c.list_artifacts(ok[0].info.run_id)}
    assert {"server.log", "launch_command.txt", "bench.json", "config.json"} <= arts
    assert parents[0].data.tags.get("best_trial") is not None
    assert "best decode" not in first.stderr


def test_resume_does_not_repeat_finished_trials(swept):
    store, _ = swept
    _, _, _, before = _children(store)
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")
    n_before = len(study.trials)
    again = _run(store, [])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "trial budget spent" in again.stdout
    _, _, parents, after = _children(store)
    assert len(parents) == 1
    keys = [k.data.tags["trial_key"] for k in after]
    assert len(keys) == len(set(keys)), "duplicate MLflow runs"
    assert len(optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}").trials) == n_before
    assert len(after) == len(before)


def test_changed_space_is_refused_with_a_way_out(swept):
    store, _ = swept
    r = _run(store, ["sweep.params.cuda_graph_max_bs.choices=[64,128]"])
    assert r.returncode == 1
    assert "different search space" in r.stderr and "new_study=true" in r.stderr


def test_bad_config_stops_before_ray(tmp_path):
    r = _run(tmp_path / "store", ["sweep.params.allreduce.choices=[]"], timeout=60)
    assert r.returncode == 2
    assert "sweep.params.allreduce.choices is empty" in r.stderr
    assert not (tmp_path / "store").exists()  # nothing created, Ray never started


def test_second_driver_on_the_same_study_is_refused(tmp_path):
    store = tmp_path / "store"
    cmd = [sys.executable, str(REPO / "run_sweep.py"), *FAST, f"tracking.store_dir={store}",
           f"tracking.findings_dir={store / 'findings'}", "sweep.budget.trials=1"]
    first = subprocess.Popen(cmd, cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = store / "locks" / "smoke.lock"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.2)
        assert lock.read_text().strip() == str(first.pid)
        second = _run(store, ["sweep.budget.trials=1"], timeout=120)
        assert second.returncode == 2  # a refusal, like a lease held by a driver elsewhere
        assert f"being run by another driver (pid {first.pid})" in second.stderr
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0
