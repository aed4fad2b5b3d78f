"""Knob registry: how each sampled knob value reaches the SGLang server.

A knob renders to CLI flags (always full names: SGLang's parser accepts unique
prefixes, so an abbreviation silently changes meaning across versions) and/or
environment variables (NCCL_ALGO, NCCL_PROTO, ...). Rendering is a pure function.

Version-dependent flag names (SGLang 0.5.23 has no ``--cuda-graph-max-bs``; older
releases have only that name) are looked up through :data:`FLAGS`, a logical-id ->
full-flag mapping for the targeted SGLang version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.sglang_cli import DEFAULT_SGLANG_VERSION, FlagSet, FlagUnavailable, flags_from_table, resolve_flags

# Logical flag id -> full flag name. The names and their version ranges live in one place,
# tasks/sglang_cli.VERSION_TABLE (sources there: SGLang 0.5.22/0.5.23's real parsers, older
# wheels read statically); render_launch reads the installed SGLang's own parser when it is
# importable (tasks.sglang_cli.resolve_flags), else the table for backend["sglang_version"].
FLAGS_0_5_23: FlagSet = flags_from_table("0.5.23")
# Releases before the decode/prefill split of the CUDA-graph flags (only --cuda-graph-max-bs).
FLAGS_LEGACY: FlagSet = flags_from_table("0.5.10")

FLAGS = FLAGS_0_5_23

ALLREDUCE_LEVELS = ("nccl", "custom", "flashinfer_fusion", "torch_symm_mem")

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
}

KNOWN_KNOBS = frozenset(
    {
        "speculative",
        "allreduce",
        "eagle_num_steps",
        "eagle_topk",
        "eagle_num_draft_tokens",
        "moe_a2a_backend",
        *ENV_KNOBS,
        *VALUE_KNOBS,
    }
)


# Knobs whose values SGLang parses as numbers (argparse type=int / float): a sweep level of
# another type would only fail at launch, so it is refused when the config is validated.
INT_KNOBS = frozenset({"cuda_graph_max_bs", "eagle_num_steps", "eagle_topk", "eagle_num_draft_tokens",
                       "nccl_min_nchannels"})
FLOAT_KNOBS = frozenset({"mem_fraction_static"})


class KnobError(ValueError):
    """A knob name or value that cannot be rendered (names the knob and the fix)."""


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
            ``tasks.sglang_cli.resolve_flags(backend["sglang_version"])``: the installed
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
        raise KnobError(
            f"unknown knob(s) {unknown}; known knobs: {sorted(KNOWN_KNOBS)}"
        )
    tp = int(backend.get("tp_size") or node.get("gpus") or 1)
    argv: list[str] = [str(x) for x in backend.get("launcher", ["python", "-m", "sglang.launch_server"])]
    argv += [f["model_path"], str(model["path"]), f["tp_size"], str(tp)]
    if model.get("trust_remote_code"):
        argv.append(f["trust_remote_code"])
    env: dict[str, str] = {str(k): str(v) for k, v in (backend.get("env") or {}).items()}
    expected: dict[str, Any] = {}

    allreduce = params.get("allreduce", "nccl")
    if allreduce == "nccl":
        argv += [f["disable_custom_all_reduce"], f["enforce_disable_flashinfer_allreduce_fusion"]]
    elif allreduce == "custom":
        argv += [f["enforce_disable_flashinfer_allreduce_fusion"]]
    elif allreduce == "flashinfer_fusion":
        argv += [f["disable_custom_all_reduce"], f["enable_flashinfer_allreduce_fusion"]]
    elif allreduce == "torch_symm_mem":
        argv += [
            f["disable_custom_all_reduce"],
            f["enforce_disable_flashinfer_allreduce_fusion"],
            f["enable_torch_symm_mem"],
        ]
    else:
        raise KnobError(f"allreduce={allreduce!r}: choose one of {list(ALLREDUCE_LEVELS)}")
    expected["allreduce"] = allreduce

    spec = params.get("speculative", "none")
    if spec == "eagle3":
        draft = model.get("draft_path")
        if not draft:
            raise KnobError("speculative=eagle3 needs model.draft_path (the EAGLE-3 draft checkpoint)")
        argv += [f["speculative_algorithm"], "EAGLE3", f["speculative_draft_model_path"], str(draft)]
        for knob, flag in (
            ("eagle_num_steps", "speculative_num_steps"),
            ("eagle_topk", "speculative_eagle_topk"),
            ("eagle_num_draft_tokens", "speculative_num_draft_tokens"),
        ):
            if params.get(knob) is not None:
                argv += [f[flag], _fmt(params[knob])]
    elif spec not in (None, "none"):
        raise KnobError(f"speculative={spec!r}: choose none or eagle3")

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
    return argv, env, expected
