"""Probe launches (tasks/probe.py): which classes a probe reveals, its layer count, its argv,
and (marker ``contract``) that SGLang 0.5.23's and vLLM 0.32.0's own parsers accept it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tasks import probe
from tasks.backends.sglang import cli as sglang_cli
from tasks.failures import KIND
from tasks.probe import EAGLE3_MIN_LAYERS, parse_probe, probe_argv, probe_classes, probe_layers

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SERVESWEEP_SHARED_DIR", ROOT.parent / "shared")).resolve()
CLASSES_MD = SHARED / "data" / "failure_classes.md"
KIMI = yaml.safe_load((ROOT / "conf/model/kimi_k25_eagle3.yaml").read_text())
DENSE = {"name": "tiny", "path": "/m", "emulator": {"num_layers": 32, "num_moe_layers": 0, "architecture": "LlamaForCausalLM"}}
LAUNCHER = ["python", "-m", "sglang.launch_server"]
KIMI_ARGS = ["--model-path", "moonshotai/Kimi-K2.5", "--tp-size", "8", "--trust-remote-code",
             "--host", "127.0.0.1", "--port", "30011", "--nccl-port", "30012"]
EAGLE = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "AQ-MedAI/Kimi-K25-eagle3",
         "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
NCCL = ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion"]
# The campaign's startup-failure configs and its two healthy ones, as full SGLang launches.
FULL_SGLANG = {
    "baseline": LAUNCHER + KIMI_ARGS + NCCL + ["--cuda-graph-max-bs-decode", "512"],
    "fusion": LAUNCHER + KIMI_ARGS + ["--disable-custom-all-reduce", "--enable-flashinfer-allreduce-fusion"],
    "symm_mem": LAUNCHER + KIMI_ARGS + NCCL + ["--enable-torch-symm-mem"],
    "ep_a2a": LAUNCHER + KIMI_ARGS + NCCL + ["--moe-a2a-backend", "flashinfer", "--ep-size", "8"],
    "eagle3": LAUNCHER + KIMI_ARGS + NCCL + EAGLE + ["--cuda-graph-max-bs-decode", "128"],
    "with_override": LAUNCHER + KIMI_ARGS + NCCL + ["--load-format", "auto",
                                                    "--json-model-override-args", '{"rope_scaling": {"factor": 2.0}}'],
}


def _canonical_from_md() -> list[str]:
    rows = re.findall(r"^\|\s*([a-z][a-z0-9_]*)\b[^|]*\|\s*(deterministic|transient|infra|perf)\s*\|",
                      CLASSES_MD.read_text(), flags=re.M)
    return [c for c, _ in rows]


# --- which classes a probe reveals --------------------------------------------------------
@pytest.mark.skipif(not CLASSES_MD.is_file(), reason=f"{CLASSES_MD} not found (set SERVESWEEP_SHARED_DIR)")
def test_every_canonical_class_is_listed_exactly_once():
    canonical = _canonical_from_md()
    assert len(canonical) == len(set(canonical)) >= 30
    pc = probe_classes()
    listed = list(pc.revealable) + list(pc.not_revealable)
    from tasks.failure_signatures import TABLES

    assert sorted(listed) == sorted(KIND) == sorted([*canonical, *TABLES.added])
    for cls, added in TABLES.added.items():  # the added classes' probe group, as their table row says
        assert pc.reveals(cls) is (added["probe"] == "revealable"), cls
    assert not set(pc.revealable) & set(pc.not_revealable)


def test_probe_reveals_startup_classes_but_not_memory_or_transient_ones():
    pc = probe_classes()
    for cls in ("flashinfer_allreduce_fusion_unsupported_arch", "torch_symm_mem_unsupported",
                "nccl_env_algo_proto_invalid", "moe_ep_a2a_config_error", "spec_decode_config_error",
                "cli_arg_error", "unsupported_arch_kernel"):
        assert pc.reveals(cls), cls
    for cls in ("kv_cache_pool_too_small", "cuda_oom_graph_capture", "cuda_oom_runtime", "host_oom_killed",
                "model_weights_error", "startup_timeout", "collective_hang_or_timeout", "node_lost", "unknown",
                "spec_decode_no_speedup", "allreduce_path_degraded"):
        assert not pc.reveals(cls), cls
    for cls in pc.revealable:  # only deterministic classes can make a dead end
        assert KIND[cls] == "deterministic", cls
    with pytest.raises(KeyError):
        pc.reveals("no_such_class")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["not_revealable"].pop("node_lost"), "classes not listed: ['node_lost']"),
    (lambda d: d["revealable"].update(node_lost="x"), "not_revealable.node_lost: already listed under revealable"),
    (lambda d: d["revealable"].update(bogus_class="x"), "revealable.bogus_class: not a canonical"),
    (lambda d: d["revealable"].update(cli_arg_error=""), "revealable.cli_arg_error: the reason must be text"),
    (lambda d: d.update(extra={}), "expected exactly the keys"),
])
def test_bad_probe_classes_file_names_the_field(tmp_path, mutate, message):
    data = yaml.safe_load(probe.PROBE_CLASSES_YAML.read_text())
    mutate(data)
    path = tmp_path / "probe_classes.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError) as err:
        probe_classes(path)
    assert message in str(err.value) and str(path) in str(err.value)


# --- layer count ---------------------------------------------------------------------------
def _eagle3_default_ok(n: int) -> bool:
    """SGLang/vLLM default EAGLE-3 captures [2, n//2, n-3]: in range(n) and strictly increasing."""
    ids = [2, n // 2, n - 3]
    return ids == sorted(set(ids)) and all(0 <= i < n for i in ids)


def test_eagle3_minimum_is_the_smallest_layer_count_with_three_ordered_captures():
    assert EAGLE3_MIN_LAYERS == min(n for n in range(1, 64) if _eagle3_default_ok(n))
    assert all(_eagle3_default_ok(n) for n in range(EAGLE3_MIN_LAYERS, 200))
    # n = 4..6 repeat a layer, so only 2 of the 3 captures fire ("captured 2 of 3 aux hidden states")
    assert [n for n in range(4, 7) if len({2, n // 2, n - 3}) == 3] == []


def test_probe_layers_kimi():
    plain = {"speculative": "none"}
    # 1 dense + 60 MoE: layer 1 is the first MoE layer, so two layers reveal an all-to-all failure
    assert probe_layers(KIMI, plain) == 2
    assert probe_layers(KIMI, {**plain, "moe_a2a_backend": "flashinfer"}) == 2
    assert probe_layers(KIMI, plain, "vllm") == 2
    # SGLang passes the override to the EAGLE-3 draft too: no cut; vLLM keeps dict overrides target-only
    assert probe_layers(KIMI, {"speculative": "eagle3"}) == 61
    assert probe_layers(KIMI, {"speculative": "eagle3"}, "vllm") == EAGLE3_MIN_LAYERS
    with pytest.raises(ValueError, match="engine"):
        probe_layers(KIMI, plain, "trtllm")


def test_probe_layers_other_geometries():
    assert probe_layers(DENSE, {}) == 1
    assert probe_layers(DENSE, {"speculative": "eagle3"}, "vllm") == 7
    three_dense = {**KIMI, "probe": {"first_k_dense": 3}}
    assert probe_layers(three_dense, {}) == 4
    under_emulator = {**KIMI, "emulator": {**KIMI["emulator"], "probe": {"first_k_dense": 3}}}
    assert probe_layers(under_emulator, {}) == 4
    explicit = {**KIMI, "probe": {"draft_aux_layer_ids": [1, 29, 57]}}
    assert probe_layers(explicit, {"speculative": "eagle3"}, "vllm") == 59
    tiny = {"emulator": {"num_layers": 2, "num_moe_layers": 0}}
    assert probe_layers(tiny, {"speculative": "eagle3"}, "vllm") == 2  # never more than the model has
    with pytest.raises(ValueError, match="num_layers"):
        probe_layers({"emulator": {}}, {})


# --- argv ----------------------------------------------------------------------------------
def test_probe_argv_sglang_moe_keeps_every_token_and_adds_dummy_and_the_nested_override():
    full = FULL_SGLANG["ep_a2a"]
    p = probe_argv(full, "sglang", KIMI)
    assert p[:len(full)] == full
    assert p[len(full):] == ["--load-format", "dummy", "--json-model-override-args",
                             '{"text_config":{"num_hidden_layers":2}}']
    assert parse_probe(p) == probe.ProbeLaunch(num_layers=2)
    assert parse_probe(full) is None


def test_probe_argv_replaces_and_merges_existing_values():
    p = probe_argv(FULL_SGLANG["with_override"], "sglang", KIMI)
    assert p.count("--load-format") == 1 and p[p.index("--load-format") + 1] == "dummy"
    over = json.loads(p[p.index("--json-model-override-args") + 1])
    assert over == {"rope_scaling": {"factor": 2.0}, "text_config": {"num_hidden_layers": 2}}
    eq = probe_argv(["--model-path", "m", "--load-format=auto", '--json-model-override-args={"text_config": {"x": 1}}'],
                    "sglang", KIMI)
    assert eq == ["--model-path", "m", "--load-format", "dummy", "--json-model-override-args",
                  '{"text_config":{"num_hidden_layers":2,"x":1}}']
    with pytest.raises(ValueError, match="JSON object"):
        probe_argv(["--json-model-override-args", "[1]"], "sglang", KIMI)


def test_sglang_eagle3_probe_is_dummy_weights_only():
    full = FULL_SGLANG["eagle3"]
    p = probe_argv(full, "sglang", KIMI)
    assert p == full + ["--load-format", "dummy"]
    assert parse_probe(p) == probe.ProbeLaunch(num_layers=None)


def test_vllm_probe_uses_hf_overrides_and_reads_speculation_from_argv():
    base = ["--model", "/m", "--tensor-parallel-size", "8"]
    spec = base + ["--speculative-config", json.dumps({"method": "eagle3", "model": "/d", "num_speculative_tokens": 3})]
    p = probe_argv(spec, "vllm", KIMI)
    assert p[p.index("--hf-overrides") + 1] == '{"text_config":{"num_hidden_layers":7}}'
    flat = probe_argv(base, "vllm", DENSE)
    assert flat == base + ["--load-format", "dummy", "--hf-overrides", '{"num_hidden_layers":1}']
    assert parse_probe(flat, "vllm") == probe.ProbeLaunch(num_layers=1)


# --- contract: the engines' own parsers accept probe argvs -------------------------------
CONTRACT_PY = ROOT / ".contract-venv" / "bin" / "python"
VLLM_PY = ROOT / ".vllm-venv" / "bin" / "python"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CONTRACT CHECK NOT RUN: {reason} (CI=true)")
    pytest.skip(f"CONTRACT CHECK NOT RUN: {reason}")


@pytest.mark.contract
def test_sglang_0_5_23_parser_accepts_probe_argvs():
    if not CONTRACT_PY.exists():
        _unavailable(f"{CONTRACT_PY} missing (scripts/contract_env.sh)")
    probes = [probe_argv(a, "sglang", KIMI) for a in FULL_SGLANG.values()]
    bad_format = [a if a != "dummy" else "bogus" for a in probes[3]]  # negative control: the check bites
    results = sglang_cli.check_many(probes + [bad_format], python=str(CONTRACT_PY))
    bad = [(a, r["error"]) for a, r in zip(probes, results) if not r["ok"]]
    assert not bad, bad
    assert not results[-1]["ok"] and "load-format" in results[-1]["error"], results[-1]


_VLLM_SNIPPET = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    try:
        ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        out.append({"ok": True, "load_format": ns.load_format, "hf_overrides": ns.hf_overrides})
    except BaseException as e:  # argparse exits
        out.append({"ok": False, "error": repr(e)})
print(json.dumps(out))
"""


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
@pytest.mark.contract
def test_vllm_0_32_parser_accepts_probe_argvs():
    if not VLLM_PY.exists():
        _unavailable(f"{VLLM_PY} missing (scripts/vllm_env.sh)")
    base = ["--model", "/tmp/tiny", "--tensor-parallel-size", "1", "--host", "127.0.0.1", "--port", "30020"]
    spec = base + ["--speculative-config", json.dumps({"method": "eagle3", "model": "/tmp/d", "num_speculative_tokens": 3})]
    probes = [probe_argv(base, "vllm", DENSE), probe_argv(spec, "vllm", KIMI),
              probe_argv(base + ["--load-format", "auto"], "vllm", KIMI)]
    # negative control: vLLM's parser takes any --load-format / --hf-overrides string (a bad
    # one fails later), so prove the check bites with an unknown flag
    bad = probes[0] + ["--no-such-probe-flag", "1"]
    proc = subprocess.run([str(VLLM_PY), "-c", _VLLM_SNIPPET], input=json.dumps(probes + [bad]),
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["ok"] for r in res] == [True, True, True, False], res
    assert [r["load_format"] for r in res[:3]] == ["dummy"] * 3
    assert res[0]["hf_overrides"] == {"num_hidden_layers": 1}
    assert res[1]["hf_overrides"] == {"text_config": {"num_hidden_layers": 7}}
    assert res[2]["hf_overrides"] == {"text_config": {"num_hidden_layers": 2}}  # parsed as JSON, not a string


# SGLang 0.5.23's own config code (needs transformers: taken from the vLLM venv) on a
# Kimi-K2.5-shaped target and a flat EAGLE-3 draft config: why an SGLang EAGLE-3 probe keeps all layers.
_SGLANG_CONFIG_SNIPPET = r"""
import importlib.abc, importlib.machinery, importlib.metadata as md, json, sys, types
class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        m = _Stub(f"{self.__name__}.{name}"); m.__path__ = []; sys.modules[m.__name__] = m
        setattr(self, name, m); return m
    def __call__(self, *a, **k):
        return self
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # image-side imports that the config code pulls in but never uses here
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision.") or name == "sglang.srt.multimodal.internvl_utils":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = _Stub(spec.name); m.__path__ = []; return m
    def exec_module(self, m):
        pass
sys.meta_path.insert(0, _Finder())
_v = md.version
md.version = lambda n: "0.28.0" if n == "torchvision" else _v(n)
sys.path.insert(0, sys.argv[1])
from sglang.srt.utils.hf_transformers.config import get_config
from sglang.srt.utils.hf_transformers.common import get_hf_text_config
out = {}
for name in ("kimi", "draft"):
    for key, ov in (("none", {}), ("nested", json.loads(sys.argv[3]))):
        try:
            t = get_hf_text_config(get_config(f"{sys.argv[2]}/{name}", trust_remote_code=False, model_override_args=ov))
            out[f"{name}/{key}"] = [t.num_hidden_layers, getattr(t, "first_k_dense_replace", None)]
        except Exception as e:
            out[f"{name}/{key}"] = type(e).__name__
print(json.dumps(out))
"""
KIMI_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
                               "hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 1,
                               "moe_layer_freq": 1, "n_routed_experts": 384, "num_experts_per_tok": 8,
                               "num_attention_heads": 64, "vocab_size": 163840, "kv_lora_rank": 512,
                               "q_lora_rank": 1536}}
DRAFT_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
                "intermediate_size": 18432, "num_attention_heads": 64, "num_key_value_heads": 64,
                "num_hidden_layers": 1, "vocab_size": 163840, "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


@pytest.mark.contract
def test_sglang_override_cuts_the_kimi_target_but_breaks_a_flat_eagle3_draft(tmp_path):
    site = next((ROOT / ".contract-venv" / "lib").glob("python3*/site-packages"), None)
    if site is None or not (site / "sglang").is_dir() or not VLLM_PY.exists():
        _unavailable("needs .contract-venv (SGLang 0.5.23) and .vllm-venv (transformers)")
    for name, cfg in (("kimi", KIMI_CONFIG), ("draft", DRAFT_CONFIG)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    p = probe_argv(FULL_SGLANG["ep_a2a"], "sglang", KIMI)
    override = p[p.index("--json-model-override-args") + 1]
    proc = subprocess.run([str(VLLM_PY), "-c", _SGLANG_CONFIG_SNIPPET, str(site), str(tmp_path), override],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["kimi/none"] == [61, 1]
    assert res["kimi/nested"] == [2, 1]  # cut to 2 layers, first_k_dense_replace kept: layer 1 is MoE
    assert res["draft/none"] == [1, None]
    assert res["draft/nested"] == "AssertionError"  # hence: no layer cut for SGLang EAGLE-3 probes
