"""Page test: the MLflow UI (``python -m sweeps.ui``, what ``make ui`` runs) loaded in
headless Chromium lists the sweep's trials with their tok/s and failure class.

The store is written by the driver's own MLflow code (``sweeps.store.tracking.Tracker``) from
trial records, so no Ray is needed. Chromium: Debian package ``chromium``
(``/usr/bin/chromium``); without it the test skips with a loud reason, and under
``CI=true`` a missing browser is a failure. The screenshot is saved in the test's
output directory (``tmp_path``; its path is printed).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sweeps.publish.parent_run import confirmed_fields
from sweeps.store import records
from sweeps.store.tracking import Tracker
from tests.conftest import REPO

pytestmark = [pytest.mark.page, pytest.mark.slow]  # a real Chromium and MLflow server: ~80 s
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    msg = (f"PAGE TEST SKIPPED: no Chromium found (looked for {', '.join(CHROMIUM_NAMES)}). Install the Debian "
           "package: apt-get install -y chromium")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + " -- CI=true, so a skip is a failure")
    print("\n" + "!" * 80 + "\n" + msg + "\n" + "!" * 80, file=sys.stderr)
    pytest.skip(msg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records() -> list[records.TrialRecord]:
    def rec(n, status, params, tok=None, cls=None, base=False):
        return records.TrialRecord(number=n, state="COMPLETE" if status == "ok" else "PRUNED", params=params, status=status,
                             metrics={"decode_tok_s": tok, "speedup_vs_baseline": tok / 82.0} if tok else {},
                             failure_class=cls, failure_kind="deterministic" if cls else None,
                             failure_signature="No supported CUDA architectures found" if cls else None,
                             is_baseline=base, launch_command=f"python -m sglang.launch_server # t{n}")
    p = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 512}
    return [rec(0, "ok", p, 82.04, base=True),
            rec(1, "ok", {**p, "cuda_graph_max_bs": 128}, 89.51),
            rec(2, "failed", {**p, "allreduce": "flashinfer_fusion"}, cls="flashinfer_allreduce_fusion_unsupported_arch"),
            rec(3, "failed", {**p, "allreduce": "torch_symm_mem"}, cls="torch_symm_mem_unsupported")]


CONFIRMATION = {"winner": 1, "confidence": 0.95, "winner_note": "Winner t1: 88.7 tok/s mean over 3 runs.",
                "entries": [{"trial": 1, "mean": 88.7342, "ci_low": 87.91, "ci_high": 89.55, "n": 3,
                             "speedup_mean": 1.081, "speedup_ci": [1.06, 1.10]}]}


class _Study:
    """The two things Tracker.open_parent reads from an Optuna study."""

    study_name = "pagesweep"

    def __init__(self):
        self.user_attrs: dict = {}

    def set_user_attr(self, k, v):
        self.user_attrs[k] = v


@pytest.fixture
def ui(tmp_path):
    store = tmp_path / "store"
    (store / "artifacts").mkdir(parents=True)
    tr = Tracker(f"sqlite:///{store / 'mlflow.db'}", "pagesweep", (store / "artifacts").as_uri())
    tr.open_parent(_Study(), "Page-test sweep: allreduce x graph size", {"sweep": "pagesweep"})
    assert tr.sync("pagesweep", _records(), store, {"backend": "emulated"}) == 4
    # the confirmed winner, as the driver logs it after the confirmation (sweeps.publish.parent_run)
    metrics, tags = confirmed_fields(CONFIRMATION, "decode_tok_s")
    tr.log_parent_metrics(metrics)
    tr.set_parent_tags(tags)
    tr.close_parent()
    port = _free_port()
    log = open(tmp_path / "ui.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.ui", "--store-dir", str(store), "--port", str(port),
                             "--foreground"],  # the server in this process group: the teardown's killpg stops it
                            cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # 4 uvicorn workers: ~10 s idle, > 70 s on a loaded 2-core box
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "ui.log").read_text()[-2000:]
            time.sleep(0.5)
        else:
            pytest.fail("MLflow UI did not come up: " + (tmp_path / "ui.log").read_text()[-2000:])
        yield base, tr.experiment_id
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
        log.close()


def _chrome_argv(chrome: str, profile: Path) -> list[str]:
    return [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1600,1000",
            "--virtual-time-budget=20000"]


def test_experiment_page_lists_trials_with_toks_and_failure_class(ui, tmp_path):
    chrome = _chromium()
    base, exp_id = ui
    # the link python -m sweeps.ui should print: the "Model training" workflow (MLflow 3 defaults to GenAI)
    url = f"{base}/#/experiments/{exp_id}?workflowType=machine_learning"
    argv = _chrome_argv(chrome, tmp_path / "chrome-profile")
    dom = subprocess.run([*argv, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    (tmp_path / "experiment.html").write_text(html)
    shot = tmp_path / "experiment.png"
    r = subprocess.run([*argv, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, r.stderr[-2000:]
    print(f"\nscreenshot: {shot}")
    # the JS app ran and rendered the sweep's experiment on its runs view: the study's parent
    # run, with the trials nested under it (collapsed by default) counted in the table
    assert "pagesweep" in html and "Run Name" in html, "the runs table was not rendered"
    m = re.search(r"(\d+)\s+matching\s+runs", re.sub(r"<[^>]+>", " ", html))
    assert m and int(m.group(1)) == 5, "the table does not count the parent run + 4 trials"
    # the rows behind that table, from the REST endpoint the page itself calls
    r = httpx.post(f"{base}/ajax-api/2.0/mlflow/runs/search", json={"experiment_ids": [exp_id], "max_results": 100},
                   timeout=30)
    # child run names carry the outcome after " · " (sweeps.store.tracking.run_label); key by the config part
    runs = {x["info"]["run_name"].split(" · ")[0]: x for x in r.json()["runs"]}
    assert any(x["info"]["run_name"] == "t001 none nccl g128 · 89.5 tok/s" for x in r.json()["runs"])
    def tags(x):
        return {t["key"]: t["value"] for t in x["data"].get("tags", [])}
    def metrics(x):
        return {m["key"]: m["value"] for m in x["data"].get("metrics", [])}
    assert metrics(runs["t001 none nccl g128"])["decode_tok_s"] == pytest.approx(89.51)
    assert metrics(runs["t000 none nccl g512"])["decode_tok_s"] == pytest.approx(82.04)
    assert tags(runs["t002 none flashinfer_fusion g512"])["failure_class"] == "flashinfer_allreduce_fusion_unsupported_arch"
    assert tags(runs["t003 none torch_symm_mem g512"])["failure_class"] == "torch_symm_mem_unsupported"
    parent = runs["pagesweep"]
    assert all(tags(runs[n])["mlflow.parentRunId"] == parent["info"]["run_id"] for n in runs if n != "pagesweep")


def test_parent_run_page_shows_the_confirmed_winner(ui, tmp_path):
    chrome = _chromium()
    base, exp_id = ui
    r = httpx.post(f"{base}/ajax-api/2.0/mlflow/runs/search", json={"experiment_ids": [exp_id], "max_results": 100},
                   timeout=30)
    parent = next(x for x in r.json()["runs"] if x["info"]["run_name"] == "pagesweep")
    url = f"{base}/#/experiments/{exp_id}/runs/{parent['info']['run_id']}"
    dom = subprocess.run([*_chrome_argv(chrome, tmp_path / "chrome-profile"), "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    (tmp_path / "parent.html").write_text(dom.stdout)
    text = re.sub(r"<[^>]+>", " ", dom.stdout)
    # the run page lists the parent's metrics: the confirmed mean and its interval, by name and value
    for key in ("confirmed_decode_tok_s", "confirmed_decode_tok_s_ci_low", "confirmed_decode_tok_s_ci_high",
                "confirmed_speedup_vs_baseline"):
        assert key in text, f"{key} is not on the parent run's page"
    assert re.search(r"88\.73", text), "the confirmed mean's value is not on the page"
