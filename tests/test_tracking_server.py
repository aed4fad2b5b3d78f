"""Tracking at team scale: ``tracking.uri`` is a real ``mlflow server`` process, stopped and
restarted mid-sweep by this test. Optuna is the source of truth; the outage delays the MLflow
sync, and after the restart every finished launched trial has exactly one MLflow run (``trial_key``)."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

# Many distinct configs (graph size 1..512 x memory fraction), instant trials (the model
# evaluated in-process): the sweep runs long enough to stop MLflow in the middle. 150 trials
# take ~60 s with the server up (~0.4 s each through it): 5 before the outage, 10 during it and
# the server's restart (5-15 s) leave well over a hundred to finish after it.
MANY = ["sweep=smoke", "backend=instant", "sweep.params.allreduce.choices=[nccl]", "sweep.seed_each_level_of=[]",
        "~sweep.params.cuda_graph_max_bs", "+sweep.params.cuda_graph_max_bs={type:int,low:1,high:512}",
        "+sweep.params.mem_fraction_static={type:float,low:0.80,high:0.88}",
        "+sweep.baseline.mem_fraction_static=0.85", "sweep.sampler.name=random", "sweep.budget.wall_time_s=null"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on loopback over a SQLite backend store, in its own process group."""

    def __init__(self, root: Path, port: int):
        self.root, self.port, self.proc = root, port, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout_s: float = 120) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job-runner workers
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
             f"sqlite:///{self.root / 'mlflow.db'}", "--artifacts-destination", (self.root / "artifacts").as_uri(),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=open(self.root / "server.log", "ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-2000:]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError("mlflow server did not come up")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def _finished(store: Path) -> int:
    try:
        with sqlite3.connect(str(store / "optuna.db"), timeout=1) as c:
            return c.execute("select count(*) from trials where state in ('COMPLETE','PRUNED','FAIL')").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_mlflow_outage_delays_sync_without_loss_or_duplicates(tmp_path):
    root = tmp_path / "mlflow-server"
    root.mkdir()
    srv = MlflowServer(root, _free_port())
    srv.start()
    store = tmp_path / "store"
    cmd = [sys.executable, str(REPO / "run_sweep.py"), *MANY, "sweep.budget.trials=150", "sweep.budget.max_asks=450",
           f"tracking.uri={srv.url}", f"tracking.store_dir={store}", f"tracking.findings_dir={tmp_path / 'f'}"]
    log = tmp_path / "sweep.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=str(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        def finished_at_least(n: int) -> bool:
            assert proc.poll() is None, f"the sweep ended early: {log.read_text()[-3000:]}"
            return _finished(store) >= n

        wait_for(lambda: finished_at_least(5), 180, interval=0.2, what="5 finished trials")
        srv.stop()  # outage
        n_down = _finished(store)
        wait_for(lambda: finished_at_least(n_down + 10), 180, interval=0.2,
                 what="10 more trials during the MLflow outage (the sweep must go on)")
        srv.start()  # back, same port and backend store
        assert proc.poll() is None, "the sweep ended before MLflow was back: not a mid-sweep outage"
        n_back = _finished(store)
        proc.wait(timeout=400)
        assert proc.returncode == 0, log.read_text()[-4000:]
        text = log.read_text()
        assert "MLflow unreachable" in text or "MLflow sync of" in text, "the outage was not noticed"

        study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")
        from sweeps.store import records

        # one run per finished LAUNCHED trial (skipped proposals are counts on the parent)
        finished = {f"smoke/{r.number}" for r in records.load_records(study)
                    if r.launched and r.state not in ("RUNNING", "WAITING")}
        c = MlflowClient(tracking_uri=srv.url)
        exp = c.get_experiment_by_name("smoke")
        runs, token = [], None
        while True:
            page = c.search_runs([exp.experiment_id], max_results=1000, page_token=token)
            runs += page
            token = page.token
            if not token:
                break
        keys = [r.data.tags["trial_key"] for r in runs if "trial_key" in r.data.tags]
        assert len(keys) == len(set(keys)), "duplicate MLflow runs"
        assert set(keys) == finished, (sorted(finished - set(keys))[:10], sorted(set(keys) - finished)[:10])
        assert len([r for r in runs if r.data.tags.get("servesweep.role") == "study"]) == 1
        assert len(finished) > n_back  # trials finished after the restart were synced too
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.stop()


def test_a_sweep_whose_mlflow_never_answered_says_so_last(tmp_path):
    port = _free_port()  # nothing listens there
    r = subprocess.run([sys.executable, str(REPO / "run_sweep.py"), "sweep=smoke", "backend=instant",
                        "sweep.budget.trials=2", "sweep.confirm.top_k=0", "sweep.budget.wall_time_s=null",
                        f"tracking.uri=http://127.0.0.1:{port}", f"tracking.store_dir={tmp_path / 's'}",
                        f"tracking.findings_dir={tmp_path / 'f'}"], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.strip().splitlines()
    assert out[-1].startswith(f"MLflow (http://127.0.0.1:{port}) was not reached at the end: the 2 finished trials"), out[-3:]
    assert "run the same command once MLflow is back" in out[-1]
    # one line says it, not one per retried request
    assert not any("urllib3.connectionpool" in line for line in (r.stdout + r.stderr).splitlines())
