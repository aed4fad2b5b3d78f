"""A full store (a 4 MB tmpfs filled up mid-sweep) stops the sweep gracefully: a clear
error naming the store and the cause (no traceback, exit code 2), trials recorded so far
kept, and the same command resumes once space is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.app.inprocess import InProcessDriver, run_in_process
from sweeps.app.lifecycle import execute
from sweeps.config.spec import load_spec
from sweeps.errors import exit_code
from sweeps.run.graceful import store_cause
from sweeps.run.stores import StoreError
from sweeps.store import records
from tests.conftest import compose_cfg
from tests.procs import small_tmpfs_at


@pytest.fixture
def small_tmpfs(tmp_path):
    with small_tmpfs_at(tmp_path / "mnt", "4m") as mnt:
        yield mnt


def _fill(d: Path) -> Path:
    """Fill the file system of ``d`` with ``d/filler`` until a write fails (ENOSPC); returns
    the filler's path, which may not exist: a sweep's own writes can fill a small tmpfs before
    the filler's first byte (then even creating it fails), and the disk is full either way."""
    filler = d / "filler"
    try:
        with open(filler, "wb") as f:
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
    assert exit_code(ei.value) == 2
    fill["file"].unlink(missing_ok=True)
    # the lease row could not be deleted while the disk was full (it would expire by itself):
    # with space back, the stopped driver's release goes through
    drv.hold.lease.release()
    again = run_in_process(spec)
    recs = records.load_records(again.study)
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
    with small_tmpfs_at(tmp_path / "store" / "work", "1m", read_only=True) as work:
        yield work


def test_unwritable_work_dir_is_an_infra_error_with_its_message_not_retried(readonly_workdir):
    store = readonly_workdir.parent
    spec = load_spec(compose_cfg(["backend=emulated", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  "sweep.budget.trials=2", "sweep.confirm.top_k=0", "+sweep.circuit_breaker.window=2",
                                  "backend.emulator.time_scale=0.002",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    drv = run_in_process(spec)
    recs = [r for r in records.load_records(drv.study) if r.launched]
    assert recs, records.load_records(drv.study)
    r = recs[0]
    assert r.status == "infra_error" and r.failure_class != "node_lost" and r.phase == "preflight"
    assert "worker cannot write its work dir" in r.failure_signature and "Read-only file system" in r.failure_signature
    assert r.attempts == 1  # not retried on the same node within milliseconds
    assert drv.stop_reason and drv.stop_reason.startswith("circuit breaker")
