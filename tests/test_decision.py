"""The confirmation race's statistics (sweeps/search/decision.py): Welch and TOST against
scipy, Fieller ratio intervals that never go below 0, the race's decisions and tie-break."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from scipy import stats

from sweeps.search import decision


def test_welch_interval_matches_scipy():
    a, b = [90.1, 91.0, 89.7, 90.4], [88.0, 88.9, 87.2, 89.5, 88.1]
    d, lo, hi = decision.welch_interval(a, b, 0.95)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d == pytest.approx(sum(a) / 4 - sum(b) / 5)
    assert (lo, hi) == pytest.approx((ref.low, ref.high))
    with pytest.raises(ValueError, match=">= 2 values"):
        decision.welch_interval([1.0], b, 0.95)


def test_fieller_is_the_delta_interval_when_precise_and_never_below_zero():
    rng = random.Random(1)
    a = [100 * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(8)]
    b = [80 * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(8)]
    r, lo, hi = decision.fieller_ratio(a, b, 0.95)
    assert r == pytest.approx((sum(a) / 8) / (sum(b) / 8))
    assert lo < r < hi and hi - lo < 0.05  # precise means: a narrow interval around the ratio
    # the goodput case: two rates measured twice, far apart; a delta-method interval went below 0
    a, b = [1.0, 4.6], [2.6, 3.0]
    r, lo, hi = decision.fieller_ratio(a, b, 0.95)
    ma, mb = sum(a) / 2, sum(b) / 2
    se = r * math.sqrt(stats.tvar(a) / 2 / ma**2 + stats.tvar(b) / 2 / mb**2)
    assert r - stats.t.ppf(0.975, 1) * se < 0  # what the delta method gave
    assert lo == 0.0 and (hi is None or hi > r)
    # a denominator not distinguishable from 0: unbounded above, still not below 0
    r, lo, hi = decision.fieller_ratio([5.0, 5.2], [0.1, 3.0], 0.95)
    assert lo == 0.0 and hi is None
    assert all(math.isnan(x) for x in decision.fieller_ratio([1.0], [1.0, 2.0])[1:])


def test_fieller_coverage_by_simulation():
    """The 95 % Fieller interval covers the true ratio about 95 % of the time (n = 4, 2 % noise)."""
    rng = random.Random(7)
    hits = 0
    for _ in range(400):
        a = [90 * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(4)]
        b = [80 * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(4)]
        _, lo, hi = decision.fieller_ratio(a, b, 0.95)
        hits += lo <= 90 / 80 <= (hi if hi is not None else math.inf)
    assert 0.92 <= hits / 400 <= 0.995, hits


def test_tost_equivalence():
    rng = random.Random(3)
    a = [100 * (1 + 0.002 * rng.gauss(0, 1)) for _ in range(6)]
    b = [100.1 * (1 + 0.002 * rng.gauss(0, 1)) for _ in range(6)]
    assert decision.tost_equivalent(a, b, 1.0, 0.95)  # within 1 % of 100
    assert not decision.tost_equivalent(a, [x + 3 for x in b], 1.0, 0.95)
    assert not decision.tost_equivalent(a[:1], b, 1.0, 0.95)
    assert decision.compare(a, b, True, 0.01, 0.95) == "equivalent"
    assert decision.compare([x + 3 for x in a], b, True, 0.01, 0.95) == "separated"
    assert decision.compare(b, [x + 3 for x in a], False, 0.01, 0.95) == "separated"  # minimize: lower leads
    noisy = [100 * (1 + 0.03 * rng.gauss(0, 1)) for _ in range(3)]
    assert decision.compare(noisy, b[:3], True, 0.01, 0.95) == "undecided"


def _c(trial, values, **kw):
    return decision.Contender(trial, list(values), len(values), **kw)


def test_decide_separated_equivalent_budget_and_racing():
    sep = decision.decide([_c(0, [80, 80.5, 79.8]), _c(1, [90, 90.4, 89.9]), _c(2, [85, 85.3, 84.8])], True, 0.01, 0.95, 8)
    assert (sep.status, sep.leader, sep.pick, sep.tie_group) == ("separated", 1, 1, [1])
    assert sep.relation == {1: "leader", 2: "separated", 0: "separated"} and not sep.more
    # undecided with budget left: the leader and the undecided contender race on, the separated one does not
    race = decision.decide([_c(0, [80, 80.5, 79.8]), _c(1, [90, 91, 89]), _c(2, [88.5, 89.5, 87.5])], True, 0.01, 0.95, 8)
    assert race.status == "racing" and sorted(race.more) == [1, 2]
    # the same at the budget: a tie group, picked by the tie-break (fewer non-default settings)
    full = [_c(0, [80, 80.5, 79.8] * 2), _c(1, [90, 92, 88] * 2, non_default=3), _c(2, [89, 91.5, 88.5] * 2, non_default=1)]
    spent = decision.decide(full, True, 0.01, 0.95, 6)
    assert spent.status == "budget_spent" and spent.leader == 1 and spent.pick == 2 and spent.tie_group == [2, 1]
    assert "t2" in spent.reason and "tie-break" in spent.reason and "6 per config" in spent.reason
    # the serving check comes first in the tie-break
    full[2].serving_ok = False
    assert decision.decide(full, True, 0.01, 0.95, 6).pick == 1
    # equivalent within the margin: a tie group by equivalence, not by lack of repeats
    eq = decision.decide([_c(1, [90.0, 90.1, 89.9, 90.05], non_default=2), _c(2, [90.02, 89.95, 90.08, 89.98], non_default=0)],
                  True, 0.01, 0.95, 8)
    assert eq.status == "equivalent" and set(eq.tie_group) == {1, 2} and eq.pick == 2
    # ineligible configs never lead; nothing eligible: no decision
    assert decision.decide([_c(5, [99, 99.1], eligible=False), _c(6, [80, 80.2])], True, 0.01, 0.95, 4).pick == 6
    assert decision.decide([_c(5, [99, 99.1], eligible=False)], True, 0.01, 0.95, 4).pick is None


def test_the_race_stops_for_contenders_that_cannot_change_the_pick():
    """The leader is the pick (fewest non-default settings) and a rival ranked after it by the
    tie-break is undecided (neither separated nor equivalent) but cannot be better than the pick
    by more than the margin (non-inferiority): it is not raced on, and the decision says so. A
    rival that might still be better by more than the margin, one that ties the pick on the
    tie-break's keys, or a pick that is not the leader, is raced on."""
    lead = [89.6, 90.0, 90.4]
    rival = [89.1, 89.5, 89.9]  # 0.5 below: not separated, not within 1 % by TOST, not better by 1 %
    base = _c(0, [80, 80.5, 79.8])
    assert decision.compare(lead, rival, True, 0.01, 0.95, decision.separation_confidence(0.95, 2)) == "undecided"
    assert decision.non_inferior(lead, rival, 0.9, True, 0.95) and not decision.non_inferior(rival, lead, 0.3, True, 0.95)
    done = decision.decide([base, _c(1, lead, non_default=1), _c(2, rival, non_default=2)], True, 0.01, 0.95, 8)
    assert done.status == "pick_decided" and done.pick == 1 and not done.more
    assert done.relation[2] == "undecided" and done.tie_group == [1, 2] and done.settled == [2]
    assert "t2 neither separated from t1 nor shown equivalent, but ranked after the pick" in done.reason
    # further from the baseline's numeric settings ranks after too
    far = decision.decide([base, _c(1, lead, non_default=1, departure=2.0), _c(2, rival, non_default=1, departure=3.0)],
                          True, 0.01, 0.95, 8)
    assert far.status == "pick_decided" and far.pick == 1
    # noisier: the rival might still be more than 1 % better than the pick, so both race
    noisy = decision.decide([base, _c(1, [90, 91, 89], non_default=1), _c(2, [89.5, 90.5, 88.5], non_default=2)],
                            True, 0.01, 0.95, 8)
    assert noisy.status == "racing" and sorted(noisy.more) == [1, 2] and noisy.settled == []
    # a rival that ties the pick on the tie-break's keys: the mean decides, so it races
    tie = decision.decide([base, _c(1, lead, non_default=1), _c(2, rival, non_default=1)], True, 0.01, 0.95, 8)
    assert tie.status == "racing" and sorted(tie.more) == [1, 2]
    # the pick is not the leader: it may separate below the leader, so both race
    simpler = decision.decide([base, _c(1, lead, non_default=2), _c(2, rival, non_default=1)], True, 0.01, 0.95, 8)
    assert simpler.status == "racing" and simpler.pick == 2 and sorted(simpler.more) == [1, 2]
    # minimising: the same rule with the direction reversed (lower is better)
    low = decision.decide([_c(0, [120, 120.5, 119.8]), _c(1, [100 - (x - 90) for x in lead], non_default=1),
                           _c(2, [100 - (x - 90) + 0.5 for x in rival[::-1]], non_default=2)], False, 0.01, 0.95, 8)
    assert low.pick == 1 and low.relation[2] == "undecided" and low.status == "pick_decided"


def test_the_race_stops_when_the_repeat_budget_cannot_decide():
    """Two configs 1 % apart with a 2 % spread: at 8 repeats each (their means and spreads so far)
    they would still be neither separated nor equivalent within 1 %, so the race does not spend
    the launches and says why; with a budget that can decide (200) it races on."""
    vals = [_c(0, [80, 80.5, 79.8]), _c(1, [90, 92, 88]), _c(2, [89, 91.5, 88.5])]
    stop = decision.decide(vals, True, 0.01, 0.95, 8)
    assert stop.status == "undecidable" and not stop.more and stop.tie_group == [1, 2]
    assert "projected from their means and spreads so far it would still be neither at 8 repeats" in stop.reason
    assert decision.decide(vals, True, 0.01, 0.95, 200).status == "racing"
    p = decision.projected([90, 92, 88], 8)
    assert len(p) == 8 and sum(p) / 8 == pytest.approx(90) and statistics.variance(p) == pytest.approx(4.0)
    assert decision.projected([90, 92, 88], 7) and statistics.variance(decision.projected([90, 92, 88], 7)) == pytest.approx(4.0)


def test_an_undecidable_reason_accounts_for_every_member_of_the_tie_group():
    """t2 (the pick) is undecidable against the leader t1 at 8 repeats; t3 is in the tie group
    too but not raced on (the pick is non-inferior to it): the reason names it and why, so no
    member of the tie group goes unexplained."""
    d = decision.decide([_c(0, [80, 80.5, 79.8]), _c(1, [90, 91.5, 88.5], non_default=2),
                         _c(2, [89.5, 89.6, 89.4], non_default=1), _c(3, [88.0, 88.1, 87.9], non_default=3)],
                        True, 0.01, 0.95, 8)
    assert d.status == "undecidable" and d.tie_group == [2, 1, 3]
    named = d.reason.split(" Tie group ")[0]
    assert "is not distinguishable from t2 at 95 %" in named
    assert "t3 neither separated from t1 nor shown equivalent, but ranked after the pick" in named


def test_repick_applies_the_serving_check_within_the_tie_group():
    conf = {"winner": 2, "tie_group": [2, 1], "decision": {"pick": 2, "tie_group": [2, 1]},
            "entries": [{"trial": 1, "values": [90, 92, 88], "n": 3, "non_default": 3, "cost": 10,
                         "verdict": "tie group: not picked"},
                        {"trial": 2, "values": [89, 91, 88], "n": 3, "non_default": 1, "cost": 10, "verdict": "winner"},
                        {"trial": 0, "values": [80, 81, 79], "n": 3, "non_default": 0, "cost": 10, "verdict": "#3"}]}
    out = decision.repick(conf, {2: False, 1: True})
    assert out["winner"] == 1 and out["tie_group"] == [1, 2] and out["decision"]["pick"] == 1
    by = {e["trial"]: e for e in out["entries"]}
    assert by[1]["verdict"] == "winner" and by[2]["verdict"] != "winner" and by[2]["serving_ok"] is False
    assert conf["winner"] == 2  # the input is untouched
    assert decision.repick({"entries": []}, {1: True}) == {"entries": []}


def test_a_launch_cost_within_the_tolerance_does_not_decide_the_pick():
    """Launch wall times a few per cent apart are run-to-run jitter: the better mean decides;
    a launch at least COST_TIE shorter does decide, and settings count before cost."""
    from sweeps.search.decision import COST_TIE, Contender, pick

    a = Contender(1, [90.0, 90.2], 2, non_default=1, cost=100.0)
    b = Contender(2, [90.4, 90.6], 2, non_default=1, cost=100.0 * (1 + COST_TIE / 2))
    assert pick([a, b], maximize=True).trial == 2  # jitter: b's better mean wins
    assert pick([b, a], maximize=True).trial == 2  # the order of the members changes nothing
    c = Contender(3, [89.0, 89.2], 2, non_default=1, cost=100.0 * (1 - 2 * COST_TIE))
    assert pick([a, b, c], maximize=True).trial == 3  # materially cheaper
    d = Contender(4, [88.0], 1, non_default=0, cost=500.0)
    assert pick([a, b, c, d], maximize=True).trial == 4  # fewer non-default settings first
    with pytest.raises(ValueError):
        pick([], maximize=True)


def test_the_reason_names_the_step_that_decided_and_follows_a_repick():
    """The decision's reason says which tie-break step picked the winner; when the serving check
    moves the pick, the reason and the winner's sentence name the new winner and that step."""
    group = [decision.Contender(2, [89.0, 91.0, 88.0], 3, non_default=1, cost=10.0),
             decision.Contender(1, [90.0, 92.0, 88.0], 3, non_default=3, cost=10.0)]
    dec = decision.decide(group, True, 0.01, 0.95, 3)
    assert dec.pick == 2 and "fewer non-default settings decided it." in dec.reason
    conf = {"winner": 2, "tie_group": [2, 1], "decision_reason": dec.reason,
            "decision": {"pick": 2, "tie_group": [2, 1], "reason": dec.reason},
            "winner_note": f"Winner t2: 89.3 tok/s mean over 3 runs. {dec.reason}",
            "entries": [{"trial": 1, "values": [90.0, 92.0, 88.0], "n": 3, "non_default": 3, "cost": 10},
                        {"trial": 2, "values": [89.0, 91.0, 88.0], "n": 3, "non_default": 1, "cost": 10}]}
    out = decision.repick(conf, {2: False, 1: True})
    for text in (out["decision_reason"], out["decision"]["reason"], out["winner_note"]):
        assert "pick t1 by the tie-break" in text and "the serving check decided it." in text and "pick t2" not in text
    assert out["winner_note"].startswith("Winner t1: 90.0 tok/s mean over 3 runs.")


def test_departure_counts_log2_steps_of_numeric_settings_from_the_baseline():
    """g128 against the baseline's g512 is 2 steps, g32 4; categorical knobs and equal values
    count 0 (they are the non-default settings' business)."""
    base = {"cuda_graph_max_bs": 512, "nccl_algo": None, "speculative": False}
    assert decision.departure({"cuda_graph_max_bs": 128, "nccl_algo": None}, base) == 2.0
    assert decision.departure({"cuda_graph_max_bs": 32, "nccl_algo": "Ring"}, base) == 4.0
    assert decision.departure({"cuda_graph_max_bs": 512, "speculative": True}, base) == 0.0


def test_on_a_plateau_the_member_nearest_the_baseline_is_picked_whatever_the_means():
    """Equal setting counts: the smaller departure decides before cost and mean, so a plateau's
    pick does not follow the noisiest mean."""
    near = decision.Contender(1, [89.0, 89.4], 2, non_default=1, departure=2.0)
    far = decision.Contender(2, [90.0, 90.4], 2, non_default=1, departure=4.0)
    fewer = decision.Contender(3, [88.9, 89.1], 2, non_default=0, departure=6.0)
    assert decision.pick([far, near], maximize=True).trial == 1
    assert decision.decided_by([far, near], near) == "settings nearer the baseline's"
    assert decision.pick([far, near, fewer], maximize=True).trial == 3  # fewer settings first


def test_simplifications_are_measured_configs_between_the_leader_and_the_baseline():
    """The leader g64 + Ring + LL races g128 (every knob between it and the baseline) and g64 +
    Ring (one setting reverted), best measured first; g32 (beyond the leader), a config with
    another algo, the baseline, the leader itself and failed trials never join."""
    from sweeps.search.confirm import simplifications
    from sweeps.store import records

    def mk(n: int, g: int, algo: str | None, proto: str | None, v: float | None, base: bool = False,
           status: str = "ok") -> records.TrialRecord:
        return records.TrialRecord(n, "COMPLETE", {"cuda_graph_max_bs": g, "nccl_algo": algo, "nccl_proto": proto},
                                   status, {"decode_tok_s": v} if v is not None else {}, is_baseline=base)
    base = mk(0, 512, None, None, 82.0, True)
    lead = mk(1, 64, "Ring", "LL", 91.0)
    recs = [base, lead, mk(2, 128, None, None, 89.0), mk(3, 64, "Ring", None, 90.0), mk(4, 32, None, None, 90.5),
            mk(5, 128, "Tree", None, 90.8), mk(6, 256, None, None, 84.0), mk(7, 128, None, "LL", None, status="failed")]
    got = simplifications(recs, lead, base, n=2)
    assert [r.number for r in got] == [3, 2]
    assert [r.number for r in simplifications(recs, lead, base, n=5)] == [3, 2, 6]
    assert simplifications(recs, lead, None) == [] and simplifications(recs, lead, base, n=0) == []
    assert [r.number for r in simplifications(recs, lead, base, n=2, exclude={records.config_key(recs[3].params)})] == [2, 6]


def test_separation_from_many_contenders_is_bonferroni_adjusted():
    """The leader is the largest of several noisy means: a difference that separates one rival
    at 95 % does not separate it when the leader is compared with four (Bonferroni, 98.75 %)."""
    lead = [91.0, 90.0, 92.0, 91.0, 90.5]
    rival = [89.8, 90.3, 89.3, 90.4, 89.7]
    far = [80.0, 80.4, 79.7, 80.2, 80.1]
    assert decision.separation_confidence(0.95, 4) == pytest.approx(0.9875)
    assert decision.separation_confidence(0.95, 1) == decision.separation_confidence(0.95, 0) == 0.95
    two = decision.decide([_c(1, lead), _c(2, rival)], True, 0.01, 0.95, 5)
    assert two.relation[2] == "separated" and two.status == "separated" and "Bonferroni" not in two.reason
    five = decision.decide([_c(1, lead), _c(2, rival), _c(3, far), _c(4, [v - 1 for v in far]),
                            _c(5, [v - 2 for v in far])], True, 0.01, 0.95, 5)
    assert five.relation[2] == "undecided" and five.status == "budget_spent" and 2 in five.tie_group
    assert all(five.relation[t] == "separated" for t in (3, 4, 5))
    three = decision.decide([_c(1, lead), _c(3, far), _c(4, [v - 1 for v in far])], True, 0.01, 0.95, 5)
    assert three.status == "separated" and "Bonferroni over 2 comparisons" in three.reason


def test_a_simpler_config_leaves_the_tie_group_only_when_shown_worse_by_more_than_the_margin():
    """The plateau of the campaign: g64 (3 log2 steps from the baseline's g512) and g128 (2 steps)
    have the same rate. A noisy g64 leads g128 by 0.6 %, separated at 95 % but less than the 1 %
    margin ahead: g128, ranked ahead by the tie-break, stays in the tie group and is the pick. Shown
    3 % worse it leaves the group; a contender ranked after the leader leaves it once shown worse at all."""
    g64 = [90.0, 90.1, 89.95, 90.05, 90.0, 89.9]
    g128 = [v - 0.55 for v in g64[::-1]]
    assert decision.compare(g64, g128, True, 0.01, 0.95) == "separated"
    d = decision.decide([_c(1, g64, non_default=1, departure=3.0), _c(2, g128, non_default=1, departure=2.0)],
                        True, 0.01, 0.95, 6)
    assert d.leader == 1 and d.relation[2] != "separated" and d.pick == 2 and d.tie_group == [2, 1], d
    worse = decision.decide([_c(1, g64, non_default=1, departure=3.0),
                             _c(2, [v - 2.7 for v in g64], non_default=1, departure=2.0)], True, 0.01, 0.95, 6)
    assert worse.status == "separated" and worse.pick == 1 and "by more than the 1 % margin" in worse.reason
    after = decision.decide([_c(1, g64, non_default=1, departure=2.0), _c(2, g128, non_default=1, departure=3.0)],
                            True, 0.01, 0.95, 6)
    assert after.status == "separated" and after.pick == 1 and "margin" not in after.reason
    # minimising: the same rule with the direction reversed
    low = decision.decide([_c(1, [200 - v for v in g64], non_default=1, departure=3.0),
                           _c(2, [200 - v for v in g128], non_default=1, departure=2.0)], False, 0.01, 0.95, 6)
    assert low.pick == 2 and low.relation[2] != "separated"


def test_futility_projects_with_the_races_pooled_spread():
    """g256 (ranked ahead by the tie-break, truly 4.4 % below the plateau) after three launches
    whose own spread is twice the node's 1.5 %: projected with that spread it could never be
    shown worse than the margin at 8 repeats and the race would stop with it as the pick;
    projected with the spread the whole race shows, it can, so it races on."""
    g128 = [89.2, 90.6, 88.1, 89.9, 88.7, 90.3]
    g256 = [85.4, 88.0, 82.9]
    other = [89.5, 88.3, 90.4, 89.1, 88.9, 90.0]
    race = [_c(1, g128, non_default=1, departure=2.0), _c(2, g256, non_default=1, departure=1.0),
            _c(3, other, non_default=2, departure=2.0)]
    cv2 = decision.pooled_cv2([c.values for c in race])
    assert 0.01 < cv2 ** 0.5 < 0.02 and statistics.stdev(g256) / statistics.mean(g256) > 0.025
    assert decision.projected(g256, 8, cv2) != decision.projected(g256, 8)
    d = decision.decide(race, True, 0.01, 0.95, 8)
    assert d.status == "racing" and d.pick == 2 and 2 in d.more, d
    assert decision.pooled_cv2([[1.0]]) is None


def test_a_simpler_config_estimated_practically_worse_leaves_although_its_interval_reaches_the_margin():
    """A simpler config 2 % below the leader, shown worse (the interval excludes 0) but with an
    interval whose low end lies inside the 1 % margin: its mean lead is beyond the margin, so it
    leaves the tie group and the leader is the pick (keeping it deployed configs 2-3 % worse)."""
    lead = [100.0, 101.5, 98.5, 100.8, 99.2, 100.0]
    simpler = [v - 2.0 for v in lead[::-1]]
    _, lo, _ = decision.welch_interval(lead, simpler, 0.95)
    assert 0 < lo < 1.0
    d = decision.decide([_c(1, lead, non_default=2), _c(2, simpler, non_default=0)], True, 0.01, 0.95, 6)
    assert d.relation[2] == "separated" and d.pick == 1 and d.tie_group == [1], d
