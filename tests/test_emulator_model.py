"""Pure emulator model: flags, profile validation, calibration, properties, instant mode."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.emulator import calibration
from tasks.emulator.flags import LaunchArgError, flag_names
from tasks.emulator.instant import estimate_gpu_hours, simulate
from tasks.emulator.model import evaluate, evaluate_argv, parse_launch, tau
from tasks.emulator.profile import DEFAULT_MODEL_YAML, DEFAULT_NODE_YAML, build_profile, default_profile, load_yaml
from tasks.emulator.testing import EAGLE_FLAGS, baseline_flags
from tasks.types import BenchSpec

PROFILE = default_profile({"noise": 0.0})


def test_flag_sets_by_version():
    assert "--cuda-graph-max-bs-decode" in flag_names("0.5.23")
    assert "--cuda-graph-max-bs" not in flag_names("0.5.23")
    assert "--cuda-graph-max-bs" in flag_names("0.5.9")
    with pytest.raises(LaunchArgError) as e:
        parse_launch(["--model-path", "m", "--cuda-graph-max-bs", "8"], {})
    assert "ambiguous option: --cuda-graph-max-bs could match" in e.value.text and e.value.exit_code == 2
    legacy = parse_launch(["--model-path", "m", "--cuda-graph-max-bs", "8"], {}, sglang_version="0.5.9")
    assert legacy.cuda_graph_max_bs == 8
    with pytest.raises(LaunchArgError, match="unrecognized arguments: --bogus"):
        parse_launch(["python", "-m", "sglang.launch_server", "--model-path", "m", "--bogus"], {})


def test_profile_validation_names_field():
    node, model = load_yaml(DEFAULT_NODE_YAML), load_yaml(DEFAULT_MODEL_YAML)
    bad = copy.deepcopy(node)
    bad["emulator"]["eta"] = -1
    with pytest.raises(ValueError, match=r"node\.emulator\.eta: must be a number > 0"):
        build_profile(bad, model)
    bad = copy.deepcopy(model)
    del bad["emulator"]["t_ovh_ms"]
    with pytest.raises(ValueError, match=r"model\.emulator\.t_ovh_ms: missing"):
        build_profile(node, bad)
    with pytest.raises(ValueError, match=r"emulator\.fault: unknown fault"):
        build_profile(node, model, {"fault": "nope"})
    p = build_profile(node, model, {"capabilities": {"force_custom_allreduce_pcie": True}})
    assert p["emulator"]["capabilities"]["force_custom_allreduce_pcie"] is True
    assert p["emulator"]["capabilities"]["arch_major"] == 12


def test_calibration_check_passes_on_seed_campaign(capsys):
    assert calibration.main(["check"]) == 0
    out = capsys.readouterr().out
    assert "baseline_graph128" in out and "RESULT: PASS" in out


def test_calibration_check_fails_when_profile_is_off():
    prof = copy.deepcopy(PROFILE)
    prof["model"]["emulator"]["t_ovh_ms"] = 4.0
    rows = calibration.check(calibration.load_measurements(str(calibration.SEED_CAMPAIGN)), prof)
    assert not all(r.ok for r in rows)


def test_custom_allreduce_degrades_unless_forced():
    flags = ["--model-path", "m", "--tp-size", "8", "--enforce-disable-flashinfer-allreduce-fusion",
             "--cuda-graph-max-bs-decode", "128"]
    p = evaluate_argv(PROFILE, flags)
    assert p.allreduce_path.startswith("nccl") and "allreduce_path_degraded" in p.perf_tags
    assert any("Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs." in line
               for line in p.log_lines)
    forced = copy.deepcopy(PROFILE)
    forced["emulator"]["capabilities"]["force_custom_allreduce_pcie"] = True
    q = evaluate_argv(forced, flags)
    assert q.allreduce_path == "custom:pcie" and abs(q.decode_tok_s - 38.0) < 1.0


def test_capability_not_flag_name_decides_failure():
    flags = ["--model-path", "m", "--tp-size", "8", "--disable-custom-all-reduce",
             "--enable-flashinfer-allreduce-fusion"]
    assert evaluate_argv(PROFILE, flags).failure.failure_class == "flashinfer_allreduce_fusion_unsupported_arch"
    hopper = copy.deepcopy(PROFILE)
    hopper["emulator"]["capabilities"]["arch_major"] = 9
    assert evaluate_argv(hopper, flags).outcome == "ok"


def test_nccl_protocols_and_tree():
    f = baseline_flags(128)
    ll = evaluate_argv(PROFILE, f, {"NCCL_PROTO": "LL"}).decode_tok_s
    simple = evaluate_argv(PROFILE, f, {"NCCL_PROTO": "Simple"}).decode_tok_s
    ll128 = evaluate_argv(PROFILE, f, {"NCCL_PROTO": "LL128"})
    assert simple < ll128.decode_tok_s < ll and ll128.warnings
    assert evaluate_argv(PROFILE, f, {"NCCL_ALGO": "allreduce:tree"}).outcome == "ok"
    tree = evaluate_argv(PROFILE, f, {"NCCL_ALGO": "Tree"})
    assert tree.failure.failure_class == "nccl_env_algo_proto_invalid" and tree.failure.exit_code == -9


def test_memory_failures_and_eager_fallback():
    assert evaluate_argv(PROFILE, baseline_flags(128, "--mem-fraction-static", "0.70")).failure.failure_class \
        == "kv_cache_pool_too_small"
    oom = evaluate_argv(PROFILE, baseline_flags(512, "--mem-fraction-static", "0.95"))
    assert oom.failure.failure_class == "cuda_oom_graph_capture"
    launch = parse_launch(baseline_flags(16), {})
    inside, outside = evaluate(PROFILE, launch, batch=16), evaluate(PROFILE, launch, batch=17)
    assert outside.breakdown_ms["eager"] > 0 and inside.breakdown_ms["eager"] == 0
    assert outside.decode_tok_s < 0.6 * inside.decode_tok_s


def _with(profile, **kv):
    p = copy.deepcopy(profile)
    for k, v in kv.items():
        node, key = k.split("__")
        p[node]["emulator"][key] = v
    return p


@settings(max_examples=25, deadline=None)
@given(a1=st.floats(1, 200), a2=st.floats(1, 200), bs=st.sampled_from([1, 4, 64, 256]),
       spec=st.booleans())
def test_rate_falls_with_collective_latency(a1, a2, bs, spec):
    lo, hi = sorted((a1, a2))
    flags = baseline_flags(512, *(EAGLE_FLAGS if spec else []))
    launch = parse_launch(flags, {})
    p_lo = copy.deepcopy(PROFILE)
    p_lo["node"]["emulator"]["nccl"]["alpha_us"] = lo
    p_hi = copy.deepcopy(PROFILE)
    p_hi["node"]["emulator"]["nccl"]["alpha_us"] = hi
    r_lo = evaluate(p_lo, launch, batch=bs).decode_tok_s
    r_hi = evaluate(p_hi, launch, batch=bs).decode_tok_s
    assert r_hi <= r_lo + 1e-9 and r_hi > 0


@settings(max_examples=25, deadline=None)
@given(a1=st.floats(0.0, 0.95), a2=st.floats(0.0, 0.95), steps=st.integers(1, 6))
def test_rate_rises_with_acceptance(a1, a2, steps):
    lo, hi = sorted((a1, a2))
    flags = baseline_flags(128, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d",
                           "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
                           "--speculative-num-draft-tokens", str(steps + 1))
    launch = parse_launch(flags, {})
    r = [evaluate(_with(PROFILE, model__accept_rate=a), launch).decode_tok_s for a in (lo, hi)]
    assert 0 < r[0] <= r[1] + 1e-9
    assert tau(_with(PROFILE, model__accept_rate=hi), steps, 1, steps + 1) <= steps + 1


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), bs=st.sampled_from([1, 8]), spec=st.booleans())
def test_instant_deterministic_per_seed_and_positive(seed, bs, spec):
    prof = default_profile({"noise": 0.015})
    flags = baseline_flags(128, *(EAGLE_FLAGS if spec else []))
    bench = BenchSpec(concurrency=bs)
    a, b = simulate(prof, flags, {}, bench, seed), simulate(prof, flags, {}, bench, seed)
    assert a["metrics"] == b["metrics"] and a["status"] == "ok"
    assert all(v > 0 for v in a["metrics"].values())
    assert a["gpu_s"] == pytest.approx(8 * (a["startup_s"] + a["bench_s"] + 3.0))


def test_instant_noise_and_failures():
    prof = default_profile({"noise": 0.015})
    flags = baseline_flags(128)
    rates = [simulate(prof, flags, {}, BenchSpec(), s)["metrics"]["decode_tok_s"] for s in range(30)]
    mean = sum(rates) / len(rates)
    sd = (sum((r - mean) ** 2 for r in rates) / len(rates)) ** 0.5
    assert abs(mean / 89.4 - 1) < 0.02 and 0.005 < sd / mean < 0.03
    f = simulate(prof, ["--model-path", "m", "--tp-size", "8", "--enable-torch-symm-mem",
                        "--disable-custom-all-reduce"], {}, BenchSpec(), 0)
    assert f["status"] == "failed" and f["failure_class"] == "torch_symm_mem_unsupported"
    assert "KeyError: 12" in f["log"] and f["gpu_s"] > 0 and f["bench_s"] == 0
    assert estimate_gpu_hours(prof, [(flags, {})] * 3, BenchSpec()) == pytest.approx(
        3 * simulate(prof, flags, {}, BenchSpec(), 0)["gpu_s"] / 3600, rel=0.05)
