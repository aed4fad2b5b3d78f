"""Serving under load in the findings: each config's throughput–latency curve (from its load
search levels), the Pareto front of a multi-objective sweep, and for speculative configs the
concurrency at which their speedup over the baseline falls below 1.

The data are trial metrics (pure functions of the records, so the report plots and MLflow read
the same numbers): a load search logs ``load_rate_req_s_L<i>``, ``load_<m>_L<i>`` and
``load_met_L<i>`` (:func:`tasks.trial_load.curve_metrics`); closed-loop levels log
``<m>_c<N>`` (``output_tok_s_c16``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.publish.findings.text import cfg, fmt, row
from sweeps.store import records
from tasks.load_search import RATE, censored_text, censored_upper

_LEVEL = re.compile(r"^load_rate_req_s_L(\d+)$")
_CONC = re.compile(r"^output_tok_s_c(\d+)$")


def curve(r: records.TrialRecord) -> list[dict[str, float]]:
    """A record's load-search levels by rate: ``[{"rate_req_s", "met", <metric>: value}, ...]``."""
    pts = []
    for k, v in r.metrics.items():
        m = _LEVEL.match(k)
        if m:
            i = m.group(1)
            p = {"rate_req_s": float(v), "met": bool(r.metrics.get(f"load_met_L{i}", 0.0))}
            suffix = f"_L{i}"
            p |= {k2[5:-len(suffix)]: float(v2) for k2, v2 in r.metrics.items()
                  if k2.startswith("load_") and k2.endswith(suffix) and k2 not in (k, f"load_met_L{i}")}
            pts.append(p)
    return sorted(pts, key=lambda p: p["rate_req_s"])


def concurrency_levels(r: records.TrialRecord) -> dict[int, float]:
    """A record's closed-loop output tok/s by concurrency (``output_tok_s_c<N>``)."""
    return dict(sorted((int(m.group(1)), float(v)) for k, v in r.metrics.items() if (m := _CONC.match(k))))


def _speculative(r: records.TrialRecord) -> bool:
    return r.params.get("speculative") not in (None, "none")


def break_even(spec: Mapping[int, float], base: Mapping[int, float]) -> dict[str, Any]:
    """Speedup per shared concurrency level and where it falls below 1.

    Returns:
        ``{"speedups": {c: ratio}, "below_at": c | None, "last_above": c | None,
        "crossing": c* | None}``: ``below_at`` is the lowest measured level with speedup < 1
        (after one >= 1), ``crossing`` the log-log interpolated concurrency where it reaches 1
        between ``last_above`` and ``below_at``.
    """
    sp = {c: spec[c] / base[c] for c in sorted(set(spec) & set(base)) if base[c] > 0}
    below = next((c for c in sp if sp[c] < 1.0), None)
    above = max((c for c in sp if sp[c] >= 1.0 and (below is None or c < below)), default=None)
    cross = None
    if below is not None and above is not None:
        x0, x1, y0, y1 = math.log(above), math.log(below), math.log(sp[above]), math.log(sp[below])
        cross = math.exp(x0 + (0 - y0) * (x1 - x0) / (y1 - y0)) if y1 != y0 else float(below)
    return {"speedups": sp, "below_at": below, "last_above": above, "crossing": cross}


def break_evens(recs: Sequence[records.TrialRecord]) -> dict[int, dict[str, Any]]:
    """:func:`break_even` of every ok speculative record against the baseline (by trial number)."""
    base = next((r for r in recs if r.is_baseline and r.status == "ok" and concurrency_levels(r)), None)
    if base is None:
        return {}
    b = concurrency_levels(base)
    return {r.number: break_even(concurrency_levels(r), b) for r in recs
            if r.status == "ok" and _speculative(r) and concurrency_levels(r)}


def pareto_front(points: Sequence[tuple[Any, Sequence[float]]], maximize: Sequence[bool]) -> list[Any]:
    """The keys of the non-dominated points (``(key, values)``; ``maximize`` per objective)."""
    def better_eq(a: Sequence[float], b: Sequence[float]) -> bool:
        return all((x >= y) if mx else (x <= y) for x, y, mx in zip(a, b, maximize))

    return [k for k, v in points if not any(better_eq(w, v) and tuple(w) != tuple(v) for _, w in points)]


def front_of(recs: Sequence[records.TrialRecord], names: Sequence[str], directions: Sequence[str]) -> list[records.TrialRecord]:
    """The ok records on the Pareto front of ``names`` (one direction each)."""
    pts = [(r, [float(r.metrics[n]) for n in names]) for r in recs
           if r.status == "ok" and r.duplicate_of is None and all(n in r.metrics for n in names)]
    keep = set(id(r) for r in pareto_front([(r, v) for r, v in pts], [d == "maximize" for d in directions]))
    return sorted((r for r, _ in pts if id(r) in keep), key=lambda r: -float(r.metrics[names[0]]))


def _curve_lines(recs: Sequence[records.TrialRecord]) -> list[str]:
    with_curve = [(r, curve(r)) for r in recs if r.status == "ok" and r.duplicate_of is None and curve(r)]
    if not with_curve:
        return []
    L = ["#### Throughput–latency curves (load search levels)", "",
         "Each level offers Poisson traffic at a rate; ✓ met the SLO (p99 TTFT and p99 TPOT). The bracket is "
         "the lowest failed over the highest met rate; a search that did not narrow it to its tolerance is "
         "censored: only its bounds are known (`< x`: failed at x, e.g. at the incumbent's rate), and it is "
         "never ranked on a number it did not measure.", "",
         row(["trial", "config", "max rate at SLO (req/s)", "bracket",
              "levels: rate req/s → p99 TTFT ms / p99 TPOT ms / goodput req/s"]),
         row(["---"] * 5)]
    for r, pts in sorted(with_curve, key=lambda x: -rank_value(x[0])):
        lv = "; ".join(f"{p['rate_req_s']:.2f} {'✓' if p['met'] else '✗'} → {fmt(p.get('ttft_ms_p99'))} / "
                       f"{fmt(p.get('tpot_ms_p99'))} / {fmt(p.get('goodput_req_s'))}" for p in pts)
        L.append(row([f"t{r.number}", cfg(r.params), rate_text(r), bracket_text(r), lv]))
    return L + [""]


def rate_text(r: records.TrialRecord) -> str:
    """A record's ``max_rate_at_slo_req_s`` as the findings show it: the narrowed value, or the
    censored bounds (``< 2.65 req/s``), or ``-`` when the trial logged neither."""
    v = r.metrics.get(RATE)
    if v is not None:
        return fmt(v)
    return censored_text(r.metrics) or "-"


def bracket_text(r: records.TrialRecord) -> str:
    """The final bracket's relative width (``6.8 %``; ``capped`` when the range's top met; ``-``
    without a bracket, e.g. nothing met)."""
    b = r.metrics.get("max_rate_at_slo_bracket_rel")
    if b is not None:
        return f"{float(b) * 100:.1f} %"
    return "capped" if r.metrics.get(RATE) and r.metrics.get("load_search_converged") else "-"


def rank_value(r: records.TrialRecord) -> float:
    """Sort key for the curve table: the value, else a censored value's upper bound (it is below
    that), else 0."""
    v = r.metrics.get(RATE)
    return float(v) if v is not None else (censored_upper(r.metrics) or 0.0)


def _break_even_lines(recs: Sequence[records.TrialRecord]) -> list[str]:
    be = break_evens(recs)
    if not be:
        return []
    by_num = {r.number: r for r in recs}
    L = ["#### Speculative decoding vs concurrency", "",
         "Output tok/s over the baseline's at each closed-loop concurrency; where the speedup falls below 1.", "",
         row(["trial", "config", "speedup by concurrency", "falls below 1 at"]), row(["---"] * 4)]
    for n, b in sorted(be.items()):
        sp = ", ".join(f"c{c}: {v:.2f}x" for c, v in b["speedups"].items())
        if b["below_at"] is None:
            where = "not within the measured levels"
        elif b["last_above"] is None:
            where = f"every level (already {b['speedups'][b['below_at']]:.2f}x at c{b['below_at']})"
        else:
            where = f"c{b['below_at']} (crosses 1 near c≈{b['crossing']:.1f})"
        L.append(row([f"t{n}", cfg(by_num[n].params), sp, where]))
    return L + [""]


def _pareto_lines(ctx: Any, recs: Sequence[records.TrialRecord]) -> list[str]:
    objs = getattr(ctx, "objectives", None)
    if objs is None or len(objs.names) < 2:
        return []
    front = front_of(recs, objs.names, objs.directions)
    if not front:
        return []
    what = ", ".join(f"{n} ({d})" for n, d in zip(objs.names, objs.directions))
    L = ["#### Pareto front", "", f"Configs no other config beats on every objective ({what}).",
         "", row(["trial", "config", *objs.names]), row(["---"] * (2 + len(objs.names)))]
    L += [row([f"t{r.number}", cfg(r.params), *(fmt(r.metrics[n]) for n in objs.names)]) for r in front]
    return L + [""]


def load_section(ctx: Any, recs: Sequence[records.TrialRecord]) -> list[str]:
    """The "Serving under load" section (empty when no trial measured load levels and the sweep
    has a single objective)."""
    body = _curve_lines(recs) + _break_even_lines(recs) + _pareto_lines(ctx, recs)
    return ["### Serving under load", "", *body] if body else []


def break_even_metrics(recs: Sequence[records.TrialRecord]) -> dict[str, float]:
    """Parent-run metrics: ``spec_break_even_concurrency_t<N>`` (the lowest measured concurrency
    where trial N's speedup is below 1; 0 = below at every level) per speculative trial that
    falls below 1, and ``spec_speedup_t<N>_c<C>``."""
    out: dict[str, float] = {}
    for n, b in break_evens(recs).items():
        if b["below_at"] is not None:
            out[f"spec_break_even_concurrency_t{n}"] = float(b["below_at"] if b["last_above"] is not None else 0)
        out |= {f"spec_speedup_t{n}_c{c}": float(v) for c, v in b["speedups"].items()}
    return out
