"""The emulated node's performance and failure model (pure; no I/O, no sleeping).

``parse_launch(argv, env)`` turns SGLang launch flags + NCCL env into a ``LaunchConfig``;
``evaluate(profile, launch)`` returns a ``Prediction``: either a startup failure scenario
(class, phase, exit code, SGLang-like log, time to failure) or the modelled decode rate,
with the startup-time and memory breakdowns and the startup log.

The parts live beside this module: ``launch`` (flags, ServerArgs validation), ``physics``
(collectives, step time, CUDA-graph effects, memory; the equations are in its docstring),
``eagle`` (draft tree and acceptance), ``failure_logs`` (timeline and scripted failure
logs), ``prediction`` (result types). This module runs the startup sequence and re-exports
the names other code imports from ``tasks.emulator.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.emulator import failure_logs as fl
from tasks.emulator.eagle import (
    DEFAULT_TOPK_DECAY,
    DEFAULT_TOPK_RECOVERY,
    acceptance_rates,
    accepted_from_uniform,
    draft_tree,
    position_probs,
    rank_probs,
    tau,
    tau_independent,
)
from tasks.emulator.failure_logs import Timeline
from tasks.emulator.flags import LaunchArgError
from tasks.emulator.launch import LaunchConfig, check_server_args, parse_launch, server_args_line
from tasks.emulator.physics import (
    GB,
    GIB,
    CollectiveModel,
    CollectivePath,
    capabilities,
    collectives,
    delta_cg_ms,
    graph_memory_gib,
    model_params,
    node_params,
    resident_weights_gib,
    run_factor,
    step_ms,
    weights_bytes,
)
from tasks.emulator.prediction import FailureScenario, LogEvent, Prediction, format_event
from tasks.probe import parse_probe, probe_classes

__all__ = [
    "DEFAULT_CAPTURE_BS", "DEFAULT_MAX_BS_LARGE_GPU", "DEFAULT_TOPK_DECAY", "DEFAULT_TOPK_RECOVERY",
    "EXPECTED_CLASS", "GB", "GIB", "CollectiveModel", "CollectivePath", "FailureScenario", "LaunchConfig",
    "LogEvent", "Prediction", "accepted_from_uniform", "acceptance_rates", "collectives", "delta_cg_ms",
    "draft_tree", "evaluate", "evaluate_argv", "format_event", "parse_launch", "position_probs", "rank_probs",
    "resident_weights_gib", "run_factor", "step_ms", "tau", "tau_independent", "weights_bytes",
]

# SGLang's default decode capture list up to 512: 52 sizes [S] (as logged in sglang PR #11275)
DEFAULT_CAPTURE_BS = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 513, 16))
DEFAULT_MAX_BS_LARGE_GPU = 512  # [A] SGLang auto cuda_graph_max_bs for >90 GB GPUs at TP>=4

#: [A] a dummy-weight load (random init on the GPUs, no checkpoint read): ~2 s at any size
DUMMY_LOAD_S = 2.0

# Campaign failure names -> the class the emulator's log produces (calibration check).
EXPECTED_CLASS = {
    "flashinfer_allreduce_fusion": "flashinfer_allreduce_fusion_unsupported_arch",
    "torch_symm_mem": "torch_symm_mem_unsupported",
    "ep_flashinfer_a2a": "moe_ep_a2a_config_error",
    # The log carries NCCL's own "no algorithm/protocol available ... NCCL_ALGO was set to
    # Tree." line, which names the root cause (an env pin), so the classifier's precedence
    # (nccl_env_algo_proto_invalid before nccl_graph_capture_error) picks it.
    "nccl_tree": "nccl_env_algo_proto_invalid",
}


@dataclass
class _Startup:
    """State of one ``evaluate``: inputs, the timeline and the memory the phases compute."""

    profile: dict
    launch: LaunchConfig
    pred: Prediction
    tl: Timeline
    cm: CollectiveModel
    cinfo: CollectivePath
    gpu_gib: float
    mem_frac: float
    max_bs: int
    graphs: bool
    mem: dict = field(default_factory=dict)
    #: a probe launch (``--load-format dummy``): its layer fraction (1.0 = every layer), else None
    probe_frac: float | None = None

    def masked(self, failure_class: str) -> bool:
        """A probe cannot hit ``failure_class`` (conf/probe_classes.yaml: memory depends on real weights)."""
        return self.probe_frac is not None and not probe_classes().reveals(failure_class)

    @property
    def tp(self) -> int:
        return max(1, self.launch.tp)

    @property
    def rank_fail(self) -> int:
        """The rank whose traceback is printed first (rank 3 at TP 8, as in real logs)."""
        return 3 % self.tp

    @property
    def st(self) -> dict:
        return node_params(self.profile)["startup"]

    @property
    def nmem(self) -> dict:
        return node_params(self.profile)["memory"]


def _launcher(s: _Startup) -> Prediction | None:
    """Server args, env and the launcher's ServerArgs validation (exit 1)."""
    tl, launch = s.tl, s.launch
    tl.log(server_args_line(launch, s.max_bs, s.mem_frac), tag=None)
    if launch.nccl_algo:
        tl.log(f"env: NCCL_ALGO={launch.nccl_algo}", tag=None)
    if launch.nccl_proto:
        tl.log(f"env: NCCL_PROTO={launch.nccl_proto}", tag=None)
    tl.advance("process", s.st["process_s"])
    chk = check_server_args(launch, model_params(s.profile).get("spec_defaults"))
    if chk.spec is not None:
        s.pred.spec = dict(chk.spec)
    for note in chk.notes:
        tl.log(note, tag=None)
    if chk.error is not None:
        return fl.server_args_failure(s.pred, tl, chk.error)
    return None


def _dist_init(s: _Startup) -> Prediction | None:
    """TP ranks: torch distributed init (torch symmetric memory fails here)."""
    tl, caps, launch = s.tl, capabilities(s.profile), s.launch
    tl.log("Init torch distributed begin.")
    if launch.enable_torch_symm_mem and s.tp > 1 and caps["arch_major"] not in caps.get("torch_symm_mem_majors", []):
        return fl.symm_mem_failure(s.pred, tl, caps["arch_major"])
    tl.advance("dist_init", s.st["dist_init_s"])
    tl.log(f"Init torch distributed ends. mem usage={s.nmem['torch_context_gib'] * 0.41:.2f} GB")
    if s.cinfo.custom_ar_disabled:
        tl.log("Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs.")
        s.pred.perf_tags.append("allreduce_path_degraded")
    elif s.cinfo.path == "custom:pcie":
        tl.log(f"Custom allreduce is enabled on {s.tp} PCIe-only GPUs (forced: "
               f"emulator capability force_custom_allreduce_pcie).")
    for w in s.cinfo.warnings:
        tl.log(f"NCCL WARN {w}")
    return None


def _weights_and_kv(s: _Startup) -> Prediction | None:
    """Weight loading (the HTTP port binds after it) and the KV-cache pool."""
    tl, mem, me = s.tl, s.nmem, model_params(s.profile)
    spec = s.launch.speculative
    w_gib = resident_weights_gib(s.profile, s.tp, spec) * (s.probe_frac or 1.0)
    avail0 = s.gpu_gib - mem["torch_context_gib"]
    tl.log(f"Load weight begin. avail mem={avail0:.2f} GB")
    # a dummy load reads no checkpoint: random init on the GPUs, [A] ~2 s (DUMMY_LOAD_S)
    load_s = DUMMY_LOAD_S if s.probe_frac is not None else w_gib * GIB / GB * s.tp / s.st["load_gbs"]
    tl.advance("load_weights", load_s)
    tl.log(f"Load weight end. type={me.get('architecture', 'Model')}, dtype=torch.bfloat16, "
           f"avail mem={avail0 - w_gib:.2f} GB, mem usage={w_gib:.2f} GB.")
    tl.log("", kind="bind", tag=None)
    pool = s.mem_frac * s.gpu_gib
    kv_gib = pool - w_gib
    kv_tokens = int(max(0.0, kv_gib) * GIB / me["kv_bytes_per_token"])
    avail_graph = s.gpu_gib - pool - mem["torch_context_gib"] - mem["nccl_buffers_gib"] - mem["activations_gib"]
    g_target, g_draft = graph_memory_gib(s.profile, s.max_bs, s.graphs, spec)
    s.mem = {"avail_graph": avail_graph, "g_target": g_target, "g_draft": g_draft, "kv_tokens": kv_tokens}
    s.pred.memory_gib = {"gpu": s.gpu_gib, "weights": round(w_gib, 3), "pool": round(pool, 3),
                         "kv": round(kv_gib, 3), "kv_tokens": kv_tokens, "graph_target": round(g_target, 3),
                         "graph_draft": round(g_draft, 3), "avail_for_graph": round(avail_graph, 3)}
    if kv_tokens < mem["min_kv_tokens"] and not s.masked("kv_cache_pool_too_small"):
        return fl.kv_pool_failure(s.pred, tl)
    tl.advance("kv_alloc", s.st["kv_alloc_s"])
    tl.log(f"KV Cache is allocated. #tokens: {kv_tokens}, KV size: {kv_gib:.2f} GB")
    tl.log(f"Memory pool end. avail mem={avail_graph + mem['activations_gib']:.2f} GB")
    return None


def _first_forwards(s: _Startup) -> Prediction | None:
    """The first forwards (CUDA-graph capture or warmup): fusion JIT, MoE A2A, first AllGather, OOM."""
    tl, caps, launch, pred, cinfo = s.tl, capabilities(s.profile), s.launch, s.pred, s.cinfo
    avail_graph, g_target = s.mem["avail_graph"], s.mem["g_target"]
    fusion_majors = caps.get("flashinfer_fusion_supported_majors", [])
    fusion_refused = launch.fusion_requested and s.tp > 1 and caps["arch_major"] not in fusion_majors
    if fusion_refused and caps.get("flashinfer_fusion_rejected_by") == "sglang":
        return fl.fusion_gate_failure(pred, tl, graphs=s.graphs, rank=s.rank_fail)
    if s.graphs:
        tl.log(f"{fl.CAPTURE_BANNER}{avail_graph + s.nmem['activations_gib']:.2f} GB")
    if fusion_refused:
        return fl.fusion_arch_failure(pred, tl, graphs=s.graphs, rank=s.rank_fail, majors=list(fusion_majors))
    if launch.moe_a2a_backend == "flashinfer" and caps.get("flashinfer_a2a_requires_nvlink", True) \
            and not (caps.get("nvlink") or caps.get("mnnvl")):
        return fl.a2a_failure(pred, tl, graphs=s.graphs, rank=s.rank_fail, tp=s.tp, gpu_gib=s.gpu_gib,
                              avail_gib=avail_graph)
    if s.tp > 1 and not (cinfo.allgather_ok and cinfo.allreduce_ok):
        what = "AllGather" if cinfo.allreduce_ok else "AllReduce"
        set_by = f"NCCL_ALGO was set to {launch.nccl_algo}." if launch.nccl_algo else \
            f"NCCL_PROTO was set to {launch.nccl_proto}."
        return fl.nccl_invalid_failure(pred, tl, graphs=s.graphs, rank=s.rank_fail, what=what, set_by=set_by)
    if s.graphs and avail_graph < g_target and not s.masked("cuda_oom_graph_capture"):
        return fl.graph_oom_failure(pred, tl, rank=s.rank_fail, need_gib=g_target - max(avail_graph, 0.0),
                                    gpu_gib=s.gpu_gib)
    return None


def _capture_and_ready(s: _Startup) -> Prediction | None:
    """Successful capture (target, then the EAGLE draft's graphs), warmup and the ready line."""
    tl, st, act = s.tl, s.st, s.nmem["activations_gib"]
    avail_graph, g_target, g_draft = s.mem["avail_graph"], s.mem["g_target"], s.mem["g_draft"]
    sizes = [b for b in DEFAULT_CAPTURE_BS if b <= s.max_bs] or [s.max_bs]
    full_cap_s = st["capture_s_per_size"] * len(sizes) if s.graphs else 0.0
    cap_s = full_cap_s * (s.probe_frac or 1.0)  # capture replays every layer: time ∝ layers
    tl.advance("graph_capture", cap_s + st["jit_s"])
    if s.graphs:
        tl.log(f"Capture cuda graph end. Time elapsed: {cap_s + st['jit_s']:.2f} s. mem usage={g_target:.2f} GB. "
               f"avail mem={avail_graph - g_target + act:.2f} GB.")
    if s.graphs and s.launch.speculative:
        tl.log(f"Capture draft cuda graph begin. This can take up to several minutes. "
               f"avail mem={avail_graph - g_target + act:.2f} GB")
        if avail_graph < g_target + g_draft and not s.masked("cuda_oom_graph_capture"):
            return fl.draft_graph_oom_failure(s.pred, tl, need_gib=g_target + g_draft - max(avail_graph, 0),
                                              gpu_gib=s.gpu_gib)
        dcap = full_cap_s * st["draft_capture_factor"]  # the one-layer draft is never cut
        tl.advance("graph_capture", dcap)
        tl.log(f"Capture draft cuda graph end. Time elapsed: {dcap:.2f} s. mem usage={g_draft:.2f} GB. "
               f"avail mem={avail_graph - g_target - g_draft + act:.2f} GB.")
    tl.log(f"max_total_num_tokens={s.mem['kv_tokens']}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
           f"max_running_requests={s.launch.args.get('max_running_requests') or 2048}, context_len=262144, "
           f"available_gpu_mem={max(avail_graph - g_target - g_draft + act, 0):.2f} GB")
    tl.log(f"INFO:     Uvicorn running on http://{s.launch.host}:{s.launch.port} (Press CTRL+C to quit)", tag=None)
    tl.advance("warmup", st["warmup_s"])
    tl.log("Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, "
           "#queue-req: 0", tag="TP0")
    tl.log("The server is fired up and ready to roll!", tag=None)
    tl.log("", kind="ready", tag=None)
    s.pred.events = tl.events
    s.pred.startup_s = tl.startup_s()
    return None


def _performance(s: _Startup, batch: int, input_len: int, output_len: int) -> Prediction:
    """Decode rate (EAGLE cycle or plain step), ITL and TTFT of a healthy server."""
    profile, launch, pred, cm = s.profile, s.launch, s.pred, s.cm
    ne, me = node_params(profile), model_params(profile)
    ctx = input_len + output_len // 2
    use_graphs = s.graphs and batch <= s.max_bs
    if launch.speculative:
        steps, topk, dtok = pred.spec["num_steps"], pred.spec["eagle_topk"], pred.spec["num_draft_tokens"]
        t_ver = step_ms(profile, launch, cm, tokens=batch * dtok, batch=batch, ctx=ctx, graphs=use_graphs,
                        max_bs=s.max_bs, alpha_extra_us=ne["alpha_verify_us"] - ne["nccl"]["alpha_us"])
        t_draft_total = steps * me["t_draft_ms"]
        t_cycle = t_draft_total + t_ver["total"]
        tau_v = tau(profile, steps, topk, dtok)
        pred.accept_length = tau_v
        pred.t_verify_ms, pred.t_draft_total_ms, pred.t_cycle_ms = t_ver["total"], t_draft_total, t_cycle
        pred.t_step_ms = t_ver["total"]
        pred.verify_share = t_ver["total"] / t_cycle
        pred.breakdown_ms = t_ver
        pred.decode_tok_s = 1000.0 * tau_v / t_cycle
        pred.spec["position_probs"] = position_probs(profile, steps, topk, dtok)
    else:
        t = step_ms(profile, launch, cm, tokens=batch, batch=batch, ctx=ctx, graphs=use_graphs, max_bs=s.max_bs)
        pred.t_step_ms = pred.t_cycle_ms = pred.t_verify_ms = t["total"]
        pred.breakdown_ms = t
        pred.decode_tok_s = 1000.0 / t["total"]
    pred.itl_ms = 1000.0 / pred.decode_tok_s
    pf = step_ms(profile, launch, cm, tokens=input_len, batch=1, ctx=input_len, graphs=False,
                 max_bs=s.max_bs, prefill=True)
    pred.ttft_ms = pf["total"] + s.st["http_overhead_ms"] + (me["t_draft_ms"] if launch.speculative else 0.0)
    return pred


def evaluate(profile: dict, launch: LaunchConfig, *, batch: int = 1, input_len: int = 128,
             output_len: int = 128) -> Prediction:
    """Predict what launching ``launch`` on the profile's node does.

    Args:
        profile: from ``tasks.emulator.profile.build_profile``.
        launch: from ``parse_launch``.
        batch: concurrent sequences in the decode batch.
        input_len: prompt tokens (TTFT and KV context).
        output_len: output tokens (average KV context = input_len + output_len/2).

    Returns:
        Prediction (never raises for a config the node rejects: that is a failure scenario).
    """
    mem = node_params(profile)["memory"]
    cm, cinfo = collectives(profile, launch)
    s = _Startup(profile=profile, launch=launch, pred=Prediction(outcome="ok"), tl=Timeline(), cm=cm, cinfo=cinfo,
                 gpu_gib=float(profile["node"]["memory_gib"]),
                 mem_frac=launch.mem_fraction_static or mem["default_mem_fraction_static"],
                 max_bs=launch.cuda_graph_max_bs or DEFAULT_MAX_BS_LARGE_GPU, graphs=not launch.disable_cuda_graph)
    s.pred.allreduce_path = cinfo.path
    s.pred.warnings += cinfo.warnings
    probe = parse_probe(launch.argv)
    if probe is not None:
        n = int(model_params(profile)["num_layers"])
        s.probe_frac = min(1.0, (probe.num_layers or n) / n)
    for phase in (_launcher, _dist_init, _weights_and_kv, _first_forwards, _capture_and_ready):
        failed = phase(s)
        if failed is not None:
            return failed
    return _performance(s, batch, input_len, output_len)


def evaluate_argv(profile: dict, argv: list[str], env: dict | None = None, **kw) -> Prediction:
    """``parse_launch`` + ``evaluate``; an argparse rejection becomes a ``cli_arg_error`` Prediction."""
    try:
        launch = parse_launch(argv, env or {}, sglang_version=str(profile["emulator"]["sglang_version"]))
    except LaunchArgError as e:
        pred = Prediction(outcome="failed")
        pred.failure = FailureScenario("cli_arg_error", "startup", 2, 1.0, f"error: {e.message}")
        pred.events = [LogEvent(0.0, line, raw=True) for line in e.text.rstrip("\n").splitlines()]
        pred.startup_s = {"process": 1.0, "total": 1.0}
        return pred
    return evaluate(profile, launch, **kw)
