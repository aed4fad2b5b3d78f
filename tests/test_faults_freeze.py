"""A freeze mid-stream (the server SIGSTOPped for ~2.5 s) is not accepted as a normal result:
``itl_ms_max`` records the gap, the trial is tagged ``unstable``, the driver re-measures it
once, and a still-unstable trial is kept out of the winner."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from sweeps.run.executor import retry_reason
from sweeps.store import records
from tasks.backends.sglang.knobs import render_launch
from tasks.quality import quality_metrics, unstable_reason
from tasks.trial import run_trial
from tasks.types import BenchSpec, Timeouts, TrialResult, TrialSpec
from tests.test_faults import NCCL, base  # noqa: F401 - base is the module's fixture


def _server(root) -> psutil.Process | None:
    for p in psutil.process_iter(["pid"]):
        try:
            if str(root) in p.environ().get("SERVESWEEP_TRIAL", "") and "tasks.emulator.server" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    return None


def _freeze_mid_stream(root, stop_s: float, done: threading.Event, output_len: int = 128) -> None:
    """Wait until a measured stream (``output_len`` tokens, not the short warm-up) of the trial's
    emulated server is decoding, then SIGSTOP the server for ``stop_s``: the freeze lands between
    two tokens, not before a request's first token (a fixed delay after readiness froze a loaded
    machine's server before its first measured request, and the freeze read as one long TTFT)."""
    t_end = time.monotonic() + 30
    while time.monotonic() < t_end and not done.is_set():
        p = _server(root)
        if p is not None:
            argv = p.cmdline()
            port = argv[argv.index("--port") + 1]
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/emulator/requests", timeout=0.5)
                reqs = got.json().get("requests", []) if got.status_code == 200 else []
                if any(r["output_len"] == output_len and r["emitted"] >= 8 and r["finish_s"] is None for r in reqs):
                    os.kill(p.pid, signal.SIGSTOP)
                    time.sleep(stop_s)
                    os.kill(p.pid, signal.SIGCONT)
                    return
            except (httpx.HTTPError, ValueError):
                pass
        time.sleep(0.02)


@pytest.mark.slow  # ~10 s: one emulated server, a 2.5 s freeze
def test_sigstop_mid_stream_is_tagged_unstable(base, tmp_path):  # noqa: F811
    spec, profile = base
    from sweeps.config.spec import backend_dict

    argv, env, exp = render_launch(NCCL, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    bench = BenchSpec(input_len=16, output_len=128, warmup_requests=1, warmup_output_len=4, repeats=3,
                      request_timeout_s=10.0)
    ts = TrialSpec(sweep="freeze", trial_number=1, params=NCCL, argv=argv, env=env, backend="emulated", gpus=8,
                   bench=bench, timeouts=Timeouts(startup_s=10, health_request_s=1, bench_s=60, term_grace_s=1),
                   expected_paths=exp)
    done = threading.Event()
    th = threading.Thread(target=_freeze_mid_stream, args=(tmp_path, 2.5, done), daemon=True)
    th.start()
    try:
        res = run_trial(ts, profile, str(tmp_path))
    finally:
        done.set()
        th.join(10)
    assert res.status == "ok", (res.failure_class, res.failure_signature)
    assert res.metrics["itl_ms_max"] > 2000, res.metrics  # the freeze is recorded, not hidden by the median
    assert "unstable" in res.perf_tags, res.metrics
    assert retry_reason(res, 1, 1) is not None and retry_reason(res, 2, 1) is None  # re-measured once


def test_quality_metrics_and_thresholds():
    steady = [{"chunk_times": [0.0, 0.011, 0.022, 0.033], "decode_tok_s": 90.0} for _ in range(3)]
    m = quality_metrics(steady)
    assert m["itl_ms_max"] == pytest.approx(11.0) and m["decode_tok_s_cv"] == pytest.approx(0.0)
    assert unstable_reason({**m, "itl_ms_p50": 11.0}) is None
    frozen = steady[:2] + [{"chunk_times": [0.0, 0.011, 60.045], "decode_tok_s": 90.0}]
    m = quality_metrics(frozen)
    assert m["itl_ms_max"] > 60000 and "froze" in unstable_reason({**m, "itl_ms_p50": 11.0})
    spread = steady[:2] + [{"chunk_times": [0.0, 0.011], "decode_tok_s": 11.2}]
    assert "disagree" in unstable_reason({**quality_metrics(spread), "itl_ms_p50": 11.0})


def test_unstable_trials_are_kept_out_of_the_winner():
    def rec(n, v, tags=()):
        return records.TrialRecord(number=n, state="COMPLETE", params={"x": n}, status="ok",
                             metrics={"decode_tok_s": v}, perf_tags=list(tags))

    recs = [rec(0, 80.0), rec(1, 120.0, ["unstable"]), rec(2, 90.0)]
    assert records.best_record(recs).number == 2
    assert [r.number for r in records.ranked_records(recs)] == [2, 0]
    ok = TrialResult(status="ok", perf_tags=[])
    assert retry_reason(ok, 1, 1) is None
