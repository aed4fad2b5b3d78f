"""Fair coverage of the approaches a sweep compares (``sweep.approaches``,
:mod:`sweeps.search.coverage`) and the findings' coverage reasons (the knob of the rule that
excluded a level)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sweeps.app.inprocess import run_in_process
from sweeps.config.space import parse_space
from sweeps.config.spec import ApproachesConfig, ConfigError, load_spec
from sweeps.publish.findings.context import Context, context_from_spec
from sweeps.publish.findings.untried import coverage_lines, untried_section
from sweeps.search.coverage import A_APPROACH_QUOTA, Coverage, changed_knobs
from sweeps.store import records
from tests.conftest import compose_cfg

SPACE = parse_space({"speculative": {"type": "categorical", "choices": ["none", "eagle3"]},
                     "g": {"type": "categorical", "choices": [8, 64]},
                     "moe": {"type": "categorical", "choices": ["none", "flashinfer"]},
                     "steps": {"type": "int", "low": 1, "high": 2, "when": {"speculative": "eagle3"}}})


def _rec(n: int, spec: str, status: str = "ok", **params) -> records.TrialRecord:
    return records.TrialRecord(n, "COMPLETE", {"speculative": spec, "g": 8, "moe": "none", **params}, status,
                         {"decode_tok_s": 80.0 + n} if status == "ok" else {})


def test_an_approach_below_its_share_is_due_and_the_most_behind_first():
    cov = Coverage(ApproachesConfig(knob="speculative", min_share=0.3), SPACE)
    recs = [_rec(i, "none") for i in range(6)] + [_rec(6, "eagle3")]
    assert cov.due(recs, []) == "eagle3"  # 1 < 0.3 x 8
    # in-flight launches count: with two EAGLE-3 configs running it is at its share (3 >= 0.3 x 10)
    assert cov.due(recs, [{"speculative": "eagle3"}, {"speculative": "eagle3"}]) is None
    # skips and duplicates are not launches
    skipped = [records.TrialRecord(10 + i, "PRUNED", {"speculative": "eagle3"}, "skipped") for i in range(5)]
    assert cov.due(recs + skipped, []) == "eagle3"
    assert cov.shares(recs)["eagle3"] == (1, pytest.approx(1 / 7))


def test_shares_that_cannot_fit_are_refused_before_any_launch(tmp_path):
    with pytest.raises(ConfigError, match=r"sweep.approaches.min_share: 0.6 x 2 levels"):
        load_spec(compose_cfg(["backend=instant", "sweep=eagle3_allreduce", "sweep.approaches.min_share=0.6",
                               f"tracking.store_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"sweep.approaches.knob: 'eagle_topk' is active only under"):
        load_spec(compose_cfg(["backend=instant", "sweep=eagle3_allreduce", "sweep.approaches.knob=eagle_topk",
                               f"tracking.store_dir={tmp_path}"]))


def _campaign(tmp_path, seed: int, *extra: str):
    store = tmp_path / f"store{seed}"
    return run_in_process(load_spec(compose_cfg([
        "backend=instant", "sweep=eagle3_allreduce", "sweep.budget.wall_time_s=null", "sweep.confirm.top_k=0",
        f"sweep.sampler.seed={seed}", *extra, f"tracking.store_dir={store}",
        f"tracking.findings_dir={store / 'findings'}"])))


@pytest.mark.timeout(900)  # a 30-launch campaign: ~1.5 min on 2 idle cores, 5 min on a loaded box
@pytest.mark.slow  # a 30-launch campaign per seed
@pytest.mark.parametrize("seed", [0, 1])
def test_the_campaign_gives_eagle3_at_least_30_percent_of_its_launches(tmp_path, seed):
    """EAGLE-3 is paid its 9 of the 30 launches by the end of the trial budget whatever it
    measures, its draft shapes chosen by TPE; no launch is pinned to it before the launches left
    (30 - launches so far) no longer exceed what it is owed."""
    drv = _campaign(tmp_path, seed)
    recs = records.load_records(drv.study)
    # the trial budget's launches: the re-question probes of known dead ends are probe-only launches
    # outside it (records.TrialRecord.budgeted), neither owed to an approach nor counted against one
    launched = [r for r in recs if r.budgeted]
    assert drv.stop_reason == "trial budget spent (30 launched)" and len(launched) == 30
    eagle = [r for r in launched if r.params["speculative"] == "eagle3"]
    assert len(eagle) / len(launched) >= 0.3, (len(eagle), len(launched))
    # pinned asks leave the draft shape to TPE: the EAGLE-3 launches are not one shape repeated
    assert len({(r.params["eagle_num_steps"], r.params["eagle_topk"], r.params["eagle_num_draft_tokens"])
                for r in eagle}) >= 4
    pinned = [t.number for t in drv.study.trials if t.user_attrs.get(A_APPROACH_QUOTA) == "eagle3"]
    assert pinned
    # a pin is asked with >= 21 launches before it (finished or in flight: all have smaller trial numbers)
    assert all(sum(r.number < t for r in launched) >= 30 - 9 for t in pinned), (pinned, [r.number for r in launched])
    # every launch is a distinct config (the quota never re-launches a dead end or a finished config)
    assert len({records.config_key(r.params) for r in launched}) == len(launched)
    lines = coverage_lines(context_from_spec(drv.spec, drv.study_name, drv.fingerprint, None), launched)
    assert lines[0].startswith("- approaches (`speculative`, min share 30 % of the 30-launch trial budget (9 launches), "
                               "owed by its end): none ") and "below the share" not in lines[0]
    assert not any("quota" in x for x in lines)


@pytest.mark.timeout(600)
@pytest.mark.slow  # the campaign's first launches and a findings write over its 37 296 configs
def test_a_campaign_stopped_before_its_trial_budget_says_the_quota_was_not_paid(tmp_path):
    """Stopped by a limit long before its 30 launches (here ``max_asks``, deterministic; a
    ``wall_time_s`` stop takes the same path), the campaign has not paid EAGLE-3's quota (it
    falls due only at the end of the trial budget): the findings document says so, with the
    stop reason and its knob, read from the study."""
    from sweeps.publish.findings import update_findings

    drv = run_in_process(load_spec(compose_cfg([
        "backend=instant", "sweep=eagle3_allreduce", "sweep.budget.wall_time_s=null", "sweep.budget.max_asks=12",
        "sweep.confirm.top_k=0", "sweep.serving_check=false", f"tracking.store_dir={tmp_path}",
        f"tracking.findings_dir={tmp_path / 'findings'}"])))
    assert drv.stop_reason == "max_asks reached (12)"
    recs = records.load_records(drv.study)
    n = sum(r.budgeted for r in recs)
    eagle = sum(r.budgeted and r.params["speculative"] == "eagle3" for r in recs)
    assert 0 < n < 21 and eagle < 9, (n, eagle)
    text = update_findings(drv.spec, drv.study, recs, drv.fingerprint, None, path=tmp_path / "f.md").read_text()
    # each approach still short of its 9 is named (plain decoding too, when the 12 asks bought fewer than 9 of it)
    owed = ", ".join(f"`speculative={v}` {9 - k} more of its 9" for v, k in (("none", n - eagle), ("eagle3", eagle)) if k < 9)
    assert (f"- quota not paid: {owed} launches. The sweep stopped after "
            f"{n} of its 30-launch trial budget (max_asks reached (12): `sweep.budget.max_asks`)") in text


@pytest.mark.timeout(900)
@pytest.mark.slow  # a 30-launch campaign
def test_the_campaign_can_release_eagle3s_quota_once_it_is_separated_below(tmp_path):
    """Opt-in ``release_below``: EAGLE-3 (about 35 % below plain decoding on this node) has its
    quota released once one of its launches is ok, then the sampler alone decides; the findings'
    coverage section states the evidence, and no quota pin follows the release."""
    drv = _campaign(tmp_path, 0, "sweep.approaches.release_below=0.1")
    launched = [r for r in records.load_records(drv.study) if r.launched]
    eagle = [r for r in launched if r.params["speculative"] == "eagle3"]
    ok = [r for r in eagle if r.status == "ok"]
    assert ok and len(eagle) / len(launched) < 0.3, (len(eagle), len(launched))
    lines = coverage_lines(context_from_spec(drv.spec, drv.study_name, drv.fingerprint, None), launched)
    assert lines[1].startswith("- quota of `speculative=eagle3` released: its best of ") and "% below none's best" in lines[1]
    first_ok = min(r.number for r in ok)
    pinned = {t.number for t in drv.study.trials if t.user_attrs.get(A_APPROACH_QUOTA) == "eagle3"}
    # no quota pin once released (one may have been enqueued while the first ok launch ran)
    assert len({n for n in pinned if n > first_ok}) <= 1, (sorted(pinned), first_ok)
    assert not any(x.startswith("- quota owed") or x.startswith("- quota not paid") for x in lines)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_without_approaches_the_sampler_alone_decides(tmp_path):
    """The same campaign with the quota off: EAGLE-3 gets fewer launches (what the quota fixes)."""
    drv = _campaign(tmp_path, 0, "sweep.approaches=null")
    launched = [r for r in records.load_records(drv.study) if r.launched]
    eagle = [r for r in launched if r.params["speculative"] == "eagle3"]
    assert len(eagle) / len(launched) < 0.3
    assert not any(t.user_attrs.get(A_APPROACH_QUOTA) for t in drv.study.trials)


def _ctx(rules):
    return Context(study="s", space=SPACE, rules=rules, approaches={"knob": "speculative", "min_share": 0.3})


def test_a_never_launched_level_names_the_knob_of_the_rule_that_skipped_it():
    """``steps`` 2 was proposed only with ``moe=flashinfer``: the reason names that rule's knob,
    not ``steps``; a level nothing excluded is "not proposed yet"."""
    rule = SimpleNamespace(id=4, knobs={"moe": "flashinfer"}, failure_class="moe_a2a_unsupported")
    recs = [_rec(0, "none"), _rec(1, "eagle3", steps=1), _rec(2, "none", g=64),
            records.TrialRecord(3, "PRUNED", {"speculative": "eagle3", "g": 8, "moe": "flashinfer", "steps": 2},
                          "skipped", skipped_by_rule="4")]
    text = "\n".join(untried_section(_ctx([rule]), recs, {}, []))
    assert ("`steps` (when speculative=['eagle3']): never launched: 2 (its proposals were skipped by dead ends "
            "on other knobs: rule #4 (moe=flashinfer, moe_a2a_unsupported))") in text
    assert "`moe`: never launched: flashinfer (a dead end of this level itself: rule #4" in text
    assert "only skipped by a known dead end" not in text
    recs = recs[:3]
    assert "never launched: 2 (not proposed yet)" in "\n".join(untried_section(_ctx([rule]), recs, {}, []))


def test_coverage_lines_count_launches_per_approach_and_level():
    recs = [_rec(i, "none") for i in range(7)] + [_rec(7, "eagle3", steps=1), _rec(8, "eagle3", steps=2, g=64)]
    lines = coverage_lines(_ctx([]), recs)
    assert lines[0] == ("- approaches (`speculative`, min share 30 %): none 7 (78 %), eagle3 2 (22 %); "
                        "below the share: eagle3")
    assert "- `g`: 8 8 (89 %), 64 1 (11 %)" in lines
    assert "- `steps`: 1 1 (50 %), 2 1 (50 %)" in lines  # of the launches that set it (EAGLE-3 only)


def _val(n: int, spec: str, value: float, status: str = "ok", **params) -> records.TrialRecord:
    return records.TrialRecord(n, "COMPLETE", {"speculative": spec, "g": 8, "moe": "none", **params}, status,
                               {"decode_tok_s": value} if status == "ok" else {})


def test_a_quota_is_released_once_the_approach_is_separated_below_the_other():
    """Opt-in (``release_below``): EAGLE-3 below its share is due; once it has ``release_after``
    (here 2) ok launches whose best is more than 10 % below plain decoding's best, its quota is
    released (not due), with the evidence; release_after 1 releases after one; off by default."""
    cov = Coverage(ApproachesConfig(knob="speculative", min_share=0.3, release_below=0.1, release_after=2), SPACE)
    plain = [_val(i, "none", 85.0 + i) for i in range(6)]  # best: t5, 90 tok/s
    one = plain + [_val(6, "eagle3", 58.0, steps=1)]
    assert cov.due(one, []) == "eagle3" and cov.released(one) == {}  # one ok launch is not enough here
    assert Coverage(ApproachesConfig(knob="speculative", min_share=0.3, release_below=0.1),
                    SPACE).due(one, []) is None  # release_after 1
    assert Coverage(ApproachesConfig(knob="speculative", min_share=0.3), SPACE).released(one) == {}  # off by default
    failed = one + [_val(7, "eagle3", 0.0, status="failed", steps=2)]
    assert cov.due(failed, []) == "eagle3"  # a failed launch is no evidence of its speed
    two = one + [_val(7, "eagle3", 60.0, steps=2)]
    rel = cov.released(two)
    assert set(rel) == {"eagle3"} and rel["eagle3"]["trial"] == 7 and rel["eagle3"]["other_trial"] == 5
    assert rel["eagle3"]["gap"] == pytest.approx(1 - 60.0 / 90.0) and rel["eagle3"]["launches"] == 2
    assert cov.due(two, []) is None  # 2 of 8 launches, below its share, but released
    # within the margin (> 90 % of the plain best) it stays due
    close = one + [_val(7, "eagle3", 82.0, steps=2)]
    assert cov.released(close) == {} and cov.due(close, []) == "eagle3"
    # release off: the quota holds whatever the evidence
    off = Coverage(ApproachesConfig(knob="speculative", min_share=0.3, release_below=None), SPACE)
    assert off.released(two) == {} and off.due(two, []) == "eagle3"
    # a minimised objective: released when its best is more than 10 % *above* the other's
    from sweeps.config.objective import Objective

    lat = Coverage(ApproachesConfig(knob="speculative", min_share=0.3, release_below=0.1, release_after=2), SPACE,
                   Objective("decode_tok_s", "minimize"))
    assert set(lat.released(two)) == {"none"}  # plain decoding's best (85) is > 10 % above EAGLE-3's (58)


def test_the_findings_state_the_evidence_of_a_released_quota():
    recs = [_val(i, "none", 85.0 + i) for i in range(6)] + [_val(6, "eagle3", 58.0, steps=1),
                                                             _val(7, "eagle3", 60.0, steps=2)]
    ctx = _ctx([])
    ctx.approaches = {**ctx.approaches, "release_below": 0.1, "release_after": 2}
    lines = coverage_lines(ctx, recs)
    assert lines[0].startswith("- approaches (`speculative`, min share 30 %): none 6 (75 %), eagle3 2 (25 %)")
    assert lines[1] == ("- quota of `speculative=eagle3` released: its best of 2 ok launches, t7 60.0 tok/s, is 33 % "
                        "below none's best t5 90.0 tok/s (more than the 10 % release margin, after at least 2 ok "
                        "launches): the sampler alone chooses from here")
    assert not any("released" in x for x in coverage_lines(_ctx([]), recs[:6]))  # no EAGLE-3 evidence: nothing released


def test_the_quota_is_owed_by_the_end_of_the_trial_budget():
    """With a trial budget of 10 and min share 0.3, EAGLE-3 is owed 3 launches: the sampler
    decides while the launches left exceed what is owed, then EAGLE-3 is due until it is paid;
    in-flight launches count as launches."""
    cov = Coverage(ApproachesConfig(knob="speculative", min_share=0.3), SPACE, budget=10)
    assert cov.quota() == 3
    assert Coverage(ApproachesConfig(knob="speculative", min_share=0.3), SPACE, budget=30).quota() == 9  # not 10
    six = [_rec(i, "none") for i in range(6)]
    assert cov.owed(six, []) == {"eagle3": 3} and cov.due(six, []) is None  # 4 left > 3 owed: exploit
    seven = [_rec(i, "none") for i in range(7)]
    assert cov.due(seven, []) == "eagle3"  # 3 left, 3 owed
    assert cov.due(six, [{"speculative": "none"}]) == "eagle3"  # the same with one launch in flight
    paid_one = seven[:6] + [_rec(6, "eagle3", steps=1)]
    assert cov.owed(paid_one, []) == {"eagle3": 2} and cov.due(paid_one, []) is None  # 3 left > 2 owed
    assert cov.due(paid_one + [_rec(7, "none")], []) == "eagle3"  # 2 left, 2 owed
    paid = [_rec(i, "none") for i in range(4)] + [_rec(4 + i, "eagle3", steps=1) for i in range(3)]
    assert cov.owed(paid, []) == {} and cov.due(paid, []) is None  # paid (3 left): the sampler decides
    # both owed (min share 0.5: the whole budget is owed): the one owed most first
    both = Coverage(ApproachesConfig(knob="speculative", min_share=0.5), SPACE, budget=10)
    assert both.due([_rec(0, "none"), _rec(1, "none"), _rec(2, "eagle3")], []) == "eagle3"  # owed 3 and 4
    assert both.due([_rec(0, "eagle3"), _rec(1, "eagle3"), _rec(2, "none")], []) == "none"
    assert both.due([], []) == "none"  # a tie: the knob's level order
    # without a trial budget the quota is a running one (due as soon as a level is below its share)
    assert Coverage(ApproachesConfig(knob="speculative", min_share=0.3), SPACE).due(six, []) == "eagle3"


def test_the_findings_say_a_quota_is_owed_and_why_it_was_not_paid():
    """While the sweep runs the coverage section says what is still owed; after a stop before the
    trial budget it says the quota was not paid, with the stop reason and its knob; nothing once
    paid."""
    ctx = _ctx([])
    ctx.trial_budget = 10
    recs = [_rec(i, "none") for i in range(5)] + [_rec(5, "eagle3", steps=1)]
    lines = coverage_lines(ctx, recs)
    assert lines[0] == ("- approaches (`speculative`, min share 30 % of the 10-launch trial budget (3 launches), "
                        "owed by its end): none 5 (83 %), eagle3 1 (17 %); below the share: eagle3")
    assert lines[1] == ("- quota owed: `speculative=eagle3` 2 more of its 3 launches by the end of the 10-launch "
                        "trial budget (6 launched; the sampler chooses freely while the launches left exceed what "
                        "is owed)")
    ctx.stop_reason = "wall-time budget spent (480 s)"
    line = coverage_lines(ctx, recs)[1]
    assert line.startswith("- quota not paid: `speculative=eagle3` 2 more of its 3 launches. The sweep stopped after "
                           "6 of its 10-launch trial budget (wall-time budget spent (480 s): `sweep.budget.wall_time_s`)")
    paid = [_rec(i, "none") for i in range(7)] + [_rec(7 + i, "eagle3", steps=1) for i in range(3)]
    ctx.stop_reason = "trial budget spent (10 launched)"
    lines = coverage_lines(ctx, paid)
    assert "below the share" not in lines[0] and not any("quota" in x for x in lines)


def test_a_level_not_launched_under_an_owed_approach_says_the_quota_is_owed():
    """``steps`` is active only under EAGLE-3: while EAGLE-3 is still owed launches (or was not
    paid them), its never-launched levels say so besides their own reason."""
    ctx = _ctx([])
    ctx.trial_budget = 10
    recs = [_rec(i, "none") for i in range(5)] + [_rec(5, "eagle3", steps=1)]
    text = "\n".join(untried_section(ctx, recs, {}, []))
    assert ("`steps` (when speculative=['eagle3']): never launched: 2 (not proposed yet; `speculative=eagle3` is "
            "still owed 2 of its 3 launches)") in text
    ctx.stop_reason = "wall-time budget spent (480 s)"
    assert "still owed 2 of its 3 launches: the sweep stopped (wall-time budget spent (480 s)))" in \
        "\n".join(untried_section(ctx, recs, {}, []))
    paid = [_rec(i, "none") for i in range(7)] + [_rec(7 + i, "eagle3", steps=1) for i in range(3)]
    assert "never launched: 2 (not proposed yet)" in "\n".join(untried_section(ctx, paid, {}, []))


def test_approaches_in_the_race_are_compared_on_equal_footing():
    """Two approaches whose bests lie within ``compare_within`` (default 10 %) of the leader are
    compared with their shared knobs alike: each one's best takes one differing shared knob of
    the other's best, the leader's approach first; a conditional knob (EAGLE-3's steps) stays
    with its approach. Further apart, only the leader takes the other's shared knobs; with
    ``compare_within`` null there is nothing to compare."""
    cov = Coverage(ApproachesConfig(knob="speculative"), SPACE)
    plain = _val(0, "none", 90.0, g=64)
    eagle = _val(1, "eagle3", 88.0, steps=2, moe="flashinfer")
    crosses = cov.crosses([plain, eagle])
    assert crosses == [
        ({"speculative": "none", "g": 8, "moe": "none"}, 0, 1),
        ({"speculative": "none", "g": 64, "moe": "flashinfer"}, 0, 1),
        ({"speculative": "eagle3", "g": 64, "moe": "flashinfer", "steps": 2}, 1, 0),
        ({"speculative": "eagle3", "g": 8, "moe": "none", "steps": 2}, 1, 0)]
    # an approach more than 10 % behind is not in the race: only the leader takes its knobs
    assert cov.crosses([plain, _val(1, "eagle3", 78.0, steps=2, moe="flashinfer")]) == [
        ({"speculative": "none", "g": 8, "moe": "none"}, 0, 1),
        ({"speculative": "none", "g": 64, "moe": "flashinfer"}, 0, 1)]
    assert Coverage(ApproachesConfig(knob="speculative", compare_within=None), SPACE).crosses([plain, eagle]) == []
    # one approach alone, or the same shared knobs: nothing to compare
    assert cov.crosses([plain]) == []
    assert cov.crosses([plain, _val(1, "eagle3", 88.0, steps=2, g=64)]) == []


def test_the_leader_takes_only_what_a_trailing_approach_chose_otherwise_than_the_baseline():
    """A knob the far-behind approach's best left at the baseline's setting (8 graphs) is no
    evidence about the knob: the leader takes only the level that best chose (the MoE backend)."""
    cov = Coverage(ApproachesConfig(knob="speculative"), SPACE)
    base = records.TrialRecord(2, "COMPLETE", {"speculative": "none", "g": 8, "moe": "none"}, "ok",
                               {"decode_tok_s": 70.0}, is_baseline=True)
    plain = _val(0, "none", 90.0, g=64)
    eagle = _val(1, "eagle3", 60.0, steps=2, moe="flashinfer")  # g=8, as the baseline
    assert cov.crosses([plain, eagle, base]) == [({"speculative": "none", "g": 64, "moe": "flashinfer"}, 0, 1)]
    # in the race, every differing shared knob is compared, the baseline's setting too
    close = _val(1, "eagle3", 88.0, steps=2, moe="flashinfer")
    assert ({"speculative": "none", "g": 8, "moe": "none"}, 0, 1) in cov.crosses([plain, close, base])


def _bench_far(tmp_path, *extra: str):
    from pathlib import Path

    landscapes = Path(__file__).resolve().parents[1] / "benchmarks" / "landscapes"
    return run_in_process(load_spec(compose_cfg([
        f"hydra.searchpath=[file://{landscapes}]", "backend=instant", "sweep=eagle3_allreduce",
        "sweep.budget.wall_time_s=null", "sweep.confirm.top_k=0", "sweep.budget.max_asks=9", *extra,
        f"tracking.store_dir={tmp_path}", f"tracking.findings_dir={tmp_path / 'findings'}"])))


def test_eagle3_close_behind_is_launched_with_the_allreduce_plain_decoding_won_with(tmp_path):
    """On a node where EAGLE-3 and plain decoding measure within 10 % (the benchmark's ``far``
    landscape: a fast verify pass, custom all-reduce working at TP=8), the first free ask after
    the seeds launches the leading approach's best with the one shared knob the other's best
    changed: the team's EAGLE-3 seed (NCCL) with the custom all-reduce plain decoding gained
    with, which measures above both. On the campaign's node (EAGLE-3 ~35 % behind) EAGLE-3 is
    never put on plain decoding's knobs; plain decoding's best (the baseline) takes the 128 CUDA
    graphs of the team's EAGLE-3 seed, which is the campaign's hand-found gain."""
    from sweeps.search.coverage import A_EQUAL_FOOTING

    drv = _bench_far(tmp_path / "far", "node=bench_far")
    trials = {t.number: t for t in drv.study.get_trials(deepcopy=False)}
    recs = {r.number: r for r in records.load_records(drv.study)}
    eq = [n for n, t in trials.items() if t.user_attrs.get(A_EQUAL_FOOTING)]
    assert eq, {n: r.params for n, r in recs.items()}
    first = eq[0]
    t, o = trials[first].user_attrs[A_EQUAL_FOOTING]
    mine, theirs, got = recs[t].params, recs[o].params, recs[first].params
    assert mine["speculative"] == got["speculative"] == "eagle3" and theirs["speculative"] == "none"
    changed = {k for k in got if got[k] != mine.get(k)}
    assert changed == {"allreduce"} and got["allreduce"] == theirs["allreduce"] == "custom"
    val = records.value_of(recs[first])
    assert val is not None and val > max(records.value_of(recs[t]), records.value_of(recs[o]))
    # the findings' coverage section names it, with what it measured beside the two it came from
    lines = coverage_lines(context_from_spec(drv.spec, drv.study_name, drv.fingerprint, None),
                           [r for r in recs.values() if r.launched])
    said = [x for x in lines if x.startswith(f"- equal footing: t{first} ran t{t}'s config with allreduce=custom from t{o}: ")]
    assert said and f"(t{t} " in said[0] and "tok/s" in said[0], lines
    home = _bench_far(tmp_path / "campaign")
    home_recs = {r.number: r for r in records.load_records(home.study)}
    eq = [(n, t.user_attrs[A_EQUAL_FOOTING]) for n, t in sorted((t.number, t) for t in home.study.get_trials(deepcopy=False))
          if t.user_attrs.get(A_EQUAL_FOOTING)]
    assert eq and all(home_recs[n].params["speculative"] == "none" for n, _ in eq), eq
    first, (t, o) = eq[0]
    assert home_recs[o].params["speculative"] == "eagle3"
    assert changed_knobs(home_recs[first].params, home_recs[t].params) == "cuda_graph_max_bs=128"
    assert records.value_of(home_recs[first]) > records.value_of(home_recs[t])


def test_an_equal_footing_knob_brings_the_knobs_its_level_turns_on():
    """The other best's ``allreduce=custom`` comes with the ``custom_size`` it set (a knob only
    that level turns on), and a knob conditional on a shared knob is shared too."""
    space = parse_space({"speculative": {"type": "categorical", "choices": ["none", "eagle3"]},
                         "allreduce": {"type": "categorical", "choices": ["nccl", "custom"]},
                         "custom_size": {"type": "categorical", "choices": [1, 2], "when": {"allreduce": "custom"}},
                         "steps": {"type": "int", "low": 1, "high": 2, "when": {"speculative": "eagle3"}}})
    plain = records.TrialRecord(0, "COMPLETE", {"speculative": "none", "allreduce": "custom", "custom_size": 2}, "ok",
                                {"decode_tok_s": 100.0})
    eagle = records.TrialRecord(1, "COMPLETE", {"speculative": "eagle3", "allreduce": "nccl", "steps": 1}, "ok",
                                {"decode_tok_s": 95.0})
    got = [space.normalize(c) for c, t, _ in Coverage(ApproachesConfig(knob="speculative"), space).crosses([plain, eagle])
           if t == 1]
    assert {"speculative": "eagle3", "allreduce": "custom", "custom_size": 2, "steps": 1} in got
    assert all("steps" in c for c in got)  # EAGLE-3's own knob stays with it
