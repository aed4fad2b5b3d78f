"""Every failure the emulator can produce must be classified correctly by tasks.failures."""

from __future__ import annotations

import pytest

from tasks.emulator.model import evaluate_argv
from tasks.emulator.profile import default_profile
from tasks.emulator.testing import EAGLE_FLAGS, NCCL_FLAGS, baseline_flags

failures = pytest.importorskip("tasks.failures", reason="tasks.failures (classifier helper) not importable yet")

BASE = ["--model-path", "moonshotai/Kimi-K2.5", "--tp-size", "8", "--trust-remote-code"]
CASES = [
    ("fusion", BASE + ["--disable-custom-all-reduce", "--enable-flashinfer-allreduce-fusion"], {},
     "flashinfer_allreduce_fusion_unsupported_arch", -9),
    ("symm_mem", BASE + NCCL_FLAGS + ["--enable-torch-symm-mem"], {}, "torch_symm_mem_unsupported", -9),
    ("ep_a2a", BASE + NCCL_FLAGS + ["--moe-a2a-backend", "flashinfer", "--ep-size", "8"], {},
     "moe_ep_a2a_config_error", -9),
    ("a2a_runner", BASE + NCCL_FLAGS + ["--moe-a2a-backend", "flashinfer", "--moe-runner-backend", "triton"], {},
     "moe_ep_a2a_config_error", 1),
    ("ep_size", BASE + NCCL_FLAGS + ["--ep-size", "4"], {}, "moe_ep_a2a_config_error", 1),
    ("tree", baseline_flags(128), {"NCCL_ALGO": "Tree"}, "nccl_env_algo_proto_invalid", -9),
    ("tree_eager", baseline_flags(128, "--disable-cuda-graph"), {"NCCL_ALGO": "Tree"},
     "nccl_env_algo_proto_invalid", -9),
    ("kv_small", baseline_flags(128, "--mem-fraction-static", "0.7"), {}, "kv_cache_pool_too_small", -9),
    ("graph_oom", baseline_flags(512, "--mem-fraction-static", "0.95"), {}, "cuda_oom_graph_capture", -9),
    ("draft_graph_oom", baseline_flags(512, "--mem-fraction-static", "0.92", *EAGLE_FLAGS), {},
     "cuda_oom_graph_capture", -9),
    ("spec_partial", baseline_flags(128, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d",
                                    "--speculative-eagle-topk", "2"), {}, "spec_decode_config_error", 1),
    ("ambiguous", BASE + ["--cuda-graph-max-bs", "128"], {}, "cli_arg_error", 2),
    ("unknown_flag", BASE + ["--enable-magic"], {}, "cli_arg_error", 2),
]


@pytest.mark.parametrize("name,argv,env,expected,exit_code", CASES, ids=[c[0] for c in CASES])
def test_emulated_failure_is_classified(name, argv, env, expected, exit_code):
    pred = evaluate_argv(default_profile({"noise": 0.0}), argv, env)
    assert pred.outcome == "failed"
    assert pred.failure.failure_class == expected
    assert pred.failure.exit_code == exit_code
    c = failures.classify("\n".join(pred.log_lines), pred.failure.exit_code, "startup")
    assert c.failure_class == expected, ("\n".join(pred.log_lines), c)
