"""The SGLang launch-flag table the emulated server accepts (one place, on purpose).

``SGLANG_FLAGS`` lists every flag as ``Flag(name, kind, ...)``; ``build_parser(version)``
turns it into an ``argparse`` parser that behaves like SGLang's ``launch_server.py``:

* ``prog="launch_server.py"`` so errors print ``usage: launch_server.py ...``;
* ``allow_abbrev=True`` like SGLang (which relies on argparse prefix matching): that is
  what makes ``--cuda-graph-max-bs`` *ambiguous* on 0.5.23
  ("ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode,
  --cuda-graph-max-bs-prefill"). With ``allow_abbrev=False`` argparse would instead call
  it unrecognized, so this deviates from the brief's wording to match SGLang's behaviour;
* unknown flags -> ``error: unrecognized arguments: ...``, exit code 2.

Versions: ``0.5.23`` (default) has ``--cuda-graph-max-bs-decode`` and
``--cuda-graph-max-bs-prefill`` and no ``--cuda-graph-max-bs``; any older version string
selects the legacy set with ``--cuda-graph-max-bs`` only [A: the exact release of the
rename is not in our sources; DESIGN.md only says 0.5.23 has the new names].

A contract test can compare ``flag_names(version)`` with the real SGLang parser.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

DEFAULT_SGLANG_VERSION = "0.5.23"
NEW_GRAPH_FLAGS_SINCE = (0, 5, 23)  # [A] see module docstring


@dataclass(frozen=True)
class Flag:
    """One SGLang CLI flag.

    Attributes:
        name: full flag name, e.g. ``--tp-size``.
        kind: ``str`` | ``int`` | ``float`` | ``bool`` (store_true).
        aliases: extra option strings (e.g. ``--tp``).
        choices: allowed values or None.
        default: value when absent.
        versions: ``"all"`` | ``"new"`` (>= 0.5.23) | ``"legacy"`` (older only).
    """

    name: str
    kind: str = "str"
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    default: Any = None
    versions: str = "all"

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


# --- THE FLAG TABLE (SGLang 0.5.23 subset + legacy names) --------------------------------
SGLANG_FLAGS: tuple[Flag, ...] = (
    # model / server identity
    Flag("--model-path", aliases=("--model",)),
    Flag("--tokenizer-path"),
    Flag("--served-model-name"),
    Flag("--trust-remote-code", "bool"),
    Flag("--dtype", default="auto", choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    Flag("--quantization"),
    Flag("--kv-cache-dtype", default="auto"),
    Flag("--context-length", "int"),
    Flag("--host", default="127.0.0.1"),
    Flag("--port", "int", default=30000),
    Flag("--nccl-port", "int"),
    Flag("--log-level", default="info"),
    Flag("--random-seed", "int"),
    Flag("--watchdog-timeout", "float", default=300.0),
    Flag("--dist-timeout", "int"),
    Flag("--skip-server-warmup", "bool"),
    # parallelism
    Flag("--tp-size", "int", aliases=("--tp",), default=1),
    Flag("--dp-size", "int", aliases=("--dp",), default=1),
    Flag("--ep-size", "int", aliases=("--ep",), default=1),
    # memory / scheduling
    Flag("--mem-fraction-static", "float"),
    Flag("--max-running-requests", "int"),
    Flag("--chunked-prefill-size", "int"),
    Flag("--page-size", "int", default=1),
    Flag("--attention-backend"),
    # CUDA graphs
    Flag("--cuda-graph-max-bs-decode", "int", versions="new"),
    Flag("--cuda-graph-max-bs-prefill", "int", versions="new"),
    Flag("--cuda-graph-max-bs", "int", versions="legacy"),
    Flag("--disable-cuda-graph", "bool"),
    # all-reduce paths
    Flag("--disable-custom-all-reduce", "bool"),
    Flag("--enable-flashinfer-allreduce-fusion", "bool"),
    Flag("--enforce-disable-flashinfer-allreduce-fusion", "bool"),
    Flag("--enable-torch-symm-mem", "bool"),
    Flag("--enable-p2p-check", "bool"),
    # MoE
    Flag("--moe-a2a-backend", default="none",
         choices=("none", "deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer")),
    Flag("--moe-runner-backend", default="auto",
         choices=("auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm",
                  "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl", "cutlass")),
    # speculative decoding
    Flag("--speculative-algorithm", choices=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")),
    Flag("--speculative-draft-model-path"),
    Flag("--speculative-num-steps", "int"),
    Flag("--speculative-eagle-topk", "int"),
    Flag("--speculative-num-draft-tokens", "int"),
)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for p in str(version).split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def uses_new_graph_flags(version: str) -> bool:
    """True if ``version`` has ``--cuda-graph-max-bs-decode/-prefill`` (no plain ``--cuda-graph-max-bs``)."""
    return _version_tuple(version) >= NEW_GRAPH_FLAGS_SINCE


def flags_for(version: str = DEFAULT_SGLANG_VERSION) -> list[Flag]:
    """The flags present in ``version`` (see module docstring)."""
    new = uses_new_graph_flags(version)
    return [f for f in SGLANG_FLAGS
            if f.versions == "all" or (f.versions == "new") == new]


def flag_names(version: str = DEFAULT_SGLANG_VERSION) -> set[str]:
    """All option strings (names + aliases) accepted by ``version``."""
    out: set[str] = set()
    for f in flags_for(version):
        out.add(f.name)
        out.update(f.aliases)
    return out


class LaunchArgError(Exception):
    """argparse rejected the command line.

    Attributes:
        message: argparse's message, e.g. ``unrecognized arguments: --foo``.
        text: the full stderr text SGLang would print (usage line + ``error:`` line).
        exit_code: always 2 (argparse).
    """

    def __init__(self, message: str, text: str):
        super().__init__(message)
        self.message = message
        self.text = text
        self.exit_code = 2


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse hook
        text = f"{self.format_usage()}{self.prog}: error: {message}\n"
        raise LaunchArgError(message, text)


def build_parser(version: str = DEFAULT_SGLANG_VERSION) -> argparse.ArgumentParser:
    """An argparse parser for SGLang ``version``'s flags (raises LaunchArgError instead of exiting)."""
    parser = _RaisingParser(prog="launch_server.py", allow_abbrev=True, add_help=False)
    for f in flags_for(version):
        names = [f.name, *f.aliases]
        if f.kind == "bool":
            parser.add_argument(*names, dest=f.dest, action="store_true", default=False)
        else:
            typ = {"str": str, "int": int, "float": float}[f.kind]
            parser.add_argument(*names, dest=f.dest, type=typ, default=f.default,
                                choices=list(f.choices) if f.choices else None)
    return parser


def parse_flags(args: list[str], version: str = DEFAULT_SGLANG_VERSION) -> dict[str, Any]:
    """Parse SGLang flags into a dict keyed by dest (``tp_size``, ...).

    Raises:
        LaunchArgError: unknown/ambiguous flag, bad value, or missing ``--model-path``.
    """
    parser = build_parser(version)
    ns, extra = parser.parse_known_args(args)
    if extra:
        parser.error("unrecognized arguments: " + " ".join(extra))
    if not ns.model_path:
        parser.error("the following arguments are required: --model-path")
    return vars(ns)
