"""Readiness serves a real generation: one 503 right after green health is not a failure.

The emulated server's ``http_503_once`` fault answers the first ``/generate`` after its
health check went green with HTTP 503. The lifecycle's readiness check (health green AND
one generation served, retried with backoff within the startup deadline) absorbs it: the
trial is ok, its warm-up has its own timing, and nothing becomes a rule. Without that
check the 503 reaches the benchmark: its own transient class ``server_http_error`` (not
``bench_stall``), retried once by the driver, never a rule, never a dead end.
"""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

import tasks.backends.lifecycle as lifecycle
from sweeps.app.inprocess import run_in_process
from sweeps.config.spec import load_spec
from sweeps.store import records
from tests.conftest import compose_cfg
from tests.procs import trial_processes
from tests.test_faults import _run, base  # noqa: F401 - base is the module's fixture

pytestmark = pytest.mark.slow  # ~30 s: real emulated server launches


def test_one_503_after_green_health_is_absorbed_by_readiness(base, tmp_path):  # noqa: F811
    res, _, w = _run(base, tmp_path, "http_503_once")
    assert res.status == "ok", (res.failure_class, res.failure_signature, res.log_tail[-1500:])
    assert res.failure_class is None and res.metrics["decode_tok_s"] > 0
    assert res.warmup_s > 0 and res.timings()["warmup_s"] == res.warmup_s
    assert w.survivors() == []


def test_a_503_in_the_benchmark_is_server_http_error_not_a_stall(base, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(lifecycle, "ensure_serving", lambda *a, **k: 0.0)  # health green = ready (the old check)
    res, _, w = _run(base, tmp_path, "http_503_once")
    assert res.status == "failed" and res.failure_class == "server_http_error", (res.failure_class,
                                                                                 res.failure_signature)
    assert res.failure_kind == "transient" and res.phase == "bench"
    assert w.survivors() == []


def _sweep(store):
    return load_spec(compose_cfg([
        "backend=emulated", "sweep=smoke", "sweep.budget.wall_time_s=null", "sweep.budget.trials=2",
        "sweep.confirm.top_k=0", "+backend.emulator.fault=http_503_once", "backend.emulator.time_scale=0.002",
        "bench.output_len=32", "bench.repeats=2", "bench.warmup_output_len=4",
        f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))


def test_sweep_with_a_503_after_health_keeps_the_baseline_ok_and_learns_no_rule(tmp_path):
    spec = _sweep(tmp_path / "s")
    drv = run_in_process(spec)
    recs = [r for r in records.load_records(drv.study) if r.launched]
    assert len(recs) == 2 and all(r.status == "ok" and r.attempts == 1 for r in recs), recs
    assert any(r.is_baseline for r in recs)
    assert all(r.timings.get("warmup_s", 0) > 0 for r in recs if r.timings.get("bench_s"))  # a probe has no bench
    assert next(r for r in recs if r.is_baseline).timings["warmup_s"] > 0
    assert drv.rules.list() == []
    assert trial_processes(spec.store_dir) == []


def test_server_http_error_is_retried_once_and_never_a_dead_end(tmp_path, monkeypatch):
    monkeypatch.setattr(lifecycle, "ensure_serving", lambda *a, **k: 0.0)
    spec = _sweep(tmp_path / "s")
    drv = run_in_process(spec)
    recs = [r for r in records.load_records(drv.study) if r.launched]
    b0 = next(r for r in recs if r.is_baseline)
    assert b0.failure_class == "server_http_error" and b0.attempts == 2 and b0.phase == "bench", b0
    # never mistaken for bench_stall (a level whose probe showed a silent fallback is the perf class)
    assert {r.failure_class for r in recs} <= {"server_http_error", "allreduce_path_degraded", None}
    assert drv.rules.list() == []  # transient: never a rule
    # told FAIL (not PRUNED/infeasible): the sampler and the duplicate gate may propose it again
    assert b0.state == TrialState.FAIL.name
    assert trial_processes(spec.store_dir) == []
