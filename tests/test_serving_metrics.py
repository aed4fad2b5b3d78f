"""tasks.serving_metrics: hand-computed cases, and SGLang 0.5.23's own benchmark code on the
same streams (contract venv, in a subprocess): same inputs -> same numbers."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tasks.serving_metrics import RequestRecord, goodput, percentile, summarize, validate_slos

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".contract-venv" / "bin" / "python"


def rec(send, chunks, prompt_len=10, end=None, ok=True, output_len=None):
    return RequestRecord(
        send_s=send, chunk_times_s=[c[0] for c in chunks], chunk_tokens=[c[1] for c in chunks],
        prompt_len=prompt_len, end_s=end, ok=ok, output_len=output_len,
    )


def test_single_request_by_hand():
    # sent at 1.0, first token at 1.1, then 1 token every 20 ms (4 more), stream ends at 1.19
    r = rec(1.0, [(1.1, 1), (1.12, 1), (1.14, 1), (1.16, 1), (1.18, 1)], end=1.19)
    assert r.ttft_s == pytest.approx(0.1)
    assert r.e2e_s == pytest.approx(0.19)
    assert r.tpot_s == pytest.approx(0.09 / 4)
    assert r.itls_s() == pytest.approx([0.02] * 4)
    m = summarize([r], duration_s=2.0)
    assert m["completed"] == 1 and m["failed"] == 0
    assert m["ttft_ms_p50"] == pytest.approx(100.0)
    assert m["tpot_ms_mean"] == pytest.approx(22.5)
    assert m["itl_ms_p99"] == pytest.approx(20.0)
    assert m["e2e_latency_ms_mean"] == pytest.approx(190.0)
    assert m["output_throughput_tok_s"] == pytest.approx(2.5)
    assert m["input_throughput_tok_s"] == pytest.approx(5.0)
    assert m["request_throughput_req_s"] == pytest.approx(0.5)


def test_eagle_chunks_itl_is_gap_over_tokens_repeated():
    # first chunk 1 token; then chunks of 3, 2, 4 tokens after gaps of 30, 30, 40 ms
    r = rec(0.0, [(0.05, 1), (0.08, 3), (0.11, 2), (0.15, 4)])
    assert r.n_output == 10
    assert r.itls_s() == pytest.approx([0.01] * 3 + [0.015] * 2 + [0.01] * 4)
    # TPOT uses output_len - 1 = 9 tokens over e2e - ttft = 0.10
    assert r.tpot_s == pytest.approx(0.1 / 9)


def test_zero_token_chunk_neither_counts_nor_restarts_the_gap():
    r = rec(0.0, [(0.05, 1), (0.07, 0), (0.09, 2)])
    assert r.itls_s() == pytest.approx([0.02, 0.02])  # gap measured from 0.05, not 0.07


def test_first_chunk_with_several_tokens_adds_no_itl():
    r = rec(0.0, [(0.05, 3), (0.06, 1)])
    assert r.itls_s() == pytest.approx([0.01])
    assert r.tpot_s == pytest.approx(0.01 / 3)


def test_single_token_response_has_no_tpot_but_goodput_counts_it_as_zero():
    r = rec(0.0, [(0.5, 1)])
    assert r.tpot_s is None
    m = summarize([r], duration_s=1.0, slos_ms={"tpot": 1.0})
    assert m["tpot_ms_p99"] == 0.0  # SGLang's `tpots or 0`
    assert m["goodput_req_s"] == 1.0


def test_from_cumulative_counts_new_tokens_per_chunk():
    r = RequestRecord.from_cumulative(0.0, [0.1, 0.13, 0.16, 0.19], [1, 4, 4, 6], prompt_len=3, end_s=0.2)
    assert list(r.chunk_tokens) == [1, 3, 0, 2]
    assert r.n_output == 6
    assert r.itls_s() == pytest.approx([0.01] * 3 + [0.03] * 2)  # the 0-token chunk restarts nothing
    with pytest.raises(ValueError, match="decrease"):
        RequestRecord.from_cumulative(0.0, [0.1, 0.2], [3, 2], prompt_len=1)


def test_percentile_is_numpy_linear():
    vals = [1.0, 2.0, 3.0, 10.0]
    assert percentile(vals, 99) == pytest.approx(3.0 + 0.97 * 7.0)
    assert percentile(vals, 50) == pytest.approx(2.5)
    assert percentile([], 99) == 0.0


def test_failed_requests_count_in_attainment_not_throughput():
    good = rec(0.0, [(0.1, 1), (0.2, 1)])
    slow = rec(0.0, [(3.0, 1), (3.1, 1)])
    bad = RequestRecord(send_s=0.0, chunk_times_s=[], chunk_tokens=[], prompt_len=10, ok=False, error="500")
    m = summarize([good, slow, bad], duration_s=4.0, slos_ms={"ttft": 1000, "e2el": 5000})
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["output_throughput_tok_s"] == pytest.approx(4 / 4.0)
    assert m["goodput_req_s"] == pytest.approx(1 / 4.0)
    assert m["slo_attainment"] == pytest.approx(1 / 3)
    assert m["slo_attainment_e2el"] == pytest.approx(2 / 3)
    assert m["slo_attainment_ttft"] == pytest.approx(1 / 3)


def test_default_duration_is_first_send_to_last_end():
    a = rec(1.0, [(1.5, 1)], end=2.0)
    b = rec(1.5, [(2.5, 1)], end=3.0)
    assert summarize([a, b])["duration_s"] == pytest.approx(2.0)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="chunk_tokens"):
        RequestRecord(send_s=0, chunk_times_s=[1.0], chunk_tokens=[], prompt_len=1)
    with pytest.raises(ValueError, match="'ttfb'"):
        validate_slos({"ttfb": 10})
    with pytest.raises(ValueError, match="'tpot'"):
        validate_slos({"tpot": -1})
    with pytest.raises(ValueError, match="duration_s"):
        goodput([rec(0, [(1, 1)])], {"ttft": 1}, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def random_records(seed: int, n: int = 40, eagle: bool = True) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        send = float(rng.uniform(0, 5))
        t = send + float(rng.uniform(0.02, 1.5))
        chunks = [(t, 1)]
        want = int(rng.integers(1, 40))
        got = 1
        while got < want:
            k = int(min(rng.integers(2, 5) if eagle else 1, want - got))
            t += float(rng.uniform(0.005, 0.05))
            chunks.append((t, k))
            got += k
        ok = i % 13 != 5
        out.append(rec(send, chunks, prompt_len=int(rng.integers(16, 4000)), end=t + 0.001, ok=ok))
    return out


def simulated_eagle() -> list[RequestRecord]:
    """Streams of the emulator's batching model with EAGLE (accept lengths 1-4), 8 at once."""
    from tasks.emulator.batch_sim import simulate
    from tasks.emulator.scheduler import AcceptModel, SchedulerConfig

    res = simulate([(0.1 * i, 64 + 50 * i, 30) for i in range(12)], SchedulerConfig(8, 100_000),
                   lambda b, p: 0.01 + 0.001 * b + 1e-5 * p, max_concurrency=8,
                   accept=AcceptModel((1, 2, 3, 4), (0.1, 0.3, 0.3, 0.3), seed=2))
    return res.records()


# --- SGLang's own code on the same streams -------------------------------------------------

SGLANG_SIDE = textwrap.dedent('''
    """Feed recorded streams through SGLang 0.5.23's own client + metric code (no network).

    The streamed lines reach async_request_sglang_generate through a fake aiohttp session;
    the module's clock is a virtual one that the fake stream sets to each line's arrival time.
    """
    import asyncio, importlib, json, sys, types
    import sglang  # before the stubs: its transformers patches are a no-op without transformers

    def stub(name, **attrs):
        m = types.ModuleType(name); m.__path__ = []
        m.__getattr__ = lambda a: (_ for _ in ()).throw(AttributeError(a)) if a.startswith("__") else type(a, (), {})
        m.__dict__.update(attrs); sys.modules[name] = m

    stub("sglang.srt.disaggregation.utils", FAKE_BOOTSTRAP_HOST="")  # pulls model configs; not used here
    for _ in range(10):
        try:
            S = importlib.import_module("sglang.benchmark.serving"); break
        except ModuleNotFoundError as e:  # transformers, datasets: imported, unused on this path
            stub(e.name)
    from sglang.benchmark.goodput import calculate_goodput
    from sglang.benchmark.datasets.common import DatasetRow

    class Clock:
        t = 0.0
        def perf_counter(self): return self.t
    clock = Clock()
    S.time = clock

    class Content:
        def __init__(self, lines): self.lines = lines
        def __aiter__(self): return self._gen()
        async def _gen(self):
            for t, line in self.lines:
                clock.t = t
                yield line

    class Resp:
        def __init__(self, status, lines): self.status, self.content, self.reason = status, Content(lines), "err"
        async def text(self): return "failed"
        async def __aenter__(self): return self
        async def __aexit__(self, *a): return False

    class Session:
        def __init__(self, resp): self.resp = resp
        async def __aenter__(self): return self
        async def __aexit__(self, *a): return False
        def post(self, url, json=None, headers=None): return self.resp

    S.args = types.SimpleNamespace(temperature=0.0, disable_ignore_eos=False, top_p=1.0, disable_stream=False,
        return_logprob=False, return_routed_experts=False, logprob_start_len=-1, top_logprobs_num=0,
        token_ids_logprob=None, cache_report=False, header=None)

    job = json.load(sys.stdin)
    outputs, rows = [], []
    for r in job["records"]:
        lines, cum = [], 0
        for t, n in zip(r["chunk_times_s"], r["chunk_tokens"]):
            cum += n
            lines.append((t, b"data: " + json.dumps({"text": "x" * cum, "meta_info": {"completion_tokens": cum}}).encode()))
        lines.append((r["end_s"] if r["end_s"] is not None else r["chunk_times_s"][-1], b"data: [DONE]"))
        S._create_bench_client_session = lambda resp=Resp(200 if r["ok"] else 500, lines): Session(resp)
        clock.t = r["send_s"]
        inp = S.RequestFuncInput(prompt="p", api_url="http://127.0.0.1:1/generate", prompt_len=r["prompt_len"],
            output_len=64, model="m", lora_name=None, image_data=None, extra_request_body={})
        outputs.append(asyncio.run(S.async_request_sglang_generate(inp)))
        rows.append(DatasetRow(prompt="p", prompt_len=r["prompt_len"], output_len=64))

    tok = types.SimpleNamespace(encode=lambda text, add_special_tokens=False: [])
    metrics, _ = S.calculate_metrics(rows, outputs, job["dur_s"], tok, "sglang")
    g = calculate_goodput(outputs, job["slos"], job["dur_s"])
    print(json.dumps({"metrics": {k: float(v) for k, v in vars(metrics).items()},
                      "itls": [o.itl for o in outputs], "success": [o.success for o in outputs],
                      "goodput": g.request_goodput, "attainment": g.slo_attainment,
                      "by_metric": g.slo_attainment_by_metric}))
''')


def _unavailable(reason: str) -> None:
    msg = f"CONTRACT CHECK NOT RUN: {reason}. Build it with scripts/contract_env.sh"
    if os.environ.get("CI") == "true":
        pytest.fail(msg + " (CI=true: a skipped contract test is a failure)")
    pytest.skip(msg)


def sglang_metrics(records: list[RequestRecord], dur_s: float, slos: dict, tmp_path: Path) -> dict:
    if not VENV_PY.exists():
        _unavailable(f"{VENV_PY} is missing")
    script = tmp_path / "sglang_side.py"
    script.write_text(SGLANG_SIDE)
    job = {"dur_s": dur_s, "slos": slos, "records": [
        {"send_s": r.send_s, "chunk_times_s": [float(x) for x in r.chunk_times_s],
         "chunk_tokens": [int(n) for n in r.chunk_tokens],
         "end_s": r.end_s, "ok": r.ok, "prompt_len": r.prompt_len} for r in records]}
    proc = subprocess.run([str(VENV_PY), str(script)], input=json.dumps(job), capture_output=True, text=True,
                          timeout=240, check=False)
    if proc.returncode != 0 and "No module named 'sglang'" in proc.stderr:
        _unavailable("the contract venv has no SGLang")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# our key -> SGLang BenchmarkMetrics field
PAIRS = {
    "completed": "completed", "request_throughput_req_s": "request_throughput",
    "input_throughput_tok_s": "input_throughput", "output_throughput_tok_s": "output_throughput",
    "total_throughput_tok_s": "total_throughput",
    **{f"{ours}_ms_{s}": f"{stat}_{theirs}_ms" for ours, theirs in
       (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e_latency", "e2e_latency"))
       for s, stat in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))},
}


@pytest.mark.contract
def test_same_numbers_as_sglang_benchmark(tmp_path):
    """EAGLE-like streams (chunks of 2-4 tokens), failures included: every metric, the
    per-token ITLs and goodput equal SGLang 0.5.23's, from its own client and metric code."""
    records = random_records(seed=7, eagle=True) + random_records(seed=8, n=20, eagle=False) + simulated_eagle()
    slos = {"ttft": 800.0, "tpot": 12.0, "e2el": 1500.0}
    dur = 6.5
    theirs = sglang_metrics(records, dur, slos, tmp_path)
    ours = summarize(records, duration_s=dur, slos_ms=slos)
    for ok_key, sg_key in PAIRS.items():
        assert ours[ok_key] == pytest.approx(theirs["metrics"][sg_key], rel=1e-9, abs=1e-9), ok_key
    assert theirs["success"] == [r.ok for r in records]
    for r, itl in zip(records, theirs["itls"]):
        if r.ok:
            assert r.itls_s() == pytest.approx(itl, rel=1e-9, abs=1e-12)
    assert any(len(set(np.round(itl, 12))) < len(itl) for itl in theirs["itls"])  # repeated per-token values seen
    assert ours["goodput_req_s"] == pytest.approx(theirs["goodput"], rel=1e-12)
    assert ours["slo_attainment"] == pytest.approx(theirs["attainment"], rel=1e-12)
    for k, v in theirs["by_metric"].items():
        assert ours[f"slo_attainment_{k}"] == pytest.approx(v, rel=1e-12)
    assert 0 < ours["goodput_req_s"] < ours["request_throughput_req_s"]  # the SLOs bite on some, not all
