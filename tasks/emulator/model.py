"""The emulated node's performance and failure model (pure; no I/O, no sleeping).

``parse_launch(argv, env)`` turns SGLang launch flags + NCCL env into a ``LaunchConfig``;
``evaluate(profile, launch)`` returns a ``Prediction``: either a startup failure scenario
(class, phase, exit code, SGLang-like log, time to failure) or the modelled decode rate,
with the startup-time and memory breakdowns and the startup log.

Equations (../shared/data/emulated_node.md §7, constants from the profile, see
docs/emulator.md for their provenance):

    W_gpu(T)  = replicated + sharded/tp + n_moe · E·(1-(1-k/E)^T) · B_expert / tp       [bytes]
    t_mem(T)  = (W_gpu(T) + batch·ctx·kv_bytes) / (η·BW)
    t_ar(m)   = min over allowed (algo, proto) of α(algo,proto) + m / bw(proto)
                α(a,p) = α_NCCL · (base[a][p] + 2(N-1)·hw[a][p]) / (base[Ring][LL] + 2(N-1)·hw[Ring][LL])
                (NCCL tuning.cc latency model scaled to the measured 24 µs; LL only up to ll_max_bytes)
    t_step(T) = max(t_mem, t_flops) + N_coll·t_ar(2·T·H) + t_ovh + Δ_cg(max_bs) [+ eager penalty]
    Δ_cg      = δ · log2(max_bs/128) above 128, else 0
    EAGLE:  t_cycle = S·t_draft + t_verify,  t_verify = t_step(bs·D) with α + (α_verify − α_NCCL)
            q_1 = a_j, q_i = (1-a_j)·c·(1-r)·r^(i-2)  (rank-i candidate is the target's token)
            tree = SGLang's beam (width topk, depth S) pruned to the D-1 highest path scores Π q
            τ = 1 + Σ_{kept nodes} Π q  (chain, topk = 1: 1 + Σ_{i≤S} Π_{j≤i} a_j)
            tok/s per request = τ / t_cycle

Units: ms for times unless the name says ``_s``/``_us``; GB = 1e9 bytes; GiB = 2^30 bytes.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from tasks.emulator.flags import DEFAULT_SGLANG_VERSION, LaunchArgError, parse_flags, uses_new_graph_flags

GIB = float(2**30)
GB = 1e9
ALGOS = ("Ring", "Tree")
PROTOS = ("LL", "LL128", "Simple")
# SGLang's default decode capture list up to 512: 52 sizes [S] emulated_node.md §6 (PR #11275 log)
DEFAULT_CAPTURE_BS = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 513, 16))
DEFAULT_MAX_BS_LARGE_GPU = 512  # [A] SGLang auto cuda_graph_max_bs for >90 GB GPUs at TP>=4
LOG_DATE = "2026-11-29"

# Campaign failure names -> the class the emulator's log produces (calibration check).
EXPECTED_CLASS = {
    "flashinfer_allreduce_fusion": "flashinfer_allreduce_fusion_unsupported_arch",
    "torch_symm_mem": "torch_symm_mem_unsupported",
    "ep_flashinfer_a2a": "moe_ep_a2a_config_error",
    # The B08-style log carries NCCL's own "no algorithm/protocol available ... NCCL_ALGO was
    # set to Tree." line, which names the root cause (an env pin), so the classifier's
    # precedence (nccl_env_algo_proto_invalid before nccl_graph_capture_error) picks it.
    "nccl_tree": "nccl_env_algo_proto_invalid",
}


# ----------------------------------------------------------------------------------------
# Launch config
# ----------------------------------------------------------------------------------------
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
        return self.speculative_algorithm in ("EAGLE", "EAGLE3")

    @property
    def fusion_requested(self) -> bool:
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


# ----------------------------------------------------------------------------------------
# Prediction types
# ----------------------------------------------------------------------------------------
@dataclass
class LogEvent:
    """One startup event. ``t_s``: seconds since launch at time_scale 1; ``kind``:
    ``log`` | ``bind`` (HTTP port opens) | ``ready``; ``tag``: ``TP0`` etc. or None (launcher);
    ``raw``: printed without the ``[date time TPn]`` prefix (tracebacks)."""

    t_s: float
    text: str
    kind: str = "log"
    tag: str | None = None
    raw: bool = False


@dataclass
class FailureScenario:
    """How a launch fails. ``exit_code`` as Popen sees it (-9 = SGLang's sigquit self-kill,
    1 = main-process exception, 2 = argparse); ``time_to_failure_s`` at time_scale 1."""

    failure_class: str
    phase: str
    exit_code: int
    time_to_failure_s: float
    signature: str


@dataclass
class Prediction:
    """Result of ``evaluate``. Times in ms unless suffixed; memory in GiB per GPU.

    Attributes:
        outcome: ``ok`` | ``failed``.
        failure: the scenario when failed, else None.
        decode_tok_s: per-request decode rate (tok/s), 0 when failed.
        itl_ms: mean inter-token latency = 1000 / decode_tok_s.
        ttft_ms: prefill + HTTP overhead for ``input_len`` tokens.
        accept_length: τ (1.0 without speculation).
        t_step_ms: one target forward at the decode batch (verify forward with EAGLE).
        t_cycle_ms, t_verify_ms, t_draft_total_ms, verify_share: EAGLE cycle (verify_share
            = t_verify / t_cycle; 1.0 without speculation).
        breakdown_ms: t_mem, t_comm, t_ovh, delta_cg, eager of the decode/verify step.
        startup_s: phase -> seconds (time_scale 1), ``total`` included.
        memory_gib: weights, pool, kv, graph, avail_for_graph, kv_tokens (count).
        allreduce_path: e.g. ``nccl:Ring/LL``, ``custom:pcie``.
        perf_tags: e.g. ``allreduce_path_degraded``.
        events: startup log events up to ready/failure.
        warnings: free-form notes (e.g. forced LL128).
    """

    outcome: str
    failure: FailureScenario | None = None
    decode_tok_s: float = 0.0
    itl_ms: float = 0.0
    ttft_ms: float = 0.0
    accept_length: float = 1.0
    t_step_ms: float = 0.0
    t_cycle_ms: float = 0.0
    t_verify_ms: float = 0.0
    t_draft_total_ms: float = 0.0
    verify_share: float = 1.0
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    startup_s: dict[str, float] = field(default_factory=dict)
    memory_gib: dict[str, float] = field(default_factory=dict)
    allreduce_path: str = ""
    perf_tags: list[str] = field(default_factory=list)
    events: list[LogEvent] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def log_lines(self) -> list[str]:
        """Events rendered with a synthetic clock starting at 15:00:00 (stable for tests)."""
        return [format_event(e, 54000.0 + e.t_s) for e in self.events if e.kind == "log"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["log_lines"] = self.log_lines
        return d


def format_event(e: LogEvent, epoch_like_s: float, date: str = LOG_DATE) -> str:
    """``[2026-11-29 15:00:01 TP0] text`` (or raw text for traceback lines)."""
    if e.raw:
        return e.text
    s = int(epoch_like_s) % 86400
    stamp = f"{date} {s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"[{stamp}{' ' + e.tag if e.tag else ''}] {e.text}"


# ----------------------------------------------------------------------------------------
# Physics
# ----------------------------------------------------------------------------------------
def _ne(p: dict) -> dict:
    return p["node"]["emulator"]


def _me(p: dict) -> dict:
    return p["model"]["emulator"]


def _caps(p: dict) -> dict:
    return p["emulator"]["capabilities"]


def _parse_nccl_list(value: str | None, universe: tuple[str, ...]) -> tuple[set[str], dict[str, set[str]]]:
    """NCCL_ALGO / NCCL_PROTO syntax -> (global allowed set, per-collective overrides).

    Accepts ``Ring``, ``ring,tree``, ``^LL128`` (exclusion) and ``allreduce:tree;allgather:ring``.
    Unknown names are ignored for the intra-node PCIe case (e.g. NVLS is unavailable anyway).
    """
    canon = {u.lower(): u for u in universe}
    if not value:
        return set(universe), {}

    def one(spec: str) -> set[str]:
        spec = spec.strip()
        excl = spec.startswith("^")
        names = {canon[n.strip().lower()] for n in spec.lstrip("^").split(",") if n.strip().lower() in canon}
        return set(universe) - names if excl else names

    per: dict[str, set[str]] = {}
    glob = set(universe)
    for part in value.split(";"):
        if ":" in part:
            coll, spec = part.split(":", 1)
            per[coll.strip().lower()] = one(spec)
        elif part.strip():
            glob = one(part)
    return glob, per


@dataclass
class CollectiveModel:
    """NCCL/custom collective costs for one launch (µs, bytes)."""

    backend: str                 # "nccl" | "custom"
    algos_allreduce: set[str]
    algos_allgather: set[str]
    protos: set[str]
    proto_forced: bool
    scale: float                 # α_NCCL / tuning-model(Ring, LL)
    alpha_custom_us: float
    ne: dict
    n: int

    def alpha_us(self, algo: str, proto: str) -> float:
        nc = self.ne["nccl"]
        hops = 2 * (self.n - 1)
        return self.scale * (nc["base_lat_us"][algo][proto] + hops * nc["hw_lat_pci_us"][algo][proto])

    def bw_bytes_per_us(self, proto: str) -> float:
        nc = self.ne["nccl"]
        beta = nc["beta_gbs"] * 1e3  # bytes/µs
        if proto == "LL":
            return beta
        if proto == "LL128":
            return beta * 0.9375 / 0.5  # [D] 128 B lines carry 120 B data vs LL's 8 of 16 (device.h)
        return nc["bus_bw_gbs"] * 1e3 * self.n / (2 * (self.n - 1))  # [S] busbw = algbw·2(n-1)/n

    def choice(self, m_bytes: float) -> tuple[float, str]:
        """(time µs, "Algo/Proto") of one all-reduce of ``m_bytes``, NCCL picking the fastest."""
        if self.backend == "custom":
            return self.alpha_custom_us + m_bytes / self.bw_bytes_per_us("LL"), "custom"
        best: tuple[float, str] | None = None
        ll_max = self.ne["nccl"]["ll_max_bytes"]
        for a in sorted(self.algos_allreduce):
            for pr in sorted(self.protos):
                if pr == "LL" and m_bytes > ll_max and not self.proto_forced:
                    continue
                t = self.alpha_us(a, pr) + m_bytes / self.bw_bytes_per_us(pr)
                if best is None or t < best[0] - 1e-9:
                    best = (t, f"{a}/{pr}")
        assert best is not None
        return best

    def t_ar_us(self, m_bytes: float) -> float:
        return self.choice(m_bytes)[0]


def collectives(profile: dict, launch: LaunchConfig) -> tuple[CollectiveModel, dict[str, Any]]:
    """Build the collective model and describe the path actually taken.

    Returns:
        (model, info) with info keys ``path`` (e.g. ``nccl:Ring/LL``), ``degraded`` (bool),
        ``custom_ar_disabled_msg`` (bool), ``allgather_ok`` (bool), ``warnings`` (list).
    """
    ne, caps = _ne(profile), _caps(profile)
    n = max(1, launch.tp)
    algo_glob, algo_per = _parse_nccl_list(launch.nccl_algo, ALGOS)
    proto_glob, _ = _parse_nccl_list(launch.nccl_proto, PROTOS)
    warnings: list[str] = []
    ll128_default = bool(caps.get("nccl_ll128_on_pcie_default", False)) or bool(caps.get("nvlink"))
    proto_forced = bool(launch.nccl_proto)
    if not launch.nccl_proto and not ll128_default:
        proto_glob.discard("LL128")  # [S] LL128 on by default only with NVLink
    if launch.nccl_proto and "LL128" in proto_glob and not ll128_default:
        warnings.append("NCCL_PROTO forces LL128 on a PCIe-only node: NCCL allows it when set explicitly; "
                        "its docs warn of possible data corruption. Modelled at LL128 latency.")
    ar_algos = algo_per.get("allreduce", algo_glob)
    ag_algos = algo_per.get("allgather", algo_glob)
    if not caps.get("nccl_tree_supports_allgather", False):
        ag_algos = ag_algos - {"Tree"}
    nc = ne["nccl"]
    scale = nc["alpha_us"] / (nc["base_lat_us"]["Ring"]["LL"] + 2 * (n - 1) * nc["hw_lat_pci_us"]["Ring"]["LL"]) \
        if n > 1 else 0.0
    backend = "nccl"
    custom_msg = False
    degraded = False
    alpha_custom = ne["alpha_custom_ar_us"]
    if not launch.disable_custom_all_reduce and n > 1:
        if caps.get("nvlink") or n <= int(caps.get("custom_ar_max_pcie_world_size", 2)):
            backend = "custom"
            alpha_custom = ne.get("alpha_custom_ar_small_us", 9.2)  # [S] §2.3 one-shot 8 KB on PCIe switches
        elif caps.get("force_custom_allreduce_pcie"):
            backend = "custom"
        else:
            custom_msg = True
            degraded = True
    cm = CollectiveModel(backend=backend, algos_allreduce=ar_algos or set(), algos_allgather=ag_algos,
                         protos=proto_glob, proto_forced=proto_forced, scale=scale,
                         alpha_custom_us=alpha_custom, ne=ne, n=n)
    info: dict[str, Any] = {"custom_ar_disabled_msg": custom_msg, "degraded": degraded,
                            "allgather_ok": bool(ag_algos) and bool(proto_glob),
                            "allreduce_ok": bool(ar_algos) and bool(proto_glob), "warnings": warnings}
    if n == 1:
        info["path"] = "none"
    elif backend == "custom":
        info["path"] = "custom:nvlink" if caps.get("nvlink") else "custom:pcie"
    elif info["allreduce_ok"]:
        m = 2 * _me(profile)["hidden_size"]
        info["path"] = "nccl:" + cm.choice(m)[1]
    else:
        info["path"] = "nccl:invalid"
    return cm, info


def weights_bytes(profile: dict, tp: int, tokens: int) -> float:
    """Bytes each GPU streams for one forward of ``tokens`` tokens (uniform routing, [A])."""
    me = _me(profile)
    e, k = me["num_experts"], me["top_k"]
    touched = e * (1.0 - (1.0 - k / e) ** max(tokens, 1))
    return (me["replicated_gb"] * GB + me["sharded_gb"] * GB / tp
            + me["num_moe_layers"] * touched * me["expert_mb"] * 1e6 / tp)


def resident_weights_gib(profile: dict, tp: int, spec: bool) -> float:
    """Weights resident per GPU (GiB): all experts, sharded / tp, plus the draft with EAGLE."""
    me = _me(profile)
    b = (me["replicated_gb"] * GB + me["sharded_gb"] * GB / tp
         + me["num_moe_layers"] * me["num_experts"] * me["expert_mb"] * 1e6 / tp)
    if spec:
        b += me["draft_gb"] * GB / tp
    return b / GIB


def delta_cg_ms(profile: dict, max_bs: int) -> float:
    """CUDA-graph size effect Δ_cg (ms): δ·log2(max_bs/128) above 128, 0 at or below [F]."""
    if max_bs <= 128:
        return 0.0
    return _ne(profile)["delta_cg_ms_per_doubling"] * math.log2(max_bs / 128.0)


def step_ms(profile: dict, launch: LaunchConfig, cm: CollectiveModel, *, tokens: int, batch: int,
            ctx: int, graphs: bool, max_bs: int, alpha_extra_us: float = 0.0, prefill: bool = False) -> dict:
    """One target forward of ``tokens`` tokens (``batch`` sequences of context ``ctx``).

    Returns:
        dict of ms: t_mem, t_flops, t_comm, t_ovh, delta_cg, eager, total.
    """
    ne, me = _ne(profile), _me(profile)
    tp = max(1, launch.tp)
    bw = ne["eta"] * ne["mem_bw_gbs"] * GB  # bytes/s
    t_mem = (weights_bytes(profile, tp, tokens) + batch * ctx * me["kv_bytes_per_token"]) / bw * 1e3
    t_flops = 2.0 * tokens * me["active_params_b"] * 1e9 / tp / (ne["mfu"] * ne["tensor_tflops"] * 1e12) * 1e3
    n_coll = 2 * me["num_layers"] + me["n_coll_extra"]
    m = 2.0 * tokens * me["hidden_size"]
    t_comm = n_coll * (cm.t_ar_us(m) + alpha_extra_us) / 1e3 if tp > 1 else 0.0
    t_ovh = me["t_ovh_ms"]
    base = max(t_mem, t_flops) + t_comm + t_ovh
    dcg = delta_cg_ms(profile, max_bs) if graphs and not prefill else 0.0
    eager = 0.0 if (graphs or prefill) else ne["eager_penalty"] * base
    return {"t_mem": t_mem, "t_flops": t_flops, "t_comm": t_comm, "t_ovh": t_ovh,
            "delta_cg": dcg, "eager": eager, "total": base + dcg + eager}


def acceptance_rates(profile: dict, steps: int) -> list[float]:
    """Per-position top-1 acceptance a_1..a_steps (scalar repeated, list extended with its last)."""
    a = _me(profile)["accept_rate"]
    rates = list(a) if isinstance(a, list) else [float(a)]
    while len(rates) < steps:
        rates.append(rates[-1])
    return [float(r) for r in rates[:steps]]


# Rank-mass shape of the draft's candidates (see ``rank_probs``). [A] c = 0.6, r = 0.5:
# chosen within the region that reproduces SGLang's EAGLE-3 tree acceptance on Llama-3.1-8B
# (4.68 at num_steps 5, 5.39 at num_steps 8, topk 8 / 64 draft tokens; sgl-project/sglang
# PR #4247, config as in PR #4716) from a chain top-1 rate a ~= 0.8 (derived from the chain-of-3
# 2.36x in SGLang's speculative_decoding docs): this (c, r) gives 4.61 / 5.48 (-1.5 % / +1.7 %).
# See docs/emulator.md "Tree acceptance" for the fit and its sensitivity.
DEFAULT_TOPK_RECOVERY = 0.6
DEFAULT_TOPK_DECAY = 0.5


def rank_probs(a: float, topk: int, c: float = DEFAULT_TOPK_RECOVERY, r: float = DEFAULT_TOPK_DECAY) -> list[float]:
    """Probability that the target's token is the draft's rank-i candidate, i = 1..topk.

    q_1 = a (the top-1 acceptance rate); q_i = (1 - a)·c·(1 - r)·r^(i-2) for i >= 2, so the
    top-k coverage is p_k = Σ q_i = a + (1 - a)·c·(1 - r^(k-1)) <= a + (1 - a)·c <= 1:
    the lower-ranked candidates share the fraction c of the top-1 misses, geometrically
    decaying by r per rank (the probability mass of a draft is concentrated on its top-1).

    Args:
        a: top-1 acceptance in [0, 1).
        topk: candidates per node (>= 1).
        c: share of the top-1 misses recoverable by lower ranks, in [0, 1] [A].
        r: rank-to-rank decay, in [0, 1) [A].
    A draft ranks its candidates by its own probability and is taken as calibrated, so a
    rank-2 token is never likelier than the top-1: c is capped at a / ((1 - a)(1 - r)) (binds
    only for a < c(1 - r) / (1 + c(1 - r)), 0.23 at the shipped c, r).

    Returns:
        list of ``topk`` probabilities, non-increasing in rank, summing to <= 1.
    """
    if r >= 1.0:
        raise ValueError(f"rank decay r must be < 1 (got {r})")
    c_eff = min(c, a / ((1.0 - a) * (1.0 - r))) if a < 1.0 else 0.0
    return [a] + [(1.0 - a) * c_eff * (1.0 - r) * r ** (i - 2) for i in range(2, topk + 1)]


def _rank_shape(profile: dict) -> tuple[float, float]:
    me = _me(profile)
    return (float(me.get("accept_topk_recovery", DEFAULT_TOPK_RECOVERY)),
            float(me.get("accept_topk_decay", DEFAULT_TOPK_DECAY)))


def draft_tree(profile: dict, steps: int, topk: int, draft_tokens: int) -> list[tuple[int, float]]:
    """The draft tree SGLang's EAGLE worker verifies, as (depth, reach probability) per node.

    SGLang (eagle_utils / ``organize_draft_results``): step 1 proposes the draft's top-k
    tokens; every later step expands each of the ``topk`` best nodes of the previous depth
    (the beam) by its top-k children (topk² candidates per depth); at the end the
    ``draft_tokens - 1`` candidates with the highest path scores are kept (plus the root).
    The draft's scores are taken as calibrated: a node's score is the probability that the
    target's greedy path passes through it, Π_j q_{rank_j}(a_j) (``rank_probs``, positions
    independent) [A]. Kept sets are prefix-closed (a child scores below its parent).

    Returns:
        list of (depth 1..steps, probability) for the kept nodes, best first; at most
        ``draft_tokens - 1`` entries.
    """
    c, r = _rank_shape(profile)
    rates = acceptance_rates(profile, steps)
    cands: list[tuple[float, int]] = []
    beam = [1.0]
    for d in range(1, steps + 1):
        q = rank_probs(rates[d - 1], max(1, topk), c, r)
        level = sorted((p * qi for p in beam for qi in q), reverse=True)
        cands += [(p, d) for p in level]
        beam = level[:max(1, topk)]
    cands.sort(key=lambda x: (-x[0], x[1]))
    return [(d, p) for p, d in cands[:max(0, draft_tokens - 1)]]


def position_probs(profile: dict, steps: int, topk: int, draft_tokens: int) -> list[float]:
    """Conditional acceptance per depth: P(L >= d+1 | L >= d) over the kept draft tree.

    reach(d) = Σ of the reach probabilities of the kept nodes at depth d (the target's path
    meets at most one node per depth, so these are disjoint events); the entries are
    reach(d) / reach(d - 1), d = 1..deepest kept depth. A chain (topk = 1) gives a_d.
    """
    reach = [1.0] + [0.0] * steps
    for d, p in draft_tree(profile, steps, topk, draft_tokens):
        reach[d] += p
    out = []
    for d in range(1, steps + 1):
        if reach[d] <= 0.0:
            break
        out.append(min(1.0, reach[d] / reach[d - 1]))
    return out


def tau(profile: dict, steps: int, topk: int, draft_tokens: int) -> float:
    """Mean accepted tokens per verify (incl. the bonus token): 1 + Σ over kept nodes of
    their reach probability (= 1 + Σ_d reach(d)); <= min(draft_tokens, steps + 1)."""
    return 1.0 + sum(p for _, p in draft_tree(profile, steps, topk, draft_tokens))


def tau_independent(profile: dict, steps: int, topk: int, draft_tokens: int) -> float:
    """The previous heuristic, kept for comparison only: every depth up to min(S, D-1)
    accepted with 1 - (1 - a)^topk (topk independent draws at the top-1 rate, no node budget)."""
    total, prod = 1.0, 1.0
    for a in acceptance_rates(profile, steps)[:max(0, min(steps, draft_tokens - 1))]:
        prod *= 1.0 - (1.0 - a) ** max(1, topk)
        total += prod
    return total


def accepted_from_uniform(probs: list[float], u: float) -> int:
    """Inverse-CDF draw of the accepted length (1..len(probs)+1) from one uniform ``u``."""
    surv = 1.0
    for i, p in enumerate(probs):
        nxt = surv * p  # P(L >= i + 2)
        if u >= nxt:
            return i + 1
        surv = nxt
    return len(probs) + 1


def run_factor(profile: dict, launch: LaunchConfig | None = None) -> float:
    """Seeded run-to-run rate multiplier exp(noise·z), z ~ N(0,1) from (seed, launch argv)."""
    emu = profile["emulator"]
    noise = float(emu.get("noise") or 0.0)
    if noise <= 0:
        return 1.0
    key = f"{emu.get('seed', 0)}|"
    if launch is not None:
        flags = sorted((k, str(v)) for k, v in launch.args.items() if k not in ("port", "nccl_port", "host"))
        key += repr(flags) + f"|{launch.nccl_algo}|{launch.nccl_proto}"
    rng = random.Random(zlib.crc32(key.encode()))
    return math.exp(noise * rng.gauss(0.0, 1.0))


# ----------------------------------------------------------------------------------------
# Startup / failure timeline
# ----------------------------------------------------------------------------------------
def _server_args_line(launch: LaunchConfig, max_bs: int, mem_frac: float) -> str:
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


class _Timeline:
    def __init__(self):
        self.t = 0.0
        self.events: list[LogEvent] = []
        self.phases: dict[str, float] = {}

    def log(self, text: str, tag: str | None = "TP0", raw: bool = False, kind: str = "log"):
        self.events.append(LogEvent(self.t, text, kind, tag, raw))

    def advance(self, phase: str, dt: float):
        self.t += dt
        self.phases[phase] = self.phases.get(phase, 0.0) + dt


def _scheduler_exception(tl: _Timeline, rank: int, frames: list[str], final: list[str]):
    tl.log("Scheduler hit an exception: Traceback (most recent call last):", tag=f"TP{rank}")
    for f in frames:
        tl.log(f, raw=True)
    for f in final:
        tl.log(f, raw=True)


def _sigquit(tl: _Timeline):
    tl.log("Received sigquit from a child process. It usually means the child failed.", tag=None)


def _fail(pred: Prediction, tl: _Timeline, cls: str, phase: str, exit_code: int, signature: str) -> Prediction:
    pred.outcome = "failed"
    pred.failure = FailureScenario(cls, phase, exit_code, round(tl.t, 3), signature)
    pred.events = tl.events
    pred.startup_s = {**{k: round(v, 3) for k, v in tl.phases.items()}, "total": round(tl.t, 3)}
    pred.decode_tok_s = 0.0
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
    ne, me, caps = _ne(profile), _me(profile), _caps(profile)
    st, mem = ne["startup"], ne["memory"]
    tp = max(1, launch.tp)
    pred = Prediction(outcome="ok")
    tl = _Timeline()
    gpu_gib = float(profile["node"]["memory_gib"])
    mem_frac = launch.mem_fraction_static or mem["default_mem_fraction_static"]
    max_bs = launch.cuda_graph_max_bs or DEFAULT_MAX_BS_LARGE_GPU
    graphs = not launch.disable_cuda_graph
    cm, cinfo = collectives(profile, launch)
    pred.allreduce_path = cinfo["path"]
    pred.warnings += cinfo["warnings"]
    rank_fail = 3 % tp  # the rank whose traceback is printed first (as in B01/B25)

    # -- launcher: server args and main-process validation (exit 1) --
    tl.log(_server_args_line(launch, max_bs, mem_frac), tag=None)
    if launch.nccl_algo:
        tl.log(f"env: NCCL_ALGO={launch.nccl_algo}", tag=None)
    if launch.nccl_proto:
        tl.log(f"env: NCCL_PROTO={launch.nccl_proto}", tag=None)
    tl.advance("process", st["process_s"])

    def main_exc(exc_line: str, where: str, cls: str, src: str | None = None):
        tl.log("Traceback (most recent call last):", raw=True)
        tl.log('  File "<VENV>/sglang/launch_server.py", line 24, in <module>', raw=True)
        tl.log("    server_args = prepare_server_args(sys.argv[1:])", raw=True)
        tl.log('  File "<VENV>/sglang/srt/server_args.py", line 612, in __post_init__', raw=True)
        tl.log(f"    self.{where}()", raw=True)
        tl.log('  File "<VENV>/sglang/srt/server_args.py", line 2400, in ' + where, raw=True)
        if src:
            tl.log("    " + src, raw=True)
        tl.log(exc_line, raw=True)
        return _fail(pred, tl, cls, "startup", 1, exc_line)

    steps = topk = dtok = None
    if launch.speculative:
        given = [launch.speculative_num_steps, launch.speculative_eagle_topk, launch.speculative_num_draft_tokens]
        if any(g is None for g in given) and any(g is not None for g in given):
            return main_exc("AssertionError", "_handle_speculative_decoding", "spec_decode_config_error",
                            src="assert self.speculative_num_steps is not None")
        sd = me.get("spec_defaults", {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4})
        steps = launch.speculative_num_steps or sd["num_steps"]
        topk = launch.speculative_eagle_topk or sd["eagle_topk"]
        dtok = launch.speculative_num_draft_tokens or sd["num_draft_tokens"]
        if topk == 1:
            dtok = steps + 1  # [S] SGLang: "if topk=1 it is adjusted to num_steps+1"
        if dtok > topk * steps + 1 or steps < 1 or topk < 1:
            return main_exc(f"ValueError: speculative_num_draft_tokens ({dtok}) must be <= "
                            f"speculative_eagle_topk * speculative_num_steps + 1", "_handle_speculative_decoding",
                            "spec_decode_config_error")
        if not launch.speculative_draft_model_path:
            return main_exc("ValueError: speculative_draft_model_path is required for EAGLE3",
                            "_handle_speculative_decoding", "spec_decode_config_error")
        pred.spec = {"num_steps": steps, "eagle_topk": topk, "num_draft_tokens": dtok}
    if launch.moe_a2a_backend == "flashinfer":
        tl.log(f"Flashinfer MoE A2A is enabled. The expert parallel size is adjusted to be the same as "
               f"the tensor parallel size[{tp}].", tag=None)
        if launch.moe_runner_backend not in ("auto", "flashinfer_cutlass"):
            return main_exc("AssertionError: Flashinfer MoE A2A is only supported with flashinfer_cutlass "
                            "moe runner backend", "_handle_a2a_moe", "moe_ep_a2a_config_error")
    elif launch.ep not in (1, tp):
        return main_exc("AssertionError: The expert parallel size must be 1 or the same as the tensor "
                        "parallel size", "_handle_moe_kernel_config", "moe_ep_a2a_config_error")

    # -- TP ranks: distributed init --
    tl.log("Init torch distributed begin.")
    if launch.enable_torch_symm_mem and tp > 1 and caps["arch_major"] not in caps.get("torch_symm_mem_majors", []):
        tl.advance("dist_init", 3.0)
        _scheduler_exception(tl, 0, [
            '  File "<VENV>/sglang/srt/distributed/device_communicators/symm_mem.py", line 70, in __init__',
            "    if self.world_size not in SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]:"],
            [f"KeyError: {caps['arch_major']}"])
        _sigquit(tl)
        return _fail(pred, tl, "torch_symm_mem_unsupported", "startup", -9, f"KeyError: {caps['arch_major']}")
    tl.advance("dist_init", st["dist_init_s"])
    tl.log(f"Init torch distributed ends. mem usage={mem['torch_context_gib'] * 0.41:.2f} GB")
    if cinfo["custom_ar_disabled_msg"]:
        tl.log("Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs.")
        pred.perf_tags.append("allreduce_path_degraded")
    elif cinfo["path"] == "custom:pcie":
        tl.log(f"Custom allreduce is enabled on {tp} PCIe-only GPUs (forced: "
               f"emulator capability force_custom_allreduce_pcie).")
    for w in cinfo["warnings"]:
        tl.log(f"NCCL WARN {w}")

    # -- weights --
    spec = launch.speculative
    w_gib = resident_weights_gib(profile, tp, spec)
    avail0 = gpu_gib - mem["torch_context_gib"]
    tl.log(f"Load weight begin. avail mem={avail0:.2f} GB")
    me_total_gb = w_gib * GIB / GB * tp
    tl.advance("load_weights", me_total_gb / st["load_gbs"])
    tl.log(f"Load weight end. type={me.get('architecture', 'Model')}, dtype=torch.bfloat16, "
           f"avail mem={avail0 - w_gib:.2f} GB, mem usage={w_gib:.2f} GB.")
    tl.log("", kind="bind", tag=None)

    pool = mem_frac * gpu_gib
    kv_gib = pool - w_gib
    kv_tokens = int(max(0.0, kv_gib) * GIB / me["kv_bytes_per_token"])
    avail_graph = gpu_gib - pool - mem["torch_context_gib"] - mem["nccl_buffers_gib"] - mem["activations_gib"]
    gm = ne["graph_memory"]
    g_target = (gm["base_gib"] + gm["per_bs_mib"] * max_bs / 1024.0) if graphs else 0.0
    g_draft = g_target * (gm["spec_factor"] - 1.0) if (graphs and spec) else 0.0
    pred.memory_gib = {"gpu": gpu_gib, "weights": round(w_gib, 3), "pool": round(pool, 3),
                       "kv": round(kv_gib, 3), "kv_tokens": kv_tokens, "graph_target": round(g_target, 3),
                       "graph_draft": round(g_draft, 3), "avail_for_graph": round(avail_graph, 3)}
    if kv_tokens < mem["min_kv_tokens"]:
        tl.advance("kv_alloc", 1.0)
        _scheduler_exception(tl, 0, [
            '  File "<VENV>/sglang/srt/model_executor/model_runner.py", line 1702, in init_memory_pool'],
            ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."])
        _sigquit(tl)
        return _fail(pred, tl, "kv_cache_pool_too_small", "startup", -9,
                     "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
    tl.advance("kv_alloc", st["kv_alloc_s"])
    tl.log(f"KV Cache is allocated. #tokens: {kv_tokens}, KV size: {kv_gib:.2f} GB")
    tl.log(f"Memory pool end. avail mem={avail_graph + mem['activations_gib']:.2f} GB")

    # -- CUDA graph capture (the first forwards: fusion JIT, A2A, first AllGather) --
    sizes = [b for b in DEFAULT_CAPTURE_BS if b <= max_bs] or [max_bs]
    capture_banner = "Capture cuda graph begin. This can take up to several minutes. avail mem="
    hint = ["Possible solutions:",
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
            "3. disable torch compile by not using --enable-torch-compile",
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)",
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose "]
    first_fwd_phase = "graph_capture" if graphs else "warmup"
    if graphs:
        tl.log(f"{capture_banner}{avail_graph + mem['activations_gib']:.2f} GB")

    def capture_fail(frames: list[str], msg: str, cls: str, sig: str, pre: list[str] | None = None):
        tl.advance(first_fwd_phase, 3.0)
        for line in pre or []:
            tl.log(line, raw=True)
        if graphs:
            _scheduler_exception(tl, rank_fail, frames, [f"Exception: Capture cuda graph failed: {msg}", *hint])
        else:
            tl.log(f"Initialization failed. warmup error: {msg}", tag=None)
            _scheduler_exception(tl, rank_fail, frames, [msg])
        _sigquit(tl)
        return _fail(pred, tl, cls, "startup", -9, sig)

    if launch.fusion_requested and tp > 1 and caps["arch_major"] not in caps.get("flashinfer_fusion_supported_majors", []):
        majors = list(caps.get("flashinfer_fusion_supported_majors", []))
        msg = f"No supported CUDA architectures found for major versions {majors}."
        return capture_fail(['  File "<VENV>/sglang/srt/model_executor/cuda_graph_runner.py", line 400, in __init__',
                             '  File "<VENV>/flashinfer/jit/core.py", line 112, in check_cuda_arch',
                             f"RuntimeError: {msg}"], msg, "flashinfer_allreduce_fusion_unsupported_arch",
                            f"Capture cuda graph failed: {msg}")
    if launch.moe_a2a_backend == "flashinfer" and caps.get("flashinfer_a2a_requires_nvlink", True) \
            and not (caps.get("nvlink") or caps.get("mnnvl")):
        tl.advance(first_fwd_phase, 2.0)
        _scheduler_exception(tl, rank_fail, [
            '  File "<VENV>/sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py", line 686, in '
            'fused_experts_none_to_flashinfer_trtllm_fp8',
            "    assert TopKOutputChecker.format_is_bypassed(topk_output)"], ["AssertionError"])
        oom_rank = (rank_fail + 1) % tp
        _scheduler_exception(tl, oom_rank, [
            '  File "<VENV>/flashinfer/comm/trtllm_moe_alltoall.py", line 211, in __init__'],
            [f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.50 GiB. GPU {oom_rank} has a "
             f"total capacity of {gpu_gib:.2f} GiB of which {max(avail_graph, 0.1):.2f} GiB is free."])
        _sigquit(tl)
        return _fail(pred, tl, "moe_ep_a2a_config_error", "startup", -9,
                     "assert TopKOutputChecker.format_is_bypassed(topk_output)")
    if tp > 1 and not (cinfo["allgather_ok"] and cinfo["allreduce_ok"]):
        what = "AllGather" if cinfo["allreduce_ok"] else "AllReduce"
        set_by = f"NCCL_ALGO was set to {launch.nccl_algo}." if launch.nccl_algo else \
            f"NCCL_PROTO was set to {launch.nccl_proto}."
        warn = (f"<HOST>:4411:4411 [{rank_fail}] enqueue.cc:1390 NCCL WARN Error : no algorithm/protocol available "
                f"for function {what} with datatype ncclBfloat16. {set_by}")
        err = "NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"
        return capture_fail(['  File "<VENV>/sglang/srt/distributed/device_communicators/pynccl.py", line 182, in all_gather',
                             f"RuntimeError: {err}"], err, "nccl_env_algo_proto_invalid",
                            f"no algorithm/protocol available for function {what}", pre=[warn])
    if graphs and avail_graph < g_target:
        need = g_target - max(avail_graph, 0.0)
        msg = (f"CUDA out of memory. Tried to allocate {need * 1024:.2f} MiB. GPU {rank_fail} has a total capacity "
               f"of {gpu_gib:.2f} GiB")
        return capture_fail(['  File "<VENV>/sglang/srt/model_executor/cuda_graph_runner.py", line 269, in __init__'],
                            msg, "cuda_oom_graph_capture", "Capture cuda graph failed: CUDA out of memory")
    cap_s = st["capture_s_per_size"] * len(sizes) if graphs else 0.0
    tl.advance("graph_capture", cap_s + st["jit_s"])
    if graphs:
        tl.log(f"Capture cuda graph end. Time elapsed: {cap_s + st['jit_s']:.2f} s. mem usage={g_target:.2f} GB. "
               f"avail mem={avail_graph - g_target + mem['activations_gib']:.2f} GB.")
    if graphs and spec:
        tl.log(f"Capture draft cuda graph begin. This can take up to several minutes. "
               f"avail mem={avail_graph - g_target + mem['activations_gib']:.2f} GB")
        if avail_graph < g_target + g_draft:
            tl.advance("graph_capture", 5.0)
            _scheduler_exception(tl, 0, [
                '  File "<VENV>/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", line 95, in __init__'],
                [f"Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
                 f"{(g_target + g_draft - max(avail_graph, 0)):.2f} GiB. GPU 0 has a total capacity of {gpu_gib:.2f} GiB",
                 *hint])
            _sigquit(tl)
            return _fail(pred, tl, "cuda_oom_graph_capture", "startup", -9,
                         "Capture cuda graph failed: CUDA out of memory")
        dcap = cap_s * st["draft_capture_factor"]
        tl.advance("graph_capture", dcap)
        tl.log(f"Capture draft cuda graph end. Time elapsed: {dcap:.2f} s. mem usage={g_draft:.2f} GB. "
               f"avail mem={avail_graph - g_target - g_draft + mem['activations_gib']:.2f} GB.")
    tl.log(f"max_total_num_tokens={kv_tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
           f"max_running_requests={launch.args.get('max_running_requests') or 2048}, context_len=262144, "
           f"available_gpu_mem={max(avail_graph - g_target - g_draft + mem['activations_gib'], 0):.2f} GB")
    tl.log(f"INFO:     Uvicorn running on http://{launch.host}:{launch.port} (Press CTRL+C to quit)", tag=None)
    tl.advance("warmup", st["warmup_s"])
    tl.log("Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, "
           "#queue-req: 0", tag="TP0")
    tl.log("The server is fired up and ready to roll!", tag=None)
    tl.log("", kind="ready", tag=None)
    pred.events = tl.events
    pred.startup_s = {**{k: round(v, 3) for k, v in tl.phases.items()}, "total": round(tl.t, 3)}

    # -- performance --
    ctx = input_len + output_len // 2
    use_graphs = graphs and batch <= max_bs
    if spec:
        t_ver = step_ms(profile, launch, cm, tokens=batch * dtok, batch=batch, ctx=ctx, graphs=use_graphs,
                        max_bs=max_bs, alpha_extra_us=ne["alpha_verify_us"] - ne["nccl"]["alpha_us"])
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
        t = step_ms(profile, launch, cm, tokens=batch, batch=batch, ctx=ctx, graphs=use_graphs, max_bs=max_bs)
        pred.t_step_ms = pred.t_cycle_ms = pred.t_verify_ms = t["total"]
        pred.breakdown_ms = t
        pred.decode_tok_s = 1000.0 / t["total"]
    pred.itl_ms = 1000.0 / pred.decode_tok_s
    pf = step_ms(profile, launch, cm, tokens=input_len, batch=1, ctx=input_len, graphs=False,
                 max_bs=max_bs, prefill=True)
    pred.ttft_ms = pf["total"] + st["http_overhead_ms"] + (me["t_draft_ms"] if spec else 0.0)
    return pred


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
