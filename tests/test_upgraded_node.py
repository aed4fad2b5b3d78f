"""The what-if upgraded node (conf/node/rtx_pro_6000x8_upgraded.yaml): it loads, its fingerprint
differs exactly where it says, and the emulator's predictions change only where a capability
the emulator reads changed (none: every dead end stays; shipped knowledge says why)."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import yaml

from sweeps.config.spec import NodeConfig
from sweeps.rules.knowledge import match
from tasks.emulator.calibration import render_config
from tasks.emulator.instant import predict
from tasks.emulator.profile import build_profile

ROOT = Path(__file__).resolve().parent.parent
BASE_NODE = yaml.safe_load((ROOT / "conf/node/rtx_pro_6000x8.yaml").read_text())
UP_NODE = yaml.safe_load((ROOT / "conf/node/rtx_pro_6000x8_upgraded.yaml").read_text())
MODEL = yaml.safe_load((ROOT / "conf/model/kimi_k25_eagle3.yaml").read_text())
UPGRADE = UP_NODE["emulator"]["upgrade"]


def _profile(node: dict) -> dict:
    return build_profile(node, MODEL, {"noise": 0.0})


def _grid() -> list[dict]:
    """The campaign's categorical levels (conf/sweep/eagle3_allreduce.yaml) x two EAGLE shapes."""
    out = []
    for ar, algo, proto, a2a, bs in itertools.product(
            ["nccl", "custom", "flashinfer_fusion", "torch_symm_mem"], ["default", "Ring", "Tree"],
            ["default", "LL", "Simple"], ["none", "flashinfer"], [8, 128, 512]):
        base = {"allreduce": ar, "nccl_algo": algo, "nccl_proto": proto, "moe_a2a_backend": a2a, "cuda_graph_max_bs": bs}
        out.append({**base, "speculative": "none"})
        out.append({**base, "speculative": "eagle3", "eagle_num_steps": 3, "eagle_topk": 1, "eagle_num_draft_tokens": 4})
    return out


GRID = _grid()


def _outcome(profile: dict, cfg: dict) -> tuple:
    argv, env, caps = render_config(cfg, profile["model"])
    assert not caps
    p = predict(profile, argv, env)
    return (p.outcome, p.failure.failure_class if p.failure else None, round(p.decode_tok_s, 6), p.allreduce_path)


def _changed(a: dict, b: dict) -> list[dict]:
    return [cfg for cfg in GRID if _outcome(a, cfg) != _outcome(b, cfg)]


def test_upgraded_profile_loads_and_validates():
    NodeConfig.model_validate(UP_NODE)  # what Hydra's node=rtx_pro_6000x8_upgraded goes through
    prof = _profile(UP_NODE)
    assert prof["node"]["name"] == "rtx_pro_6000x8_upgraded"
    assert prof["emulator"]["fingerprint"] != _profile(BASE_NODE)["emulator"]["fingerprint"]


def test_fingerprint_differs_exactly_where_the_upgrade_block_says_with_sources():
    base_fp, up_fp = BASE_NODE["emulator"]["fingerprint"], UP_NODE["emulator"]["fingerprint"]
    assert UPGRADE["from_node"] == BASE_NODE["name"]
    changed = {k for k in base_fp if base_fp[k] != up_fp.get(k)}
    assert set(up_fp) == set(base_fp)
    assert changed == {c["component"] for c in UPGRADE["changes"]} == {"cuda", "flashinfer", "torch", "nccl"}
    for c in UPGRADE["changes"]:
        assert (c["from"], c["to"]) == (base_fp[c["component"]], up_fp[c["component"]])
        assert c["source"].startswith(("[S]", "[A]", "[D]")) and len(c["source"]) > 20
    for u in UPGRADE["unchanged"]:
        assert up_fp[u["component"]] == base_fp[u["component"]] == u["version"]


def test_same_hardware_constants():
    a, b = copy.deepcopy(BASE_NODE), copy.deepcopy(UP_NODE)
    for n in (a, b):
        n.pop("name")
        for k in ("fingerprint", "upgrade", "capabilities"):
            n["emulator"].pop(k, None)
    assert a == b
    caps_a, caps_b = BASE_NODE["emulator"]["capabilities"], UP_NODE["emulator"]["capabilities"]
    changed = {k for k in caps_a.keys() | caps_b.keys() if caps_a.get(k) != caps_b.get(k)}
    assert changed == set(UPGRADE["capabilities_changed"]) == {"flashinfer_fusion_rejected_by"}


def test_predictions_change_only_where_a_capability_changed():
    base, up = _profile(BASE_NODE), _profile(UP_NODE)
    assert _changed(base, up) == []  # no capability that decides an outcome changed: nothing moves
    outcomes = {_outcome(up, c)[1] for c in GRID}
    assert {"flashinfer_allreduce_fusion_unsupported_arch", "torch_symm_mem_unsupported",
            "nccl_env_algo_proto_invalid", "moe_ep_a2a_config_error"} <= outcomes  # the dead ends stay


@pytest.mark.parametrize("cap, value, knob, level", [
    ("flashinfer_fusion_supported_majors", [9, 10, 12], "allreduce", "flashinfer_fusion"),
    ("torch_symm_mem_majors", [9, 10, 12], "allreduce", "torch_symm_mem"),
    ("nccl_tree_supports_allgather", True, "nccl_algo", "Tree"),
])
def test_the_comparison_sees_a_capability_change_and_only_its_configs(cap, value, knob, level):
    # Guards the test above: had the upgrade changed this capability, exactly these configs would move.
    node = copy.deepcopy(UP_NODE)
    node["emulator"]["capabilities"][cap] = value
    moved = _changed(_profile(UP_NODE), _profile(node))
    assert moved and all(c[knob] == level for c in moved)


def test_the_fusion_fails_on_sglangs_gate_after_the_upgrade_and_on_flashinfers_jit_before():
    """The upgrade's one visible change: FlashInfer's JIT builds SM12x, so the error the log shows
    is SGLang's own gate; the classifier reads both as the same dead end."""
    from tasks.failures import classify

    cfg = next(c for c in GRID if c["allreduce"] == "flashinfer_fusion" and c["speculative"] == "none")
    logs = {}
    for name, node in (("base", BASE_NODE), ("up", UP_NODE)):
        argv, env, _ = render_config(cfg, _profile(node)["model"])
        p = predict(_profile(node), argv, env)
        logs[name] = "\n".join(p.log_lines)
        c = classify(logs[name], p.failure.exit_code, None)
        assert c.failure_class == "flashinfer_allreduce_fusion_unsupported_arch", (name, c)
    assert "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in logs["up"]
    assert "No supported CUDA architectures" not in logs["up"]
    assert "No supported CUDA architectures found for major versions [9, 10]" in logs["base"]
    assert "requires SM90 or SM10X" not in logs["base"]


def test_knowledge_on_the_upgraded_stack():
    fp = UP_NODE["emulator"]["fingerprint"]
    ids = {e.id for e in match(fp, UP_NODE, {"allreduce": "flashinfer_fusion"})}
    assert ids == {"sglang_fusion_gate_sm12x"}  # FlashInfer fixed its gate (0.6.17); SGLang 0.5.23 did not
    for params, entry in (({"allreduce": "torch_symm_mem"}, "torch_symm_mem_table_sm12x"),
                          ({"nccl_algo": "Tree"}, "nccl_algo_tree_no_allgather"),
                          ({"moe_a2a_backend": "flashinfer"}, "flashinfer_a2a_needs_nvlink")):
        assert [e.id for e in match(fp, UP_NODE, params)] == [entry]
