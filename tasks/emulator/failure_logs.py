"""The startup timeline and the scripted SGLang log text of each startup failure.

Each ``*_failure`` function appends the log lines SGLang 0.5.23 prints for one failure
(tracebacks with ``<VENV>`` paths, the scheduler's exception banner, the launcher's sigquit
line), marks the ``Prediction`` failed and returns it. Which failure happens is decided by
``tasks.emulator.model.evaluate``; the text here is what ``tasks.failures`` classifies.
"""

from __future__ import annotations

from tasks.emulator.launch import ServerArgsError
from tasks.emulator.prediction import FailureScenario, LogEvent, Prediction

#: SGLang's "Capture cuda graph failed" advice block (cuda_graph_runner.py).
CAPTURE_HINT = ("Possible solutions:",
                "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
                "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
                "3. disable torch compile by not using --enable-torch-compile",
                "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)",
                "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ")
CAPTURE_BANNER = "Capture cuda graph begin. This can take up to several minutes. avail mem="


class Timeline:
    """Startup clock (seconds at time_scale 1), its log events and time per phase."""

    def __init__(self) -> None:
        self.t = 0.0
        self.events: list[LogEvent] = []
        self.phases: dict[str, float] = {}

    def log(self, text: str, tag: str | None = "TP0", raw: bool = False, kind: str = "log") -> None:
        """Append an event at the current time."""
        self.events.append(LogEvent(self.t, text, kind, tag, raw))

    def advance(self, phase: str, dt: float) -> None:
        """Spend ``dt`` seconds in ``phase``."""
        self.t += dt
        self.phases[phase] = self.phases.get(phase, 0.0) + dt

    def startup_s(self) -> dict[str, float]:
        """Phase -> seconds (rounded to ms), ``total`` included."""
        return {**{k: round(v, 3) for k, v in self.phases.items()}, "total": round(self.t, 3)}


def scheduler_exception(tl: Timeline, rank: int, frames: list[str], final: list[str]) -> None:
    """A TP rank's ``Scheduler hit an exception`` traceback."""
    tl.log("Scheduler hit an exception: Traceback (most recent call last):", tag=f"TP{rank}")
    for f in frames:
        tl.log(f, raw=True)
    for f in final:
        tl.log(f, raw=True)


def sigquit(tl: Timeline) -> None:
    """The launcher's line when a scheduler child dies (SGLang then kills itself: exit -9)."""
    tl.log("Received sigquit from a child process. It usually means the child failed.", tag=None)


def fail(pred: Prediction, tl: Timeline, cls: str, phase: str, exit_code: int, signature: str) -> Prediction:
    """Mark ``pred`` failed at the timeline's current time; returns it."""
    pred.outcome = "failed"
    pred.failure = FailureScenario(cls, phase, exit_code, round(tl.t, 3), signature)
    pred.events = tl.events
    pred.startup_s = tl.startup_s()
    pred.decode_tok_s = 0.0
    return pred


def server_args_failure(pred: Prediction, tl: Timeline, err: ServerArgsError) -> Prediction:
    """The launcher's traceback for a ``ServerArgs`` rejection (exit 1)."""
    tl.log("Traceback (most recent call last):", raw=True)
    tl.log('  File "<VENV>/sglang/launch_server.py", line 24, in <module>', raw=True)
    tl.log("    server_args = prepare_server_args(sys.argv[1:])", raw=True)
    tl.log('  File "<VENV>/sglang/srt/server_args.py", line 612, in __post_init__', raw=True)
    tl.log(f"    self.{err.where}()", raw=True)
    tl.log('  File "<VENV>/sglang/srt/server_args.py", line 2400, in ' + err.where, raw=True)
    if err.src:
        tl.log("    " + err.src, raw=True)
    tl.log(err.exc_line, raw=True)
    return fail(pred, tl, err.failure_class, "startup", 1, err.exc_line)


def symm_mem_failure(pred: Prediction, tl: Timeline, arch_major: int) -> Prediction:
    """torch symmetric memory has no size table for this architecture (KeyError at dist init)."""
    tl.advance("dist_init", 3.0)
    scheduler_exception(tl, 0, [
        '  File "<VENV>/sglang/srt/distributed/device_communicators/symm_mem.py", line 70, in __init__',
        "    if self.world_size not in SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]:"],
        [f"KeyError: {arch_major}"])
    sigquit(tl)
    return fail(pred, tl, "torch_symm_mem_unsupported", "startup", -9, f"KeyError: {arch_major}")


def kv_pool_failure(pred: Prediction, tl: Timeline) -> Prediction:
    """The static memory pool leaves too few KV-cache tokens."""
    tl.advance("kv_alloc", 1.0)
    scheduler_exception(tl, 0, [
        '  File "<VENV>/sglang/srt/model_executor/model_runner.py", line 1702, in init_memory_pool'],
        ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."])
    sigquit(tl)
    return fail(pred, tl, "kv_cache_pool_too_small", "startup", -9,
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")


def first_forward_failure(pred: Prediction, tl: Timeline, *, graphs: bool, rank: int, frames: list[str],
                          msg: str, cls: str, sig: str, pre: list[str] | None = None) -> Prediction:
    """A failure in the first forwards: CUDA-graph capture, or the eager warmup without graphs.

    Args:
        graphs: CUDA graphs on (the error is wrapped in ``Capture cuda graph failed:``).
        rank: the TP rank whose traceback is printed.
        frames: traceback frames; msg: the error text; cls / sig: class and signature.
        pre: raw lines printed before the traceback (e.g. an NCCL WARN).
    """
    tl.advance("graph_capture" if graphs else "warmup", 3.0)
    for line in pre or []:
        tl.log(line, raw=True)
    if graphs:
        scheduler_exception(tl, rank, frames, [f"Exception: Capture cuda graph failed: {msg}", *CAPTURE_HINT])
    else:
        tl.log(f"Initialization failed. warmup error: {msg}", tag=None)
        scheduler_exception(tl, rank, frames, [msg])
    sigquit(tl)
    return fail(pred, tl, cls, "startup", -9, sig)


def fusion_arch_failure(pred: Prediction, tl: Timeline, *, graphs: bool, rank: int, majors: list) -> Prediction:
    """FlashInfer's all-reduce fusion JIT finds no supported architecture."""
    msg = f"No supported CUDA architectures found for major versions {majors}."
    return first_forward_failure(
        pred, tl, graphs=graphs, rank=rank,
        frames=['  File "<VENV>/sglang/srt/model_executor/cuda_graph_runner.py", line 400, in __init__',
                '  File "<VENV>/flashinfer/jit/core.py", line 112, in check_cuda_arch',
                f"RuntimeError: {msg}"],
        msg=msg, cls="flashinfer_allreduce_fusion_unsupported_arch", sig=f"Capture cuda graph failed: {msg}")


def fusion_gate_failure(pred: Prediction, tl: Timeline, *, graphs: bool, rank: int) -> Prediction:
    """SGLang's own gate on the fusion, before FlashInfer is asked: ``_resolve_backend`` (sglang
    srt/layers/flashinfer_comm_fusion.py) raises when the GPU is neither SM90 nor SM10X, from the
    workspace pre-initialisation that precedes the first forwards. The frames are those a public
    SGLang log prints for it (2026-06, the runner refactor's ``base_runner.py``)."""
    tl.advance("graph_capture" if graphs else "warmup", 1.0)
    msg = "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."
    scheduler_exception(tl, rank, [
        '  File "<VENV>/sglang/srt/model_executor/model_runner.py", line 914, in init_cuda_graphs',
        '  File "<VENV>/sglang/srt/model_executor/runner/base_runner.py", line 247, in '
        '_pre_initialize_flashinfer_allreduce_workspace',
        '  File "<VENV>/sglang/srt/layers/flashinfer_comm_fusion.py", line 669, in ensure_workspace_initialized',
        '  File "<VENV>/sglang/srt/layers/flashinfer_comm_fusion.py", line 84, in '
        'resolve_flashinfer_allreduce_fusion_backend',
        '  File "<VENV>/sglang/srt/layers/flashinfer_comm_fusion.py", line 50, in _resolve_backend'], [msg])
    sigquit(tl)
    return fail(pred, tl, "flashinfer_allreduce_fusion_unsupported_arch", "startup", -9, msg)


def a2a_failure(pred: Prediction, tl: Timeline, *, graphs: bool, rank: int, tp: int, gpu_gib: float,
                avail_gib: float) -> Prediction:
    """FlashInfer MoE all-to-all without NVLink: an assertion on one rank, OOM on the next."""
    tl.advance("graph_capture" if graphs else "warmup", 2.0)
    scheduler_exception(tl, rank, [
        '  File "<VENV>/sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py", line 686, in '
        'fused_experts_none_to_flashinfer_trtllm_fp8',
        "    assert TopKOutputChecker.format_is_bypassed(topk_output)"], ["AssertionError"])
    oom_rank = (rank + 1) % tp
    scheduler_exception(tl, oom_rank, [
        '  File "<VENV>/flashinfer/comm/trtllm_moe_alltoall.py", line 211, in __init__'],
        [f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.50 GiB. GPU {oom_rank} has a "
         f"total capacity of {gpu_gib:.2f} GiB of which {max(avail_gib, 0.1):.2f} GiB is free."])
    sigquit(tl)
    return fail(pred, tl, "moe_ep_a2a_config_error", "startup", -9,
                "assert TopKOutputChecker.format_is_bypassed(topk_output)")


def nccl_invalid_failure(pred: Prediction, tl: Timeline, *, graphs: bool, rank: int, what: str,
                         set_by: str) -> Prediction:
    """NCCL has no algorithm/protocol for a collective (``what``) under the pinned env (``set_by``)."""
    warn = (f"<HOST>:4411:4411 [{rank}] enqueue.cc:1390 NCCL WARN Error : no algorithm/protocol available "
            f"for function {what} with datatype ncclBfloat16. {set_by}")
    err = "NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"
    return first_forward_failure(
        pred, tl, graphs=graphs, rank=rank,
        frames=['  File "<VENV>/sglang/srt/distributed/device_communicators/pynccl.py", line 182, in all_gather',
                f"RuntimeError: {err}"],
        msg=err, cls="nccl_env_algo_proto_invalid", sig=f"no algorithm/protocol available for function {what}",
        pre=[warn])


def graph_oom_failure(pred: Prediction, tl: Timeline, *, rank: int, need_gib: float, gpu_gib: float) -> Prediction:
    """CUDA out of memory while capturing the target's CUDA graphs."""
    msg = (f"CUDA out of memory. Tried to allocate {need_gib * 1024:.2f} MiB. GPU {rank} has a total capacity "
           f"of {gpu_gib:.2f} GiB")
    return first_forward_failure(
        pred, tl, graphs=True, rank=rank,
        frames=['  File "<VENV>/sglang/srt/model_executor/cuda_graph_runner.py", line 269, in __init__'],
        msg=msg, cls="cuda_oom_graph_capture", sig="Capture cuda graph failed: CUDA out of memory")


def draft_graph_oom_failure(pred: Prediction, tl: Timeline, *, need_gib: float, gpu_gib: float) -> Prediction:
    """CUDA out of memory while capturing the EAGLE draft's CUDA graphs."""
    tl.advance("graph_capture", 5.0)
    scheduler_exception(tl, 0, [
        '  File "<VENV>/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", line 95, in __init__'],
        [f"Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
         f"{need_gib:.2f} GiB. GPU 0 has a total capacity of {gpu_gib:.2f} GiB",
         *CAPTURE_HINT])
    sigquit(tl)
    return fail(pred, tl, "cuda_oom_graph_capture", "startup", -9, "Capture cuda graph failed: CUDA out of memory")
