"""Ctrl-C (SIGINT to the terminal's process group) stops a sweep gracefully: running trials
are torn down and recorded as interrupted, the findings document is written, the exit
code is 130, and the same command resumes (the interrupted configs run first)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import optuna
import pytest

from sweeps.store import records
from tests.test_driver_kill import servers_of, sweep_cmd, trial_states
from tests.waiting import wait_for

pytestmark = pytest.mark.slow
#: six measured requests per trial (~8 s of benchmark at ~1.3 s each): a trial spends most of
#: its RUNNING time mid-benchmark, so the Ctrl-C rarely lands in its teardown, where the trial
#: has already finished ok and rightly keeps its result instead of being interrupted
EXTRA = ["bench.repeats=6"]


def test_ctrl_c_stops_gracefully_and_resumes(tmp_path):
    store = tmp_path / "store"
    log = tmp_path / "first.log"
    t_start = time.time()  # wall clock: compared with file mtimes below
    with open(log, "w") as out:
        # own session = a terminal's foreground process group: Ctrl-C signals all of it
        proc = subprocess.Popen(sweep_cmd(store, EXTRA), cwd=str(tmp_path), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def serving() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return bool(trial_states(store).get("RUNNING") and servers_of(store))

        wait_for(serving, 150, what=lambda: f"a running trial: {log.read_text()[-3000:]}")
        t_int = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
        stop_s = time.monotonic() - t_int
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert stop_s < 40, stop_s  # teardown grace (5 s) + recording, not a hang
    wait_for(lambda: servers_of(store) == [], 15, what="the servers to exit after Ctrl-C")

    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")
    recs = records.load_records(study)
    assert not [r for r in recs if r.state == "RUNNING"]
    interrupted = [r for r in recs if r.status == "interrupted"]
    seen = [(r.number, r.state, r.status) for r in recs]
    assert all(r.state == "FAIL" for r in interrupted), seen
    # a trial running at the Ctrl-C is torn down and recorded interrupted (failed, its config
    # re-queued), unless it finished meanwhile: then it keeps its own result (LoopDriver.interrupt).
    # Seen in CI under load: a trial mid-benchmark outlived Ray's cancel and finished 9 s later
    launched = [r for r in recs if r.launched]
    assert launched and all(r.status in ("interrupted", "ok", "failed") for r in launched), seen
    findings = (store / "findings" / "smoke.md")
    assert findings.exists() and findings.stat().st_mtime >= t_start

    again = subprocess.run(sweep_cmd(store, EXTRA), cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    recs2 = records.load_records(optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}"))
    for r in interrupted:  # each interrupted config ran again after the resume
        key = records.config_key(r.params)
        assert [x for x in recs2 if x.number > r.number and records.config_key(x.params) == key
                and x.status in ("ok", "failed", "skipped")], r.number
