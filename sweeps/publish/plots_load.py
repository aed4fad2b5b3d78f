"""Serving-under-load plots (PNG) beside the study's other plots (:func:`sweeps.publish.plots.write_plots`):

* ``throughput_latency_curves.png``: per config, p99 TTFT and p99 TPOT (ms) against the offered
  request rate (req/s) of every load-search level, with the SLO's bounds when known (a config
  whose max rate is censored says so in its label, ``(< 2.65 req/s)``).
* ``pareto_front.png``: a multi-objective study's trials on its first two objectives, the
  Pareto front highlighted.
* ``speculative_speedup_by_concurrency.png``: each speculative config's output tok/s over the
  baseline's at each closed-loop concurrency (1 = break-even).

The numbers come from the records (:mod:`sweeps.publish.findings.load`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeps.publish.findings.load import break_evens, curve, front_of
from sweeps.publish.findings.measure import unit
from sweeps.store import records
from tasks.load_search import censored_text


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: knobs a legend label leaves out at these levels (the plain defaults: shown, they only add noise)
_QUIET = {"nccl_algo": "default", "nccl_proto": "default", "moe_a2a_backend": "none"}


def _label(r: records.TrialRecord) -> str:
    """``t13 none nccl g64 proto=LL`` : the trial and every knob that tells its config apart
    (NCCL algo/proto and the MoE all-to-all when not default, the EAGLE draft shape)."""
    p = r.params
    spec = p.get("speculative", "none")
    parts = [f"t{r.number}", str(spec), str(p.get("allreduce", "")), f"g{p.get('cuda_graph_max_bs', '')}"]
    if spec not in (None, "none") and "eagle_num_steps" in p:
        parts.append(f"{p.get('eagle_num_steps')}/{p.get('eagle_topk')}/{p.get('eagle_num_draft_tokens')}")
    for k, quiet in _QUIET.items():
        if k in p and p[k] != quiet:
            parts.append(f"{k.removeprefix('nccl_').removesuffix('_backend')}={p[k]}")
    return " ".join(x for x in parts if x and x != "g")


def _colors(n: int) -> list[Any]:
    """``n`` distinct colours (tab10 up to 10 lines, tab20 up to 20, then a continuous map)."""
    import matplotlib

    name = "tab10" if n <= 10 else "tab20" if n <= 20 else "turbo"
    cmap = matplotlib.colormaps[name]
    return [cmap(i) for i in range(n)] if n <= 20 else [cmap(i / max(1, n - 1)) for i in range(n)]


#: the curves' x-axis ends this many times above the highest rate a config sustained (the answer's region)
ZOOM = 2.0


def zoom_limit(recs: Sequence[records.TrialRecord],
               rows: Sequence[tuple[records.TrialRecord, list[dict[str, Any]]]]) -> float | None:
    """Right edge of the curves' rate axis (req/s): :data:`ZOOM` x the highest rate any config
    sustained (``max_rate_at_slo_req_s``, else the highest level it met), None when that already
    spans every level (nothing to zoom) or no level was met."""
    best = 0.0
    for r, pts in rows:
        v = r.metrics.get("max_rate_at_slo_req_s")
        met = [p["rate_req_s"] for p in pts if p.get("met")]
        best = max(best, float(v) if isinstance(v, (int, float)) and v > 0 else 0.0, *met)
    top = max((p["rate_req_s"] for _, pts in rows for p in pts), default=0.0)
    if best <= 0 or best * ZOOM >= top:
        return None
    return best * ZOOM


def _censored_suffix(r: records.TrialRecord) -> str:
    """`` (< 2.65 req/s)`` for a record whose max rate at the SLO is censored, else ``""``."""
    c = censored_text(r.metrics)
    return f" ({c})" if c else ""


def curves_figure(recs: Sequence[records.TrialRecord], slo: dict[str, float] | None = None) -> Any | None:
    """p99 TTFT / p99 TPOT vs offered rate, one line per config with a curve (None: no curves)."""
    rows = [(r, curve(r)) for r in recs if r.status == "ok" and r.duplicate_of is None and curve(r)]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    right = zoom_limit(recs, rows)
    colors = _colors(len(rows))
    for key, ax, name in (("ttft_ms_p99", axes[0], "p99 TTFT (ms)"), ("tpot_ms_p99", axes[1], "p99 TPOT (ms)")):
        for (r, pts), color in zip(rows, colors):
            xs = [p["rate_req_s"] for p in pts if key in p]
            ys = [p[key] for p in pts if key in p]
            ax.plot(xs, ys, marker="o", label=_label(r) + _censored_suffix(r), color=color)
        bound = (slo or {}).get(key)
        if bound:
            ax.axhline(bound, color="red", linestyle="--", linewidth=1, label="SLO")
        if right is not None:  # the levels far past every config's capacity only squash the answer's region
            ax.set_xlim(0, right)
        ax.set_xlabel("offered request rate (req/s)" + (f", zoomed to <= {right:.3g}" if right else ""))
        ax.set_ylabel(name)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle("Throughput–latency curves (load search levels)")
    fig.tight_layout()
    return fig


def pareto_figure(recs: Sequence[records.TrialRecord], names: Sequence[str], directions: Sequence[str]) -> Any | None:
    """Trials on the first two objectives, the Pareto front joined (None: < 2 objectives or no data)."""
    if len(names) < 2:
        return None
    x, y = names[0], names[1]
    pts = [r for r in recs if r.status == "ok" and r.duplicate_of is None and x in r.metrics and y in r.metrics]
    if not pts:
        return None
    front = front_of(pts, names[:2], directions[:2])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter([r.metrics[x] for r in pts], [r.metrics[y] for r in pts], color="tab:gray", alpha=0.6, label="trials")
    fr = sorted(front, key=lambda r: r.metrics[x])
    ax.plot([r.metrics[x] for r in fr], [r.metrics[y] for r in fr], color="tab:red", marker="o", label="Pareto front")
    for r in fr:
        ax.annotate(f"t{r.number}", (r.metrics[x], r.metrics[y]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(f"{x} ({unit(x)}, {directions[0]})" if unit(x) else f"{x} ({directions[0]})")
    ax.set_ylabel(f"{y} ({unit(y)}, {directions[1]})" if unit(y) else f"{y} ({directions[1]})")
    ax.set_title("Pareto front")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speedup_figure(recs: Sequence[records.TrialRecord]) -> Any | None:
    """Speculative speedup over the baseline by concurrency (None: no concurrency levels)."""
    be = break_evens(recs)
    if not be:
        return None
    by_num = {r.number: r for r in recs}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, b in sorted(be.items()):
        cs = list(b["speedups"])
        ax.plot(cs, [b["speedups"][c] for c in cs], marker="o", label=_label(by_num[n]))
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="break-even")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tok/s speedup vs baseline (x)")
    ax.set_title("Speculative decoding vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _identity_names(study: Any) -> list[str]:
    """Objective names from the study's identity (``"a maximize, b minimize"``, sweeps.store.study),
    for a study whose metric names Optuna does not hold."""
    text = str((study.user_attrs.get("identity") or {}).get("objective", ""))
    return [part.split()[0] for part in text.split(",") if part.split()]


def write_load_plots(study: Any, recs: Sequence[records.TrialRecord], out_dir: Path,
                     slo: dict[str, float] | None = None) -> list[Path]:
    """Write whichever of the three plots the records support into ``out_dir``; their paths.
    ``study``: the Optuna study (its metric names and directions give the Pareto axes)."""
    import optuna

    names = list(getattr(study, "metric_names", None) or []) or _identity_names(study)
    dirs = ["minimize" if d == optuna.study.StudyDirection.MINIMIZE else "maximize" for d in study.directions]
    figs = {"throughput_latency_curves.png": curves_figure(recs, slo),
            "pareto_front.png": pareto_figure(recs, names, dirs) if len(dirs) > 1 else None,
            "speculative_speedup_by_concurrency.png": speedup_figure(recs)}
    out = []
    plt = None
    for name, fig in figs.items():
        if fig is None:
            continue
        plt = plt or _plt()
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out
