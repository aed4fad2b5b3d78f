"""The emulated node's physics: collectives, step time, CUDA-graph effects, memory (pure).

Equations (constants from the profile; their provenance is in docs/emulator.md and the
``emulator:`` blocks of conf/node and conf/model):

    W_gpu(T)  = replicated + sharded/tp + n_moe · E·(1-(1-k/E)^T) · B_expert / tp       [bytes]
    t_mem(T)  = (W_gpu(T) + batch·ctx·kv_bytes) / (η·BW)
    t_ar(m)   = min over allowed (algo, proto) of α(algo,proto) + m / bw(proto)
                α(a,p) = α_NCCL · (base[a][p] + 2(N-1)·hw[a][p]) / (base[Ring][LL] + 2(N-1)·hw[Ring][LL])
                (NCCL tuning.cc latency model scaled to the measured 24 µs; LL only up to ll_max_bytes)
    t_step(T) = max(t_mem, t_flops) + N_coll·t_ar(2·T·H) + t_ovh + Δ_cg(max_bs) [+ eager penalty]
    Δ_cg      = δ · log2(max_bs/128) above 128, else 0

The EAGLE draft tree and its acceptance are in ``tasks.emulator.eagle``.

Units: ms for times unless the name says ``_s``/``_us``; GB = 1e9 bytes; GiB = 2^30 bytes.
Source tags on constants: [S] sourced, [D] derived, [A] assumed, [F] fitted.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field

from tasks.emulator.launch import LaunchConfig

GIB = float(2**30)
GB = 1e9
ALGOS = ("Ring", "Tree")
PROTOS = ("LL", "LL128", "Simple")


def node_params(p: dict) -> dict:
    """The node's ``emulator`` block of a profile (``tasks.emulator.profile.build_profile``)."""
    return p["node"]["emulator"]


def model_params(p: dict) -> dict:
    """The model's ``emulator`` block of a profile."""
    return p["model"]["emulator"]


def capabilities(p: dict) -> dict:
    """The node capabilities (``emulator.capabilities``) of a profile."""
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
    """NCCL/custom all-reduce costs for one launch (µs, bytes).

    Attributes:
        backend: ``nccl`` | ``custom``.
        algos_allreduce: NCCL algorithms allowed for AllReduce.
        protos: NCCL protocols allowed.
        proto_forced: NCCL_PROTO was set (LL is then used above ``ll_max_bytes`` too).
        scale: α_NCCL / tuning-model(Ring, LL), 0 at one GPU.
        alpha_custom_us: latency of the custom all-reduce kernel.
        ne: the node's emulator block; n: GPUs in the group.
    """

    backend: str
    algos_allreduce: set[str]
    protos: set[str]
    proto_forced: bool
    scale: float
    alpha_custom_us: float
    ne: dict
    n: int

    def alpha_us(self, algo: str, proto: str) -> float:
        """Latency (µs) of one (algo, proto) all-reduce, NCCL's tuning model scaled."""
        nc = self.ne["nccl"]
        hops = 2 * (self.n - 1)
        return self.scale * (nc["base_lat_us"][algo][proto] + hops * nc["hw_lat_pci_us"][algo][proto])

    def bw_bytes_per_us(self, proto: str) -> float:
        """Bandwidth (bytes/µs) of a protocol."""
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
        """Time (µs) of one all-reduce of ``m_bytes``."""
        return self.choice(m_bytes)[0]


@dataclass
class CollectivePath:
    """The all-reduce path a launch actually takes.

    Attributes:
        path: ``none`` (one GPU), ``custom:nvlink``, ``custom:pcie``, ``nccl:<Algo>/<Proto>``
            or ``nccl:invalid`` (no allowed algorithm/protocol for AllReduce).
        custom_ar_disabled: SGLang turned its custom all-reduce off (> 2 PCIe-only GPUs).
        allgather_ok, allreduce_ok: NCCL has an allowed algorithm/protocol for the collective.
        warnings: NCCL warnings to log (e.g. LL128 forced on PCIe).
    """

    path: str
    custom_ar_disabled: bool
    allgather_ok: bool
    allreduce_ok: bool
    warnings: list[str] = field(default_factory=list)


def _custom_backend(ne: dict, caps: dict, launch: LaunchConfig, n: int) -> tuple[str, float, bool]:
    """(backend, custom α µs, custom all-reduce disabled by SGLang) for ``n`` GPUs."""
    alpha_custom = ne["alpha_custom_ar_us"]
    if launch.disable_custom_all_reduce or n <= 1:
        return "nccl", alpha_custom, False
    if caps.get("nvlink") or n <= int(caps.get("custom_ar_max_pcie_world_size", 2)):
        return "custom", ne.get("alpha_custom_ar_small_us", 9.2), False  # [S] one-shot 8 KB on PCIe switches
    if caps.get("force_custom_allreduce_pcie"):
        return "custom", alpha_custom, False
    return "nccl", alpha_custom, True


def collectives(profile: dict, launch: LaunchConfig) -> tuple[CollectiveModel, CollectivePath]:
    """Build the collective model of a launch and describe the path actually taken."""
    ne, caps = node_params(profile), capabilities(profile)
    n = max(1, launch.tp)
    algo_glob, algo_per = _parse_nccl_list(launch.nccl_algo, ALGOS)
    proto_glob, _ = _parse_nccl_list(launch.nccl_proto, PROTOS)
    warnings: list[str] = []
    ll128_default = bool(caps.get("nccl_ll128_on_pcie_default", False)) or bool(caps.get("nvlink"))
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
    backend, alpha_custom, custom_off = _custom_backend(ne, caps, launch, n)
    cm = CollectiveModel(backend=backend, algos_allreduce=ar_algos or set(), protos=proto_glob,
                         proto_forced=bool(launch.nccl_proto), scale=scale, alpha_custom_us=alpha_custom, ne=ne, n=n)
    info = CollectivePath("", custom_off, bool(ag_algos) and bool(proto_glob),
                          bool(ar_algos) and bool(proto_glob), warnings)
    if n == 1:
        info.path = "none"
    elif backend == "custom":
        info.path = "custom:nvlink" if caps.get("nvlink") else "custom:pcie"
    elif info.allreduce_ok:
        info.path = "nccl:" + cm.choice(2 * model_params(profile)["hidden_size"])[1]
    else:
        info.path = "nccl:invalid"
    return cm, info


def weights_bytes(profile: dict, tp: int, tokens: int) -> float:
    """Bytes each GPU streams for one forward of ``tokens`` tokens (uniform routing, [A])."""
    me = model_params(profile)
    e, k = me["num_experts"], me["top_k"]
    touched = e * (1.0 - (1.0 - k / e) ** max(tokens, 1))
    return (me["replicated_gb"] * GB + me["sharded_gb"] * GB / tp
            + me["num_moe_layers"] * touched * me["expert_mb"] * 1e6 / tp)


def resident_weights_gib(profile: dict, tp: int, spec: bool) -> float:
    """Weights resident per GPU (GiB): all experts, sharded / tp, plus the draft with EAGLE."""
    me = model_params(profile)
    b = (me["replicated_gb"] * GB + me["sharded_gb"] * GB / tp
         + me["num_moe_layers"] * me["num_experts"] * me["expert_mb"] * 1e6 / tp)
    if spec:
        b += me["draft_gb"] * GB / tp
    return b / GIB


def graph_memory_gib(profile: dict, max_bs: int, graphs: bool, spec: bool) -> tuple[float, float]:
    """(target, draft) CUDA-graph memory per GPU (GiB); 0 without graphs, draft 0 without EAGLE."""
    gm = node_params(profile)["graph_memory"]
    g_target = (gm["base_gib"] + gm["per_bs_mib"] * max_bs / 1024.0) if graphs else 0.0
    g_draft = g_target * (gm["spec_factor"] - 1.0) if (graphs and spec) else 0.0
    return g_target, g_draft


def delta_cg_ms(profile: dict, max_bs: int) -> float:
    """CUDA-graph size effect Δ_cg (ms): δ·log2(max_bs/128) above 128, 0 at or below [F]."""
    if max_bs <= 128:
        return 0.0
    return node_params(profile)["delta_cg_ms_per_doubling"] * math.log2(max_bs / 128.0)


def step_ms(profile: dict, launch: LaunchConfig, cm: CollectiveModel, *, tokens: int, batch: int,
            ctx: int, graphs: bool, max_bs: int, alpha_extra_us: float = 0.0, prefill: bool = False) -> dict:
    """One target forward of ``tokens`` tokens (``batch`` sequences of context ``ctx``).

    Returns:
        dict of ms: t_mem, t_flops, t_comm, t_ovh, delta_cg, eager, total.
    """
    ne, me = node_params(profile), model_params(profile)
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
