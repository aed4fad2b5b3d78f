"""Plots and ``python -m sweeps.report``: after a real (instant-backend) sweep the MLflow
parent run holds the findings document and >= 4 plots, the document names every
allreduce backend with its outcome, and the report CLI rebuilds both from storage alone
(no Ray) keeping hand-written notes byte for byte."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from sweeps.publish.findings import BEGIN, END, find_sections
from sweeps.publish.plots import write_plots
from tests.conftest import REPO

pytestmark = pytest.mark.slow
ALLREDUCE = ("nccl", "custom", "flashinfer_fusion", "torch_symm_mem")
NOTES_ABOVE = "# Our campaign notes\n\nWritten by hand.\n\n"
NOTES_BELOW = "\n## After the section\n\n- keep me\n"


def _sweep(store: Path, findings: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "backend=instant", "sweep.budget.trials=10",
           "++sweep.confirm.top_k=2", "++sweep.confirm.repeats=3",
           f"tracking.store_dir={store}", f"tracking.findings_dir={findings}", *extra]
    return subprocess.run(cmd, cwd=str(store.parent), capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    store, findings = root / "store", root / "findings"
    findings.mkdir()
    doc = findings / "eagle3_allreduce.md"
    doc.write_bytes((NOTES_ABOVE + BEGIN + "\n" + END + "\n" + NOTES_BELOW).encode())
    r = _sweep(store, findings)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return store, findings, doc


def _parent(store: Path):
    c = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = c.get_experiment_by_name("eagle3_allreduce")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`servesweep.role` = 'study'")
    assert len(runs) == 1
    return c, runs[0]


def test_parent_run_has_document_and_plots(swept):
    store, _, doc = swept
    c, parent = _parent(store)
    top = {a.path for a in c.list_artifacts(parent.info.run_id)}
    assert "eagle3_allreduce.md" in top
    plots = [a.path for a in c.list_artifacts(parent.info.run_id, "plots")]
    assert len([p for p in plots if p.endswith(".png")]) >= 4, plots
    text = doc.read_bytes().decode()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.count("|") >= 8]
    for level in ALLREDUCE:  # every allreduce backend is in the table with an outcome
        row = next((r for r in rows if r.split("|")[1].strip() == level), None)
        assert row is not None, level
        outcome = row.rstrip(" |").rsplit("|", 1)[-1].strip()
        assert outcome and outcome != "untried" or level != "nccl"
    assert "fails: flashinfer_allreduce_fusion_unsupported_arch" in text
    assert "silently falls back to NCCL" in text
    assert parent.data.tags.get("best_run")
    assert parent.data.tags.get("mlflow.note.content")


def test_report_rebuilds_from_storage_keeping_notes(swept):
    store, findings, doc = swept
    before = doc.read_bytes().decode()
    assert before.startswith(NOTES_ABOVE) and before.endswith(NOTES_BELOW)
    # a user edits the notes, then regenerates
    edited = before.replace("- keep me\n", "- keep me\n- and this new line\n")
    doc.write_bytes(edited.encode())
    for p in (store / "reports" / "eagle3_allreduce").glob("*"):  # files and the MLflow copy's folder
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    r = subprocess.run([sys.executable, "-m", "sweeps.report", "eagle3_allreduce", "--store-dir", str(store),
                        f"tracking.findings_dir={findings}"], cwd=str(REPO), capture_output=True, text=True,
                       timeout=200, env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "ray://nowhere:1"})
    assert r.returncode == 0, r.stderr[-3000:]
    after = doc.read_bytes().decode()
    assert after.startswith(NOTES_ABOVE)
    assert after.endswith(NOTES_BELOW.replace("- keep me\n", "- keep me\n- and this new line\n"))
    assert len(find_sections(after)) == 1
    # the quota is owed by the trial budget the study ran under (10), not the sweep YAML's 30
    assert "of the 10-launch trial budget" in before and "of the 10-launch trial budget" in after
    assert "30-launch" not in after
    pngs = sorted(p.name for p in (store / "reports" / "eagle3_allreduce").glob("*.png"))
    assert len(pngs) >= 4, pngs
    # rebuilt from the stores alone: no traceback, and Ray (pointed at an unreachable address) never started
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not re.search(r"\bray\b", r.stderr, re.I), r.stderr[-3000:]


@pytest.mark.xfail(strict=False, reason="findings are per study now (findings/<study>.md, issue 24): a second study "
                   "writes its own document, so the baseline history across studies is not in the first one's; "
                   "the history must be read across the studies' documents")
def test_second_sweep_keeps_notes_and_reports_baseline_history(swept, tmp_path):
    store, findings, doc = swept
    r = _sweep(store, findings, "new_study=true", "sweep.budget.trials=3", "++sweep.confirm.top_k=0")
    assert r.returncode == 0, r.stderr[-3000:]
    text = doc.read_bytes().decode()
    assert text.startswith(NOTES_ABOVE) and "- keep me\n" in text
    assert text.count(BEGIN) == 1
    assert "| sweep | date | baseline tok/s |" in text  # the history of baselines across the two sweeps
    assert "Earlier sweeps in this document" in text


def test_write_plots_on_a_tiny_study(tmp_path):
    study = optuna.create_study(direction="maximize")
    for i, (_ar, v) in enumerate([("nccl", 80.0), ("nccl", 85.0), ("custom", None)]):
        t = study.ask({"allreduce": optuna.distributions.CategoricalDistribution(["nccl", "custom"]),
                       "cuda_graph_max_bs": optuna.distributions.CategoricalDistribution([64, 128])})
        t.set_user_attr("status", "ok" if v else "failed")
        if v:
            t.set_user_attr("metrics", {"decode_tok_s": v})
        else:
            t.set_user_attr("failure_class", "custom_allreduce_graph_error")
        t.set_user_attr("is_baseline", i == 0)
        study.tell(t, v) if v else study.tell(t, state=optuna.trial.TrialState.PRUNED)
    paths = write_plots(study, tmp_path / "plots")
    names = {p.name for p in paths}
    assert {"optimization_history.png", "toks_by_allreduce_speculation.png", "failures_by_class.png",
            "eagle_draft_acceptance.png"} <= names
    assert all(p.stat().st_size > 1000 for p in paths)
