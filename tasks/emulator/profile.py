"""Emulator profile: node + model conf dicts merged with the runtime ``emulator`` block.

A profile is a plain JSON-able dict::

    {"node":  <conf/node/*.yaml as dict, with its ``emulator:`` constants>,
     "model": <conf/model/*.yaml as dict, with its ``emulator:`` constants>,
     "emulator": {"time_scale": 1.0, "seed": 0, "noise": 0.015, "sglang_version": "0.5.23",
                  "fault": None, "fault_after_s": None, "fault_after_tokens": 24,
                  "rank_processes": 2, "fingerprint": {...}, "capabilities": {...}}}

``build_profile`` fills the runtime defaults, merges ``capabilities``/``fingerprint``
overrides over the node's own tables (so ``profile["emulator"]["capabilities"]`` is the
complete effective table), and validates every number the model reads.

The trial runner writes the profile as JSON and points ``SERVESWEEP_EMULATOR_PROFILE`` at
it; without that variable the server uses ``default_profile()`` (the shipped conf files).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import yaml

PROFILE_ENV = "SERVESWEEP_EMULATOR_PROFILE"
FAULT_ENV = "SERVESWEEP_EMULATOR_FAULT"
FAULT_AFTER_ENV = "SERVESWEEP_EMULATOR_FAULT_AFTER_S"

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_NODE_YAML = REPO_ROOT / "conf" / "node" / "rtx_pro_6000x8.yaml"
DEFAULT_MODEL_YAML = REPO_ROOT / "conf" / "model" / "kimi_k25_eagle3.yaml"

FAULTS = (
    "crash_startup", "hang_startup", "crash_bench", "stall_bench", "early_exit",
    "late_bind", "ignore_sigterm", "corrupt_tokens", "orphan_children", "detach_helper",
    "http_503_once",
)

RUNTIME_DEFAULTS: dict[str, Any] = {
    "time_scale": 1.0,        # multiplies startup/teardown sleeps (1.0 = real time)
    "seed": 0,                # run-to-run noise and acceptance draws
    "noise": 0.015,           # [A] relative run-to-run sd of the token rate (DESIGN: 1-3 %)
    "sglang_version": "0.5.23",
    "fault": None,
    "fault_after_s": None,    # seconds after the first benchmark request (bench faults) / extra delay (late_bind)
    "fault_after_tokens": 24,  # bench faults fire after this many streamed tokens when fault_after_s is None
    "rank_processes": 2,      # child "TP rank" processes to spawn (min(tp, this))
    "fingerprint": {},
    "capabilities": {},
}

# (dotted path, minimum exclusive or None) for every number the model reads.
_POSITIVE = [
    "node.memory_gib", "node.gpus",
    "node.emulator.mem_bw_gbs", "node.emulator.eta", "node.emulator.tensor_tflops", "node.emulator.mfu",
    "node.emulator.nccl.alpha_us", "node.emulator.nccl.beta_gbs", "node.emulator.nccl.bus_bw_gbs",
    "node.emulator.nccl.ll_max_bytes",
    "node.emulator.alpha_verify_us", "node.emulator.alpha_custom_ar_us",
    "node.emulator.graph_memory.base_gib", "node.emulator.graph_memory.per_bs_mib",
    "node.emulator.graph_memory.spec_factor",
    "node.emulator.memory.default_mem_fraction_static",
    "node.emulator.startup.load_gbs",
    "model.emulator.num_layers", "model.emulator.hidden_size", "model.emulator.num_experts",
    "model.emulator.top_k", "model.emulator.vocab_size", "model.emulator.active_params_b",
    "model.emulator.sharded_gb", "model.emulator.expert_mb", "model.emulator.kv_bytes_per_token",
    "model.emulator.t_ovh_ms", "model.emulator.t_draft_ms",
]
_NON_NEGATIVE = [
    "node.emulator.delta_cg_ms_per_doubling", "node.emulator.eager_penalty",
    "node.emulator.memory.torch_context_gib", "node.emulator.memory.nccl_buffers_gib",
    "node.emulator.memory.activations_gib", "node.emulator.memory.min_kv_tokens",
    "node.emulator.startup.process_s", "node.emulator.startup.dist_init_s",
    "node.emulator.startup.kv_alloc_s", "node.emulator.startup.capture_s_per_size",
    "node.emulator.startup.draft_capture_factor", "node.emulator.startup.jit_s",
    "node.emulator.startup.warmup_s",
    "node.emulator.startup.teardown_s", "node.emulator.startup.http_overhead_ms",
    "model.emulator.num_moe_layers", "model.emulator.replicated_gb", "model.emulator.draft_gb",
    "model.emulator.n_coll_extra",
    "emulator.time_scale", "emulator.noise",
]


def get_path(d: dict, dotted: str) -> Any:
    """``get_path(p, "node.emulator.eta")`` -> value; raises KeyError naming the missing part."""
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(dotted)
        cur = cur[part]
    return cur


def set_path(d: dict, dotted: str, value: Any) -> None:
    """Set ``d[a][b][c] = value`` for ``"a.b.c"``, creating dicts on the way."""
    parts = dotted.split(".")
    cur = d
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


def _where(dotted: str) -> str:
    if dotted.startswith("node."):
        return "the `emulator:` block of conf/node/<node>.yaml"
    if dotted.startswith("model."):
        return "the `emulator:` block of conf/model/<model>.yaml"
    return "the profile's `emulator` block"


def _arch_major(node: dict) -> int | None:
    cc = node.get("compute_capability")
    if cc is None:
        return None
    try:
        return int(str(cc).split(".")[0])
    except ValueError:
        raise ValueError(f"node.compute_capability: expected like '12.0', got {cc!r}; "
                         f"fix conf/node/<node>.yaml") from None


def _caps_and_fingerprint(node: dict, emu_in: dict, prof: dict) -> tuple[dict, dict]:
    """Effective capabilities (node, arch from compute capability, overrides) and fingerprint."""
    caps = copy.deepcopy(node["emulator"].get("capabilities") or {})
    major = _arch_major(node)
    if major is not None:
        caps.setdefault("arch_major", major)
    if "nvlink" in node:
        caps.setdefault("nvlink", bool(node["nvlink"]))
    caps.update(emu_in.get("capabilities") or {})
    fp = copy.deepcopy(node["emulator"].get("fingerprint") or {})
    fp.update(emu_in.get("fingerprint") or {})
    fp.setdefault("sglang", str(prof["emulator"]["sglang_version"]))
    if "fingerprint" in emu_in and "sglang" not in (emu_in.get("fingerprint") or {}):
        fp["sglang"] = str(prof["emulator"]["sglang_version"])
    return caps, fp


def _validate(prof: dict) -> None:
    """Check the merged profile's numbers, acceptance model, NCCL tables and fault (ValueError)."""
    for dotted in _POSITIVE + _NON_NEGATIVE:
        try:
            v = get_path(prof, dotted)
        except KeyError:
            raise ValueError(f"{dotted}: missing; add it to {_where(dotted)} "
                             f"(values and sources: conf/node/rtx_pro_6000x8.yaml, docs/emulator.md)") from None
        strict = dotted in _POSITIVE
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (v <= 0 if strict else v < 0):
            raise ValueError(f"{dotted}: must be a number {'> 0' if strict else '>= 0'} (got {v!r}); "
                             f"fix it in {_where(dotted)}")
    for dotted in ("node.emulator.eta", "node.emulator.mfu"):
        if get_path(prof, dotted) > 1:
            raise ValueError(f"{dotted}: a fraction in (0, 1] (got {get_path(prof, dotted)}); fix it in {_where(dotted)}")
    a = prof["model"]["emulator"].get("accept_rate")
    rates = a if isinstance(a, list) else [a]
    if not rates or any(isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < 1 for r in rates):
        raise ValueError(f"model.emulator.accept_rate: a number or list of numbers in [0, 1) (got {a!r}); "
                         f"fix it in {_where('model.')}")
    for key, hi_ok in (("accept_topk_recovery", True), ("accept_topk_decay", False)):
        v = prof["model"]["emulator"].get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not (0 <= v <= 1 if hi_ok else 0 <= v < 1)):
            raise ValueError(f"model.emulator.{key}: a number in [0, 1{']' if hi_ok else ')'} (got {v!r}); "
                             f"fix it in {_where('model.')}")
    for algo in ("Ring", "Tree"):
        for proto in ("LL", "LL128", "Simple"):
            for tbl in ("base_lat_us", "hw_lat_pci_us"):
                try:
                    get_path(prof, f"node.emulator.nccl.{tbl}.{algo}.{proto}")
                except KeyError:
                    raise ValueError(f"node.emulator.nccl.{tbl}.{algo}.{proto}: missing; copy the NCCL "
                                     f"tuning.cc table from conf/node/rtx_pro_6000x8.yaml") from None
    fault = prof["emulator"].get("fault")
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"emulator.fault: unknown fault {fault!r}; use one of {list(FAULTS)} or null")
    if "arch_major" not in prof["emulator"]["capabilities"]:
        raise ValueError("node.compute_capability: missing (e.g. \"12.0\"); or set emulator.capabilities.arch_major")


def build_profile(node: dict, model: dict, emulator: dict | None = None) -> dict:
    """Merge defaults and validate; returns a new profile dict (inputs are not modified).

    Args:
        node: conf/node yaml as dict; must hold an ``emulator:`` mapping.
        model: conf/model yaml as dict; must hold an ``emulator:`` mapping.
        emulator: runtime overrides (see module docstring); None = defaults.

    Returns:
        ``{"node": ..., "model": ..., "emulator": ...}`` with effective
        ``emulator.capabilities`` and ``emulator.fingerprint``.

    Raises:
        ValueError: naming the dotted field and the fix, e.g.
            ``node.emulator.eta: must be a number > 0 (got -1) - fix it in ...``.
    """
    if not isinstance(node, dict) or not isinstance(node.get("emulator"), dict):
        raise ValueError("node.emulator: missing; add the `emulator:` block to conf/node/<node>.yaml "
                         "(see conf/node/rtx_pro_6000x8.yaml)")
    if not isinstance(model, dict) or not isinstance(model.get("emulator"), dict):
        raise ValueError("model.emulator: missing; add the `emulator:` block to conf/model/<model>.yaml "
                         "(see conf/model/kimi_k25_eagle3.yaml)")
    emu_in = dict(emulator or {})
    unknown = set(emu_in) - set(RUNTIME_DEFAULTS)
    if unknown:
        raise ValueError(f"emulator.{sorted(unknown)[0]}: unknown key; allowed: {sorted(RUNTIME_DEFAULTS)}")
    prof = {"node": copy.deepcopy(node), "model": copy.deepcopy(model),
            "emulator": copy.deepcopy(RUNTIME_DEFAULTS)}
    for k, v in emu_in.items():
        if k in ("fingerprint", "capabilities"):
            continue
        prof["emulator"][k] = copy.deepcopy(v)
    for k, v in RUNTIME_DEFAULTS.items():
        if prof["emulator"].get(k) is None and v is not None:
            prof["emulator"][k] = v
    prof["emulator"]["capabilities"], prof["emulator"]["fingerprint"] = _caps_and_fingerprint(node, emu_in, prof)
    _validate(prof)
    return prof


def load_yaml(path: str | os.PathLike) -> dict:
    """Read a YAML mapping; raises ValueError if it is not a mapping."""
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping")
    return data


def default_profile(emulator: dict | None = None) -> dict:
    """The shipped profile: conf/node/rtx_pro_6000x8.yaml + conf/model/kimi_k25_eagle3.yaml."""
    return build_profile(load_yaml(DEFAULT_NODE_YAML), load_yaml(DEFAULT_MODEL_YAML), emulator)


def load_profile(path: str | os.PathLike) -> dict:
    """Load a profile JSON file (as written by the trial runner) and validate it.

    Raises:
        ValueError: unreadable file, missing ``node``/``model``, or a bad field (dotted name).
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{PROFILE_ENV}={path}: cannot read profile JSON ({e})") from e
    if not isinstance(data, dict) or "node" not in data or "model" not in data:
        raise ValueError(f"{path}: a profile needs top-level 'node' and 'model' (and optional 'emulator')")
    return build_profile(data["node"], data["model"], data.get("emulator"))


def profile_from_env(env: dict | None = None) -> dict:
    """Profile for the server process: ``$SERVESWEEP_EMULATOR_PROFILE`` or the default,
    with ``$SERVESWEEP_EMULATOR_FAULT`` / ``..._FAULT_AFTER_S`` overriding the fault."""
    env = os.environ if env is None else env
    path = env.get(PROFILE_ENV)
    prof = load_profile(path) if path else default_profile()
    fault = env.get(FAULT_ENV)
    if fault:
        if fault not in FAULTS:
            raise ValueError(f"{FAULT_ENV}={fault!r}: unknown fault; use one of {list(FAULTS)}")
        prof["emulator"]["fault"] = fault
    after = env.get(FAULT_AFTER_ENV)
    if after:
        prof["emulator"]["fault_after_s"] = float(after)
    return prof


def write_profile(profile: dict, path: str | os.PathLike) -> str:
    """Write ``profile`` as JSON (what the trial runner does); returns the path."""
    with open(path, "w") as f:
        json.dump(profile, f, indent=1, sort_keys=True)
    return str(path)
