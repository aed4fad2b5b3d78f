"""MLflow shows what ran and who won, read back through MLflow's REST API.

A fresh smoke sweep through the driver (in-process executor, ``backend=instant``: the same
Driver/Publisher/Tracker code as the Ray driver) logs to a real ``mlflow server``. Then:
child runs (confirmation runs excluded) = launched trials; a run is FAILED only when its
launch failed; skipped proposals are counts on the parent plus one ``skipped.csv``; the
parent's findings artifact is byte-identical to ``findings/<sweep>.md``; the parent carries
``confirmed_decode_tok_s`` with its CI, the speedup CI, the winner's trial, the deployable
command and ``best_run``; confirmation runs are nested under the trial they confirm.
"""

from __future__ import annotations

import csv
import io

import httpx
import pytest

from sweeps.app.inprocess import run_in_process
from sweeps.config.spec import load_spec
from sweeps.store import records
from tests.conftest import compose_cfg
from tests.test_tracking_server import MlflowServer, _free_port

OVERRIDES = ["backend=instant", "sweep=smoke", "sweep.budget.trials=5", "sweep.confirm.top_k=2",
             "sweep.confirm.repeats=2"]


def _tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def _metrics(run: dict) -> dict[str, float]:
    return {m["key"]: m["value"] for m in run["data"].get("metrics", [])}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("truth")
    server = MlflowServer(root, _free_port())
    server.start()
    try:
        store = root / "store"
        spec = load_spec(compose_cfg([*OVERRIDES, f"tracking.store_dir={store}", f"tracking.uri={server.url}",
                                      f"tracking.findings_dir={store / 'findings'}"]))
        drv = run_in_process(spec, track=True, findings=True)
        api = httpx.Client(base_url=server.url + "/api/2.0/mlflow", timeout=30)
        exp = api.get("/experiments/get-by-name", params={"experiment_name": "smoke"}).json()["experiment"]
        runs = api.post("/runs/search", json={"experiment_ids": [exp["experiment_id"]], "max_results": 1000}).json()["runs"]
        yield drv, spec, server, runs
    finally:
        server.stop()


def test_child_runs_are_the_launched_trials(swept):
    drv, _, _, runs = swept
    recs = records.load_records(drv.study)
    launched = [r for r in recs if r.launched]
    parent = next(x for x in runs if _tags(x).get("servesweep.role") == "study")
    pid = parent["info"]["run_id"]
    kids = [x for x in runs if _tags(x).get("mlflow.parentRunId") == pid]
    assert sorted(int(_tags(k)["trial_number"]) for k in kids) == sorted(r.number for r in launched)
    assert len(kids) == len(launched) == 5
    # FAILED only for a launch that failed (smoke seeds flashinfer_fusion: it fails on SM120)
    by_n = {r.number: r for r in recs}
    for k in kids:
        r = by_n[int(_tags(k)["trial_number"])]
        assert (k["info"]["status"] == "FAILED") == (r.status in ("failed", "infra_error")), (r.status, k["info"])
    assert any(k["info"]["status"] == "FAILED" for k in kids)
    # nothing else in the experiment but the parent, its trials, their probes and the confirmation runs
    others = [x for x in runs if x not in kids and x is not parent]
    assert others and all(_tags(x).get("servesweep.role") in ("confirmation", "probe") for x in others)


def test_a_probe_is_a_run_nested_under_its_trial(swept):
    """smoke seeds flashinfer_fusion, a shipped dead end on SM120: it is probed, the probe fails,
    the trial ends there. Its probe is a run tagged ``probe`` under the trial's run."""
    drv, _, _, runs = swept
    probed = {t.number: t.user_attrs["probe"] for t in drv.study.get_trials() if t.user_attrs.get("probe")}
    assert probed, "smoke has no probed trial"
    by_id = {x["info"]["run_id"]: x for x in runs}
    probes = [x for x in runs if _tags(x).get("probe") == "true"]
    assert sorted(int(_tags(x)["trial_number"]) for x in probes) == sorted(probed)
    for x in probes:
        t = _tags(x)
        info = probed[int(t["trial_number"])]
        trial_run = by_id[t["mlflow.parentRunId"]]
        assert _tags(trial_run)["trial_number"] == t["trial_number"]
        assert _tags(trial_run)["probe_result"] == info["result"] == t["status"]
        assert x["info"]["status"] == ("FINISHED" if info["result"] == "ok" else "FAILED")
        assert _metrics(x)["gpu_s"] == pytest.approx(info["gpu_s"])
        assert t["dead_end"] == str(bool(info["dead_end"])).lower() and t["reason"] == info["reason"]
        if info["dead_end"]:  # the trial ended at its probe: it cost the probe's GPU-seconds only
            assert _metrics(trial_run)["gpu_s"] == pytest.approx(info["gpu_s"])


def test_skipped_proposals_are_counted_on_the_parent(swept):
    drv, _, server, runs = swept
    recs = records.load_records(drv.study)
    skipped = [r for r in recs if not r.launched]
    parent = next(x for x in runs if _tags(x).get("servesweep.role") == "study")
    m = _metrics(parent)
    assert m["skipped_total"] == len(skipped)
    # launches of the trial budget; re-question probes (probe-only launches of known dead ends) apart
    assert m["trials_launched"] == sum(r.budgeted for r in recs)
    assert m["requestion_probes"] == sum(r.launched and r.requestion for r in recs)
    assert sum(m[f"skipped_{k}"] for k in ("rule", "duplicate", "degraded", "infeasible", "other")) == len(skipped)
    table = httpx.get(f"{server.url}/get-artifact", params={"path": "skipped.csv", "run_uuid": parent["info"]["run_id"]},
                      timeout=30)
    assert table.status_code == 200
    rows = list(csv.DictReader(io.StringIO(table.text)))
    assert sorted(int(x["trial"]) for x in rows) == sorted(r.number for r in skipped)


def test_parent_carries_the_confirmed_winner_and_the_final_findings(swept):
    drv, spec, server, runs = swept
    conf = drv.study.user_attrs["confirmation"]
    winner = conf["winner"]
    entry = next(e for e in conf["entries"] if e["trial"] == winner)
    parent = next(x for x in runs if _tags(x).get("servesweep.role") == "study")
    m, t = _metrics(parent), _tags(parent)
    assert m["confirmed_decode_tok_s"] == pytest.approx(entry["mean"])
    assert m["confirmed_decode_tok_s_ci_low"] == pytest.approx(entry["ci_low"])
    assert m["confirmed_decode_tok_s_ci_high"] == pytest.approx(entry["ci_high"])
    assert m["confirmed_decode_tok_s_ci_low"] <= m["confirmed_decode_tok_s"] <= m["confirmed_decode_tok_s_ci_high"]
    assert "confirmed_speedup_vs_baseline_ci_low" in m and "confirmed_speedup_vs_baseline_ci_high" in m
    assert t["confirmed_trial"] == t["best_trial"] == str(winner)
    best = next(x for x in runs if x["info"]["run_id"] == t["best_run"])
    assert _tags(best)["trial_number"] == str(winner)
    assert t["best_launch_command"].startswith("python -m sglang.launch_server --model-path ")
    assert "tasks.emulator" not in t["best_launch_command"] and "--port 30000" in t["best_launch_command"]
    # the findings artifact is the final document (written after the confirmation), byte for byte,
    # without the marker comments MLflow's artifact view would show as text
    from sweeps.publish.findings.document import without_markers

    got = httpx.get(f"{server.url}/get-artifact", params={"path": "smoke.md", "run_uuid": parent["info"]["run_id"]},
                    timeout=30)
    assert got.status_code == 200
    assert got.text == without_markers(spec.findings_path.read_text()) and "<!-- servesweep" not in got.text
    summary = httpx.get(f"{server.url}/get-artifact", params={"path": "summary.txt", "run_uuid": parent["info"]["run_id"]},
                        timeout=30)
    assert "sglang.launch_server" in summary.text and "emulated 8×RTX PRO 6000" in summary.text


def test_confirmation_runs_are_nested_under_the_trial_they_confirm(swept):
    drv, _, _, runs = swept
    conf = drv.study.user_attrs["confirmation"]
    by_id = {x["info"]["run_id"]: x for x in runs}
    confirms = [x for x in runs if _tags(x).get("servesweep.role") == "confirmation"]
    assert len(confirms) == conf["repeats"] * len(conf["entries"])
    for c in confirms:
        tr = by_id[_tags(c)["mlflow.parentRunId"]]
        assert _tags(tr)["trial_number"] == _tags(c)["confirms_trial"]
        # filterable like the trial runs: what ran where
        assert {k: _tags(c).get(k) for k in ("backend", "node_profile")} == {
            k: _tags(tr).get(k) for k in ("backend", "node_profile")}
        assert _tags(c)["backend"]
        if c["info"]["status"] == "FINISHED":
            assert _metrics(c)["decode_tok_s"] > 0


def test_report_uploads_the_changed_artifacts_again(swept):
    """``python -m sweeps.report <study>`` rewrites findings/plots/summary and re-logs them: the
    parent's findings artifact is again byte-identical to the (rewritten) file."""
    from sweeps.report import main

    drv, spec, server, _ = swept
    before = spec.findings_path.read_bytes()
    overrides = [f"tracking.uri={server.url}", f"tracking.findings_dir={spec.findings_path.parent}",
                 "sweep.budget.trials=5", "sweep.confirm.top_k=2", "sweep.confirm.repeats=2"]
    assert main([drv.study_name, "--store-dir", str(spec.store_dir), *overrides]) == 0
    after = spec.findings_path.read_bytes()
    pid = drv.study.user_attrs["mlflow_parent_run_id"]
    got = httpx.get(f"{server.url}/get-artifact", params={"path": spec.findings_path.name, "run_uuid": pid}, timeout=30)
    assert got.content == after
    assert b"Confirmation" in after and len(before) > 0
    api = httpx.Client(base_url=server.url + "/api/2.0/mlflow", timeout=30)
    parent = api.get("/runs/get", params={"run_id": pid}).json()["run"]
    assert "confirmed_decode_tok_s" in _metrics(parent)
    runs = api.post("/runs/search", json={"experiment_ids": [parent["info"]["experiment_id"]],
                                          "max_results": 1000}).json()["runs"]
    confirms = [x for x in runs if _tags(x).get("servesweep.role") == "confirmation"]
    conf = drv.study.user_attrs["confirmation"]
    assert len(confirms) == conf["repeats"] * len(conf["entries"]), "the report duplicated confirmation runs"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_driver_emulated_smoke_through_ray_reads_back_true(tmp_path):
    """``run_sweep.py backend=emulated sweep=smoke`` (Ray, emulated SGLang servers), then MLflow
    served over the sweep's store: the same truths through the REST API."""
    import os
    import subprocess
    import sys

    import optuna

    from tests.conftest import REPO

    store = tmp_path / "store"
    args = ["backend=emulated", "sweep=smoke", f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]
    r = subprocess.run([sys.executable, str(REPO / "run_sweep.py"), *args], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=800, env={**os.environ, "RAY_ADDRESS": "local"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "python -m sglang.launch_server --model-path" in r.stdout
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")
    recs = records.load_records(study)
    server = MlflowServer(store, _free_port())  # serves the sweep's own store (file:// artifacts under it)
    server.start()
    try:
        api = httpx.Client(base_url=server.url + "/api/2.0/mlflow", timeout=30)
        exp = api.get("/experiments/get-by-name", params={"experiment_name": "smoke"}).json()["experiment"]
        runs = api.post("/runs/search", json={"experiment_ids": [exp["experiment_id"]], "max_results": 1000}).json()["runs"]
        parent = next(x for x in runs if _tags(x).get("servesweep.role") == "study")
        kids = [x for x in runs if _tags(x).get("mlflow.parentRunId") == parent["info"]["run_id"]]
        assert len(kids) == sum(x.launched for x in recs)
        print(f"\n{len(kids)} child runs, {sum(x.launched for x in recs)} launched, {len(recs)} proposals, "
              f"{len(runs) - len(kids) - 1} confirmation runs")
        by_n = {x.number: x for x in recs}
        assert all((k["info"]["status"] == "FAILED") == (by_n[int(_tags(k)["trial_number"])].status
                                                         in ("failed", "infra_error")) for k in kids)
        assert "confirmed_decode_tok_s" in _metrics(parent) and "confirmed_decode_tok_s_ci_low" in _metrics(parent)
        got = httpx.get(f"{server.url}/get-artifact", params={"path": "smoke.md", "run_uuid": parent["info"]["run_id"]},
                        timeout=30)
        from sweeps.publish.findings.document import without_markers

        assert got.text == without_markers((store / "findings" / "smoke.md").read_text())  # what a viewer shows
    finally:
        server.stop()
