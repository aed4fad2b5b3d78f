"""Failure classifier: (server log, exit code, lifecycle phase) -> canonical failure class.

The classifier is a *table* (:data:`SIGNATURES`), not a chain of ifs. Each row names a
canonical class (``../shared/data/failure_classes.md``), the regexes that identify it and
optional guards (exit codes, a context regex that must or must not occur, a regex that
must occur in the few lines just above the decisive one, the startup stage of that line,
a numeric check). Rows are ordered by the precedence suggested in
``../shared/data/failure_taxonomy.md`` §0; the first row that matches wins, because SGLang
wraps many root causes in the same generic banners (``Capture cuda graph failed:``,
``Received sigquit from a child process``) and the specific text must be tried first.

When no row matches, a second small table (:data:`FALLBACKS`) applies the exit-code and
phase semantics of taxonomy §0 (harness-observed classes: ``startup_timeout``,
``server_crash``, ``bench_stall``, ``early_exit``, ...). Anything else is ``unknown``
with a normalized signature so that unknown failures still group.

Signatures are the decisive log line with timestamps, paths, hosts, IPs, ports, hex,
TP/DP/EP ranks and numbers masked (:func:`normalize_line`), so two logs that differ only in
those details give the same signature.

CLI: ``python -m tasks.failures [--exit-code N] [--phase P] LOG...`` prints
``PATH<TAB>CLASS<TAB>KIND<TAB>SIGNATURE`` per log.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "KIND",
    "PRECEDENCE",
    "SIGNATURES",
    "FALLBACKS",
    "Classification",
    "PerfFinding",
    "Signature",
    "classify",
    "harness_classification",
    "detect_perf_findings",
    "detect_perf_tags",
    "normalize_line",
    "spec_no_speedup",
]

# --------------------------------------------------------------------------------------
# Kinds: canonical in ../shared/data/failure_classes.md (tests check this copy against it).
# The node has no access to the shared directory, so the table lives here.
# --------------------------------------------------------------------------------------
KIND: dict[str, str] = {
    "cli_arg_error": "deterministic",
    "server_args_incompatible": "deterministic",
    "flashinfer_allreduce_fusion_unsupported_arch": "deterministic",
    "flashinfer_jit_build_failure": "deterministic",
    "unsupported_arch_kernel": "deterministic",
    "torch_symm_mem_unsupported": "deterministic",
    "nccl_env_algo_proto_invalid": "deterministic",
    "nccl_graph_capture_error": "deterministic",
    "custom_allreduce_graph_error": "deterministic",
    "allreduce_path_degraded": "perf",
    "nccl_init_system_error": "infra",
    "collective_hang_or_timeout": "transient",
    "startup_timeout": "transient",
    "kv_cache_pool_too_small": "deterministic",
    "cuda_oom_graph_capture": "deterministic",
    "cuda_oom_runtime": "transient",
    "moe_ep_a2a_config_error": "deterministic",
    "spec_decode_config_error": "deterministic",
    "spec_decode_no_speedup": "perf",
    "cuda_illegal_memory_access": "transient",
    "cuda_graph_capture_failed_other": "deterministic",
    "host_oom_killed": "infra",
    "health_check_failed": "transient",
    "model_weights_error": "deterministic",
    "server_crash": "transient",
    "bench_stall": "transient",
    "server_http_error": "transient",
    "early_exit": "transient",
    "teardown_timeout": "infra",
    "port_in_use": "infra",
    "gpu_busy": "infra",
    "node_lost": "infra",
    "unknown": "transient",
}

#: Lines above the decisive one searched by ``Signature.near`` (a Python traceback frame
#: and its source line sit 1-3 lines above the exception line; 8 leaves room for chained
#: frames and rank-interleaved output).
NEAR_LINES = 8
#: Longest line the regexes look at, chars (guards against pathological single-line logs).
MAX_LINE_CHARS = 4000
#: Longest signature returned, chars (MLflow tag values are capped at 5000; keep them readable).
MAX_SIGNATURE_CHARS = 300


@dataclass(frozen=True)
class Classification:
    """The classifier's verdict for one trial.

    Attributes:
        failure_class: canonical class id (a key of :data:`KIND`).
        kind: ``deterministic`` | ``transient`` | ``infra`` | ``perf``.
        signature: the decisive line normalized by :func:`normalize_line` (or a
            ``<...>`` description when no log line decided), at most
            :data:`MAX_SIGNATURE_CHARS` chars.
        line: the decisive raw log line ("" when none).
    """

    failure_class: str
    kind: str
    signature: str
    line: str


@dataclass(frozen=True)
class Signature:
    """One row of the signature table.

    Attributes:
        failure_class: canonical class id.
        patterns: regexes searched line by line; the earliest matching line is the
            decisive one. Empty for classes only the harness sets by name.
        source: where the fragment comes from (taxonomy section / issue).
        requires: regex that must occur somewhere in the log (multiline).
        unless: regex that vetoes the row when it occurs anywhere in the log.
        near: regex that must occur within :data:`NEAR_LINES` lines above (or on) the
            decisive line, e.g. the traceback frame that raised it.
        exit_codes: the row applies only for these exit codes (``None`` = still running
            or killed by the harness); ``None`` here means any exit code.
        stages: the row applies only when the decisive line falls in one of these startup
            stages (see :data:`MILESTONES`).
        check: numeric test on the whole log returning the decisive line or None
            (used by the perf rows, e.g. throughput below the baseline).
    """

    failure_class: str
    patterns: tuple[re.Pattern[str], ...] = ()
    source: str = ""
    requires: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None
    near: re.Pattern[str] | None = None
    exit_codes: frozenset[int | None] | None = None
    stages: frozenset[str] | None = None
    check: Callable[[str], str | None] | None = None


def _re(*alternatives: str, flags: int = 0) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(a, flags) for a in alternatives)


def _ctx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags | re.MULTILINE)


# --------------------------------------------------------------------------------------
# Startup milestones (taxonomy §3), used for the stage of a line and for sub-classifying a
# startup timeout by its last progress line. Later milestones win on the same line.
# --------------------------------------------------------------------------------------
MILESTONES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("dist_init", re.compile(r"Init torch distributed begin|NCCL INFO (?:Bootstrap|NCCL version|ncclCommInitRank(?!.*Init COMPLETE))")),
    ("dist_ready", re.compile(r"Init torch distributed ends|Init COMPLETE")),
    ("load", re.compile(r"Load weight begin|Loading safetensors checkpoint shards|Starting to load model")),
    ("loaded", re.compile(r"Load weight end|KV Cache is allocated|Memory pool end")),
    ("capture", re.compile(r"Capture (?:draft |draft-extend )?cuda graph begin")),
    ("captured", re.compile(r"Capture (?:draft |draft-extend )?cuda graph end")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
)

_OOM = r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|CUDA error: out of memory|cudaErrorMemoryAllocation"
_SIGKILL = frozenset({-9, 137})
_FUSION_OFF = _ctx(r"enforce_disable_flashinfer_allreduce_fusion=True|--enforce-disable-flashinfer-allreduce-fusion")
_SYMM_ON = _ctx(r"enable_torch_symm_mem=True|--enable-torch-symm-mem")


def _speedup_check(text: str) -> str | None:
    """Decisive line when the log's bench lines show no speedup over the baseline."""
    f = _spec_bench_finding(text)
    return f[0] if f else None


# --------------------------------------------------------------------------------------
# The table, in precedence order (taxonomy §0, with port_in_use, health_check_failed,
# node_lost and the perf/harness classes placed where they cannot shadow a root cause).
# --------------------------------------------------------------------------------------
SIGNATURES: tuple[Signature, ...] = (
    # argparse rejected the command line: nothing started (taxonomy 2.1; exit 2).
    Signature("cli_arg_error", _re(
        r"\berror: (?:unrecognized arguments|ambiguous option|the following arguments are required"
        r"|one of the arguments|argument -{1,2}[\w-]+: (?:invalid|expected|not allowed|ignored))"),
        "taxonomy 2.1; sglang#4116, #7505, #10835"),
    Signature("cli_arg_error", _re(r"^\S+: error: "), "argparse 'prog: error:' after a usage block",
              requires=_ctx(r"^usage: ")),
    Signature("cli_arg_error", _re(r"^usage: "), "exit 2 + usage: argparse (taxonomy §0)",
              exit_codes=frozenset({2})),
    # The node's port was taken between reservation and bind (infra).
    Signature("port_in_use", _re(r"Address already in use|EADDRINUSE|\[Errno 98\]"),
              "OSError errno 98 from uvicorn / torch TCPStore"),
    # FlashInfer TRT-LLM allreduce fusion on a non-SM90/SM10X GPU (taxonomy 2.3).
    Signature("flashinfer_allreduce_fusion_unsupported_arch", _re(
        r"FlashInfer allreduce fusion requires SM90 or SM10X",
        r"\[SymmDeviceMemory\] Device does not support multicasting"),
        "taxonomy 2.3; flashinfer_comm_fusion.py; vllm#34891"),
    Signature("flashinfer_allreduce_fusion_unsupported_arch", _re(
        r"No supported CUDA architectures found for major versions \[9, 10\]"),
        "taxonomy 2.3 disambiguation: [9, 10] is the fusion module unless fusion was disabled; sglang#15650",
        unless=_FUSION_OFF),
    # torch symmetric-memory allreduce: no SM120 row in its size table (taxonomy 2.6).
    Signature("torch_symm_mem_unsupported", _re(r"torch symmetric memory multicast operations are not supported"),
              "taxonomy 2.6; torch_symm_mem.py"),
    Signature("torch_symm_mem_unsupported", _re(r"\bKeyError: \d+\s*$", r"The size of tensor a \(\d+\) must match the size of tensor b"),
              "taxonomy 2.6: MAX_SIZES[12] lookup / fixed buffer overflow; sglang#24548, #27123",
              near=re.compile(r'symm_mem\w*\.py"|SYMM_MEM_')),
    Signature("torch_symm_mem_unsupported", _re(r"\bKeyError: 1\d\s*$"),
              "taxonomy 2.6: KeyError on a compute-capability major with symm mem enabled",
              requires=_SYMM_ON),
    # NCCL_ALGO / NCCL_PROTO pinned globally (taxonomy 2.7).
    Signature("nccl_env_algo_proto_invalid", _re(
        r"no algorithm/protocol available for function", r"NCCL_(?:ALGO|PROTO) was set to"),
        "taxonomy 2.7; NVIDIA/nccl#317, #1709; enqueue.cc"),
    Signature("nccl_env_algo_proto_invalid", _re(r"NCCL error: invalid usage|ncclInvalidUsage"),
              "taxonomy 2.7: generic invalid-usage wrapper with an algorithm/protocol pinned in the env",
              requires=_ctx(r"\bNCCL_(?:ALGO|PROTO)=(?!allreduce:)\w")),
    # Expert-parallel / all-to-all backend combinations (taxonomy 2.17).
    Signature("moe_ep_a2a_config_error", _re(
        r"Flashinfer MoE A2A is only supported with",
        r"expert parallel size must be 1 or the same as the tensor parallel size",
        r"assert TopKOutputChecker\.format_is_bypassed",
        r"DeepEP v2 MoE is not validated for"),
        "taxonomy 2.17; server_args.py _handle_a2a_moe; sglang#26324, #39408"),
    Signature("moe_ep_a2a_config_error", _re(r"^\s*AssertionError\b"),
              "taxonomy 2.17: bare assertion raised from MoE / A2A code",
              near=re.compile(r'(?:/moe/|moe_runner/|deepep|token_dispatcher)[\w/]*\.py"|in _handle_(?:a2a_)?moe')),
    # Inconsistent speculative flags (taxonomy 2.18).
    Signature("spec_decode_config_error", _re(
        r"speculative_eagle_topk > 1 with page_size > 1",
        r"Spec v2 currently only supports topk = 1",
        r"only supports topk = 1 for speculative decoding",
        r"(?:AssertionError|ValueError)\b.*\bspeculative_(?:num_steps|num_draft_tokens|eagle_topk)",
        r"^\s*assert .*\bspeculative_(?:num_steps|num_draft_tokens|eagle_topk|algorithm)"),
        "taxonomy 2.18; server_args.py _handle_speculative_decoding"),
    Signature("spec_decode_config_error", _re(r"^\s*(?:AssertionError|ValueError)\b"),
              "taxonomy 2.18: bare assertion in the speculative-decoding argument handler",
              near=re.compile(r"in _handle_speculative_decoding")),
    # ServerArgs validation rejected a combination (taxonomy 2.2).
    Signature("server_args_incompatible", _re(
        r"TRTLLM MHA backend is only supported on Blackwell",
        r"triton or trtllm_mha backend are the only supported backends",
        r"Unsupported compute capability"),
        "taxonomy 2.2; sglang#18758, #32933; server_args.py"),
    Signature("server_args_incompatible", _re(r"^\s*(?:\w+\.)*(?:AssertionError|ValueError|TypeError)\b"),
              "taxonomy §0: exception raised from ServerArgs validation in the main process",
              near=re.compile(r"server_args\.py")),
    # Prebuilt kernel without SM120 code / no backend for the arch (taxonomy 2.5).
    Signature("unsupported_arch_kernel", _re(
        r"no kernel image is available for execution on the device",
        r"cudaErrorNoKernelImageForDevice",
        r"No compiled cutlass_scaled_mm for CUDA device capability",
        r"No valid attention backend found for",
        r"No supported CUDA architectures found for major versions"),
        "taxonomy 2.5; sglang#7249, #13342; vllm#31936, #32109"),
    # JIT toolchain failures (taxonomy 2.4).
    Signature("flashinfer_jit_build_failure", _re(
        r"Ninja build failed",
        r"not supported on \.target 'sm_\d+\w?'",
        r"ptxas fatal\s*: Value 'sm_\d+\w?' is not defined",
        r"nvcc fatal\s*:",
        r"error: command '[^']*nvcc' failed"),
        "taxonomy 2.4; flashinfer#1166, #1966; RLinf#92"),
    # Static pool leaves no KV cache (taxonomy 2.14).
    Signature("kv_cache_pool_too_small", _re(
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        r"Please try to increase --mem-fraction-static"),
        "taxonomy 2.14; sglang#4330; pool_configurator"),
    # CUDA OOM while capturing graphs (taxonomy 2.15), then at runtime (2.16).
    Signature("cuda_oom_graph_capture", _re(
        r"Capture (?:draft |draft-extend )?cuda graph failed:.*(?:out of memory|OutOfMemoryError)"),
        "taxonomy 2.15; sglang#5285, #3395"),
    Signature("cuda_oom_graph_capture", _re(_OOM), "taxonomy 2.15: OOM after 'Capture cuda graph begin'",
              stages=frozenset({"capture"})),
    Signature("cuda_oom_runtime", _re(_OOM), "taxonomy 2.16; vllm#15598"),
    # Custom (IPC) allreduce registering graph buffers (taxonomy 2.9).
    Signature("custom_allreduce_graph_error", _re(
        r"custom_all_reduce\.cuh:\d+ '[^']+'", r"Registering 0 cuda graph addresses"),
        "taxonomy 2.9; vllm#5613; sglang PR #11275"),
    Signature("custom_allreduce_graph_error", _re(r"RuntimeError: invalid argument"),
              "taxonomy 2.9; sglang#9706 (register_graph_buffers)", near=re.compile(r'custom_all_reduce\w*\.py"')),
    # NCCL call failing inside CUDA-graph capture (taxonomy 2.8).
    Signature("nccl_graph_capture_error", _re(
        r"operation failed due to a previous error during capture",
        r"NCCL cannot be captured in a graph",
        r"cudaErrorStreamCapture\w+|operation not permitted when stream is capturing",
        r"Capture (?:draft |draft-extend )?cuda graph failed:.*NCCL error"),
        "taxonomy 2.8; vllm#4432, #3069; sglang#5770"),
    # NCCL communicator init fails on a system call (taxonomy 2.11; infra).
    Signature("nccl_init_system_error", _re(
        r"Error while creating shared memory segment",
        r"NCCL error: unhandled system error",
        r"ncclSystemError"),
        "taxonomy 2.11; sglang#4289, #3460"),
    Signature("cuda_illegal_memory_access", _re(
        r"an illegal memory access was encountered", r"cudaErrorIllegalAddress"),
        "taxonomy 2.20; sglang#28569, #22930"),
    # A collective never completed (taxonomy 2.12), incl. a startup deadline hit in NCCL init.
    Signature("collective_hang_or_timeout", _re(
        r"Watchdog caught collective operation timeout",
        r"watchdog got stuck for \d+ seconds",
        r"Scheduler watchdog timeout",
        r"ProcessGroupNCCL.*(?:timed out|Timeout at NCCL work)",
        r"startup deadline exceeded.*last progress line: .*(?:Init torch distributed begin|ncclCommInitRank|NCCL INFO Bootstrap)"),
        "taxonomy 2.12, 2.13; sglang#3784, #1691; NVIDIA/nccl#1999"),
    Signature("health_check_failed", _re(r"Health check failed\. Server couldn't get a response from detokenizer"),
              "taxonomy 2.23; entrypoints/http_server.py"),
    # Loader cannot map checkpoint tensors (taxonomy 2.24).
    Signature("model_weights_error", _re(
        r"KeyError: 'model\.",
        r"KeyError: '[\w.]*(?:weight|_scale|scale_inv|bias)\w*'",
        r"Error\(s\) in loading state_dict|Missing key\(s\) in state_dict",
        r"Model architectures \[.*\] are not supported",
        r"SafetensorError"),
        "taxonomy 2.24; sglang#5095"),
    Signature("model_weights_error", _re(r"\bKeyError: '"), "taxonomy 2.24: KeyError raised while loading weights",
              near=re.compile(r'(?:model_loader|weight_utils)[\w/]*\.py"|in (?:load_weights|weight_loader)')),
    Signature("cuda_graph_capture_failed_other", _re(r"Capture (?:draft |draft-extend )?cuda graph failed:"),
              "taxonomy 2.21; sglang#13342, #4205"),
    # Killed from outside by the kernel OOM killer / cgroup (taxonomy 2.22; needs the evidence line).
    Signature("host_oom_killed", _re(
        r"Out of memory: Kill(?:ed)? process", r"oom-kill:|oom_kill_process|Memory cgroup out of memory"),
        "taxonomy 2.22 (dmesg lines the harness appends)"),
    Signature("node_lost", _re(
        r"NodeDiedError|WorkerCrashedError|RayletDiedError|OwnerDiedError|has been marked dead"),
        "ray.exceptions names (harness sets node_lost from the Ray exception)"),
    Signature("startup_timeout", _re(r"startup deadline exceeded"), "harness line at the startup deadline (taxonomy 2.13)"),
    # Perf classes: only for a server that exited cleanly / is still up (after every failure row).
    Signature("spec_decode_no_speedup", (), "taxonomy 2.19: bench tok/s vs the no-spec baseline; sglang#6949, SpecForge#339",
              exit_codes=frozenset({0, None}), check=_speedup_check),
    Signature("allreduce_path_degraded", (), "taxonomy 2.10: perf tag, see detect_perf_tags",
              exit_codes=frozenset({0}), check=lambda text: _first_perf_line(text, "allreduce_path_degraded")),
    # Harness classes: set by the lifecycle by name (or by FALLBACKS below).
    Signature("server_crash", (), "harness: exited after healthy, no specific signature"),
    Signature("bench_stall", (), "harness: stream stopped while the server stayed up"),
    Signature("server_http_error", (), "harness: HTTP 5xx from a server that passed its readiness check"),
    Signature("early_exit", (), "harness: exit 0 before the benchmark finished"),
    Signature("teardown_timeout", (), "harness: group survived SIGKILL or GPU memory not released"),
    Signature("gpu_busy", (), "harness: assigned GPUs held memory before launch"),
    Signature("unknown", (), "nothing matched"),
)

#: Class precedence (first match wins), derived from :data:`SIGNATURES`.
PRECEDENCE: tuple[str, ...] = tuple(dict.fromkeys(s.failure_class for s in SIGNATURES))


@dataclass(frozen=True)
class _Facts:
    exit_code: int | None
    phase: str | None
    sigquit: bool
    traceback: bool
    ready: bool
    last_milestone: str | None


#: Exit-code / phase semantics applied when no signature row matched (taxonomy §0 and the
#: harness classes of failure_classes.md), in order: (why, predicate, class).
FALLBACKS: tuple[tuple[str, Callable[[_Facts], bool], str], ...] = (
    ("still starting at the deadline, last progress in NCCL init (taxonomy 2.13 -> 2.12)",
     lambda f: f.exit_code is None and f.phase == "startup" and f.last_milestone == "dist_init",
     "collective_hang_or_timeout"),
    ("still starting at the deadline", lambda f: f.exit_code is None and f.phase == "startup", "startup_timeout"),
    ("SIGKILL from outside during startup, no sigquit, no traceback, no OOM evidence (taxonomy §0)",
     lambda f: f.exit_code in _SIGKILL and not f.sigquit and not f.traceback and f.phase == "startup",
     "startup_timeout"),
    ("server up but the stream stopped", lambda f: f.exit_code is None and f.phase in ("warmup", "bench"), "bench_stall"),
    ("process group survived teardown", lambda f: f.exit_code is None and f.phase == "teardown", "teardown_timeout"),
    ("exit 0 before the benchmark finished",
     lambda f: f.exit_code == 0 and f.phase in ("startup", "warmup", "bench"), "early_exit"),
    ("exited after it was healthy",
     lambda f: f.exit_code not in (None, 0) and (f.phase in ("warmup", "bench") or f.ready), "server_crash"),
)


# --------------------------------------------------------------------------------------
# Signature normalization
# --------------------------------------------------------------------------------------
_NORMALIZERS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), r) for p, r in (
    # timestamps: ISO / SGLang "2026-01-01 10:00:01", glog "F1015 22:50:12.358", vLLM "01-17 10:00:00"
    (r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?", "<TS>"),
    (r"\b[IWEF]\d{4} \d{2}:\d{2}:\d{2}(?:\.\d+)?", "<TS>"),
    (r"\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?", "<TS>"),
    (r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b", "<TS>"),
    (r"\b[a-z][a-z0-9+.-]*://\S+", "<URL>"),
    (r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b", "<IP>"),
    (r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]+\](?::\d+)?", "<IP>"),
    # NCCL line prefix "host:pid:tid [dev]"
    (r"^\S+:\d+:\d+(?= \[\d+\])", "<HOST>"),
    # source locations "enqueue.cc:1390" keep the file, mask the line (before host:port)
    (r"\b([\w-]+\.(?:cc|cpp|cxx|cu|cuh|c|h|hpp|py|pyx|rs|go)):\d+\b", r"\1:<N>"),
    (r"\b(?:localhost|[A-Za-z][\w-]*(?:\.[A-Za-z][\w-]*)+):\d{2,5}\b", "<HOST>:<PORT>"),
    (r"(?<![\w.-])[A-Za-z][\w-]*:\d{4,5}\b", "<HOST>:<PORT>"),
    (r"(?<![\w.>])(?:~|\.{1,2})?(?:/[\w.@+%=,-]+)+/?", "<PATH>"),
    (r"(?<=<VENV>)(?:/[\w.@+%=,-]+)+", "<PATH>"),
    (r"\b0x[0-9a-fA-F]+\b", "<HEX>"),
    (r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", "<HEX>"),
    (r"(?<![A-Za-z])(TP|DP|EP|PP|CP)\d+", r"\1<R>"),
    (r"\b([Rr]ank)(\s*)\d+", r"\1\2<R>"),
    (r"\b(pid|tid)=\d+", r"\1=<N>"),
    (r"\b(port)([=: ]\s*)\d+", r"\1\2<PORT>"),
    (r"\b\d+(?:\.\d+){2,}\b", "<V>"),
    (r"(?<=[A-Za-z_]\.)\d+(?=\.[A-Za-z_])", "<N>"),
    (r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w)(?!\.\d)", "<N>"),
    (r"\s+", " "),
))


def normalize_line(line: str) -> str:
    """Mask the run-specific parts of a log line so equal failures give equal signatures.

    Masks timestamps (``<TS>``), URLs, IPv4/IPv6 (``<IP>``), ``host:port``, NCCL
    ``host:pid:tid`` prefixes (``<HOST>``), absolute paths (``<PATH>``), hex ids
    (``<HEX>``), TP/DP/EP/PP ranks (``TP<R>``, ``rank<R>``), pids, ports, versions
    (``<V>``) and numbers (``<N>``); collapses whitespace.

    Args:
        line: one raw log line (any length; only the first :data:`MAX_LINE_CHARS` used).
    Returns:
        The normalized line, stripped, at most :data:`MAX_SIGNATURE_CHARS` chars.
    """
    s = line[:MAX_LINE_CHARS]
    for pat, repl in _NORMALIZERS:
        s = pat.sub(repl, s)
    return s.strip()[:MAX_SIGNATURE_CHARS]


# --------------------------------------------------------------------------------------
# Perf findings (healthy server)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PerfFinding:
    """A performance finding on a healthy server.

    Attributes:
        tag: perf class id (``allreduce_path_degraded`` | ``spec_decode_no_speedup``).
        path: the allreduce path the line says is off (``custom_allreduce``,
            ``torch_symm_mem``, ``flashinfer_fusion``), or "" for non-allreduce tags.
        line: the raw log line.
        signature: ``normalize_line(line)``.
    """

    tag: str
    path: str
    line: str
    signature: str


#: Lines saying an allreduce path was silently turned off (taxonomy 2.10): (path, regex).
_DEGRADED: tuple[tuple[str, re.Pattern[str]], ...] = (
    # SGLang 0.5.23 logs it for the V2 (default) and V1 implementations:
    # "CustomAllReduceV2 is disabled because it's not supported on more than two PCIe-only GPUs."
    ("custom_allreduce", re.compile(r"Custom ?all ?reduce(?:V\d)? is disabled because", re.IGNORECASE)),
    ("torch_symm_mem", re.compile(
        r"SymmMemCommunicator: Device capability [\d.]+ not supported"
        r"|[Tt]orch symm(?:etric)?[ _-]?mem\w*[^\n]*(?:is disabled|not supported|not available|falling back)")),
    ("flashinfer_fusion", re.compile(
        r"(?i:flashinfer) allreduce fusion (?:is )?(?:disabled|not supported|unavailable|falls? back)"
        r"|Disabl\w* (?i:flashinfer) allreduce fusion")),
)

#: allreduce knob level -> the path it must run (tasks.knobs ALLREDUCE_LEVELS; nccl has no path to lose).
_LEVEL_PATH = {"custom": "custom_allreduce", "torch_symm_mem": "torch_symm_mem", "flashinfer_fusion": "flashinfer_fusion"}

_NUM = r"(\d+(?:\.\d+)?)"
_TRIAL_VS_BASELINE = re.compile(r"Output token throughput \(tok/s\):\s*" + _NUM + r"\s*\(baseline[^)]*?" + _NUM + r"\s*\)")
_BASELINE_TPUT = re.compile(r"\bbaseline\b.*?Output token throughput \(tok/s\):\s*" + _NUM)
_TRIAL_TPUT = re.compile(r"\bthis trial\b.*?Output token throughput \(tok/s\):\s*" + _NUM)
_SPEEDUP = re.compile(r"\bspeedup(?: vs\.? baseline)?\s*[:=]\s*" + _NUM)


def spec_no_speedup(decode_tok_s: float, baseline_tok_s: float, *, min_speedup: float = 1.0) -> bool:
    """True when speculative decoding did not beat the no-spec baseline.

    Args:
        decode_tok_s: the trial's decode throughput, tok/s.
        baseline_tok_s: the baseline config's decode throughput on the same node, tok/s.
        min_speedup: speedup (ratio) a trial must strictly exceed to count as a speedup;
            default 1.0 (taxonomy 2.19: "slower than baseline", e.g. 59 vs 61 tok/s).
    Returns:
        ``decode_tok_s / baseline_tok_s <= min_speedup``.
    Raises:
        ValueError: a throughput that is not a finite number >= 0, or a baseline of 0.
    """
    for name, v in (("decode_tok_s", decode_tok_s), ("baseline_tok_s", baseline_tok_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0 (got {v!r})")
    if baseline_tok_s == 0:
        raise ValueError("baseline_tok_s must be > 0")
    return decode_tok_s / baseline_tok_s <= min_speedup


def _spec_bench_finding(text: str) -> tuple[str, float, float] | None:
    """(decisive line, trial tok/s, baseline tok/s) when bench lines show no speedup."""
    baseline: float | None = None
    trial: tuple[str, float] | None = None
    for raw in text.splitlines():
        line = raw[:MAX_LINE_CHARS]
        m = _TRIAL_VS_BASELINE.search(line)
        if m:
            t, b = float(m.group(1)), float(m.group(2))
            if b > 0 and spec_no_speedup(t, b):
                return raw, t, b
            continue
        m = _SPEEDUP.search(line)
        if m and float(m.group(1)) <= 1.0:
            return raw, float(m.group(1)), 1.0
        m = _BASELINE_TPUT.search(line)
        if m:
            baseline = float(m.group(1))
            continue
        m = _TRIAL_TPUT.search(line)
        if m:
            trial = (raw, float(m.group(1)))
    if trial and baseline and spec_no_speedup(trial[1], baseline):
        return trial[0], trial[1], baseline
    return None


def detect_perf_findings(log_text: str) -> list[PerfFinding]:
    """All performance findings in a healthy server's log, in log order (one per path/tag).

    Args:
        log_text: the server log (plus any bench lines the harness appended).
    Returns:
        ``allreduce_path_degraded`` findings (one per allreduce path that a log line says
        was turned off) and a ``spec_decode_no_speedup`` finding when bench lines compare
        the trial's throughput to a baseline and it is not faster.
    """
    out: list[PerfFinding] = []
    seen: set[str] = set()
    for raw in log_text.splitlines():
        line = raw[:MAX_LINE_CHARS]
        for path, pat in _DEGRADED:
            if path not in seen and pat.search(line):
                seen.add(path)
                out.append(PerfFinding("allreduce_path_degraded", path, raw, normalize_line(raw)))
    spec = _spec_bench_finding(log_text)
    if spec:
        out.append(PerfFinding("spec_decode_no_speedup", "", spec[0], normalize_line(spec[0])))
    return out


def detect_perf_tags(log_text: str, expected_paths: Mapping[str, object] | None = None) -> list[str]:
    """Perf class ids for a healthy server's log (e.g. ``["allreduce_path_degraded"]``).

    Args:
        log_text: the server log.
        expected_paths: optional ``TrialSpec.expected_paths``: path booleans
            (``{"custom_allreduce": True}``) and/or the allreduce level
            (``{"allreduce": "custom"}``, as ``tasks.knobs.render_launch`` returns); when
            given, an allreduce path that was turned off counts only if the trial expected
            that path to run.
    Returns:
        Unique tags in first-seen order; [] when nothing was found.
    """
    expected: dict[str, object] | None = None
    if expected_paths is not None:
        expected = dict(expected_paths)
        level = _LEVEL_PATH.get(str(expected_paths.get("allreduce")))
        if level:
            expected[level] = True
    tags: list[str] = []
    for f in detect_perf_findings(log_text):
        if f.path and expected is not None and not expected.get(f.path):
            continue
        if f.tag not in tags:
            tags.append(f.tag)
    return tags


def _first_perf_line(text: str, tag: str) -> str | None:
    for f in detect_perf_findings(text):
        if f.tag == tag:
            return f.line
    return None


# --------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_SIGQUIT = re.compile(r"Received sigquit from a child process")
_ERRORISH = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\b:?|\b(?:ERROR|FATAL|fatal|Fatal)\b|\bNCCL WARN\b")


def _stages(lines: list[str]) -> list[str | None]:
    """Startup stage of each line: the last milestone at or before it."""
    out: list[str | None] = []
    cur: str | None = None
    for line in lines:
        for name, pat in MILESTONES:
            if pat.search(line):
                cur = name
        out.append(cur)
    return out


def _match_row(row: Signature, text: str, lines: list[str], stages: list[str | None],
               exit_code: int | None) -> str | None:
    if row.exit_codes is not None and exit_code not in row.exit_codes:
        return None
    if row.requires is not None and not row.requires.search(text):
        return None
    if row.unless is not None and row.unless.search(text):
        return None
    if row.check is not None:
        return row.check(text)
    for pat in row.patterns:
        for i, line in enumerate(lines):
            if not pat.search(line):
                continue
            if row.stages is not None and stages[i] not in row.stages:
                continue
            if row.near is not None and not any(row.near.search(x) for x in lines[max(0, i - NEAR_LINES):i + 1]):
                continue
            return line
    return None


def _make(failure_class: str, line: str, fallback_sig: str) -> Classification:
    sig = normalize_line(line) if line.strip() else fallback_sig
    return Classification(failure_class, KIND[failure_class], sig or fallback_sig, line)


def _last_line(lines: list[str], pat: re.Pattern[str] | None = None) -> str:
    for line in reversed(lines):
        if line.strip() and (pat is None or pat.search(line)):
            return line
    return ""


def _classify(log_text: str, exit_code: int | None, phase: str | None) -> Classification:
    text = log_text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    lines = [x[:MAX_LINE_CHARS] for x in text.split("\n")]
    stages = _stages(lines)
    for row in SIGNATURES:
        if not row.patterns and row.check is None:
            continue
        line = _match_row(row, text, lines, stages, exit_code)
        if line is not None:
            return _make(row.failure_class, line, f"<{row.failure_class}>")

    ready = "ready" in stages
    if phase is None and exit_code is None:
        phase = "bench" if ready else "startup"  # still running: infer the phase from the log
    facts = _Facts(exit_code, phase, bool(_SIGQUIT.search(text)), bool(_TRACEBACK.search(text)),
                   ready, next((s for s in reversed(stages) if s), None))
    code = "still running" if exit_code is None else f"exit {exit_code}"
    for _why, pred, cls in FALLBACKS:
        if pred(facts):
            if cls in ("startup_timeout", "collective_hang_or_timeout") and exit_code is None:
                progress = [ln for ln, st in zip(lines, stages) if st and st == facts.last_milestone]
                line = _last_line(progress) or _last_line(lines)
            else:
                line = _last_line(lines, _ERRORISH) or _last_line(lines)
            return _make(cls, line, f"<{cls}: no log output, {code}>")
    line = _last_line(lines, _ERRORISH) or _last_line(lines)
    return _make("unknown", line, f"<no log output, {code}>")


def classify(log_text: str, exit_code: int | None = None, phase: str | None = None) -> Classification:
    """Classify one trial's failure (or healthy-server perf finding).

    Args:
        log_text: the server log (any size; harness lines such as
            ``[harness] startup deadline exceeded ...`` or dmesg OOM lines may be appended).
        exit_code: what the parent saw: Popen return code (negative = signal, e.g. -9),
            137-style shell codes, 0 for a clean exit, None while still running / killed by
            the harness.
        phase: lifecycle phase where it failed: ``preflight`` | ``startup`` | ``warmup`` |
            ``bench`` | ``teardown``, or None (inferred from the log when still running).
    Returns:
        A :class:`Classification`; ``unknown`` with a normalized signature when no row and
        no exit-code rule applies.
    Raises:
        Nothing: a classifier bug returns ``unknown`` with a ``<classifier error: ...>``
        signature rather than losing the trial's result.
    """
    try:
        return _classify(str(log_text or ""), exit_code, phase)
    except Exception as e:  # noqa: BLE001 - the result must survive a classifier bug
        return Classification("unknown", KIND["unknown"], f"<classifier error: {type(e).__name__}>", "")


def harness_classification(failure_class: str, detail: str = "") -> Classification:
    """A classification for a class the harness decides by name (``bench_stall``, ``gpu_busy``...).

    Args:
        failure_class: a key of :data:`KIND`.
        detail: the harness message (normalized into the signature).
    Raises:
        KeyError: ``failure_class`` is not canonical.
    """
    kind = KIND[failure_class]
    sig = normalize_line(detail) if detail.strip() else f"<{failure_class}>"
    return Classification(failure_class, kind, sig, detail)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------
def _exit_code_arg(s: str) -> int | None:
    return None if s.lower() in ("none", "null", "") else int(s)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m tasks.failures [--exit-code N] [--phase P] LOG...``; returns 0, or 2 on unreadable files."""
    p = argparse.ArgumentParser(prog="python -m tasks.failures", description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", metavar="LOG", help="server log file(s)")
    p.add_argument("--exit-code", type=_exit_code_arg, default=None,
                   help="exit code the parent saw (int, or 'none' = still running)")
    p.add_argument("--phase", choices=["preflight", "startup", "warmup", "bench", "teardown"], default=None)
    a = p.parse_args(list(argv) if argv is not None else None)
    rc = 0
    for path in a.logs:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError as e:
            print(f"{path}: {e.strerror}", file=sys.stderr)
            rc = 2
            continue
        c = classify(text, a.exit_code, a.phase)
        print(f"{path}\t{c.failure_class}\t{c.kind}\t{c.signature}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
