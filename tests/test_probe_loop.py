"""Probe launches end to end: the emulator prices and fails probes physically, and the driver
loop (sweeps/search/probes.py) turns a revealable probe failure into a dead end at a fraction of a
full launch, a pass into the full launch, and keeps the probe on the trial."""

from __future__ import annotations

import pytest

from sweeps.app.driver import emulator_profile
from sweeps.app.inprocess import InProcessDriver
from sweeps.config.spec import load_spec
from sweeps.rules.store import RuleStore
from sweeps.search import probes
from sweeps.store import records
from tasks.backends.sglang.knobs import render_launch
from tasks.emulator.instant import simulate
from tasks.probe import probe_argv
from tests.conftest import compose_cfg

CAMPAIGN = ["backend=instant", "sweep=eagle3_allreduce", "sweep.budget.wall_time_s=null",
            "sweep.budget.max_asks=200", "sweep.confirm.top_k=0"]
BASE = {"speculative": "none", "allreduce": "nccl", "nccl_algo": "default", "nccl_proto": "default",
        "cuda_graph_max_bs": 512, "moe_a2a_backend": "none"}


@pytest.fixture(scope="module")
def env():
    spec = load_spec(compose_cfg(CAMPAIGN))
    return spec, emulator_profile(spec), spec.node.model_dump(), spec.model.model_dump()


def _full_and_probe(env, cfg, extra=()):
    spec, prof, node, model = env
    from sweeps.config.spec import backend_dict

    argv, e, _ = render_launch(cfg, node, model, backend_dict(spec))
    argv = list(argv) + list(extra)
    full = simulate(prof, argv, e, spec.bench_spec(), seed=0)
    probe = simulate(prof, probe_argv(argv, "sglang", model, cfg), e, spec.bench_spec(), seed=0)
    return full, probe


@pytest.mark.parametrize("level", [{"allreduce": "flashinfer_fusion"}, {"nccl_algo": "Tree"},
                                   {"moe_a2a_backend": "flashinfer"}, {"allreduce": "torch_symm_mem"}])
def test_emulated_probe_fails_like_the_full_launch_for_a_fraction(env, level):
    full, probe = _full_and_probe(env, {**BASE, **level})
    assert full["status"] == probe["status"] == "failed"
    assert probe["failure_class"] == full["failure_class"]
    assert probe["gpu_s"] <= full["gpu_s"]
    if full["startup_s"] > 60:  # failures after the weight load: the probe skips it
        assert probe["gpu_s"] < 0.15 * full["gpu_s"], (probe["gpu_s"], full["gpu_s"])


def test_emulated_probe_of_a_healthy_config_starts_without_weight_load(env):
    full, probe = _full_and_probe(env, BASE)
    assert full["status"] == probe["status"] == "ok"
    p, f = probe["prediction"]["startup_s"], full["prediction"]["startup_s"]
    assert p["load_weights"] < 5 < f["load_weights"]
    assert p["graph_capture"] < f["graph_capture"]  # 2 of 61 layers captured (plus the fixed JIT)
    assert probe["startup_s"] < 0.25 * full["startup_s"]


def test_emulated_probe_never_fails_a_memory_class(env):
    # a pool fraction too small for the real weights: the full launch fails, a probe cannot tell
    full, probe = _full_and_probe(env, BASE, ["--mem-fraction-static", "0.3"])
    assert full["status"] == "failed" and full["failure_class"] == "kv_cache_pool_too_small"
    assert probe["status"] == "ok"


def _campaign_driver(tmp_path, trials: int, extra: tuple[str, ...] = (), findings: bool = False) -> InProcessDriver:
    store = tmp_path / "store"
    spec = load_spec(compose_cfg([*CAMPAIGN, f"sweep.budget.trials={trials}", f"tracking.store_dir={store}",
                                  f"tracking.findings_dir={store / 'findings'}", *extra]))
    drv = InProcessDriver(spec, findings=findings)
    drv.setup()
    drv.loop()
    return drv


def test_known_dead_end_seeds_are_re_questioned_by_a_probe_and_a_pass_launches_in_full(tmp_path):
    # nccl_algo seeded level by level too, so one seed's probe passes (Ring). The seeds a shipped
    # entry names (fusion, symm-mem, Tree, FlashInfer all-to-all) are not launched as seeds: each
    # level gets its re-question probe instead, which fails here and ends the trial
    drv = _campaign_driver(tmp_path, 8, ("sweep.seed_each_level_of=[allreduce,nccl_algo,moe_a2a_backend]",))
    trials = {t.number: t for t in drv.study.get_trials()}
    recs = {r.number: r for r in records.load_records(drv.study)}
    # a probe does not spend the trial budget twice, and a re-question probe (probe-only) not at all
    # (README: probes count in the GPU-hours, not in the trial budget)
    assert sum(r.budgeted for r in recs.values()) == 8
    assert sum(r.launched and r.requestion for r in recs.values()) == 4
    dead = {n: t.user_attrs["probe"] for n, t in trials.items()
            if (t.user_attrs.get("probe") or {}).get("dead_end") and recs[n].status == "failed"}
    assert {recs[n].failure_class for n in dead} == {
        "flashinfer_allreduce_fusion_unsupported_arch", "torch_symm_mem_unsupported",
        "nccl_env_algo_proto_invalid", "moe_ep_a2a_config_error"}
    for n, p in dead.items():
        assert p["result"] == "failed" and p["reason"].startswith("re-question: ")
        assert recs[n].timings["gpu_s"] == pytest.approx(p["gpu_s"])  # the trial cost its probe only
        rule = drv.rules.match(drv.fingerprint, drv.spec.model.name, recs[n].params, record_hit=False)
        assert rule is not None and any(e.get("probe") and e["trial_number"] == n for e in rule.evidence)
        assert rule.origin == "shipped" and rule.evidence[0]["shipped"] == p["requestion"]["entries"]
    # each known dead end was launched once, by its re-question, never as a seed as well
    assert sorted(str(recs[n].params) for n in dead) == sorted({str(recs[n].params) for n in dead})
    ring = next(n for n, r in recs.items() if r.params.get("nccl_algo") == "Ring")
    p = trials[ring].user_attrs["probe"]
    assert p["result"] == "ok" and not p["dead_end"] and p["reason"] == "first launch of nccl_algo=Ring"
    assert recs[ring].status == "ok" and recs[ring].value
    assert recs[ring].timings["gpu_s"] > p["gpu_s"] > 0  # full launch + its probe
    custom = next(n for n, r in recs.items() if r.params.get("allreduce") == "custom")
    assert trials[custom].user_attrs["probe"]["dead_end"] and not records.counts_for_level(recs[custom])
    base = next(n for n, r in recs.items() if r.params == {**BASE})
    assert "probe" not in trials[base].user_attrs  # the baseline's levels are never probed
    assert (records.trial_dir(drv.spec.store_dir, drv.study_name, ring) / "server.probe.log").exists()


def test_re_question_probes_count_as_probes_in_the_budget_the_quota_and_the_findings(tmp_path):
    """The campaign's four shipped dead ends are re-questioned by one probe each (t-numbers
    before the sampler's); a 6-launch trial budget still buys 6 launches besides them, the
    approaches quota counts those 6 only, and the findings count and name the probes as such."""
    from sweeps.publish.summary import summary_of_study
    from sweeps.search.coverage import Coverage

    drv = _campaign_driver(tmp_path, 6, ("sweep.serving_check=false",), findings=True)
    recs = records.load_records(drv.study)
    asked = [r for r in recs if r.launched and r.requestion]
    assert len(asked) == 4 and all(r.status == "failed" for r in asked)
    assert sum(r.budgeted for r in recs) == 6 and drv.launched == 6
    assert drv.stop_reason == "trial budget spent (6 launched)"
    cov = Coverage(drv.spec.sweep.approaches, drv.space, budget=6)
    assert sum(cov.counts(recs, ()).values()) == 6
    c = summary_of_study(drv.spec, drv.study).counts
    assert (c.launched, c.probes, c.probes_passed) == (6, 4, 0)
    assert c.launched == c.ok + c.degraded + c.failed + c.infra + c.interrupted
    assert c.failed == sum(r.status == "failed" for r in recs if r.budgeted)
    assert "launched 6/6 (+4 re-question probes)" in drv.progress.status_line(recs, 0, 0.0)
    drv.finish()
    doc = "\n".join(f.read_text() for f in (tmp_path / "store" / "findings").glob("*.md"))
    assert "4 re-question probes (4 reproduced their dead end, 0 no longer did)" in doc
    dead = doc.split("### Dead ends", 1)[1].split("\n### ", 1)[0]
    for r in asked:
        line = next(x for x in dead.splitlines() if f"**{r.failure_class}**" in x)
        assert f"re-questioned by a probe (t{r.number}, of shipped knowledge " in line, line
        assert "it still fails" in line
    approaches = doc.split("### Approaches", 1)[1].split("\n### ", 1)[0]
    assert "(+1 re-question probe)" in approaches
    assert "- not counted above: 4 re-question probes" in doc


def test_cleared_marker_per_fingerprint(tmp_path):
    rules = RuleStore(f"sqlite:///{tmp_path / 'r.db'}")
    fp = {"gpu_arch": "sm_120", "sglang": "0.5.23"}
    assert probes.cleared_entries(rules, fp) == set()
    probes.mark_cleared(rules, fp, ["a", "b"], {"sweep": "s", "trial_number": 1})
    probes.mark_cleared(rules, fp, ["a"], {"sweep": "s", "trial_number": 2})
    assert probes.cleared_entries(rules, fp) == {"a", "b"}
    assert probes.cleared_entries(rules, {**fp, "sglang": "0.5.24"}) == set()
    assert rules.list() == []  # a marker is no failure rule


def test_a_typo_in_extra_args_makes_no_probed_config_a_dead_end(tmp_path):
    """One bad flag in ``backend.extra_args`` fails every launch with ``cli_arg_error``, probes
    included. The cause is the sweep's static config, not the knob values: a probe learns no
    rule from it, as the full launch learns none, so fixing the flag makes every config launchable."""
    drv = _campaign_driver(tmp_path, 6, ("+backend.extra_args=[--no-such-flag]",))
    probed = [t.user_attrs["probe"] for t in drv.study.get_trials() if t.user_attrs.get("probe")]
    assert probed and all(p["failure_class"] == "cli_arg_error" for p in probed), probed
    assert [r for r in drv.rules.list() if r.failure_class == "cli_arg_error"] == []


def _after_firmware(store):
    """The campaign on the same node after a change its fingerprint does not see: NCCL Tree now
    has an AllGather (as benchmarks' bench_stale), 7 launches, stores under ``store``."""
    return load_spec(compose_cfg([*CAMPAIGN, "sweep.budget.trials=7", f"tracking.store_dir={store}",
                                  f"tracking.findings_dir={store / 'findings'}",
                                  "node.emulator.capabilities.nccl_tree_supports_allgather=true",
                                  "sweep.serving_check=false"]))


def test_one_study_retires_the_dead_end_that_no_longer_reproduces_and_strengthens_the_one_that_does(tmp_path):
    """Stale knowledge under an unchanged fingerprint: a first study on the campaign node learns the
    shipped dead ends as rules (each from its re-question probe). The node then gains a Tree
    AllGather (capabilities change, fingerprint does not, as in benchmarks' bench_stale). The next
    study re-questions every rule once, for a probe each: Tree's probe passes and retires its rule
    (and clears its shipped entry); FlashInfer fusion's fails again and strengthens its rule."""
    first = _campaign_driver(tmp_path, 7)
    rules = {str(r.knobs): r for r in first.rules.list()}
    tree0, fusion0 = rules[str({"nccl_algo": "Tree"})], rules[str({"allreduce": "flashinfer_fusion"})]
    assert tree0.origin == fusion0.origin == "shipped" and tree0.retired_at is None
    first.release()

    store = tmp_path / "store"
    spec = _after_firmware(store)
    second = InProcessDriver(spec, "campaign-after-firmware", findings=True)
    second.setup()
    assert second.fingerprint == first.fingerprint  # the change is invisible to the fingerprint
    second.loop()
    trials = second.study.get_trials()
    asked = {t.number: t.user_attrs["probe"] for t in trials if (t.user_attrs.get("probe") or {}).get("requestion")}
    by_rule = {rid: (n, p) for n, p in asked.items() for rid in p["requestion"]["rules"]}
    assert set(by_rule) == {r.id for r in first.rules.list()}  # every rule questioned once

    n, p = by_rule[tree0.id]
    tree = second.rules.get(tree0.id)
    assert p["result"] == "ok" and not p["dead_end"]
    assert tree.retired_at is not None and tree.retired_evidence["trial_number"] == n
    assert tree.retired_evidence["sweep"] == "campaign-after-firmware" and tree.retired_evidence["gpu_s"] > 0
    assert p["finding"].startswith(f"dead end no longer reproduces: rule {tree0.id}")
    assert "nccl_algo_tree_no_allgather" in probes.cleared_entries(second.rules, second.fingerprint)
    rec = next(r for r in records.load_records(second.study) if r.number == n)
    assert rec.timings["gpu_s"] == pytest.approx(p["gpu_s"])  # the re-question cost its probe only
    tree_cfg = {**BASE, "nccl_algo": "Tree"}
    assert second.rules.match(second.fingerprint, spec.model.name, tree_cfg, record_hit=False) is None

    n, p = by_rule[fusion0.id]
    fusion = second.rules.get(fusion0.id)
    assert p["result"] == "failed" and p["dead_end"] and fusion.retired_at is None
    assert len(fusion.evidence) == len(fusion0.evidence) + 1 and fusion.evidence[-1]["trial_number"] == n
    assert fusion.last_confirmed >= fusion0.last_confirmed
    assert set(fusion.studies) == {first.study_name, "campaign-after-firmware"}
    assert "flashinfer_fusion_jit_gate_sm12x" not in probes.cleared_entries(second.rules, second.fingerprint)

    second.finish()  # the findings name the level the probe re-opened, with the probe's evidence
    doc = "\n".join(f.read_text() for f in (store / "findings").glob("*.md"))
    # the level is searchable again: either the sweep launched it after the probe, or its line in
    # the levels that lost or never ran says why only the probe ran it
    relaunched = [r for r in records.load_records(second.study)
                  if r.params.get("nccl_algo") == "Tree" and r.status == "ok" and r.number > by_rule[tree0.id][0]
                  and not (r.probe or {}).get("requestion")]
    lines = [x for x in doc.splitlines() if x.startswith("- `nccl_algo=Tree`")]
    assert relaunched or lines, doc
    if not relaunched:
        assert f"dead end no longer reproduces: rule {tree0.id}, nccl_algo_tree_no_allgather" in lines[0]
        assert f"trial {by_rule[tree0.id][0]}'s probe" in lines[0]
    # the dead-ends section lists what this study retired, whatever the level measured later
    dead = doc[doc.index("### Dead ends"):]
    (retired,) = [x for x in dead.splitlines() if x.startswith("- **retired: ")]
    n, p = by_rule[tree0.id]
    assert f"retired: rule {tree0.id}, nccl_algo_tree_no_allgather**" in retired and f"t{n}'s re-question probe" in retired
    assert f"{p['startup_s']:.0f} s, {p['gpu_s']:.0f} GPU-s" in retired
    assert p["retired"] == [f"rule {tree0.id}", "nccl_algo_tree_no_allgather"]  # the console line's words

    # once per study: either study resumed re-questions nothing again (the first one's rules were
    # learned by its own re-questions of shipped entries)
    for drv_spec, name in ((first.spec, first.study_name), (spec, "campaign-after-firmware")):
        again = InProcessDriver(drv_spec, name)
        again.setup()
        waiting = [t for t in again.study.get_trials() if t.state.name == "WAITING" and t.user_attrs.get("requestion")]
        assert waiting == [], name
        again.release()


def test_the_console_line_of_a_passed_re_question_names_what_it_retired(tmp_path):
    """A re-question trial is its probe only: its line says the probe passed and what it retired,
    not a blank 'not benchmarked' reason."""
    from sweeps.publish.outputs import Publisher
    from tasks.types import TrialResult

    spec = load_spec(compose_cfg(["backend=instant", f"tracking.store_dir={tmp_path}"]))
    pub = Publisher(spec, "s", track=False, findings=False)
    lines: list[str] = []
    pub.progress.event = lines.append
    res = TrialResult(trial_number=3, status="ok")
    pub.trial_done(3, dict(spec.sweep.baseline), res, {}, ["rule 4", "nccl_algo_tree_no_allgather"])
    pub.trial_done(4, dict(spec.sweep.baseline), res, {})  # no re-question: the old wording
    assert "re-question probe passed: retired rule 4, nccl_algo_tree_no_allgather" in lines[0], lines
    assert "not benchmarked" in lines[1] and "retired" not in lines[1]


def test_a_re_question_whose_retirement_cannot_be_written_stops_the_sweep_and_is_asked_again_on_resume(
        tmp_path, monkeypatch):
    """A rules DB that turns read-only mid-sweep: the passed re-question cannot retire its rule.
    The sweep stops (StoreError, exit 2) instead of logging an ERROR per trial, and the trial is
    re-queued with its re-question, so the resumed study asks it again and retires the rule."""
    import sqlite3

    from sweeps.errors import exit_code
    from sweeps.run.graceful import store_failures
    from sweeps.run.stores import StoreError

    first = _campaign_driver(tmp_path, 7)
    tree0 = next(r for r in first.rules.list() if r.knobs == {"nccl_algo": "Tree"})
    first.release()
    store = tmp_path / "store"
    spec = _after_firmware(store)

    def read_only(self, rule_id, evidence):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(RuleStore, "retire", read_only)
    second = InProcessDriver(spec, "campaign-ro")
    second.setup()
    with pytest.raises(StoreError) as ei, store_failures(second):
        second.loop()
    assert exit_code(ei.value) == 2 and "readonly database" in str(ei.value)
    second.release()
    monkeypatch.undo()
    assert second.rules.get(tree0.id).retired_at is None
    waiting = [t for t in second.study.get_trials() if t.state.name == "WAITING"
               and tree0.id in (t.user_attrs.get("requestion") or {}).get("rules", [])]
    assert len(waiting) == 1  # re-queued with its re-question

    again = InProcessDriver(spec, "campaign-ro")
    again.setup()
    again.loop()
    assert again.rules.get(tree0.id).retired_at is not None  # asked again, and recorded this time
    again.release()
