"""Driver crash safety: SIGKILL the driver mid-sweep, run the same command again.

Checked after the second run: finished trials are kept (same numbers, states, values);
the trials that were running are FAIL with an infrastructure class and their configs ran
again; Optuna and MLflow agree (one active child run per finished launched trial, no duplicate
``trial_key``); no server of the killed driver's tasks survives; the findings document is
current. Repeated three times (the kill lands at a different moment each time).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from mlflow.tracking import MlflowClient

from sweeps.store import records
from sweeps.store.study import stale_config
from tests.conftest import REPO
from tests.procs import trial_processes
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

# Two TP=8 trials in flight on 16 logical GPUs; ~1.3 s per measured request (120 tokens at
# ~90 tok/s) so a trial is running for a few seconds when the kill lands.
ARGS = ["sweep=smoke", "backend.emulator.time_scale=0.002", "bench.output_len=120", "bench.repeats=2",
        "bench.warmup_output_len=4", "sweep.budget.trials=4", "ray.num_gpus=16"]


def sweep_cmd(store: Path, extra: list[str] = ()) -> list[str]:
    """The sweep command line (same each run) with every store under ``store``."""
    return [sys.executable, str(REPO / "run_sweep.py"), *ARGS, f"tracking.store_dir={store}",
            f"tracking.findings_dir={store / 'findings'}", *extra]


def trial_states(store: Path) -> dict[str, int]:
    """{Optuna state: count} read straight from the SQLite file (no Optuna import cost)."""
    db = store / "optuna.db"
    if not db.exists():
        return {}
    try:
        with sqlite3.connect(str(db), timeout=1) as c:
            return dict(c.execute("select state, count(*) from trials group by state").fetchall())
    except sqlite3.Error:
        return {}


def servers_of(store: Path) -> list[psutil.Process]:
    """Live emulated-server / TP-rank processes started for this store (their environment
    names a profile under ``<store>/work``)."""
    return trial_processes(store)


def kill_mid_sweep(store: Path, log: Path, timeout_s: float = 150) -> None:
    """Start the sweep, wait until one trial finished and another one's server is up, SIGKILL
    the driver (its process only), and assert the servers of its tasks are gone soon after."""
    with open(log, "w") as out:
        proc = subprocess.Popen(sweep_cmd(store), cwd=str(store.parent), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def one_done_one_serving() -> list:
            assert proc.poll() is None, f"the sweep ended before the kill: {log.read_text()[-2000:]}"
            st = trial_states(store)
            live = servers_of(store)
            return live if st.get("RUNNING") and st.get("COMPLETE", 0) + st.get("PRUNED", 0) >= 1 else []

        live = wait_for(one_done_one_serving, timeout_s, what=lambda: f"a running trial: {log.read_text()[-2000:]}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # no orphaned servers: the servers (and their TP ranks) of the killed driver's tasks go away
    assert live
    wait_for(lambda: not [p for p in servers_of(store) if p.is_running()], 30,
             what=lambda: f"servers to go away: {[(p.pid, p.cmdline()[-4:]) for p in servers_of(store)]}")


def _snapshot(store: Path) -> dict[int, tuple[str, float | None]]:
    st = optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")
    return {t.number: (t.state.name, t.value) for t in st.trials}


@pytest.mark.parametrize("rep", range(3))
def test_sigkill_then_same_command_resumes_cleanly(tmp_path, rep):
    store = tmp_path / "store"
    t0 = time.monotonic()
    kill_mid_sweep(store, tmp_path / "first.log")
    print(f"killed after {time.monotonic() - t0:.1f} s")
    before = _snapshot(store)
    running = {n for n, (s, _) in before.items() if s == "RUNNING"}
    finished = {n: v for n, v in before.items() if v[0] in ("COMPLETE", "PRUNED", "FAIL")}
    assert running, before

    again = subprocess.run(sweep_cmd(store), cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
    print(f"second run done after {time.monotonic() - t0:.1f} s")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "was running when the driver stopped" in again.stdout + again.stderr

    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")
    recs = {r.number: r for r in records.load_records(study)}
    after = {t.number: (t.state.name, t.value) for t in study.trials}
    # finished trials kept as they were
    for n, v in finished.items():
        assert after[n] == v, (n, v, after[n])
    # the running ones: FAIL with an infrastructure class, and their config ran again later
    for n in running:
        r = recs[n]
        assert after[n][0] == "FAIL" and r.failure_kind == "infra" and r.failure_class == "node_lost", r
        cfg = stale_config(study.trials[n])
        if not cfg:  # a sampler draw killed half-way: nothing of it ran, nothing to re-run
            assert not (store / "trials" / "smoke" / f"{n:05d}").exists()
            continue
        key = records.config_key(cfg)
        rerun = [m for m, x in recs.items() if m > n and records.config_key(x.params) == key and x.state != "RUNNING"]
        assert rerun, f"trial {n}'s config was not re-queued"
    assert not any(s == "RUNNING" for s, _ in after.values())

    # Optuna and MLflow agree: one active child run per finished trial, same status
    c = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = c.get_experiment_by_name("smoke")
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("servesweep.role") == "study"]
    kids = [r for r in runs if "trial_key" in r.data.tags]
    assert len(parents) == 1
    keys = [k.data.tags["trial_key"] for k in kids]
    assert len(keys) == len(set(keys)), f"duplicate MLflow runs: {sorted(keys)}"
    # launched trials only: a proposal answered without a launch is a count on the parent
    assert set(keys) == {f"smoke/{n}" for n, r in recs.items() if r.launched}
    assert parents[0].data.metrics.get("skipped_total", 0) == sum(not r.launched for r in recs.values())
    for k in kids:
        n = int(k.data.tags["trial_number"])
        assert k.data.tags["status"] == recs[n].status
        assert k.info.status in ("FINISHED", "FAILED", "KILLED")
        assert k.data.tags["mlflow.parentRunId"] == parents[0].info.run_id

    # the findings document was rewritten by the second run and names its best trial
    doc = (store / "findings" / "smoke.md")
    assert doc.exists()
    best = records.best_record(list(recs.values()))
    text = doc.read_text()
    assert best is not None and f"t{best.number}" in text, [
        (r.number, r.status, r.params, r.perf_tags, r.duplicate_of) for r in recs.values()]
    launched = sum(1 for r in recs.values() if r.budgeted)  # re-question probes are counted apart
    assert f": {launched} launched (" in text  # the one summary's counts line
    assert servers_of(store) == []
