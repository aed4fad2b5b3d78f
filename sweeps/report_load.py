"""Serving-under-load plots (PNG) beside the study's other plots (:func:`sweeps.report.write_plots`):

* ``throughput_latency_curves.png``: per config, p99 TTFT and p99 TPOT (ms) against the offered
  request rate (req/s) of every load-search level, with the SLO's bounds when known.
* ``pareto_front.png``: a multi-objective study's trials on its first two objectives, the
  Pareto front highlighted.
* ``speculative_speedup_by_concurrency.png``: each speculative config's output tok/s over the
  baseline's at each closed-loop concurrency (1 = break-even).

The numbers come from the records (:mod:`sweeps.findings.load`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeps import records as R
from sweeps.findings.load import break_evens, curve, front_of
from sweeps.findings.measure import unit


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(r: R.TrialRecord) -> str:
    p = r.params
    spec = p.get("speculative", "none")
    return f"t{r.number} {spec} {p.get('allreduce', '')} g{p.get('cuda_graph_max_bs', '')}".strip()


def curves_figure(recs: Sequence[R.TrialRecord], slo: dict[str, float] | None = None) -> Any | None:
    """p99 TTFT / p99 TPOT vs offered rate, one line per config with a curve (None: no curves)."""
    rows = [(r, curve(r)) for r in recs if r.status == "ok" and r.duplicate_of is None and curve(r)]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, ax, name in (("ttft_ms_p99", axes[0], "p99 TTFT (ms)"), ("tpot_ms_p99", axes[1], "p99 TPOT (ms)")):
        for r, pts in rows:
            xs = [p["rate_req_s"] for p in pts if key in p]
            ys = [p[key] for p in pts if key in p]
            ax.plot(xs, ys, marker="o", label=_label(r))
        bound = (slo or {}).get(key)
        if bound:
            ax.axhline(bound, color="red", linestyle="--", linewidth=1, label="SLO")
        ax.set_xlabel("offered request rate (req/s)")
        ax.set_ylabel(name)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle("Throughput–latency curves (load search levels)")
    fig.tight_layout()
    return fig


def pareto_figure(recs: Sequence[R.TrialRecord], names: Sequence[str], directions: Sequence[str]) -> Any | None:
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


def speedup_figure(recs: Sequence[R.TrialRecord]) -> Any | None:
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
    """Objective names from the study's identity (``"a maximize, b minimize"``, sweeps.study),
    for a study whose metric names Optuna does not hold."""
    text = str((study.user_attrs.get("identity") or {}).get("objective", ""))
    return [part.split()[0] for part in text.split(",") if part.split()]


def write_load_plots(study: Any, recs: Sequence[R.TrialRecord], out_dir: Path,
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
