"""tasks.load_search: the knee of synthetic monotone latency curves, the incumbent early stop,
censored results (bounds, never a 0.0), the shipped goodput search reaching its tolerance, and a
search over the instant-mode scheduler simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.emulator.batch_sim import simulate
from tasks.emulator.scheduler import SchedulerConfig
from tasks.load_search import LoadSearchResult, Slo, censored_text, censored_upper, max_rate_at_slo
from tasks.serving_metrics import summarize
from tasks.workloads import build_requests, parse_workload

SLO = Slo(ttft_ms_p99=1000, tpot_ms_p99=50)
CAPS = np.geomspace(0.5, 40, 25)
RANGES = [(0.1, 100.0), (0.25, 64.0), (0.5, 50.0)]


def queue_curve(cap):
    """p99s of a queue: TTFT ~ 1 / (1 - rho), TPOT grows with the batch; saturated above cap."""
    def measure(r):
        rho = r / cap
        ttft = 100 / (1 - rho) if rho < 1 else 5000 * rho
        return {"ttft_ms_p99": ttft, "tpot_ms_p99": 20 * (1 + 0.5 * min(rho, 1.2)),
                "request_throughput_req_s": min(r, 0.99 * cap)}
    return measure


def linear_tpot(k):
    return lambda r: {"ttft_ms_p99": 100.0, "tpot_ms_p99": 10 + 40 * r / k}


def kinked_ttft(knee):
    return lambda r: {"ttft_ms_p99": 300 + max(0.0, r - knee) * 5000, "tpot_ms_p99": 30 + 2 * r / knee,
                      "request_throughput_req_s": min(r, 1.2 * knee)}


def truth(measure, lo, hi):
    """The exact knee by 100 bisections (what the search must bracket)."""
    ok = lambda r: SLO.ratio(measure(r)) <= 1  # noqa: E731
    if not ok(lo):
        return 0.0
    if ok(hi):
        return hi
    a, b = lo, hi
    for _ in range(100):
        m = math.sqrt(a * b)
        a, b = (m, b) if ok(m) else (a, m)
    return a


def counted(measure):
    """``measure`` that records the rates it was asked for (``m.raw`` does not)."""
    calls = []

    def m(r):
        calls.append(r)
        return measure(r)
    m.raw = measure
    return m, calls


def check(res: LoadSearchResult, t: float, calls: list) -> float:
    """The result brackets the true knee; returns the bracket's width (failed / met)."""
    assert len(res.levels) == len(calls) <= 6
    assert res.max_rate_at_slo_req_s <= t * (1 + 1e-9)
    assert all(lv.met == (SLO.ratio(lv.metrics) <= 1) for lv in res.levels)
    if t == 0.0 or res.capped:  # the knee is outside the range: reported as 0 or the bound
        assert res.max_rate_at_slo_req_s == t
        return 1.0
    assert res.failed_at_req_s >= t * (1 - 1e-9)
    return res.failed_at_req_s / res.max_rate_at_slo_req_s


@pytest.mark.parametrize("lo, hi", RANGES)
def test_queueing_curves_knee_within_5_percent_in_6_levels(lo, hi):
    for cap in CAPS:
        f, calls = counted(queue_curve(cap))
        res = max_rate_at_slo(f, SLO, rate_lo=lo, rate_hi=hi)
        knee = truth(f.raw, lo, hi)
        assert check(res, knee, calls) <= 1.05, (cap, [(lv.rate_req_s, lv.met) for lv in res.levels])
        assert res.converged() or knee == 0.0


@pytest.mark.parametrize("lo, hi", RANGES)
def test_other_monotone_shapes_are_bracketed(lo, hi):
    for k in CAPS:
        for curve, width in ((linear_tpot(k), 1.16), (kinked_ttft(k), 1.26)):
            f, calls = counted(curve)
            assert check(max_rate_at_slo(f, SLO, rate_lo=lo, rate_hi=hi), truth(f.raw, lo, hi), calls) <= width


def test_logged_metrics_are_the_best_passing_level():
    res = max_rate_at_slo(queue_curve(10.0), SLO, rate_lo=0.5, rate_hi=50)
    m = res.metrics()
    best = max((lv for lv in res.levels if lv.met), key=lambda lv: lv.rate_req_s)
    assert m["max_rate_at_slo_req_s"] == best.rate_req_s and m["ttft_ms_p99"] == best.metrics["ttft_ms_p99"]
    assert m["slo_failed_at_req_s"] == res.failed_at_req_s and m["load_levels"] == len(res.levels)
    assert m["load_search_converged"] == 1.0


def test_noisy_levels_keep_a_consistent_answer():
    """A real server is noisy: a level may fail below one that passed. The answer stays the
    highest passing rate, and failed_at the lowest failing rate above it."""
    rng = np.random.default_rng(0)
    base = queue_curve(10.0)

    def noisy(r):
        m = dict(base(r))
        m["ttft_ms_p99"] *= float(rng.uniform(0.8, 1.25))
        return m
    for _ in range(20):
        res = max_rate_at_slo(noisy, SLO, rate_lo=0.5, rate_hi=50)
        assert 1 <= len(res.levels) <= 6
        passed = [lv.rate_req_s for lv in res.levels if lv.met]
        assert res.max_rate_at_slo_req_s == max(passed)
        assert res.failed_at_req_s == min(lv.rate_req_s for lv in res.levels if not lv.met and lv.rate_req_s > max(passed))
        assert 0.7 * 9.0 < res.max_rate_at_slo_req_s <= 10.0  # near the noiseless knee (9.0)


def test_never_meets_reports_zero():
    f, calls = counted(lambda r: {"ttft_ms_p99": 5000.0, "tpot_ms_p99": 10.0})
    res = max_rate_at_slo(f, SLO, rate_lo=0.5, rate_hi=50)
    assert res.max_rate_at_slo_req_s == 0.0
    assert res.failed_at_req_s == pytest.approx(0.5)
    assert len(calls) == 2 and not res.converged()


def test_always_meets_is_capped_at_the_range():
    res = max_rate_at_slo(lambda r: {"ttft_ms_p99": 1.0, "tpot_ms_p99": 1.0}, SLO, rate_lo=0.5, rate_hi=50)
    assert res.capped and res.max_rate_at_slo_req_s == pytest.approx(50) and len(res.levels) == 2


def test_incumbent_failure_stops_at_once():
    f, calls = counted(queue_curve(4.0))
    res = max_rate_at_slo(f, SLO, rate_lo=0.5, rate_hi=50, incumbent_rate=8.0)
    assert calls == [pytest.approx(8.0)]
    assert res.stopped_at_incumbent
    assert res.max_rate_at_slo_req_s == 0.0 and res.failed_at_req_s == pytest.approx(8.0)


def test_incumbent_passed_keeps_searching_above_it():
    f, calls = counted(queue_curve(20.0))
    res = max_rate_at_slo(f, SLO, rate_lo=0.5, rate_hi=50, incumbent_rate=8.0)
    assert calls[0] == pytest.approx(8.0) and not res.stopped_at_incumbent
    assert res.max_rate_at_slo_req_s > 8.0
    assert check(res, truth(f.raw, 0.5, 50), calls) <= 1.05


def test_failed_requests_fail_the_level_and_curve_is_sorted():
    def f(r):
        return {"ttft_ms_p99": 10.0, "tpot_ms_p99": 10.0, "completed": 99.0, "failed": 1.0 if r > 5 else 0.0}
    res = max_rate_at_slo(f, SLO, rate_lo=0.5, rate_hi=50)
    assert res.max_rate_at_slo_req_s <= 5 < res.failed_at_req_s
    rates = [r for r, _ in res.curve()]
    assert rates == sorted(rates) and len(rates) == len(res.levels)
    lenient = Slo(ttft_ms_p99=1000, tpot_ms_p99=50, max_failed_fraction=0.05)
    assert max_rate_at_slo(f, lenient, rate_lo=0.5, rate_hi=50).capped


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="rate_lo < rate_hi"):
        max_rate_at_slo(lambda r: {}, SLO, rate_lo=5, rate_hi=1)
    with pytest.raises(ValueError, match="max_levels"):
        max_rate_at_slo(lambda r: {}, SLO, rate_lo=1, rate_hi=5, max_levels=1)
    with pytest.raises(ValueError, match="slo.tpot_ms_p99"):
        Slo(ttft_ms_p99=1, tpot_ms_p99=0)
    assert SLO.ratio({"ttft_ms_p99": 1.0}) == math.inf  # a missing metric never meets


def test_search_over_the_scheduler_simulation():
    """The instant-mode use: each level simulates 200 Poisson requests on the batching model."""
    cfg = SchedulerConfig(max_running_requests=32, max_total_tokens=400_000, chunked_prefill_size=4096)
    step = lambda b, p: 0.006 + 0.0004 * b + 1.5e-5 * p  # noqa: E731
    w = parse_workload({"num_requests": 200, "arrival": {"kind": "poisson", "rate_req_s": 1.0}, "seed": 1,
                        "prompt_len": {"kind": "uniform", "low": 200, "high": 2000}, "output_len": 128})

    def measure(rate):
        plan = build_requests(w.at_rate(rate))
        res = simulate(plan.requests, cfg, step)
        return summarize(res.records(), res.duration_s)

    slo = Slo(ttft_ms_p99=500, tpot_ms_p99=20)
    res = max_rate_at_slo(measure, slo, rate_lo=1.0, rate_hi=200.0)
    assert 1.0 < res.max_rate_at_slo_req_s < 200.0 and len(res.levels) <= 6
    # the curve is monotone enough that every measured rate below the answer met the SLO
    assert all(lv.met for lv in res.levels if lv.rate_req_s <= res.max_rate_at_slo_req_s)
    assert res.failed_at_req_s <= res.max_rate_at_slo_req_s * 1.25
    tput = [m["output_throughput_tok_s"] for _, m in res.curve()]
    assert tput[-1] > tput[0]  # the throughput-latency curve: more load, more tokens


def test_a_result_that_did_not_narrow_is_censored_not_zero():
    """Failing at the incumbent's rate, at rate_lo, or running out of levels leaves only bounds:
    the metrics carry them and no ``max_rate_at_slo_req_s`` (a 0.0 would read as measured)."""
    at_inc = max_rate_at_slo(queue_curve(4.0), SLO, rate_lo=0.5, rate_hi=50, incumbent_rate=8.0).metrics()
    assert "max_rate_at_slo_req_s" not in at_inc and at_inc["max_rate_at_slo_req_s_censored"] == 1.0
    assert at_inc["max_rate_at_slo_req_s_upper"] == pytest.approx(8.0) and "max_rate_at_slo_req_s_lower" not in at_inc
    assert censored_text(at_inc) == "< 8.00 req/s" and censored_upper(at_inc) == pytest.approx(8.0)
    never = max_rate_at_slo(lambda r: {"ttft_ms_p99": 5000.0, "tpot_ms_p99": 10.0}, SLO, rate_lo=0.5, rate_hi=50)
    m = never.metrics()
    assert censored_text(m) == "< 0.50 req/s" and all(v != 0.0 for k, v in m.items() if "rate" in k)
    short = max_rate_at_slo(queue_curve(10.0), SLO, rate_lo=0.5, rate_hi=50, max_levels=3)
    m = short.metrics()
    assert short.censored and "max_rate_at_slo_req_s" not in m and m["max_rate_at_slo_req_s_lower"] > 0
    assert censored_text(m).endswith("req/s, not narrowed") and m["max_rate_at_slo_bracket_rel"] > 0.05
    done = max_rate_at_slo(queue_curve(10.0), SLO, rate_lo=0.5, rate_hi=50).metrics()
    assert censored_text(done) is None and done["max_rate_at_slo_bracket_rel"] <= 0.05
    assert "slo_failed_at_req_s" not in max_rate_at_slo(lambda r: {"ttft_ms_p99": 1.0, "tpot_ms_p99": 1.0}, SLO,
                                                         rate_lo=0.5, rate_hi=50).metrics()  # none failed: no 0.0


def test_shipped_goodput_search_narrows_to_its_tolerance():
    """conf/bench/chat_goodput.yaml's search (2..64 req/s, 10 %) on knees like the emulated node's
    (about 2-3 req/s; a first trial, then rivals passing the incumbent's rate) ends within its
    tolerance inside its level budget. Four levels from 2..64 left the baseline 63 % wide."""
    from omegaconf import OmegaConf

    ls = OmegaConf.load("conf/bench/chat_goodput.yaml")["load_search"]
    slo = Slo(ttft_ms_p99=2000, tpot_ms_p99=50)

    def chat(cap):  # p99 TPOT binds first, TTFT diverges at saturation (what the emulator shows)
        def measure(r):
            rho = r / cap
            return {"ttft_ms_p99": 300 / (1 - rho) if rho < 1 else 4000 * rho, "tpot_ms_p99": 30 + 25 * min(rho, 1.3),
                    "request_throughput_req_s": min(r, 0.98 * cap)}
        return measure

    for cap in np.geomspace(2.7, 12.0, 15):  # knee = 0.8 cap (TPOT), 2.2..9.6 req/s
        for inc in (None, 0.9 * 0.8 * cap, 2.0):
            res = max_rate_at_slo(chat(cap), slo, rate_lo=ls.rate_lo, rate_hi=ls.rate_hi, incumbent_rate=inc,
                                  max_levels=ls.max_levels, rel_tol=ls.rel_tol)
            assert not res.censored and res.bracket_rel <= ls.rel_tol + 1e-9, (cap, inc, res.levels)


def test_passing_the_incumbent_doubles_towards_the_knee():
    f, calls = counted(queue_curve(20.0))
    max_rate_at_slo(f, SLO, rate_lo=0.5, rate_hi=50, incumbent_rate=4.0)
    assert calls[:3] == [pytest.approx(4.0), pytest.approx(8.0), pytest.approx(16.0)]


def test_every_level_on_one_server_sends_prompts_of_its_own(monkeypatch):
    """A server's radix/prefix cache must not serve a later level from an earlier one: each level
    of run_load (the rate search's and then the concurrency levels') gets prompts no other level sent."""
    import tasks.trial_load as trial_load
    from tasks.load_client import prompt_ids
    from tasks.types import BenchSpec, LoadSearchSpec, SloSpec

    sent: list[set[tuple[int, ...]]] = []

    def fake_level(target, w, *, slos_ms=None, seed=0, level=0, request_timeout_s=60.0, deadline_s=None):
        plan = build_requests(w)
        sent.append({tuple(prompt_ids(target.api, r.prompt_len, seed, i, level)) for i, r in enumerate(plan.requests)})
        rate = w.arrival.rate_req_s if w.arrival.kind == "poisson" else 1.0
        ttft = 500.0 * rate  # meets a 2 s p99 TTFT below 4 req/s
        m = {"ttft_ms_p99": ttft, "tpot_ms_p99": 20.0, "ttft_ms_p50": ttft, "tpot_ms_p50": 20.0, "completed": 4.0,
             "failed": 0.0, "request_throughput_req_s": rate, "output_throughput_tok_s": 100.0, "itl_ms_p50": 20.0,
             "goodput_req_s": rate if ttft <= 2000 else 0.0}
        return m, []

    monkeypatch.setattr(trial_load, "run_level", fake_level)
    bench = BenchSpec(workload={"num_requests": 4, "arrival": {"kind": "poisson", "rate_req_s": 1.0}, "seed": 0,
                                "prompt_len": 32, "output_len": 8},
                      slo=SloSpec(ttft_ms_p99=2000, tpot_ms_p99=50), load_search=LoadSearchSpec(0.5, 16.0, max_levels=4),
                      concurrency_levels=(1, 4))
    _, arts = trial_load.run_load("http://127.0.0.1:1", "sglang", bench)
    assert [a["kind"] for a in arts] == ["load_search", "concurrency"]
    assert len(sent) == arts[0]["prompt_sets"] + 2 and arts[0]["prompt_sets"] >= 2
    for i, a in enumerate(sent):
        for b in sent[i + 1:]:
            assert not a & b, "a prompt was sent again at a later level"
