"""backend=vllm without launching vLLM: rendering through the knob table, the paths read from the
log, the acceptance-length arithmetic, the real failure logs' classes, preflight, and the tiny
model's cache path. (The real engine: tests/test_vllm_real.py, slow.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweeps.config.spec import ConfigError, load_spec
from tasks.backends import get_backend
from tasks.backends.preflight import PreflightReport, check_gpus, check_model, preflight
from tasks.backends.sglang.knobs import KnobError
from tasks.backends.vllm import KNOWN_KNOBS, engine_args, flags_for, render_vllm
from tasks.failures import classify
from tasks.openai_bench import ACCEPTED, DRAFTS, acceptance_length, prompt_ids
from tasks.tiny_model import SPEC, content_hash, model_dir
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "data" / "vllm_logs"
NODE_CPU = yaml.safe_load((ROOT / "conf/node/local_cpu.yaml").read_text())
NODE_GPU = {**yaml.safe_load((ROOT / "conf/node/rtx_pro_6000x8.yaml").read_text()), "emulator": {}}
MODEL = yaml.safe_load((ROOT / "conf/model/tiny_llama.yaml").read_text())
BACKEND = yaml.safe_load((ROOT / "conf/backend/vllm.yaml").read_text())
CPU_REAL = ["backend=vllm", "node=local_cpu", "model=tiny_llama", "sweep=cpu_real", "bench=concurrent8"]


def _opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_cpu_baseline_renders_with_env_and_absolute_paths():
    argv, env, expected = render_vllm({"max_num_seqs": 16, "chunked_prefill": False, "kv_cache_space_gib": 1,
                                       "gpu_memory_utilization": 0.1, "dtype": "bfloat16"}, NODE_CPU, MODEL, BACKEND)
    assert argv[0] == str(ROOT / ".vllm-venv/bin/python")
    assert argv[1:3] == ["-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert _opt(argv, "--model") == str(ROOT / MODEL["path"])
    assert "--tensor-parallel-size" not in argv  # CPU node: TP 1 is vLLM's default
    assert _opt(argv, "--max-num-seqs") == "16" and _opt(argv, "--gpu-memory-utilization") == "0.1"
    assert "--no-enable-chunked-prefill" in argv and "--enable-chunked-prefill" not in argv
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert expected == {}
    _, env2, _ = render_vllm({"kv_cache_space_gib": "unset"}, NODE_CPU, MODEL, BACKEND)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env2


def test_speculative_config_is_json_vllm_reads():
    argv, _, expected = render_vllm({"speculative": "ngram", "spec_num_tokens": 3, "ngram_prompt_lookup_max": 4},
                                    NODE_CPU, MODEL, BACKEND)
    assert json.loads(_opt(argv, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert expected == {"speculative": "ngram"}
    with pytest.raises(KnobError, match="draft_path"):
        render_vllm({"speculative": "eagle3"}, NODE_GPU, MODEL, BACKEND)
    argv, _, _ = render_vllm({"speculative": "eagle3", "spec_num_tokens": 2}, NODE_GPU,
                             {**MODEL, "draft_path": "/ckpt/eagle3"}, BACKEND)
    assert json.loads(_opt(argv, "--speculative-config")) == {
        "method": "eagle3", "model": "/ckpt/eagle3", "num_speculative_tokens": 2}


@pytest.mark.parametrize("level,disabled,symm,fi", [
    ("nccl", True, "0", "0"), ("custom", False, "0", "0"), ("symm_mem", True, "1", "0"), ("flashinfer", True, "0", "1"),
])
def test_gpu_allreduce_levels_pin_both_default_on_paths(level, disabled, symm, fi):
    argv, env, expected = render_vllm({"allreduce": level, "nccl_algo": "Ring", "cuda_graph_max_bs": 64},
                                      NODE_GPU, MODEL, BACKEND)
    assert _opt(argv, "--tensor-parallel-size") == "8"
    assert ("--disable-custom-all-reduce" in argv) is disabled
    assert env["VLLM_ALLREDUCE_USE_SYMM_MEM"] == symm and env["VLLM_ALLREDUCE_USE_FLASHINFER"] == fi
    assert env["NCCL_ALGO"] == "Ring" and _opt(argv, "--max-cudagraph-capture-size") == "64"
    assert expected == {"allreduce": level}


def test_expert_parallel_and_unknown_knobs():
    argv, _, _ = render_vllm({"moe_a2a_backend": "deepep_low_latency"}, NODE_GPU, MODEL, BACKEND)
    assert "--enable-expert-parallel" in argv and _opt(argv, "--all2all-backend") == "deepep_low_latency"
    with pytest.raises(KnobError, match="unknown vLLM knob.*mem_fraction_static"):
        render_vllm({"mem_fraction_static": 0.8}, NODE_GPU, MODEL, BACKEND)
    with pytest.raises(KnobError, match="allreduce='torch_symm_mem'"):
        render_vllm({"allreduce": "torch_symm_mem"}, NODE_GPU, MODEL, BACKEND)


def test_knob_table_covers_only_the_inspected_release():
    assert flags_for("0.32.0")["speculative_config"] == "--speculative-config"
    with pytest.raises(KnobError, match="vLLM 0.31.0 has no flag"):
        render_vllm({}, NODE_CPU, MODEL, {**BACKEND, "vllm_version": "0.31.0"})
    assert {"max_num_seqs", "block_size", "dtype", "kv_cache_space_gib", "allreduce"} <= KNOWN_KNOBS


def test_engine_args_strip_the_launcher():
    assert engine_args(["/py", "-m", "vllm.x", "--model", "m"]) == ["--model", "m"]
    assert engine_args(["vllm-wrapper", "--model", "m"]) == ["--model", "m"]


def test_paths_taken_reads_vllm_fallback_lines():
    be = get_backend("vllm")
    log = ("WARNING custom_all_reduce.py:271] Custom allreduce is disabled because it's not supported on more "
           "than two PCIe-only GPUs.")
    assert be.paths_taken(log, {"allreduce": "custom"}) == ["allreduce_path_degraded"]
    assert be.paths_taken(log, {"allreduce": "nccl"}) == []
    assert be.paths_taken("SymmMemCommunicator: World size 8 not supported, communicator is not available.",
                          {"allreduce": "symm_mem"}) == ["allreduce_path_degraded"]
    assert be.paths_taken("engine config ... disable_custom_all_reduce=True", {"allreduce": "nccl"}) == []
    assert be.paths_taken("", {}) == []


def test_acceptance_length_is_one_plus_accepted_over_drafts_between_readings():
    before = {ACCEPTED: 100.0, DRAFTS: 50.0}
    after = {ACCEPTED: 433.0 + 100.0, DRAFTS: 180.0 + 50.0}
    assert acceptance_length(before, after) == pytest.approx(1 + 433 / 180)
    assert acceptance_length({}, {}) == 1.0
    ids = prompt_ids(128, 0, 3)
    assert ids == prompt_ids(128, 0, 3) and all(3 <= i < 259 for i in ids) and ids != prompt_ids(128, 0, 4)


@pytest.mark.parametrize("case", yaml.safe_load((LOGS / "cases.yaml").read_text())["cases"], ids=lambda c: c["id"])
def test_real_vllm_failure_logs_classify(case):
    text = (LOGS / case["log"]).read_text()
    c = classify(text, case["exit_code"], case["phase"])
    assert c.failure_class == case["expected_class"], c
    assert c.kind == {"server_crash": "transient"}.get(c.failure_class, "deterministic")


def test_tiny_model_path_in_the_config_is_the_builders():
    assert model_dir(ROOT / "mlflow") == (ROOT / MODEL["path"]).resolve()
    assert content_hash({**SPEC, "hidden_size": 128}) != content_hash(SPEC)
    assert SPEC["hidden_size"] // SPEC["num_attention_heads"] == 64  # vLLM's CPU attention rejects 16


def test_cpu_real_sweep_config_validates_and_has_a_failing_memory_level():
    spec = load_spec(compose_cfg(CPU_REAL))
    assert spec.backend.kind == "vllm" and spec.node.device == "cpu" and spec.bench.concurrency > 1
    assert {"kv_cache_space_gib": "unset", "gpu_memory_utilization": 0.98}.items() <= next(
        s for s in spec.sweep.seed_trials if s.get("gpu_memory_utilization") == 0.98).items()
    with pytest.raises(ConfigError, match="sweep.params.mem_fraction_static: unknown knob"):
        load_spec(compose_cfg([*CPU_REAL, "+sweep.params.mem_fraction_static={type:categorical,choices:[0.8]}"]))


def test_preflight_model_and_gpu_checks_name_the_field(monkeypatch):
    r = PreflightReport()
    check_model({"path": "/nonexistent/model"}, r)
    check_model({"path": "org/some-model"}, r)
    assert r.errors == ["model.path: '/nonexistent/model' does not exist (download the checkpoint there or fix the path)"]
    assert r.warnings and r.warnings[0].startswith("model.path: 'org/some-model' is not a local path")
    r = PreflightReport()
    check_gpus(NODE_CPU, BACKEND, r)
    assert r.errors == []  # CPU node: no NVML needed
    monkeypatch.setattr("tasks.backends.preflight.visible_gpus", lambda: (None, "NVML does not answer (test)"))
    check_gpus(NODE_GPU, BACKEND, r)
    assert len(r.errors) == 1 and r.errors[0].startswith("node: 'rtx_pro_6000x8' is a GPU node but NVML")
    r = PreflightReport()
    monkeypatch.setattr("tasks.backends.preflight.visible_gpus", lambda: (4, None))
    check_gpus(NODE_GPU, BACKEND, r)
    assert r.errors and r.errors[0].startswith("backend.tp_size: TP=8 needs 8 visible GPUs, this node shows 4")


def test_preflight_refuses_a_missing_engine_interpreter():
    r = preflight(get_backend("vllm"), NODE_CPU, MODEL, {**BACKEND, "python": "/nonexistent/python"})
    assert any(e.startswith("backend.python: '/nonexistent/python' does not exist") for e in r.errors)


def test_preflight_runs_for_real_engines_only():
    from tasks.backends.preflight import run_preflight

    assert run_preflight("emulated", NODE_GPU, MODEL, BACKEND) is None
    assert run_preflight("instant", NODE_GPU, MODEL, BACKEND) is None
    r = run_preflight("vllm", NODE_CPU, {**MODEL, "path": "/nonexistent"}, {**BACKEND, "python": "/nonexistent/py"})
    assert r is not None and [e.split(":")[0] for e in r.errors] == ["backend.python", "model.path"]


def test_a_vllm_memory_failure_rule_implicates_the_memory_knobs():
    from sweeps.rules.match import implicated_params, load_implicated_knobs

    params = {"speculative": "none", "max_num_seqs": 16, "dtype": "bfloat16", "kv_cache_space_gib": "unset",
              "gpu_memory_utilization": 0.98}
    got = implicated_params("kv_cache_pool_too_small", params, load_implicated_knobs())
    assert {"gpu_memory_utilization": 0.98, "kv_cache_space_gib": "unset"}.items() <= dict(got).items()
    assert "max_num_seqs" not in got and "dtype" not in got
