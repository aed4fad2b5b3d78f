"""Benchmark math on known streams (no server)."""

from __future__ import annotations

import math

import pytest

from tasks.backends.sglang.client import BenchError, record_from_events, summarize


def _stream(t_send, t_first, itl, n, per_chunk=1, verify=False):
    events, tokens, t = [], 0, t_first
    while tokens < n:
        tokens = min(n, tokens + (1 if tokens == 0 else per_chunk))
        meta = {"completion_tokens": tokens}
        if verify:
            meta["spec_verify_ct"] = 1 + math.ceil((tokens - 1) / per_chunk)
        events.append((t, {"meta_info": meta, "output_ids": list(range(tokens))}))
        t += itl
    return record_from_events(t_send, events)


def test_plain_decode_stream():
    r = _stream(t_send=0.0, t_first=0.050, itl=0.010, n=128)
    assert r.ttft_ms == pytest.approx(50.0)
    assert r.decode_tok_s == pytest.approx(100.0)  # 127 tokens over 127 gaps of 10 ms
    m = summarize([r], wall_s=0.050 + 127 * 0.010)
    assert m["itl_ms_p50"] == pytest.approx(10.0)
    assert m["itl_ms_p99"] == pytest.approx(10.0)
    assert m["output_tok_s"] == pytest.approx(128 / 1.32)
    assert m["accept_length"] == 1.0


def test_speculative_stream_acceptance_and_rate():
    # 3 tokens per verify cycle of 30 ms -> 100 tok/s, acceptance length ~3
    r = _stream(0.0, 0.1, 0.030, n=127, per_chunk=3, verify=True)
    assert r.decode_tok_s == pytest.approx(126 / (42 * 0.030))
    m = summarize([r], 2.0)
    assert m["accept_length"] == pytest.approx(127 / 43)
    # per-token ITL (bench_serving's adjust_itl): a 30 ms verify cycle carrying 3 tokens is 3 x 10 ms
    assert m["itl_ms_p50"] == pytest.approx(10.0)
    assert r.itl_ms[:6] == pytest.approx([10.0] * 6)


def test_median_over_repeats_and_percentiles():
    rs = [_stream(0, 0.05, itl, 64) for itl in (0.010, 0.020, 0.040)]
    m = summarize(rs, 5.0)
    assert m["decode_tok_s"] == pytest.approx(50.0)
    assert m["completed"] == 3
    assert 10.0 <= m["itl_ms_p50"] <= 40.0
    assert m["itl_ms_p99"] == pytest.approx(40.0)


def test_chunks_without_tokens_ignored_and_empty_stream_is_error():
    r = record_from_events(0.0, [(0.1, {"meta_info": {"completion_tokens": 0}}),
                                 (0.2, {"meta_info": {"completion_tokens": 1}}),
                                 (0.3, {"meta_info": {"completion_tokens": 1}}),
                                 (0.4, {"meta_info": {"completion_tokens": 2}})])
    assert r.chunk_times == [0.2, 0.4]
    with pytest.raises(BenchError) as e:
        record_from_events(0.0, [(0.1, {"meta_info": {"completion_tokens": 0}})])
    assert e.value.kind == "short"
