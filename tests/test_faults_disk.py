"""A full store (a 4 MB tmpfs filled up mid-sweep) stops the sweep gracefully: a clear
error naming the store and the cause (no traceback, exit code 2), trials recorded so far
kept, and the same command resumes once space is back."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sweeps import records as R
from sweeps.config import load_spec
from sweeps.graceful import store_cause
from sweeps.inprocess import InProcessDriver, run_in_process
from sweeps.lifecycle import execute
from sweeps.stores import StoreError
from tests.conftest import compose_cfg


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(d: Path) -> Path:
    filler = d / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_full_store_stops_the_sweep_with_path_and_cause_then_resumes(small_tmpfs):
    store = small_tmpfs / "store"
    spec = load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  "sweep.budget.trials=3", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    fill = {}

    def hook(args):
        if args[0].trial_number == 1 and not fill:
            fill["file"] = _fill(small_tmpfs)
        return None

    drv = InProcessDriver(spec, task_hook=hook)
    with pytest.raises(StoreError) as ei:
        execute(drv)
    msg = str(ei.value)
    assert str(store) in msg and "run the same command again" in msg
    assert "No space left on device" in msg or "disk is full" in msg, msg
    assert ei.value.exit_code == 2
    fill["file"].unlink()
    # the lease row could not be deleted while the disk was full (it would expire by itself):
    # with space back, the stopped driver's release goes through
    drv.hold.lease.release()
    again = run_in_process(spec)
    recs = R.load_records(again.study)
    assert recs[0].is_baseline and recs[0].status == "ok"  # recorded before the disk filled
    assert all(r.state != "RUNNING" for r in recs)
    lost = next(r for r in recs if r.number == 1)
    assert lost.status == "interrupted"  # the trial whose record hit the full disk: recovered, re-queued
    rerun = [r for r in recs if r.number > 1 and r.params == lost.params]
    assert rerun and rerun[0].status in ("ok", "failed"), rerun  # ran again after the resume


def test_store_causes_are_recognised():
    import sqlite3

    assert store_cause(OSError(28, "No space left on device", "/s/trials/x")) == "/s/trials/x: No space left on device"
    wrapped = RuntimeError("commit failed")
    wrapped.__cause__ = sqlite3.OperationalError("database or disk is full")
    assert store_cause(wrapped) == "database or disk is full"
    assert store_cause(ValueError("bad value")) is None
    refused = RuntimeError("cannot reach Ray")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    assert store_cause(refused) is None  # a socket, not the store's file


@pytest.fixture
def readonly_workdir(tmp_path):
    work = tmp_path / "store" / "work"
    work.mkdir(parents=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(work)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a read-only tmpfs")
    try:
        yield work
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)


def test_unwritable_work_dir_is_an_infra_error_with_its_message_not_retried(readonly_workdir):
    store = readonly_workdir.parent
    spec = load_spec(compose_cfg(["backend=emulated", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  "sweep.budget.trials=2", "sweep.confirm.top_k=0", "+sweep.circuit_breaker.window=2",
                                  "backend.emulator.time_scale=0.002",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    drv = run_in_process(spec)
    recs = [r for r in R.load_records(drv.study) if r.launched]
    assert recs, R.load_records(drv.study)
    r = recs[0]
    assert r.status == "infra_error" and r.failure_class != "node_lost" and r.phase == "preflight"
    assert "worker cannot write its work dir" in r.failure_signature and "Read-only file system" in r.failure_signature
    assert r.attempts == 1  # not retried on the same node within milliseconds
    assert drv.stop_reason and drv.stop_reason.startswith("circuit breaker")
