"""SGLang launch flags -> ``LaunchConfig``, and SGLang's ServerArgs validation (pure).

``parse_launch(argv, env)`` parses flags + NCCL env; ``check_server_args`` applies the checks
SGLang's ``ServerArgs.__post_init__`` makes in the launcher process (speculative-decoding
and MoE/A2A combinations): what config fails before any GPU work, and with which exception.
Failures that depend on the node (architecture, memory, NCCL) are decided later by
``tasks.emulator.model.evaluate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.emulator.flags import DEFAULT_SGLANG_VERSION, parse_flags, uses_new_graph_flags

#: SGLang's EAGLE defaults when no speculative shape flag is given.
SPEC_DEFAULTS = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


@dataclass(frozen=True)
class LaunchConfig:
    """A parsed SGLang launch (flags + the NCCL env the server sees).

    Attributes mirror SGLang's ServerArgs names; ``cuda_graph_max_bs`` is the decode
    capture limit (None = SGLang's auto value), ``nccl_algo``/``nccl_proto`` the raw env
    strings (None = unset), ``args`` every parsed flag by dest name.
    """

    argv: tuple[str, ...]
    args: dict[str, Any]
    model_path: str
    tp: int
    ep: int
    dp: int
    mem_fraction_static: float | None
    cuda_graph_max_bs: int | None
    disable_cuda_graph: bool
    disable_custom_all_reduce: bool
    enable_flashinfer_allreduce_fusion: bool
    enforce_disable_flashinfer_allreduce_fusion: bool
    enable_torch_symm_mem: bool
    moe_a2a_backend: str
    moe_runner_backend: str
    speculative_algorithm: str | None
    speculative_draft_model_path: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    nccl_algo: str | None
    nccl_proto: str | None
    host: str
    port: int
    nccl_port: int | None
    sglang_version: str = DEFAULT_SGLANG_VERSION

    @property
    def speculative(self) -> bool:
        """EAGLE / EAGLE3 speculative decoding requested."""
        return self.speculative_algorithm in ("EAGLE", "EAGLE3")

    @property
    def fusion_requested(self) -> bool:
        """FlashInfer all-reduce fusion enabled and not force-disabled."""
        return self.enable_flashinfer_allreduce_fusion and not self.enforce_disable_flashinfer_allreduce_fusion


def _strip_launcher(argv: list[str]) -> list[str]:
    """Drop a leading ``python -m sglang.launch_server`` (or any prefix before the first flag)."""
    argv = list(argv)
    for i, a in enumerate(argv):
        if a.startswith("-") and a != "-m":
            return argv[i:]
        if a == "-m":
            continue
    return []


def parse_launch(argv: list[str], env: dict | None = None, *,
                 sglang_version: str = DEFAULT_SGLANG_VERSION) -> LaunchConfig:
    """Parse SGLang launch flags (and NCCL_ALGO / NCCL_PROTO from ``env``).

    Args:
        argv: flags, optionally preceded by ``python -m sglang.launch_server``.
        env: environment of the server (only NCCL_* are read); None = empty.
        sglang_version: selects the flag set (``tasks.emulator.flags``).

    Raises:
        LaunchArgError: argparse rejection (exit code 2, SGLang's usage text in ``.text``).
    """
    env = env or {}
    flags = parse_flags(_strip_launcher(argv), sglang_version)
    if uses_new_graph_flags(sglang_version):
        max_bs = flags.get("cuda_graph_max_bs_decode")
    else:
        max_bs = flags.get("cuda_graph_max_bs")
    return LaunchConfig(
        argv=tuple(argv), args=flags, model_path=flags["model_path"],
        tp=int(flags["tp_size"] or 1), ep=int(flags["ep_size"] or 1), dp=int(flags["dp_size"] or 1),
        mem_fraction_static=flags.get("mem_fraction_static"), cuda_graph_max_bs=max_bs,
        disable_cuda_graph=bool(flags["disable_cuda_graph"]),
        disable_custom_all_reduce=bool(flags["disable_custom_all_reduce"]),
        enable_flashinfer_allreduce_fusion=bool(flags["enable_flashinfer_allreduce_fusion"]),
        enforce_disable_flashinfer_allreduce_fusion=bool(flags["enforce_disable_flashinfer_allreduce_fusion"]),
        enable_torch_symm_mem=bool(flags["enable_torch_symm_mem"]),
        moe_a2a_backend=flags["moe_a2a_backend"] or "none",
        moe_runner_backend=flags["moe_runner_backend"] or "auto",
        speculative_algorithm=flags.get("speculative_algorithm"),
        speculative_draft_model_path=flags.get("speculative_draft_model_path"),
        speculative_num_steps=flags.get("speculative_num_steps"),
        speculative_eagle_topk=flags.get("speculative_eagle_topk"),
        speculative_num_draft_tokens=flags.get("speculative_num_draft_tokens"),
        nccl_algo=env.get("NCCL_ALGO") or None, nccl_proto=env.get("NCCL_PROTO") or None,
        host=flags["host"], port=int(flags["port"]), nccl_port=flags.get("nccl_port"),
        sglang_version=sglang_version,
    )


def server_args_line(launch: LaunchConfig, max_bs: int, mem_frac: float) -> str:
    """SGLang's ``server_args=ServerArgs(...)`` launcher log line (the fields the model reads)."""
    a = launch.args
    parts = [f"model_path='{launch.model_path}'", f"tp_size={launch.tp}", f"dp_size={launch.dp}",
             f"ep_size={launch.ep}", f"mem_fraction_static={mem_frac}", f"cuda_graph_max_bs={max_bs}",
             f"disable_cuda_graph={launch.disable_cuda_graph}",
             f"disable_custom_all_reduce={launch.disable_custom_all_reduce}",
             f"enable_flashinfer_allreduce_fusion={launch.enable_flashinfer_allreduce_fusion}",
             f"enforce_disable_flashinfer_allreduce_fusion={launch.enforce_disable_flashinfer_allreduce_fusion}",
             f"enable_torch_symm_mem={launch.enable_torch_symm_mem}",
             f"moe_a2a_backend='{launch.moe_a2a_backend}'", f"moe_runner_backend='{launch.moe_runner_backend}'",
             f"speculative_algorithm={launch.speculative_algorithm!r}"]
    if launch.speculative:
        parts += [f"speculative_draft_model_path={launch.speculative_draft_model_path!r}",
                  f"speculative_num_steps={a.get('speculative_num_steps')}",
                  f"speculative_eagle_topk={a.get('speculative_eagle_topk')}",
                  f"speculative_num_draft_tokens={a.get('speculative_num_draft_tokens')}"]
    parts += [f"host='{launch.host}'", f"port={launch.port}", f"nccl_port={launch.nccl_port}",
              f"trust_remote_code={a.get('trust_remote_code')}"]
    return "server_args=ServerArgs(" + ", ".join(parts) + ", ...)"


@dataclass(frozen=True)
class ServerArgsError:
    """An exception ``ServerArgs.__post_init__`` raises in the launcher (exit code 1).

    Attributes:
        exc_line: the exception line (``ValueError: ...``).
        where: the ``ServerArgs`` method that raises it (``_handle_speculative_decoding``).
        failure_class: the canonical class of the failure.
        src: the source line printed under the frame (an ``assert``), or None.
    """

    exc_line: str
    where: str
    failure_class: str
    src: str | None = None


@dataclass
class ServerArgsCheck:
    """Result of ``check_server_args``.

    Attributes:
        spec: resolved EAGLE shape ``{num_steps, eagle_topk, num_draft_tokens}`` (None
            without speculation or when the speculative flags were rejected).
        notes: launcher log lines SGLang prints while adjusting the args.
        error: the rejection, or None when the args pass.
    """

    spec: dict[str, int] | None = None
    notes: list[str] = field(default_factory=list)
    error: ServerArgsError | None = None


def _check_speculative(launch: LaunchConfig, defaults: Mapping[str, int]) -> dict[str, int] | ServerArgsError:
    given = [launch.speculative_num_steps, launch.speculative_eagle_topk, launch.speculative_num_draft_tokens]
    where, cls = "_handle_speculative_decoding", "spec_decode_config_error"
    if any(g is None for g in given) and any(g is not None for g in given):
        return ServerArgsError("AssertionError", where, cls, "assert self.speculative_num_steps is not None")
    steps = launch.speculative_num_steps or defaults["num_steps"]
    topk = launch.speculative_eagle_topk or defaults["eagle_topk"]
    dtok = launch.speculative_num_draft_tokens or defaults["num_draft_tokens"]
    if topk == 1:
        dtok = steps + 1  # [S] SGLang: "if topk=1 it is adjusted to num_steps+1"
    if dtok > topk * steps + 1 or steps < 1 or topk < 1:
        return ServerArgsError(f"ValueError: speculative_num_draft_tokens ({dtok}) must be <= "
                               f"speculative_eagle_topk * speculative_num_steps + 1", where, cls)
    if not launch.speculative_draft_model_path:
        return ServerArgsError("ValueError: speculative_draft_model_path is required for EAGLE3", where, cls)
    return {"num_steps": steps, "eagle_topk": topk, "num_draft_tokens": dtok}


def check_server_args(launch: LaunchConfig, spec_defaults: Mapping[str, int] | None = None) -> ServerArgsCheck:
    """SGLang's launcher-side ServerArgs checks for speculative decoding and MoE A2A / EP.

    Args:
        launch: the parsed launch.
        spec_defaults: the model's EAGLE defaults (``num_steps``, ``eagle_topk``,
            ``num_draft_tokens``); None = :data:`SPEC_DEFAULTS`.
    Returns:
        A :class:`ServerArgsCheck` (never raises for a rejected config).
    """
    out = ServerArgsCheck()
    if launch.speculative:
        spec = _check_speculative(launch, SPEC_DEFAULTS if spec_defaults is None else spec_defaults)
        if isinstance(spec, ServerArgsError):
            out.error = spec
            return out
        out.spec = spec
    tp = max(1, launch.tp)
    if launch.moe_a2a_backend == "flashinfer":
        out.notes.append(f"Flashinfer MoE A2A is enabled. The expert parallel size is adjusted to be the same as "
                         f"the tensor parallel size[{tp}].")
        if launch.moe_runner_backend not in ("auto", "flashinfer_cutlass"):
            out.error = ServerArgsError("AssertionError: Flashinfer MoE A2A is only supported with flashinfer_cutlass "
                                        "moe runner backend", "_handle_a2a_moe", "moe_ep_a2a_config_error")
    elif launch.ep not in (1, tp):
        out.error = ServerArgsError("AssertionError: The expert parallel size must be 1 or the same as the tensor "
                                    "parallel size", "_handle_moe_kernel_config", "moe_ep_a2a_config_error")
    return out
