"""Readable MLflow run names (the default experiment view shows them)."""

import pytest

from sweeps.records import TrialRecord
from sweeps.tracking import run_name


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
