"""Which knobs move the objective: an ANOVA of main effects on the launched trials.

Optuna's evaluators see every COMPLETE trial (a duplicate proposal carries its source's
value, so a config measured once counts many times) and can miss a categorical whose effect
sits in a few levels (PED-ANOVA's top quantile can hold a single level of ``speculative``:
importance 0 for the largest effect). Here the *launched* ok trials only (each measured
config once; skips, duplicates, infeasible proposals and silently degraded launches out)
are fitted by least squares with every knob's levels as categories (one indicator per level
but a reference one; intercept). Knobs enter one at a time, each step taking the knob that
raises the adjusted R² most (forward selection; the adjustment charges a knob its levels, so
of two knobs that single out the same trials the one with fewer levels explains them), and a
knob's importance is the R² it added (sequential, "Type I", sums of squares over the total):

    importance_k = (RSS before k − RSS after k) / SS_total

The importances sum to the model's R². A large effect in one knob does not hide the others
(each later knob is measured given the earlier ones), and a conditional knob (``eagle_*``
only with ``speculative=eagle3``) has indicators only where it is active, its shift over
inactive trials left to the knob that gates it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.config.objective import Objective
from sweeps.store import records as trial_records

METHOD = "ANOVA main effects (sequential R², categorical levels), launched trials"
MIN_TRIALS = 3


def launched_rows(records: Sequence[trial_records.TrialRecord], obj: Objective) -> list[tuple[dict[str, Any], float]]:
    """(params, objective value) of every launched, ok trial on the path it names."""
    return [(r.params, v) for r in records
            if r.launched and trial_records.counts_for_level(r)
            and (v := trial_records.value_of(r, obj)) is not None and math.isfinite(v)]


def _columns(rows: Sequence[tuple[Mapping[str, Any], float]]) -> dict[str, list[list[float]]]:
    """knob -> its indicator columns (one per level but the first seen; 0 where inactive)."""
    cols: dict[str, list[list[float]]] = {}
    for knob in dict.fromkeys(k for p, _ in rows for k in p):
        levels = list(dict.fromkeys(str(p[knob]) for p, _ in rows if knob in p))
        cols[knob] = [[1.0 if knob in p and str(p[knob]) == lv else 0.0 for p, _ in rows] for lv in levels[1:]]
    return cols


def _rss(y: Any, columns: list[list[float]]) -> float:
    import numpy as np

    x = np.column_stack([np.ones(len(y)), *columns]) if columns else np.ones((len(y), 1))
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(((y - x @ coef) ** 2).sum())


def _adjusted(rss: float, ss_total: float, n: int, p: int) -> float:
    """Adjusted R² of a fit with ``p`` columns besides the intercept (-inf without residual df)."""
    return 1.0 - (rss / (n - p - 1)) / (ss_total / (n - 1)) if n - p - 1 > 0 else float("-inf")


def anova_importances(rows: Sequence[tuple[Mapping[str, Any], float]]) -> dict[str, float]:
    """knob -> the share of the objective's variance it added (0..1), largest first; {} with
    fewer than :data:`MIN_TRIALS` rows or no spread.

    Args:
        rows: (params, objective value) per launched trial (:func:`launched_rows`).
    """
    import numpy as np

    if len(rows) < MIN_TRIALS:
        return {}
    y = np.array([v for _, v in rows], dtype=float)
    n = len(y)
    ss_total = float(((y - y.mean()) ** 2).sum())
    if ss_total <= 1e-12 * max(1.0, float((y**2).sum())):
        return {}
    cols = _columns(rows)
    chosen: list[list[float]] = []
    rss_prev, out = ss_total, {}
    remaining = dict(cols)
    while remaining:
        fits = {k: _rss(y, chosen + cs) for k, cs in remaining.items()}
        k = max(remaining, key=lambda j: (_adjusted(fits[j], ss_total, n, len(chosen) + len(remaining[j])),
                                          ss_total - fits[j], -len(remaining[j])))
        out[k] = max(0.0, min(1.0, (rss_prev - fits[k]) / ss_total))
        rss_prev = min(rss_prev, fits[k])
        chosen += remaining.pop(k)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def importances(records: Sequence[trial_records.TrialRecord], obj: Objective) -> dict[str, float]:
    """:func:`anova_importances` of the launched trials' objective values."""
    return anova_importances(launched_rows(records, obj))


def importances_figure(records: Sequence[trial_records.TrialRecord], obj: Objective | None = None) -> Any | None:
    """Bar chart of :func:`importances` (matplotlib figure), or None when there is nothing to show."""
    obj = obj or Objective()
    imp = importances(records, obj)
    if not imp:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(imp)[::-1]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6))
    ax.barh(names, [imp[n] for n in names], color="#4c72b0")
    n = len(launched_rows(records, obj))
    ax.set_xlabel(f"importance: {METHOD}\n(share of the variance, n={n}; the bars sum to the model's R²)")
    ax.set_title(f"parameter importances for {obj.label}")
    return fig


def importances_plotly(records: Sequence[trial_records.TrialRecord], obj: Objective | None = None) -> Any:
    """The same numbers as an interactive plotly bar chart (for ``param_importances.html``).

    Raises:
        ValueError: nothing to show (fewer than :data:`MIN_TRIALS` launched trials, no spread).
    """
    import plotly.graph_objects as go

    obj = obj or Objective()
    imp = importances(records, obj)
    if not imp:
        raise ValueError("too few launched trials with a spread of the objective")
    names = list(imp)[::-1]
    fig = go.Figure(go.Bar(x=[imp[k] for k in names], y=names, orientation="h"))
    fig.update_layout(title=f"parameter importances for {obj.label}", xaxis_title=f"importance: {METHOD}")
    return fig
