"""Every proposal is a config not yet measured; the budget means launches.

When the sampler repeats a finished config or proposes a known dead end, the driver tells
Optuna (it learns) and launches an untried feasible config drawn by :mod:`sweeps.search.untried`;
"exhausted" means nothing untried and feasible is left.
"""

from __future__ import annotations

from collections import Counter

import pytest

from sweeps.app.inprocess import run_in_process
from sweeps.config.space import parse_space
from sweeps.config.spec import load_spec
from sweeps.search.untried import A_UNTRIED, EXHAUSTED, UntriedDraw, distance, ordered_knobs
from sweeps.store import records
from tests.conftest import compose_cfg


def _spec(tmp_path, *extra):
    store = tmp_path / "store"
    return load_spec(compose_cfg(["backend=instant", *extra, "sweep.budget.wall_time_s=null", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_budget_of_60_launches_60_distinct_configs_on_the_campaign_space(tmp_path):
    drv = run_in_process(_spec(tmp_path, "sweep=eagle3_allreduce", "sweep.budget.trials=60"))
    recs = records.load_records(drv.study)
    launched = [r for r in recs if r.budgeted]  # the re-question probes are outside the trial budget
    assert drv.stop_reason == "trial budget spent (60 launched)"
    assert len(launched) == 60
    keys = Counter(records.config_key(r.params) for r in launched)
    assert len(keys) == 60, [k for k, n in keys.items() if n > 1]
    # the sampler did repeat itself / propose dead ends: those were answered and replaced
    skipped = [r for r in recs if not r.launched]
    assert skipped, "the campaign's TPE never proposed a finished config or a dead end (test proves nothing)"
    drawn = [t for t in drv.study.trials if t.user_attrs.get(A_UNTRIED)]
    assert drawn and all(records.record_from_trial(t).launched for t in drawn if t.state.is_finished())
    # a drawn config is never one already measured before it
    seen: set[str] = set()
    for r in sorted(recs, key=lambda r: r.number):
        if r.launched:
            assert records.config_key(r.params) not in seen, r.number
        if r.status in ("ok", "failed"):
            seen.add(records.config_key(r.params))


def test_a_stepped_float_is_one_config_however_optuna_rounds_it(tmp_path):
    """Optuna suggests 0.7 + 1 x 0.1 as 0.7999999999999999 where the space's levels say 0.8: one
    config, one key, never launched twice."""
    assert records.config_key({"f": 0.7999999999999999}) == records.config_key({"f": 0.8})
    assert records.config_key({"f": 0.8}) != records.config_key({"f": 0.9})
    drv = run_in_process(_spec(tmp_path, "sweep=smoke", "sweep.budget.trials=10", "sweep.budget.max_asks=300",
                               "+sweep.params.mem_fraction_static={type: float, low: 0.7, high: 0.9, step: 0.1}",
                               "+sweep.baseline.mem_fraction_static=0.8"))
    launched = [r for r in records.load_records(drv.study) if r.launched]
    keys = Counter(records.config_key(r.params) for r in launched)
    assert len(launched) >= 6 and len(keys) == len(launched), [k for k, n in keys.items() if n > 1]


def test_exhausted_means_nothing_untried_and_feasible_is_left(tmp_path):
    # smoke: 3 allreduce levels x 3 graph sizes; flashinfer_fusion fails on SM120 (a rule then
    # refuses its other sizes) and custom silently degrades to NCCL (its other sizes are skipped)
    drv = run_in_process(_spec(tmp_path, "sweep=smoke", "sweep.budget.trials=20", "sweep.budget.max_asks=500"))
    recs = records.load_records(drv.study)
    launched = [r for r in recs if r.launched]
    assert drv.stop_reason == EXHAUSTED
    assert len({records.config_key(r.params) for r in launched}) == len(launched) == 5
    assert {r.params["cuda_graph_max_bs"] for r in launched if r.params["allreduce"] == "nccl"} == {64, 128, 512}
    # the same command again: the study resumes used up, and asks the sampler nothing more
    asked = len(drv.study.trials)
    again = run_in_process(_spec(tmp_path, "sweep=smoke", "sweep.budget.trials=20", "sweep.budget.max_asks=500"))
    assert again.stop_reason == EXHAUSTED
    assert len(again.study.trials) == asked, [t.params for t in again.study.trials[asked:]]


def test_draw_walks_a_finite_space_once_then_reports_exhaustion():
    space = parse_space({"a": {"type": "categorical", "choices": [1, 2, 3]}, "b": {"type": "int", "low": 0, "high": 3}},
                        [{"name": "no_3_3", "expr": "not (a == 3 and b == 3)"}])
    d = UntriedDraw(space, seed=1)
    taken: set[str] = set()
    got = []
    while (cfg := d.draw(taken, lambda c: c["b"] != 0)) is not None:
        got.append(cfg)
        taken.add(records.config_key(cfg))
    assert len(got) == 3 * 3 - 1  # b=0 refused, (3, 3) infeasible
    assert len({records.config_key(c) for c in got}) == len(got)
    assert UntriedDraw(space, seed=1).draw(set(), lambda c: True) == UntriedDraw(space, seed=1).draw(set(), lambda c: True)


def test_draw_takes_the_untried_config_nearest_the_proposal():
    space = parse_space({"a": {"type": "categorical", "choices": [1, 2, 3]}, "b": {"type": "categorical", "choices": [1, 2, 3]},
                         "c": {"type": "categorical", "choices": [1, 2, 3]}}, [])
    proposal = {"a": 2, "b": 2, "c": 2}
    taken = {records.config_key(proposal)}
    for seed in range(5):
        got = UntriedDraw(space, seed=seed).draw(taken, lambda c: True, near=proposal)
        assert got is not None and distance(got, proposal) == 1, got  # one knob changed, not a uniform draw
    # a refused neighbourhood moves one step further out
    got = UntriedDraw(space, seed=0).draw(taken, lambda c: distance(c, proposal) > 1, near=proposal)
    assert got is not None and distance(got, proposal) == 2


def _recs(rows):
    return [records.TrialRecord(n, "COMPLETE", params, "ok", {"decode_tok_s": v}) for n, (params, v) in enumerate(rows)]


def _picks(space, recs, near, model, seeds=range(8)):
    taken = {records.config_key(r.params) for r in recs}
    return {records.config_key(d) for s in seeds
            if (d := UntriedDraw(space, seed=s).draw(taken, lambda c: True, near=near, model=model)) is not None}


def test_equally_near_the_draw_adds_the_level_that_won_elsewhere_first():
    """The far landscape's move: the incumbent won with a=2 (b=1), another trial showed b=3 is
    the best b; among the incumbent's untried neighbours the one adding b=3 comes first on every
    seed, where the seeded order alone picks other neighbours too."""
    from sweeps.config.objective import ObjectiveSet
    from sweeps.search.untried import level_model

    space = parse_space({"a": {"type": "categorical", "choices": [1, 2, 3]},
                         "b": {"type": "categorical", "choices": [1, 2, 3]}}, [])
    objs = ObjectiveSet.from_config("decode_tok_s", "maximize")
    recs = _recs([({"a": 1, "b": 1}, 80.0), ({"a": 2, "b": 1}, 100.0), ({"a": 1, "b": 3}, 95.0), ({"a": 1, "b": 2}, 70.0)])
    model = level_model(recs, objs)
    assert model.effect("b", 3) > 0 > model.effect("b", 2) and model.effect("a", 2) > 0
    assert model.counts[("b", "3")] == 1 and model.effect("a", 3) == 0.0
    incumbent = {"a": 2, "b": 1}
    assert _picks(space, recs, incumbent, model) == {records.config_key({"a": 2, "b": 3})}
    # without a model the same seeds pick other neighbours too (the test can tell the difference)
    assert len(_picks(space, recs, incumbent, None)) > 1


def test_the_draw_changes_a_barely_tried_knob_before_one_that_made_no_difference():
    """p and q were each run at both levels around the incumbent and changed nothing; a decided
    the value and its level 3 was never run. The incumbent's untried neighbours are p=2, q=2 (each
    run twice, no effect) and a=2 (run twice, worse) or a=3 (never run): a=3 comes first on every
    seed, where the best value seen with a level would rank the p and q swaps first (gain 0)."""
    from sweeps.config.objective import ObjectiveSet
    from sweeps.search.untried import level_model

    space = parse_space({"a": {"type": "categorical", "choices": [1, 2, 3]},
                         "p": {"type": "categorical", "choices": [1, 2]}, "q": {"type": "categorical", "choices": [1, 2]}}, [])
    objs = ObjectiveSet.from_config("decode_tok_s", "maximize")
    recs = _recs([({"a": 1, "p": 1, "q": 1}, 100.0), ({"a": 1, "p": 2, "q": 2}, 100.0),
                  ({"a": 2, "p": 1, "q": 2}, 90.0), ({"a": 2, "p": 2, "q": 1}, 90.0)])
    model = level_model(recs, objs)
    assert abs(model.effect("p", 2)) < 1e-9 and abs(model.effect("q", 2)) < 1e-9 and model.effect("a", 2) < 0
    incumbent = {"a": 1, "p": 1, "q": 1}
    assert _picks(space, recs, incumbent, model) == {records.config_key({"a": 3, "p": 1, "q": 1})}
    assert len(_picks(space, recs, incumbent, None)) > 1


def test_among_equal_gains_the_draw_changes_the_knob_seen_to_matter():
    """The campaign's first draw: the baseline and one seed differ in a (and their values differ),
    b was never varied. The incumbent's untried neighbours a=3 and b=2 are both unseen levels
    (equal gain): a=3 comes first on every seed, where the seeded order alone picks b=2 too."""
    from sweeps.config.objective import ObjectiveSet
    from sweeps.search.untried import level_model

    space = parse_space({"a": {"type": "categorical", "choices": [1, 2, 3]},
                         "b": {"type": "categorical", "choices": [1, 2]}}, [])
    objs = ObjectiveSet.from_config("decode_tok_s", "maximize")
    recs = _recs([({"a": 1, "b": 1}, 82.0), ({"a": 2, "b": 1}, 54.0)])
    model = level_model(recs, objs)
    incumbent = {"a": 1, "b": 1}
    assert model.gain({"a": 3, "b": 1}, incumbent) == model.gain({"a": 1, "b": 2}, incumbent)
    assert model.knob_ranges()["a"] > 0 == model.knob_ranges()["b"]
    assert _picks(space, recs, incumbent, model) == {records.config_key({"a": 3, "b": 1})}
    assert len(_picks(space, recs, incumbent, None)) > 1


def test_among_equal_gains_a_knob_seen_to_change_nothing_at_the_anchor_is_changed_last():
    """The far landscape's waste: g differed between the baseline and a seed that also changed d
    and s (which alone moved the baseline little), so its fitted range is the widest; but a trial
    that moved only g from the incumbent
    measured the same value. The incumbent's untried neighbours g=4 and d=3 are both unseen levels
    (equal gain): d=3 comes first on every seed, where the fitted ranges alone pick g=4."""
    from sweeps.config.objective import ObjectiveSet
    from sweeps.search.untried import level_model

    space = parse_space({"g": {"type": "categorical", "choices": [1, 2, 3, 4]},
                         "d": {"type": "categorical", "choices": [1, 2, 3]},
                         "s": {"type": "categorical", "choices": [1, 2]}}, [])
    objs = ObjectiveSet.from_config("decode_tok_s", "maximize")
    recs = _recs([({"g": 1, "d": 1, "s": 1}, 80.0), ({"g": 2, "d": 2, "s": 2}, 100.0),
                  ({"g": 3, "d": 2, "s": 2}, 100.0), ({"g": 1, "d": 2, "s": 1}, 81.0), ({"g": 1, "d": 1, "s": 2}, 81.0)])
    model = level_model(recs, objs)
    incumbent = {"g": 2, "d": 2, "s": 2}
    assert model.gain({**incumbent, "g": 4}, incumbent) == model.gain({**incumbent, "d": 3}, incumbent)
    fitted, here = model.knob_ranges(), model.knob_ranges(incumbent)
    assert fitted["g"] > fitted["d"] > 0 and here["g"] == 0.0 and here["d"] == fitted["d"]
    assert _picks(space, recs, incumbent, model) == {records.config_key({**incumbent, "d": 3})}


def test_a_direct_difference_at_the_anchor_never_raises_a_knobs_range():
    from sweeps.config.objective import ObjectiveSet
    from sweeps.search.untried import level_model

    objs = ObjectiveSet.from_config("decode_tok_s", "maximize")
    model = level_model(_recs([({"a": 1, "b": 1}, 80.0), ({"a": 2, "b": 1}, 100.0), ({"a": 2, "b": 2}, 60.0)]), objs)
    near = {"a": 2, "b": 1}
    assert model.knob_ranges(near) == model.knob_ranges()  # both direct differences exceed the fitted ranges
    assert model.knob_ranges({"a": 3, "b": 1}) == model.knob_ranges()  # an anchor never measured: fitted only


def test_the_level_model_of_a_minimised_objective_and_of_no_trial():
    from sweeps.config.objective import ObjectiveSet
    from sweeps.search.untried import LevelModel, level_model

    objs = ObjectiveSet.from_config("decode_tok_s", "minimize")
    model = level_model(_recs([({"a": 1}, 10.0), ({"a": 2}, 20.0)]), objs)
    assert model.effect("a", 1) > 0 > model.effect("a", 2)  # lower is better: a=1 is worth more
    assert level_model([], objs) == LevelModel({}, {}, 0.0)
    assert LevelModel({}, {}, 0.0).gain({"a": 1}, {"a": 2}) == 0.0


def test_an_untried_level_of_an_ordered_knob_is_read_from_its_neighbours():
    """Three, four and six draft steps measured in falling order: two steps (one beyond the
    tried range) is worth the trend's next step, one step no more than that; a level between two
    tried ones is their mean; an untried level of a categorical knob is worth nothing."""
    from sweeps.config.objective import ObjectiveSet
    from sweeps.search.untried import level_model, ordered_knobs

    objs = ObjectiveSet.from_config("decode_tok_s", "maximize")
    space = parse_space({"steps": {"type": "int", "low": 1, "high": 8}, "algo": {"type": "categorical", "choices": ["a", "b"]},
                         "on": {"type": "categorical", "choices": [True, False]}}, [])
    assert ordered_knobs(space) == {"steps"}
    recs = _recs([({"steps": 3, "algo": "a", "on": True}, 112.0), ({"steps": 4, "algo": "a", "on": True}, 104.0),
                  ({"steps": 6, "algo": "b", "on": True}, 95.0)])
    model = level_model(recs, objs, ordered_knobs(space))
    e3, e4, e6 = (model.effect("steps", n) for n in (3, 4, 6))
    assert e3 > e4 > e6
    assert model.effect("steps", 2) == pytest.approx(2 * e3 - e4) and model.effect("steps", 2) > e3
    assert model.effect("steps", 1) == model.effect("steps", 2)  # one step of the trend, however far
    assert model.effect("steps", 5) == pytest.approx((e4 + e6) / 2)
    assert model.effect("steps", 8) == pytest.approx(2 * e6 - e4) and model.effect("steps", 8) < e6
    assert model.effect("algo", "c") == 0.0 and model.effect("on", False) == 0.0
    # a tried level written as another number type is that level
    assert model.effect("steps", 4.0) == e4 and model.effect("steps", 3.5) == pytest.approx((e3 + e4) / 2)
    two = level_model(_recs([({"g": 64}, 100.0), ({"g": 512}, 90.0)]), objs, {"g"})
    assert two.effect("g", 64.0) == two.effect("g", 64) and two.effect("g", 32.0) > two.effect("g", 64)
    # one tried level is no trend, and a categorical's numbers are no order
    assert level_model(_recs([({"steps": 3}, 100.0)]), objs, {"steps"}).effect("steps", 2) == 0.0
    assert level_model(recs, objs).effect("steps", 2) == 0.0
    # the draw takes the trend's side: from three steps, two before five's neighbour six
    assert model.gain({"steps": 2, "algo": "a", "on": True}, {"steps": 3, "algo": "a", "on": True}) > \
        model.gain({"steps": 5, "algo": "a", "on": True}, {"steps": 3, "algo": "a", "on": True})


def test_draw_rejection_samples_a_continuous_space():
    space = parse_space({"x": {"type": "float", "low": 0.0, "high": 1.0}, "k": {"type": "categorical", "choices": ["a"]}},
                        [{"name": "upper", "expr": "x > 0.5"}])
    d = UntriedDraw(space, seed=0)
    cfg = d.draw(set(), lambda c: True)
    assert cfg is not None and cfg["x"] > 0.5 and not d.exact
    assert UntriedDraw(space, seed=0).draw(set(), lambda c: False) is None


@pytest.mark.parametrize("cap", [3])
def test_max_consecutive_skips_is_a_safety_net_not_the_exhaustion_test(tmp_path, cap):
    """With redirection a skip is followed by a launch, so skips in a row stay below the cap on a
    space with untried configs left: the budget, not the cap, ends the sweep."""
    drv = run_in_process(_spec(tmp_path, "sweep=eagle3_allreduce", "sweep.budget.trials=25",
                               f"sweep.budget.max_consecutive_skips={cap}"))
    assert drv.stop_reason == "trial budget spent (25 launched)"


def test_a_change_a_constraint_forces_counts_with_the_change_that_forced_it():
    """From EAGLE-3's 3 steps / 4 draft tokens (top-k 1), 1 step alone breaks ``num_draft_tokens
    <= topk x num_steps + 1``: 1 step with the 2 draft tokens it allows is one move, as near as a
    one-knob change; two changes neither of which alone breaks a constraint stay two."""
    space = parse_space({"steps": {"type": "int", "low": 1, "high": 3}, "topk": {"type": "categorical", "choices": [1, 2]},
                         "tokens": {"type": "int", "low": 2, "high": 4}},
                        [{"name": "fit", "expr": "tokens <= topk * steps + 1"}])
    here = {"steps": 3, "topk": 1, "tokens": 4}
    draw = UntriedDraw(space, seed=0)
    assert draw.move_distance({"steps": 1, "topk": 1, "tokens": 2}, here) == 1
    assert draw.move_distance({"steps": 2, "topk": 1, "tokens": 3}, here) == 1  # 2 steps alone fits 3 tokens, not 4
    assert draw.move_distance({"steps": 3, "topk": 2, "tokens": 3}, here) == 2  # neither change alone breaks it
    assert draw.move_distance({"steps": 2, "topk": 1, "tokens": 4}, here) == 1  # one knob: as before
    # the draw reaches the one-step shape among its nearest candidates
    taken = {records.config_key(here)}
    picks = {records.config_key(d) for s in range(20)
             if (d := UntriedDraw(space, seed=s).draw(taken, lambda c: True, near=here)) is not None}
    assert records.config_key({"steps": 1, "topk": 1, "tokens": 2}) in picks


def test_from_an_infeasible_anchor_no_pair_of_changes_counts_as_one():  # a guard of the rule above
    space = parse_space({"steps": {"type": "int", "low": 1, "high": 3}, "topk": {"type": "categorical", "choices": [1, 2]},
                         "tokens": {"type": "int", "low": 2, "high": 4}},
                        [{"name": "fit", "expr": "tokens <= topk * steps + 1"}])
    bad = {"steps": 1, "topk": 1, "tokens": 4}  # a redirect's fallback anchor may be the refused proposal
    assert UntriedDraw(space, seed=0).move_distance({"steps": 2, "topk": 2, "tokens": 4}, bad) == 2


def _measured_study(space_def, rows):
    """An in-memory study holding ``rows`` of ``(params, tok/s)``, measured ok."""
    import optuna

    study = optuna.create_study(direction="maximize")
    for params, value in rows:
        dist = {k: optuna.distributions.CategoricalDistribution(space_def[k]["choices"]) for k in params}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dist, value=value,
                                                  user_attrs={"status": "ok", "metrics": {"decode_tok_s": value}}))
    return study


_REPAIR_SPACE = {"spec": {"type": "categorical", "choices": ["none", "eagle3"]},
                 "ar": {"type": "categorical", "choices": ["nccl", "custom", "dead"]},
                 "g": {"type": "categorical", "choices": [8, 64, 512]},
                 "steps": {"type": "categorical", "choices": [1, 3, 5]}}


@pytest.mark.parametrize("eagle_wins", [True, False])
def test_a_proposal_with_a_dead_level_is_repaired_when_its_other_choices_look_better(eagle_wins):
    """After a rule answers a proposal (``ar=dead``), the draw keeps the sampler's other choices
    (EAGLE-3 and 64 graphs: two knobs from the incumbent besides the dead one) and swaps the dead
    level when the level model rates that above the incumbent's neighbour (each choice measured
    well on its own); where EAGLE-3 measured badly the incumbent's neighbour is drawn, as before."""
    import optuna

    from sweeps.search.untried import redirect
    from sweeps.store.study import DEFAULT_OBJECTIVES

    space = parse_space(_REPAIR_SPACE)
    incumbent = {"spec": "none", "ar": "custom", "g": 512, "steps": 3}
    study = _measured_study(_REPAIR_SPACE, [
        ({"spec": "none", "ar": "nccl", "g": 512, "steps": 3}, 80.0), (incumbent, 90.0),
        ({"spec": "none", "ar": "nccl", "g": 64, "steps": 3}, 88.0),
        ({"spec": "eagle3", "ar": "nccl", "g": 512, "steps": 3}, 87.0 if eagle_wins else 40.0)])
    proposal = {"spec": "eagle3", "ar": "dead", "g": 64, "steps": 3}
    assert redirect(study, UntriedDraw(space, seed=0), [], lambda c: c["ar"] != "dead", DEFAULT_OBJECTIVES, proposal,
                    "rule")
    got = dict(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))[0].system_attrs["fixed_params"])
    if eagle_wins:  # the proposal with the dead level swapped
        assert distance(got, proposal) == 1 and got["ar"] != "dead", got
    else:  # one knob from the incumbent
        assert distance(got, incumbent) == 1 and got["spec"] == "none", got


def test_a_repair_is_not_preferred_for_the_knobs_its_approach_turns_on():
    """EAGLE-3 measured far below plain decoding (10 against 80-90 tok/s) and turns on three draft
    knobs of its own, all at untried levels: their optimism does not outweigh EAGLE-3's measured
    effect, and the incumbent's neighbour (plain decoding) is drawn."""
    import optuna

    from sweeps.search.untried import redirect
    from sweeps.store.study import DEFAULT_OBJECTIVES

    e = {"spec": "eagle3"}
    space_def = {**_REPAIR_SPACE, "steps": {"type": "categorical", "choices": [1, 3, 5], "when": e},
                 "topk": {"type": "categorical", "choices": [1, 4, 8], "when": e},
                 "tokens": {"type": "categorical", "choices": [2, 4, 8], "when": e}}
    space = parse_space(space_def)
    incumbent = {"spec": "none", "ar": "custom", "g": 512}
    study = _measured_study(space_def, [
        ({"spec": "none", "ar": "nccl", "g": 512}, 80.0), (incumbent, 90.0), ({"spec": "none", "ar": "nccl", "g": 64}, 88.0),
        ({"spec": "eagle3", "ar": "nccl", "g": 512, "steps": 3, "topk": 1, "tokens": 4}, 10.0)])
    proposal = {"spec": "eagle3", "ar": "dead", "g": 64, "steps": 5, "topk": 8, "tokens": 8}
    assert redirect(study, UntriedDraw(space, seed=0), [], lambda c: c["ar"] != "dead", DEFAULT_OBJECTIVES, proposal,
                    "rule")
    got = dict(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))[0].system_attrs["fixed_params"])
    assert got["spec"] == "none" and distance(got, incumbent) == 1, got


def _reference_draw(draw, taken, allowed, near, model):
    """The draw's order rated config by config (the definition the coded ranking must match)."""
    gain = model.gain if model is not None else (lambda c, n: 0.0)
    ranges = model.knob_ranges(near) if model is not None else {}

    def key(c):
        moved = max((ranges.get(k, 0.0) for k, v in c.items() if near.get(k) != v), default=0.0)
        return draw.move_distance(c, near), -round(gain(c, near), 9), -moved
    for cfg in sorted(draw._candidates(), key=key):
        if records.config_key(cfg) not in taken and allowed(cfg):
            return cfg
    return None


def test_the_coded_ranking_draws_what_rating_each_config_draws_on_the_campaign_space(tmp_path):
    """On the campaign space (constraints, inactive draft knobs, ~37k configs), with fitted level
    models, taken configs and a knowledge filter, the draw picks exactly the config the per-config
    rating picks, for anchors feasible and not, inside the space and outside it."""
    import random

    from sweeps.search.untried import level_model
    from sweeps.store.study import DEFAULT_OBJECTIVES

    space = _spec(tmp_path, "sweep=eagle3_allreduce").space
    rng = random.Random(7)
    draw = UntriedDraw(space, seed=3)
    every = list(draw._candidates())
    checked = 0
    for case in range(12):
        measured = rng.sample(every, 3 + case * 3)
        recs = _recs([(p, rng.uniform(40, 90)) for p in measured])
        model = level_model(recs, DEFAULT_OBJECTIVES, ordered_knobs(space)) if case % 4 else None
        taken = {records.config_key(p) for p in measured}
        anchor = dict(rng.choice(measured))
        if case % 3 == 1:  # an infeasible anchor: one knob moved off its constraint
            anchor = {**anchor, "cuda_graph_max_bs": 512, "eagle_num_draft_tokens": 8} \
                if "eagle_num_draft_tokens" in anchor else {**anchor, "outside_the_space": 1}
        dead = rng.choice(sorted({str(p.get("allreduce")) for p in every}))

        def allowed(c, dead=dead):
            return str(c.get("allreduce")) != dead
        got = draw.draw(taken, allowed, near=anchor, model=model)
        assert got == _reference_draw(draw, taken, allowed, anchor, model), (case, anchor)
        checked += got is not None
    assert checked == 12
