"""tasks.emulator.scheduler (+ batch_sim): continuous batching with an affine step-time model."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.emulator.batch_sim import level_metrics, saturation_rate_req_s, simulate
from tasks.emulator.scheduler import AcceptModel, BatchScheduler, SchedulerConfig
from tasks.serving_metrics import summarize

A, B_PER_REQ, C_PER_TOK = 0.008, 0.0005, 2e-5  # s, s per decoding request, s per prefill token


def step(b: int, p: int) -> float:
    return A + B_PER_REQ * b + C_PER_TOK * p


CFG = SchedulerConfig(max_running_requests=64, max_total_tokens=1_000_000, chunked_prefill_size=8192)


def test_ttft_grows_with_prompt_length():
    short = simulate([(0.0, 128, 8)], CFG, step).records()[0].ttft_s
    long = simulate([(0.0, 32768, 8)], CFG, step).records()[0].ttft_s
    assert short == pytest.approx(step(0, 128))
    assert long == pytest.approx(4 * step(0, 8192))  # four chunks of 8192
    assert long >= 5 * short


def test_ttft_grows_with_load():
    alone = simulate([(0.0, 2048, 16)], CFG, step).records()[0].ttft_s
    crowd = summarize(simulate([(0.0, 2048, 16)] * 32, CFG, step).records())
    assert crowd["ttft_ms_p99"] > 5 * alone * 1e3  # 32 prompts share 8192-token prefill steps


def test_itl_at_16_streams_is_the_batch_step_time():
    res = simulate([(0.0, 128, 64)] * 16, CFG, step, max_concurrency=16)
    for r in res.records():
        itl = np.median(r.itls_s())
        assert itl == pytest.approx(step(16, 0))
        assert itl > 1.5 * step(1, 0)


def test_a_stream_slows_down_when_others_join():
    reqs = [(0.0, 128, 200)] + [(0.5, 128, 50)] * 15
    r0 = simulate(reqs, CFG, step).records()[0]
    itl = r0.itls_s()
    assert itl[:10] == pytest.approx([step(1, 0)] * 10)
    assert max(itl) >= step(16, 0) - 1e-12  # the shared steps of the crowd


def test_queueing_at_max_running_requests():
    cfg = SchedulerConfig(max_running_requests=4, max_total_tokens=1_000_000)
    seen = []
    sch = BatchScheduler(cfg, lambda b, p: seen.append(b) or step(b, p))
    ids = [sch.submit(128, 32, 0.0) for _ in range(8)]
    sch.advance(0.0)
    assert [sch.state(i) for i in ids].count("waiting") == 4
    sch.advance(float("inf"))
    assert max(seen) == 4
    ttft = sorted(sch.chunks(i)[0][0] for i in ids)
    assert ttft[4] > sch.chunks(ids[0])[0][-1] - 1e-12  # the fifth starts after one of the first four ends
    assert all(sch.state(i) == "done" for i in ids)


def test_kv_full_preempts_and_still_completes():
    # 4 requests of 100 prompt tokens; a pool of 700 tokens cannot hold 4 x (100 + 100)
    cfg = SchedulerConfig(max_running_requests=8, max_total_tokens=700, chunked_prefill_size=8192, new_token_ratio=0.0)
    res = simulate([(0.0, 100, 100)] * 4, cfg, step)
    sch = res.scheduler
    assert sum(r.preemptions for r in sch.reqs) >= 1
    assert all(r.state == "done" and r.emitted == 100 for r in sch.reqs)
    assert sch.kv_used == 0
    recs = res.records()
    victim = max(sch.reqs, key=lambda r: r.preemptions)
    assert recs[victim.rid].n_output == 100
    assert max(recs[victim.rid].itls_s()) > 3 * step(4, 0)  # the pause while it was out


def test_admission_reserves_output_so_ignore_eos_never_preempts():
    cfg = SchedulerConfig(max_running_requests=8, max_total_tokens=700, new_token_ratio=1.0)
    res = simulate([(0.0, 100, 100)] * 4, cfg, step)
    assert sum(r.preemptions for r in res.scheduler.reqs) == 0
    assert all(r.state == "done" for r in res.scheduler.reqs) and res.scheduler.kv_used == 0
    first = sorted(r.ttft_s for r in res.records())
    assert first[3] > first[2]  # the fourth waited for KV


def test_abort_frees_the_slot():
    cfg = SchedulerConfig(max_running_requests=1, max_total_tokens=1_000_000)
    res = simulate([(0.0, 128, 10_000), (0.0, 128, 10)], cfg, step, abort_after_s={0: 0.5})
    a, b = res.records()
    assert not a.ok and a.error == "client disconnected"
    assert res.scheduler.reqs[0].emitted < 10_000
    assert 0.5 <= b.ttft_s + b.send_s <= 0.5 + 2 * step(1, 128)
    assert b.ok and b.n_output == 10


def test_closed_loop_sends_when_a_slot_frees():
    res = simulate([(0.0, 128, 20)] * 4, CFG, step, max_concurrency=2)
    recs = res.records()
    ends = sorted(r.send_s + r.e2e_s for r in recs[:2])
    assert [r.send_s for r in recs[:2]] == [0.0, 0.0]
    assert sorted(r.send_s for r in recs[2:]) == pytest.approx(ends)


def test_eagle_tokens_per_step_are_the_accept_lengths():
    acc = AcceptModel(values=(3, 1, 4, 2))
    res = simulate([(0.0, 128, 41)], CFG, step, accept=acc)
    _, counts = res.scheduler.chunks(0)
    assert list(counts[:9]) == [1, 3, 1, 4, 2, 3, 1, 4, 2]  # first token from prefill, then the cycle
    assert counts.sum() == 41
    r = res.records()[0]
    gaps = np.diff(res.scheduler.chunks(0)[0])
    assert r.itls_s()[:3] == pytest.approx([gaps[0] / 3] * 3)


def test_eagle_sampled_accepts_are_seeded_and_mean_matches():
    acc = AcceptModel(values=(1, 2, 3, 4), probs=(0.1, 0.2, 0.3, 0.4), seed=5)
    one = simulate([(0.0, 64, 2000)] * 4, CFG, step, accept=acc)
    two = simulate([(0.0, 64, 2000)] * 4, CFG, step, accept=acc)
    c1, c2 = one.scheduler.chunks(2)[1], two.scheduler.chunks(2)[1]
    assert np.array_equal(c1, c2)
    assert c1[1:-1].mean() == pytest.approx(3.0, abs=0.1)


def test_mixed_chunk_decodes_during_prefill_and_default_pauses():
    reqs = [(0.0, 128, 100), (0.3, 16384, 4)]
    plain = simulate(reqs, CFG, step).records()[0]
    mixed_cfg = SchedulerConfig(max_running_requests=64, max_total_tokens=1_000_000, mixed_chunk=True)
    mixed = simulate(reqs, mixed_cfg, step).records()[0]
    # SGLang's default: both 8192-token chunks pause decoding, then the long one joins the batch
    assert max(plain.itls_s()) == pytest.approx(2 * step(0, 8192) + step(2, 0))
    assert max(mixed.itls_s()) == pytest.approx(step(1, 8192))


def test_request_larger_than_the_kv_pool_is_rejected():
    cfg = SchedulerConfig(max_running_requests=4, max_total_tokens=1000)
    res = simulate([(0.0, 900, 200), (0.0, 100, 10)], cfg, step)
    bad, good = res.records()
    assert not bad.ok and "KV pool" in bad.error
    assert good.ok


def test_advancing_in_small_increments_matches_one_run():
    rng = np.random.default_rng(3)
    reqs = [(float(t), int(p), int(o)) for t, p, o in
            zip(np.cumsum(rng.exponential(0.05, 60)), rng.integers(16, 3000, 60), rng.integers(1, 80, 60))]
    whole = simulate(reqs, CFG, step).records()
    sch = BatchScheduler(CFG, step)
    for t, p, o in reqs:
        sch.advance(t)  # the server's view: only arrivals up to now are known
        sch.submit(p, o, t)
    sch.advance(float("inf"))
    for i, r in enumerate(whole):
        ts, ns = sch.chunks(i)
        assert np.allclose(ts, r.chunk_times_s) and np.array_equal(ns, r.chunk_tokens)


def test_bad_config_and_requests_are_named():
    with pytest.raises(ValueError, match="max_running_requests"):
        SchedulerConfig(max_running_requests=0, max_total_tokens=10)
    with pytest.raises(ValueError, match="max_total_tokens"):
        SchedulerConfig(max_running_requests=1, max_total_tokens=0)
    with pytest.raises(ValueError, match="values"):
        AcceptModel(values=(0, 2))
    with pytest.raises(ValueError, match="probs"):
        AcceptModel(values=(1, 2), probs=(0.5,))
    with pytest.raises(ValueError, match="output_len"):
        BatchScheduler(CFG, step).submit(10, 0, 0.0)
    with pytest.raises(ValueError, match="max_concurrency"):
        simulate([(0.0, 1, 1)], CFG, step, max_concurrency=0)


def test_level_metrics_of_a_closed_loop_plan():
    from tasks.workloads import build_requests, parse_workload

    plan = build_requests(parse_workload({"num_requests": 32, "arrival": {"kind": "closed", "concurrency": 16},
                                          "prompt_len": 128, "output_len": 64}))
    m = level_metrics(plan.requests, CFG, step, max_concurrency=plan.max_concurrency, slos_ms={"tpot": 1000})
    assert m["completed"] == 32 and m["goodput_req_s"] == pytest.approx(m["request_throughput_req_s"])
    assert m["itl_ms_p50"] == pytest.approx(step(16, 0) * 1e3)
    # closed loop of 16 x 64 tokens: output throughput ~ 16 streams / step time, less the prefill pauses
    assert 0.8 * 16 / step(16, 0) < m["output_throughput_tok_s"] < 16 / step(16, 0)


def test_server_style_streaming_with_a_disconnect():
    """Real-time use: submit on arrival, advance to 'now' on a tick, stream new chunks, abort."""
    sch = BatchScheduler(SchedulerConfig(max_running_requests=2, max_total_tokens=100_000), step)
    a = sch.submit(128, 500, 0.0)
    b = sch.submit(128, 20, 0.0)
    c = sch.submit(128, 20, 0.05)  # waits for a slot
    seen = {a: [], b: [], c: []}
    now = 0.0
    while now < 2.0:
        if abs(now - 0.3) < 1e-9:
            sch.abort(a, now)
        sch.advance(now)
        for rid in seen:
            new, _ = sch.stream(rid, len(seen[rid]))
            assert all(t <= now + step(2, 256) + 1e-9 for t, _ in new)  # never more than a step ahead
            seen[rid] += new
        now = round(now + 0.01, 10)
    assert sch.stream(a, 0)[1] and sch.state(a) == "aborted" and sum(n for _, n in seen[a]) < 500
    assert sum(n for _, n in seen[b]) == 20 and sum(n for _, n in seen[c]) == 20
    assert seen[c][0][0] > seen[b][-1][0] - 1e-9  # c got b's slot
    assert sch.kv_used == 0 and not sch.busy


def test_saturation_rate_bounds_what_an_open_loop_level_serves():
    reqs = [(0.0, 512, 64)] * 128
    cap = saturation_rate_req_s(reqs, CFG, step)
    # 64 slots x one token per step: 64 requests per (64 decode steps + prefills)
    assert cap == pytest.approx(64 / (64 * step(64, 0)), rel=0.25)
    over = level_metrics([(i / (4 * cap), 512, 64) for i in range(128)], CFG, step)
    assert over["request_throughput_req_s"] <= cap * 1.05
