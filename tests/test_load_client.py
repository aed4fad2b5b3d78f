"""The load client (tasks.load_client) and the in-trial load search (tasks.trial_load) against the
real emulated server process on 127.0.0.1; the bench CLI; per-token ITL on an EAGLE stream."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from tasks.backends.sglang.client import record_from_events
from tasks.emulator.testing import baseline_flags, emulated_servers
from tasks.load_client import Target, run_level
from tasks.trial_load import curve_metrics, derived_metrics, run_load
from tasks.types import BenchSpec, LoadSearchSpec, SloSpec, Timeouts, TrialSpec
from tasks.workloads import parse_workload
from tests.test_lifecycle import NCCL, base, leftovers_of  # noqa: F401 - base is a fixture
from tests.test_serving_metrics import sglang_metrics

CLOSED = {"num_requests": 12, "arrival": {"kind": "closed", "concurrency": 4}, "prompt_len": 64, "output_len": 16}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with emulated_servers(tmp_path_factory.mktemp("lc")) as start:
        srv = start(baseline_flags(128))
        srv.wait_healthy()
        yield srv


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_closed_loop_both_apis(server, api):
    m, recs = run_level(Target(server.base_url, api), parse_workload(CLOSED), slos_ms={"ttft": 2000, "tpot": 50})
    assert m["completed"] == 12 and m["failed"] == 0
    assert all(r.n_output == 16 for r in recs)
    assert m["concurrency"] == 4
    # 4 streams at once: each stream's per-token time is the batch's step, tens of ms at most
    assert 1 < m["tpot_ms_p50"] < 100 and 1 < m["itl_ms_p50"] < 100
    assert m["output_throughput_tok_s"] == pytest.approx(12 * 16 / m["duration_s"])
    assert m["goodput_req_s"] == pytest.approx(m["request_throughput_req_s"])  # a loose SLO: all good


def test_open_loop_sends_at_arrival_times(server):
    w = parse_workload({**CLOSED, "num_requests": 8, "arrival": {"kind": "poisson", "rate_req_s": 4.0}})
    m, recs = run_level(Target(server.base_url), w)
    sends = sorted(r.send_s - min(x.send_s for x in recs) for r in recs)
    from tasks.workloads import build_requests

    planned = [r.arrival_s for r in build_requests(w).requests]
    assert sends == pytest.approx(planned, abs=0.05)  # open loop: sent on schedule, not when one finishes
    assert m["offered_rate_req_s"] == 4.0 and m["completed"] == 8


def test_concurrency_levels_are_keyed_by_concurrency(server):
    bench = BenchSpec(workload={**CLOSED, "num_requests": 8}, concurrency_levels=(1, 4))
    m, arts = run_load(server.base_url, "sglang", bench)
    assert {"output_tok_s_c1", "output_tok_s_c4", "tpot_ms_p50_c4", "ttft_ms_p50_c1"} <= set(m)
    assert m["output_tok_s_c4"] > 1.5 * m["output_tok_s_c1"]  # 4 streams batch: more tokens per second
    assert [lv["concurrency"] for lv in arts[0]["levels"]] == [1, 4]


def test_deadline_bounds_a_level(server):
    w = parse_workload({**CLOSED, "num_requests": 6, "output_len": 400, "arrival": {"kind": "closed", "concurrency": 1}})
    t0 = time.monotonic()
    m, recs = run_level(Target(server.base_url), w, deadline_s=1.0)
    assert time.monotonic() - t0 < 3.0
    assert m["failed"] >= 5 and any("deadline" in r.error for r in recs)


def test_bench_itl_is_per_token_as_bench_serving(tmp_path):
    """The project's ITL on an EAGLE stream (3-4 tokens per chunk) equals bench_serving's
    adjust_itl: by hand here, and through SGLang 0.5.23's own client in the contract env."""
    t, events, cum = 0.05, [], 0
    for k in (1, 3, 4, 2, 3, 4, 3):
        cum += k
        events.append((t, {"meta_info": {"completion_tokens": cum, "spec_verify_ct": len(events) + 1}}))
        t += 0.0307
    rec = record_from_events(0.0, events)
    assert rec.itl_ms == pytest.approx([30.7 / k for k in (3, 4, 2, 3, 4, 3) for _ in range(k)])
    theirs = sglang_metrics([rec.to_serving(prompt_len=16)], 1.0, {"ttft": 1000.0}, tmp_path)
    assert [x * 1e3 for x in theirs["itls"][0]] == pytest.approx(rec.itl_ms, rel=1e-9)


def test_derived_and_curve_metrics():
    d = derived_metrics({"output_tok_s": 1000.0, "tpot_ms_p50": 20.0}, gpus=8, gpu_hour_usd=2.0)
    assert d["output_tok_s_per_gpu"] == 125.0 and d["tok_s_per_user"] == 50.0
    assert d["cost_usd_per_mtok"] == pytest.approx(2.0 * 8 / 3600 / 1000 * 1e6)
    assert "cost_usd_per_mtok" not in derived_metrics({"output_tok_s": 10.0}, 1)
    c = curve_metrics({"levels": [{"rate_req_s": 1.0, "met": True, "metrics": {"ttft_ms_p99": 5.0}},
                                  {"rate_req_s": 2.0, "met": False, "metrics": {"ttft_ms_p99": math.inf}}]})
    assert c["load_rate_req_s_L1"] == 2.0 and c["load_met_L0"] == 1.0 and c["load_ttft_ms_p99_L0"] == 5.0


CHAT = {"num_requests": 10, "arrival": {"kind": "poisson", "rate_req_s": 1.0},
        "dataset": {"format": "jsonl", "path": "conf/bench/traces/chat_prompts_sample.jsonl"},
        "output_len": {"kind": "fixed", "value": 12}}


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_load_search_in_an_emulated_server_trial(base, tmp_path):  # noqa: F811
    from sweeps.config.spec import backend_dict
    from tasks.backends.sglang.knobs import render_launch
    from tasks.trial import run_trial

    spec, profile = base
    argv, renv, exp = render_launch(NCCL, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    bench = BenchSpec(input_len=16, output_len=8, warmup_requests=0, repeats=1, request_timeout_s=10,
                      workload=CHAT, slo=SloSpec(ttft_ms_p99=2000, tpot_ms_p99=50),
                      load_search=LoadSearchSpec(rate_lo=1.0, rate_hi=40.0, max_levels=3, rel_tol=0.05))
    # bench_s: room for 3 levels on a loaded machine (a level past the budget sends nothing and ends the search)
    ts = TrialSpec(sweep="load", trial_number=1, params=NCCL, argv=argv, env=renv, backend="emulated", gpus=8,
                   bench=bench, timeouts=Timeouts(startup_s=20, health_request_s=2, bench_s=150, term_grace_s=2),
                   expected_paths=exp)
    res = run_trial(ts, profile, str(tmp_path))
    assert res.status == "ok", (res.failure_class, res.log_tail)
    m = res.metrics
    # 3 levels rarely close 1..40 req/s to 5 %: then only the bounds are logged (censored)
    rate = m.get("max_rate_at_slo_req_s", m.get("max_rate_at_slo_req_s_upper"))
    assert m["load_levels"] == 3 and rate is not None and 1.0 <= rate <= 40.0
    assert ("max_rate_at_slo_req_s" in m) != bool(m.get("max_rate_at_slo_req_s_censored"))
    for k in ("goodput_req_s", "ttft_ms_p99", "tpot_ms_p99", "slo_failed_at_req_s", "decode_tok_s"):
        assert k in m, k
    curve = next(r["load"] for r in res.bench if "load" in r)["levels"]
    assert len(curve) == 3 and [lv["rate_req_s"] for lv in curve] == sorted(lv["rate_req_s"] for lv in curve)
    assert m["load_rate_req_s_L0"] == curve[0]["rate_req_s"]
    assert leftovers_of(tmp_path) == []


def test_bench_cli_prints_json(server):
    out = subprocess.run([sys.executable, "-m", "tasks.backends.sglang.client", "--url", server.base_url, "--api", "openai",
                          "--concurrency", "2", "--num-requests", "4", "--input-len", "32", "--output-len", "8",
                          "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50"],
                         capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(out.stdout)
    assert doc["metrics"]["completed"] == 4 and doc["metrics"]["concurrency"] == 2
    assert "goodput_req_s" in doc["metrics"]


def test_bench_cli_load_search(server):
    out = subprocess.run([sys.executable, "-m", "tasks.backends.sglang.client", "--url", server.base_url, "--request-rate", "1",
                          "--num-requests", "8", "--input-len", "64", "--output-len", "8", "--slo-ttft-ms", "2000",
                          "--slo-tpot-ms", "50", "--load-search", "--rate-lo", "2", "--rate-hi", "32", "--max-levels", "2"],
                         capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(out.stdout)
    assert doc["metrics"]["load_levels"] == 2 and len(doc["levels"]) == 2
    m = doc["metrics"]  # 2 levels: the rate, or (not narrowed) its censored bounds, each a measured level
    rates = {lv["rate_req_s"] for lv in doc["levels"]}
    assert {m[k] for k in ("max_rate_at_slo_req_s", "max_rate_at_slo_req_s_upper", "max_rate_at_slo_req_s_lower")
            if k in m} <= rates and ("max_rate_at_slo_req_s" in m or m["max_rate_at_slo_req_s_censored"] == 1.0)
    bad = subprocess.run([sys.executable, "-m", "tasks.backends.sglang.client", "--url", server.base_url, "--load-search"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--slo-ttft-ms" in bad.stderr
