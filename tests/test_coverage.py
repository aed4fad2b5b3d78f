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
from sweeps.search.coverage import A_APPROACH_QUOTA, Coverage
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
    """With the release off, EAGLE-3 keeps >= 30 % of the launches whatever it measures."""
    drv = _campaign(tmp_path, seed, "sweep.approaches.release_below=null")
    recs = records.load_records(drv.study)
    launched = [r for r in recs if r.launched]
    assert drv.stop_reason == "trial budget spent (30 launched)"
    eagle = [r for r in launched if r.params["speculative"] == "eagle3"]
    assert len(eagle) / len(launched) >= 0.3, (len(eagle), len(launched))
    # pinned asks leave the draft shape to TPE: the EAGLE-3 launches are not one shape repeated
    assert len({(r.params["eagle_num_steps"], r.params["eagle_topk"], r.params["eagle_num_draft_tokens"])
                for r in eagle}) >= 4
    assert any(t.user_attrs.get(A_APPROACH_QUOTA) == "eagle3" for t in drv.study.trials)
    # every launch is a distinct config (the quota never re-launches a dead end or a finished config)
    assert len({records.config_key(r.params) for r in launched}) == len(launched)
    lines = coverage_lines(context_from_spec(drv.spec, drv.study_name, drv.fingerprint, None), launched)
    assert lines[0].startswith("- approaches (`speculative`, min share 30 %): none ") and "below the share" not in lines[0]


@pytest.mark.timeout(900)
@pytest.mark.slow  # a 30-launch campaign
def test_the_campaign_releases_eagle3s_quota_once_it_is_separated_below(tmp_path):
    """The shipped campaign: EAGLE-3 (about 35 % below plain decoding on this node) keeps its
    quota until one of its launches is ok, then the sampler alone decides; the findings' coverage
    section states the evidence, and every EAGLE-3 launch after the release was the sampler's."""
    drv = _campaign(tmp_path, 0)
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
    """EAGLE-3 below its share is due; once it has ``release_after`` (here 2) ok launches whose
    best is more than 10 % below plain decoding's best, its quota is released (not due), with
    the evidence; the default releases after one."""
    cov = Coverage(ApproachesConfig(knob="speculative", min_share=0.3, release_after=2), SPACE)
    plain = [_val(i, "none", 85.0 + i) for i in range(6)]  # best: t5, 90 tok/s
    one = plain + [_val(6, "eagle3", 58.0, steps=1)]
    assert cov.due(one, []) == "eagle3" and cov.released(one) == {}  # one ok launch is not enough here
    assert Coverage(ApproachesConfig(knob="speculative", min_share=0.3), SPACE).due(one, []) is None  # the default
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

    lat = Coverage(ApproachesConfig(knob="speculative", min_share=0.3, release_after=2), SPACE,
                   Objective("decode_tok_s", "minimize"))
    assert set(lat.released(two)) == {"none"}  # plain decoding's best (85) is > 10 % above EAGLE-3's (58)


def test_the_findings_state_the_evidence_of_a_released_quota():
    recs = [_val(i, "none", 85.0 + i) for i in range(6)] + [_val(6, "eagle3", 58.0, steps=1),
                                                             _val(7, "eagle3", 60.0, steps=2)]
    ctx = _ctx([])
    ctx.approaches = {**ctx.approaches, "release_after": 2}
    lines = coverage_lines(ctx, recs)
    assert lines[0].startswith("- approaches (`speculative`, min share 30 %): none 6 (75 %), eagle3 2 (25 %)")
    assert lines[1] == ("- quota of `speculative=eagle3` released: its best of 2 ok launches, t7 60.0 tok/s, is 33 % "
                        "below none's best t5 90.0 tok/s (more than the 10 % release margin, after at least 2 ok "
                        "launches): the sampler alone chooses from here")
    assert not any("released" in x for x in coverage_lines(_ctx([]), recs[:6]))  # no EAGLE-3 evidence: nothing released
