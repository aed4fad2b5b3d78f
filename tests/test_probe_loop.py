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


def _campaign_driver(tmp_path, trials: int, extra: tuple[str, ...] = ()) -> InProcessDriver:
    store = tmp_path / "store"
    spec = load_spec(compose_cfg([*CAMPAIGN, f"sweep.budget.trials={trials}", f"tracking.store_dir={store}",
                                  f"tracking.findings_dir={store / 'findings'}", *extra]))
    drv = InProcessDriver(spec)
    drv.setup()
    drv.loop()
    return drv


def test_seed_dead_ends_end_at_their_probe_and_a_pass_launches_in_full(tmp_path):
    # nccl_algo seeded level by level too, so one seed's probe passes (Ring): the 8 seeds
    drv = _campaign_driver(tmp_path, 8, ("sweep.seed_each_level_of=[allreduce,nccl_algo,moe_a2a_backend]",))
    trials = {t.number: t for t in drv.study.get_trials()}
    recs = {r.number: r for r in records.load_records(drv.study)}
    assert sum(r.launched for r in recs.values()) == 8  # a probe does not spend the trial budget twice
    dead = {n: t.user_attrs["probe"] for n, t in trials.items()
            if (t.user_attrs.get("probe") or {}).get("dead_end") and recs[n].status == "failed"}
    assert {recs[n].failure_class for n in dead} == {
        "flashinfer_allreduce_fusion_unsupported_arch", "torch_symm_mem_unsupported",
        "nccl_env_algo_proto_invalid", "moe_ep_a2a_config_error"}
    for n, p in dead.items():
        assert p["result"] == "failed" and p["reason"].startswith("shipped knowledge: ")
        assert recs[n].timings["gpu_s"] == pytest.approx(p["gpu_s"])  # the trial cost its probe only
        rule = drv.rules.match(drv.fingerprint, drv.spec.model.name, recs[n].params, record_hit=False)
        assert rule is not None and any(e.get("probe") and e["trial_number"] == n for e in rule.evidence)
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
