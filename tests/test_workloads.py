"""tasks.workloads: specs validate with named fields; plans are deterministic and follow the spec."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tasks.workloads import build_requests, load_rows, parse_workload, trace_rate_req_s

MOONCAKE = "conf/bench/traces/mooncake_conversation_sample.jsonl"
CHAT = "conf/bench/traces/chat_prompts_sample.jsonl"


def plan(**kw):
    return build_requests(parse_workload(kw))


def test_closed_loop_fixed_lengths():
    p = plan(num_requests=8, arrival={"kind": "closed", "concurrency": 4}, prompt_len=128, output_len=64)
    assert p.max_concurrency == 4
    assert [tuple(r) for r in p.requests] == [(0.0, 128, 64)] * 8


def test_poisson_is_seeded_and_has_the_rate():
    spec = {"num_requests": 4000, "arrival": {"kind": "poisson", "rate_req_s": 8.0}, "prompt_len": 100,
            "output_len": 10, "seed": 3}
    a, b = plan(**spec), plan(**spec)
    assert a == b
    t = np.array([r.arrival_s for r in a.requests])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(8.0, rel=0.05)
    assert plan(**{**spec, "seed": 4}) != a
    assert a.max_concurrency is None


def test_infinite_rate_sends_everything_at_once():
    p = plan(num_requests=5, arrival={"kind": "poisson", "rate_req_s": math.inf}, prompt_len=1, output_len=1)
    assert {r.arrival_s for r in p.requests} == {0.0}


def test_length_distributions():
    u = plan(num_requests=3000, arrival={"kind": "closed", "concurrency": 1},
             prompt_len={"kind": "uniform", "low": 10, "high": 20}, output_len=5)
    ps = np.array([r.prompt_len for r in u.requests])
    assert ps.min() == 10 and ps.max() == 20 and set(ps) == set(range(10, 21))
    ln = plan(num_requests=20000, arrival={"kind": "closed", "concurrency": 1}, prompt_len=7,
              output_len={"kind": "lognormal", "mean": 300, "sd": 200, "low": 1})
    outs = np.array([r.output_len for r in ln.requests])
    assert outs.mean() == pytest.approx(300, rel=0.03)
    assert outs.std() == pytest.approx(200, rel=0.08)
    clipped = plan(num_requests=500, arrival={"kind": "closed", "concurrency": 1}, prompt_len=7,
                   output_len={"kind": "lognormal", "mean": 300, "sd": 600, "low": 50, "high": 400})
    o = [r.output_len for r in clipped.requests]
    assert min(o) == 50 and max(o) == 400


def test_mooncake_trace_replays_its_timestamps():
    rows = [json.loads(line) for line in open(MOONCAKE)]
    p = plan(num_requests=50, arrival={"kind": "trace"}, dataset={"format": "mooncake", "path": MOONCAKE})
    want = [((r["timestamp"] - rows[0]["timestamp"]) / 1000.0, r["input_length"], r["output_length"]) for r in rows[:50]]
    assert [r.arrival_s for r in p.requests] == pytest.approx([w[0] for w in want])
    assert [(r.prompt_len, r.output_len) for r in p.requests] == [w[1:] for w in want]
    slow = plan(num_requests=50, arrival={"kind": "trace", "slowdown": 2.0}, dataset={"format": "mooncake", "path": MOONCAKE})
    assert slow.requests[-1].arrival_s == pytest.approx(2 * p.requests[-1].arrival_s)


def test_trace_at_rate_rescales_the_timeline():
    w = parse_workload({"num_requests": 100, "arrival": {"kind": "trace"}, "dataset": {"format": "mooncake", "path": MOONCAKE}})
    native = trace_rate_req_s(w)
    assert native == pytest.approx(3.5, rel=0.1)  # the sample's documented rate
    fast = build_requests(w.at_rate(2 * native))
    t = [r.arrival_s for r in fast.requests]
    assert 99 / t[-1] == pytest.approx(2 * native)
    with pytest.raises(ValueError, match="closed-loop"):
        w.at_concurrency(4).at_rate(1.0)


def test_jsonl_prompts_with_lengths_or_ids(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt_len": 5, "output_len": 7}\n\n{"prompt_ids": [1, 2, 3], "output_len": 2}\n')
    p = plan(num_requests=5, arrival={"kind": "closed", "concurrency": 2}, dataset={"format": "jsonl", "path": str(f)})
    assert [(r.prompt_len, r.output_len) for r in p.requests] == [(5, 7), (3, 2), (5, 7), (3, 2), (5, 7)]
    f.write_text('{"input_ids": [1, 2]}\n')
    p = plan(num_requests=2, arrival={"kind": "closed", "concurrency": 2}, output_len=9,
             dataset={"format": "jsonl", "path": str(f)})
    assert [(r.prompt_len, r.output_len) for r in p.requests] == [(2, 9), (2, 9)]
    with pytest.raises(ValueError, match="output_len"):
        plan(num_requests=2, arrival={"kind": "closed", "concurrency": 2}, dataset={"format": "jsonl", "path": str(f)})


def test_shipped_chat_sample_loads():
    rows = load_rows(parse_workload({"num_requests": 1, "arrival": {"kind": "closed", "concurrency": 1},
                                     "dataset": {"format": "jsonl", "path": CHAT}}).dataset)
    assert len(rows) == 200 and all(r.output_len >= 1 for r in rows)


@pytest.mark.parametrize("spec, field", [
    ({"num_requests": 0, "arrival": {"kind": "closed", "concurrency": 1}, "prompt_len": 1, "output_len": 1},
     "workload.num_requests"),
    ({"num_requests": 1, "arrival": {"kind": "poisson", "rate_req_s": -1}, "prompt_len": 1, "output_len": 1},
     "workload.arrival.poisson.rate_req_s"),
    ({"num_requests": 1, "arrival": {"kind": "closed", "concurrency": 1}, "prompt_len": {"kind": "uniform", "low": 5, "high": 2},
      "output_len": 1}, "workload.prompt_len.uniform"),
    ({"num_requests": 1, "arrival": {"kind": "sometimes"}, "prompt_len": 1, "output_len": 1}, "workload.arrival"),
    ({"num_requests": 1, "arrival": {"kind": "closed", "concurrency": 1}, "prompt_len": 1}, "give prompt_len and output_len"),
    ({"num_requests": 1, "arrival": {"kind": "trace"}, "prompt_len": 1, "output_len": 1}, "needs a mooncake dataset"),
    ({"num_requests": 1, "arrival": {"kind": "closed", "concurrency": 1}, "prompt_len": 1, "output_len": 1, "rate": 3},
     "workload.rate"),
])
def test_errors_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_workload(spec)


def test_bad_rows_name_file_and_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}\n{"timestamp": 9, "input_length": 5}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:2: .*'output_length'"):
        plan(num_requests=2, arrival={"kind": "trace"}, dataset={"format": "mooncake", "path": str(f)})
    with pytest.raises(ValueError, match="num_requests: 9 > the 1 rows"):
        f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
        plan(num_requests=9, arrival={"kind": "trace"}, dataset={"format": "mooncake", "path": str(f)})
    with pytest.raises(ValueError, match="does not exist"):
        plan(num_requests=1, arrival={"kind": "closed", "concurrency": 1}, dataset={"format": "jsonl", "path": "nope.jsonl"})
