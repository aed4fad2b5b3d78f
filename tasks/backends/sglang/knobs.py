"""Knob registry: how each sampled knob value reaches the SGLang server.

A knob renders to CLI flags (always full names: SGLang's parser accepts unique
prefixes, so an abbreviation silently changes meaning across versions) and/or
environment variables (NCCL_ALGO, NCCL_PROTO, ...). Rendering is a pure function.

Flags are named by *logical id* (``cuda_graph_max_bs``) and looked up for the targeted
SGLang version in the one knob table (``tasks/backends/sglang_flags.json``, the table the
emulated server parses with too): SGLang 0.5.14 renamed ``--cuda-graph-max-bs`` to
``--cuda-graph-max-bs-decode``, and a version without a flag a level needs refuses it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.backends.base import KnobError
from tasks.backends.sglang.cli import DEFAULT_SGLANG_VERSION, FlagSet, FlagUnavailable, flags_from_table, resolve_flags

# render_launch reads the installed SGLang's own parser when it is importable
# (tasks.backends.sglang.cli.resolve_flags), else the knob table for backend["sglang_version"].
FLAGS_0_5_23: FlagSet = flags_from_table("0.5.23")
# Releases before the decode/prefill split of the CUDA-graph flags (only --cuda-graph-max-bs).
FLAGS_LEGACY: FlagSet = flags_from_table("0.5.10")

FLAGS = FLAGS_0_5_23

# Allreduce level -> the flags (logical ids) that pin its path: explicit on/off switches, since
# SGLang turns paths on or off by itself (custom allreduce off on PCIe with TP > 2, FlashInfer
# fusion on for some MoE models), so every level names each switch.
ALLREDUCE_FLAGS: dict[str, tuple[str, ...]] = {
    "nccl": ("disable_custom_all_reduce", "enforce_disable_flashinfer_allreduce_fusion"),
    "custom": ("enforce_disable_flashinfer_allreduce_fusion",),
    "flashinfer_fusion": ("disable_custom_all_reduce", "enable_flashinfer_allreduce_fusion"),
    "torch_symm_mem": ("disable_custom_all_reduce", "enforce_disable_flashinfer_allreduce_fusion", "enable_torch_symm_mem"),
}
ALLREDUCE_LEVELS = tuple(ALLREDUCE_FLAGS)

# EAGLE knob -> logical flag id (rendered only with speculative=eagle3).
EAGLE_KNOBS: dict[str, str] = {
    "eagle_num_steps": "speculative_num_steps",
    "eagle_topk": "speculative_eagle_topk",
    "eagle_num_draft_tokens": "speculative_num_draft_tokens",
}

# Knobs that are environment variables. "default" leaves the variable unset.
ENV_KNOBS: dict[str, str] = {
    "nccl_algo": "NCCL_ALGO",
    "nccl_proto": "NCCL_PROTO",
    "nccl_p2p_disable": "NCCL_P2P_DISABLE",
    "nccl_min_nchannels": "NCCL_MIN_NCHANNELS",
}

# Knobs rendered as `--flag value` one-to-one.
VALUE_KNOBS: dict[str, str] = {
    "cuda_graph_max_bs": "cuda_graph_max_bs",
    "mem_fraction_static": "mem_fraction_static",
    "max_running_requests": "max_running_requests",
}

KNOWN_KNOBS = frozenset(
    {
        "speculative",
        "allreduce",
        *EAGLE_KNOBS,
        "moe_a2a_backend",
        *ENV_KNOBS,
        *VALUE_KNOBS,
    }
)


# Knobs whose values SGLang parses as numbers (argparse type=int / float): a sweep level of
# another type would only fail at launch, so it is refused when the config is validated.
INT_KNOBS = frozenset({"cuda_graph_max_bs", "eagle_num_steps", "eagle_topk", "eagle_num_draft_tokens",
                       "nccl_min_nchannels", "max_running_requests"})
FLOAT_KNOBS = frozenset({"mem_fraction_static"})


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer() is False:
        return f"{value:g}"
    return str(value)


class _FlagLookup:
    """``f[logical_id]`` -> full flag name; a flag the version lacks is a :class:`KnobError`."""

    def __init__(self, flags: Mapping[str, str]):
        self._flags = flags

    def __getitem__(self, key: str) -> str:
        try:
            return self._flags[key]
        except FlagUnavailable as e:
            raise KnobError(str(e)) from None
        except KeyError:
            raise KnobError(f"no flag name for {key!r} in the given flag mapping") from None


def render_launch(
    params: Mapping[str, Any],
    node: Mapping[str, Any],
    model: Mapping[str, Any],
    backend: Mapping[str, Any],
    flags: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """Render knob values into a launch command.

    Args:
        params: knob name -> value (canonical names, see :data:`KNOWN_KNOBS`).
        node: node config (``gpus``, ``nvlink``, ...).
        model: model config (``path``, ``draft_path``, ``trust_remote_code``).
        backend: backend config; ``launcher`` is the argv prefix (e.g.
            ``["python", "-m", "sglang.launch_server"]``), ``tp_size`` the TP size
            (default: all GPUs of the node), ``extra_args`` appended verbatim as argv
            elements, ``env`` extra environment variables.
        flags: logical flag id -> full flag name (default:
            ``tasks.backends.sglang.cli.resolve_flags(backend["sglang_version"])``: the installed
            SGLang's parser when importable, else the version table, default 0.5.23).

    Returns:
        ``(argv, env, expected_paths)``: argv without host/port flags (the node adds
        them), the environment variables to set, and what the server log must show
        (``{"allreduce": level}``) so a silent fallback is detected.

    Raises:
        KnobError: unknown knob or value, a value that needs a config field that
            is missing (e.g. EAGLE-3 without ``model.draft_path``), or a flag the targeted
            SGLang version does not have.
    """
    if flags is None:
        flags = resolve_flags(str(backend.get("sglang_version") or DEFAULT_SGLANG_VERSION))
    f = _FlagLookup(flags)
    unknown = sorted(set(params) - KNOWN_KNOBS)
    if unknown:
        raise KnobError(f"unknown knob(s) {unknown}; known knobs: {sorted(KNOWN_KNOBS)}")
    tp = int(backend.get("tp_size") or node.get("gpus") or 1)
    argv: list[str] = [str(x) for x in backend.get("launcher", ["python", "-m", "sglang.launch_server"])]
    argv += [f["model_path"], str(model["path"]), f["tp_size"], str(tp)]
    if model.get("trust_remote_code"):
        argv.append(f["trust_remote_code"])
    env: dict[str, str] = {str(k): str(v) for k, v in (backend.get("env") or {}).items()}

    allreduce = params.get("allreduce", "nccl")
    if not isinstance(allreduce, str) or allreduce not in ALLREDUCE_FLAGS:
        raise KnobError(f"allreduce={allreduce!r}: choose one of {list(ALLREDUCE_LEVELS)}")
    argv += [f[flag_id] for flag_id in ALLREDUCE_FLAGS[allreduce]]
    argv += _speculative_args(params, model, f)

    a2a = params.get("moe_a2a_backend", "none")
    if a2a not in (None, "none"):
        argv += [f["moe_a2a_backend"], str(a2a), f["ep_size"], str(tp)]

    for knob, flag_id in VALUE_KNOBS.items():
        if params.get(knob) is not None:
            argv += [f[flag_id], _fmt(params[knob])]

    for knob, var in ENV_KNOBS.items():
        value = params.get(knob)
        if value is not None and value != "default":
            env[var] = _fmt(value)

    argv += [str(x) for x in backend.get("extra_args") or []]
    return argv, env, {"allreduce": allreduce}


def _speculative_args(params: Mapping[str, Any], model: Mapping[str, Any], f: _FlagLookup) -> list[str]:
    """The speculative-decoding flags of ``params`` (none without ``speculative=eagle3``).

    Raises:
        KnobError: an unknown level, or EAGLE-3 without ``model.draft_path``.
    """
    spec = params.get("speculative", "none")
    if spec in (None, "none"):
        return []
    if spec != "eagle3":
        raise KnobError(f"speculative={spec!r}: choose none or eagle3")
    draft = model.get("draft_path")
    if not draft:
        raise KnobError("speculative=eagle3 needs model.draft_path (the EAGLE-3 draft checkpoint)")
    out = [f["speculative_algorithm"], "EAGLE3", f["speculative_draft_model_path"], str(draft)]
    for knob, flag_id in EAGLE_KNOBS.items():
        if params.get(knob) is not None:
            out += [f[flag_id], _fmt(params[knob])]
    return out
