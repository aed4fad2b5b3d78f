"""Readable MLflow run names (the default experiment view shows them)."""

import pytest

from sweeps.store.records import TrialRecord
from sweeps.store.tracking import run_name


@pytest.mark.parametrize("params,tags,expected", [
    ({"speculative": "eagle3", "allreduce": "nccl", "nccl_algo": "Ring", "nccl_proto": "default",
      "cuda_graph_max_bs": 128, "eagle_num_steps": 3, "eagle_topk": 1, "eagle_num_draft_tokens": 4}, [],
     "t012 eagle3 nccl/Ring g128 3/1/4"),
    ({"speculative": "none", "allreduce": "nccl", "nccl_algo": "default", "nccl_proto": "Simple",
      "cuda_graph_max_bs": 512}, [], "t012 none nccl/Simple g512"),
    ({"speculative": "none", "allreduce": "custom", "cuda_graph_max_bs": 64}, ["allreduce_path_degraded"],
     "t012 none custom->nccl g64"),
    ({"speculative": "none", "allreduce": "nccl", "moe_a2a_backend": "flashinfer"}, [], "t012 none nccl a2a:flashinfer"),
])
def test_run_name(params, tags, expected):
    assert run_name(TrialRecord(number=12, state="COMPLETE", params=params, status="ok", perf_tags=tags)) == expected


def test_run_label_carries_the_outcome():
    from sweeps.store.tracking import run_label

    base = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}
    ok = TrialRecord(number=1, state="COMPLETE", params=base, status="ok", metrics={"decode_tok_s": 89.46})
    assert run_label(ok) == "t001 none nccl g128 · 89.5 tok/s"
    bad = TrialRecord(number=3, state="PRUNED", params={**base, "allreduce": "torch_symm_mem"}, status="failed",
                      failure_class="torch_symm_mem_unsupported")
    assert run_label(bad).endswith("· torch_symm_mem_unsupported")
    skip = TrialRecord(number=9, state="PRUNED", params=base, status="skipped", skipped_by_rule="4",
                       failure_class="nccl_env_algo_proto_invalid")
    assert run_label(skip).endswith("· skipped: nccl_env_algo_proto_invalid")


def test_a_space_beyond_the_campaign_names_every_knob():
    """A vLLM CPU sweep's runs differ by max_num_seqs, dtype...: the name shows them, never the
    campaign's defaults (``none nccl``) for knobs the space does not have."""
    p = {"speculative": "none", "max_num_seqs": 32, "dtype": "bfloat16", "chunked_prefill": True}
    name = run_name(TrialRecord(number=5, state="COMPLETE", params=p, status="ok"))
    assert name == "t005 speculative=none max_num_seqs=32 dtype=bfloat16 chunked_prefill=True"


def test_run_label_shows_the_sweeps_objective():
    from sweeps.config.objective import Objective
    from sweeps.store.tracking import run_label

    base = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}
    r = TrialRecord(number=2, state="COMPLETE", params=base, status="ok",
                    metrics={"decode_tok_s": 89.46, "max_rate_at_slo_req_s": 2.61})
    assert run_label(r, Objective("max_rate_at_slo_req_s", "maximize")) == "t002 none nccl g128 · 2.6 max_rate_at_slo_req_s"
    assert run_label(r, Objective("ttft_ms_p50", "minimize")).endswith("· ok")  # the objective was not measured
    # throughputs other than the batch-1 decode rate say which they are
    assert run_label(TrialRecord(number=3, state="COMPLETE", params=base, status="ok", metrics={"output_tok_s": 2406.14}),
                     Objective("output_tok_s", "maximize")) == "t003 none nccl g128 · 2406.1 output tok/s"
