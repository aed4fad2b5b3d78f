"""Shipped public knowledge: conf/knowledge/*.yaml loaded, validated and matched (sweeps/rules/knowledge.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeps.rules import knowledge
from sweeps.rules.knowledge import KnowledgeError, load_knowledge, match

ROOT = Path(__file__).resolve().parent.parent
NODE = yaml.safe_load((ROOT / "conf/node/rtx_pro_6000x8.yaml").read_text())
CAMPAIGN_FP = dict(NODE["emulator"]["fingerprint"])
BASE = {"speculative": "none", "allreduce": "nccl", "nccl_algo": "default", "nccl_proto": "default",
        "cuda_graph_max_bs": 512, "moe_a2a_backend": "none"}
HOPPER = {"compute_capability": "9.0", "nvlink": True}
HOPPER_FP = {**CAMPAIGN_FP, "gpu_arch": "sm_90"}
SOURCE_REPOS = ("sgl-project/sglang", "flashinfer-ai/flashinfer", "pytorch/pytorch", "NVIDIA/nccl")


def _ids(fp, node, **params) -> set[str]:
    return {e.id for e in match(fp, node, {**BASE, **params})}


def test_loads_the_four_required_dead_ends_with_real_sources():
    entries = load_knowledge()
    by_class = {e.failure_class for e in entries}
    assert {"flashinfer_allreduce_fusion_unsupported_arch", "torch_symm_mem_unsupported",
            "nccl_env_algo_proto_invalid", "moe_ep_a2a_config_error"} <= by_class
    for e in entries:
        assert e.file.startswith("conf/knowledge/")
        for s in e.sources + e.fixed_by:
            assert s.url.startswith(tuple(f"https://github.com/{r}/" for r in SOURCE_REPOS)), s.url


@pytest.mark.parametrize("params, expected", [
    ({"allreduce": "flashinfer_fusion"}, {"flashinfer_fusion_jit_gate_sm12x", "sglang_fusion_gate_sm12x"}),
    ({"allreduce": "torch_symm_mem"}, {"torch_symm_mem_table_sm12x"}),
    ({"nccl_algo": "Tree"}, {"nccl_algo_tree_no_allgather"}),
    ({"moe_a2a_backend": "flashinfer"}, {"flashinfer_a2a_needs_nvlink"}),
    ({"speculative": "eagle3", "eagle_num_steps": 3, "eagle_topk": 1, "eagle_num_draft_tokens": 4}, set()),
    ({}, set()),
    ({"allreduce": "custom", "nccl_algo": "Ring", "nccl_proto": "LL"}, set()),
    ({"allreduce": "torch_symm_mem", "nccl_algo": "Tree"}, {"torch_symm_mem_table_sm12x", "nccl_algo_tree_no_allgather"}),
])
def test_campaign_node_matches_each_entry_for_the_right_configs(params, expected):
    assert _ids(CAMPAIGN_FP, NODE, **params) == expected


def test_the_emulated_nodes_own_fingerprint_matches_too():
    from tasks.emulator.profile import default_profile

    prof = default_profile()
    fp, node = prof["emulator"]["fingerprint"], prof["node"]
    assert _ids(fp, node, allreduce="flashinfer_fusion") == {"flashinfer_fusion_jit_gate_sm12x", "sglang_fusion_gate_sm12x"}
    assert _ids(fp, node, moe_a2a_backend="flashinfer") == {"flashinfer_a2a_needs_nvlink"}


@pytest.mark.parametrize("flashinfer, jit_gate_matches", [
    ("0.5.3", True), ("0.6.16", True), ("0.6.16.post4", True),
    ("0.6.17rc1", False), ("0.6.17", False), ("0.7.2", False),
])
def test_a_flashinfer_with_the_sm12x_jit_fix_does_not_match(flashinfer, jit_gate_matches):
    # flashinfer-ai/flashinfer#3903 is first in v0.6.17rc1 (v0.6.16.post4 still gates [9, 10]);
    # PEP 440 keeps 0.6.17's pre-releases out of "<0.6.17", which is right here.
    ids = _ids({**CAMPAIGN_FP, "flashinfer": flashinfer}, NODE, allreduce="flashinfer_fusion")
    assert ("flashinfer_fusion_jit_gate_sm12x" in ids) is jit_gate_matches
    assert "sglang_fusion_gate_sm12x" in ids  # SGLang's own SM90/SM10X gate has no public fix


def test_other_hardware_does_not_match_the_sm12x_and_pcie_entries():
    assert _ids(HOPPER_FP, HOPPER, allreduce="flashinfer_fusion") == set()
    assert _ids(HOPPER_FP, HOPPER, allreduce="torch_symm_mem") == set()
    assert _ids(HOPPER_FP, HOPPER, moe_a2a_backend="flashinfer") == set()
    assert _ids(HOPPER_FP, HOPPER, nccl_algo="Tree") == {"nccl_algo_tree_no_allgather"}  # NCCL, any arch
    assert _ids({**CAMPAIGN_FP, "nccl": "2.4.8"}, NODE, nccl_algo="Tree") == set()  # before NCCL_ALGO existed


def test_engine_and_arch_from_the_fingerprint():
    assert _ids({**CAMPAIGN_FP, "engine": "vllm"}, NODE, allreduce="torch_symm_mem") == set()
    # no compute_capability on the node: derived from the fingerprint's gpu_arch
    assert _ids(HOPPER_FP, {"nvlink": True}, allreduce="flashinfer_fusion") == set()
    assert _ids(CAMPAIGN_FP, {"nvlink": False}, allreduce="torch_symm_mem") == {"torch_symm_mem_table_sm12x"}


def test_unreported_fields_match_so_a_probe_runs():
    assert _ids({}, {}, allreduce="flashinfer_fusion") == {"flashinfer_fusion_jit_gate_sm12x", "sglang_fusion_gate_sm12x"}
    assert _ids({"flashinfer": "not-a-version"}, NODE, allreduce="flashinfer_fusion") >= {"flashinfer_fusion_jit_gate_sm12x"}
    assert _ids(CAMPAIGN_FP, NODE, moe_a2a_backend="flashinfer") == _ids(CAMPAIGN_FP, {}, moe_a2a_backend="flashinfer")


def test_rule_rows_and_for_stack():
    rows = [e.rule_row() for e in knowledge.for_stack(CAMPAIGN_FP, NODE)]
    assert {r["origin"] for r in rows} == {"shipped"}
    assert len(rows) == len(load_knowledge())
    assert {r["id"] for r in (e.rule_row() for e in knowledge.for_stack(HOPPER_FP, HOPPER))} == {"nccl_algo_tree_no_allgather"}
    jit = next(r for r in rows if r["id"] == "flashinfer_fusion_jit_gate_sm12x")
    assert jit["fixed_by"] == ["flashinfer 0.6.17 (https://github.com/flashinfer-ai/flashinfer/pull/3903)"]


# --- validation: a bad entry names its file and field ------------------------------------
GOOD = {"id": "x_y", "failure_class": "nccl_env_algo_proto_invalid", "summary": "a summary of it",
        "knobs": {"nccl_algo": ["Tree"]},
        "sources": [{"url": "https://github.com/NVIDIA/nccl/issues/317", "kind": "issue", "says": "what it says"}]}


@pytest.mark.parametrize("patch, field", [
    ({"failure_class": "no_such_class"}, "entries[0].failure_class"),
    ({"knobs": {"nccl_algorithm": ["Tree"]}}, "entries[0].knobs.nccl_algorithm"),
    ({"knobs": {"nccl_algo": ["Trie"]}}, "entries[0].knobs.nccl_algo"),
    ({"applies_to": {"versions": {"flashinfer": "~~0.6"}}}, "entries[0].applies_to.versions"),
    ({"applies_to": {"versions": {"cudnn": ">=9"}}}, "entries[0].applies_to.versions"),
    ({"applies_to": {"compute_capability": "twelve"}}, "entries[0].applies_to.compute_capability"),
    ({"sources": [{"url": "https://example.com/x", "kind": "issue", "says": "what it says"}]}, "entries[0].sources.0.url"),
    ({"sources": []}, "entries[0].sources"),
    ({"surprise": 1}, "entries[0].surprise"),
])
def test_bad_entry_names_file_and_field(tmp_path, patch, field):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"entries": [{**GOOD, **patch}]}))
    with pytest.raises(KnowledgeError) as err:
        load_knowledge(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'bad.yaml'}: {field}"), str(err.value)


def test_duplicate_ids_and_bad_files(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"entries": [GOOD]}))
    load_knowledge(tmp_path)  # a good entry loads
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"entries": [GOOD]}))
    with pytest.raises(KnowledgeError, match="already defined in"):
        load_knowledge(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "c.yaml").write_text("[1, 2]")
    with pytest.raises(KnowledgeError, match="entries:"):
        load_knowledge(other)
