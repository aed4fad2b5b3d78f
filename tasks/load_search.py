"""``max_rate_at_slo_req_s``: the highest offered request rate whose p99 TTFT and p99 TPOT
stay within the SLO, found by a bounded search over load levels on one running server.

The caller passes ``measure(rate) -> metrics`` (a closure that runs one load level against
the live server, or the instant-mode simulation, and returns
:func:`tasks.serving_metrics.summarize`'s dict), so every level reuses the same server.

Search (at most ``max_levels`` levels, stop when the bracket is within ``rel_tol``):

1. The first level is the incumbent's rate when there is one, else the geometric middle of
   ``[rate_lo, rate_hi]``. A candidate that fails at the incumbent's rate cannot beat it:
   it stops there (``stopped_at_incumbent``); its value is censored, ``< incumbent``.
2. Then the knee is bracketed: after a failure without an incumbent, ``rate_lo`` (failing
   there: censored ``< rate_lo``); after a pass, the rate doubles (``rate_hi`` at most)
   until a level fails, since a candidate that beat the incumbent usually sits within a
   factor of a few of it. Passing at ``rate_hi`` reports it (``capped``: the true value is
   at least that).
3. Inside the bracket (highest met, lowest failed rate), each level is placed at a
   predicted knee, nudged by half the tolerance away from the side that moved last so the
   next level can close the bracket from the other side (the nudge doubles when the same
   side keeps moving). The prediction, for each p99 metric that failed at the lowest
   failed level: a queueing fit ``a / (1 - r / c)`` through the two highest met levels;
   else a secant to the failed level (log-log when it is far above the bound; Illinois:
   an end that stayed put is down-weighted) when that level was not saturated; else the
   queueing shape through the highest met level and the capacity a saturated level served
   (``request_throughput_req_s`` well below the offered rate). Never at or above that
   capacity; a log midpoint when nothing predicts (e.g. flat below a kink). vLLM's
   ``serve_sla`` fits a curve the same way; the fits here are the queueing shapes above.

A result whose bracket did not close to ``rel_tol`` (the level budget ran out, nothing met,
or the incumbent's rate failed) is **censored**: :meth:`LoadSearchResult.metrics` then logs
no ``max_rate_at_slo_req_s`` (a 0.0 there would read as a measured zero) but its bounds,
``max_rate_at_slo_req_s_upper`` (the lowest failed rate: the value is below it),
``max_rate_at_slo_req_s_lower`` (the highest met rate, when one met) and
``max_rate_at_slo_req_s_censored`` = 1; :func:`censored_text` words it (``< 2.65 req/s``).

Measured on synthetic curves (25 capacities from 0.5 to 40 req/s; ranges 0.1..100,
0.25..64 and 0.5..50 req/s): queueing-shaped p99s (``1 / (1 - rho)``) always end within 5 %
in <= 6 levels; a linear TPOT ramp within 7 % (16 % when the knee sits on the range's lower
bound); a flat-then-kinked TTFT within 25 %. The bracket always contains the true knee
(tests/test_load_search.py); :meth:`LoadSearchResult.converged` says whether it closed.

The result keeps every level (rate, metrics, met) for the throughput–latency curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Metrics = Mapping[str, float]

#: the objective this search measures (req/s); a censored result logs ``<RATE>_upper`` etc. instead
RATE = "max_rate_at_slo_req_s"
#: suffixes of a censored value's bounds and flag (``max_rate_at_slo_req_s_upper``, ...)
UPPER, LOWER, CENSORED = "_upper", "_lower", "_censored"
#: what the search logs beside the shown level's metrics (every name :meth:`LoadSearchResult.metrics` can add)
RESULT_KEYS = frozenset({RATE, RATE + UPPER, RATE + LOWER, RATE + CENSORED, "max_rate_at_slo_bracket_rel",
                         "slo_failed_at_req_s", "load_levels", "load_search_converged"})


@dataclass(frozen=True)
class Slo:
    """Per-level SLO on p99 latencies (ms), e.g. ``Slo(ttft_ms_p99=2000, tpot_ms_p99=50)``."""

    ttft_ms_p99: float
    tpot_ms_p99: float
    max_failed_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ttft_ms_p99", "tpot_ms_p99"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"slo.{name} must be a positive number of ms, got {v!r}")
        if not 0.0 <= self.max_failed_fraction < 1.0:
            raise ValueError(f"slo.max_failed_fraction must be in [0, 1), got {self.max_failed_fraction!r}")

    def ratio(self, m: Metrics) -> float:
        """Worst observed/allowed ratio (<= 1 meets the SLO); ``inf`` when a metric is
        missing or non-finite, or more requests failed than allowed."""
        try:
            r = max(float(m["ttft_ms_p99"]) / self.ttft_ms_p99, float(m["tpot_ms_p99"]) / self.tpot_ms_p99)
        except (KeyError, TypeError, ValueError):
            return math.inf
        sent = float(m.get("completed", 0.0)) + float(m.get("failed", 0.0))
        if sent and float(m.get("failed", 0.0)) / sent > self.max_failed_fraction:
            return math.inf
        return r if math.isfinite(r) else math.inf


@dataclass(frozen=True)
class LoadLevel:
    """One measured load level."""

    rate_req_s: float
    metrics: Metrics
    met: bool


@dataclass(frozen=True)
class LoadSearchResult:
    """Outcome of :func:`max_rate_at_slo`.

    Attributes:
        max_rate_at_slo_req_s: highest measured rate that met the SLO (0 if none).
        failed_at_req_s: lowest measured rate above it that failed (None if none failed).
        levels: every level in the order measured.
        stopped_at_incumbent: failed at the incumbent's rate, so the search stopped.
        capped: met at ``rate_hi`` (the true maximum may be higher).
        rel_tol: the relative bracket the search aimed for (what :attr:`censored` compares to).
    """

    max_rate_at_slo_req_s: float
    failed_at_req_s: float | None
    levels: tuple[LoadLevel, ...] = field(default_factory=tuple)
    stopped_at_incumbent: bool = False
    capped: bool = False
    rel_tol: float = 0.05

    def converged(self, rel_tol: float | None = None) -> bool:
        """The knee is bracketed within ``rel_tol`` (default: the search's) or pinned to ``rate_hi``."""
        tol = self.rel_tol if rel_tol is None else rel_tol
        if self.capped or self.failed_at_req_s is None:
            return self.capped
        if self.max_rate_at_slo_req_s <= 0:
            return False
        return self.failed_at_req_s <= self.max_rate_at_slo_req_s * (1 + tol) * (1 + 1e-9)

    @property
    def censored(self) -> bool:
        """Only bounds are known: the bracket did not close to :attr:`rel_tol` (nothing met,
        the incumbent's rate failed, or the level budget ran out)."""
        return not self.converged()

    @property
    def bracket_rel(self) -> float | None:
        """Relative width of the final bracket, ``failed / met - 1`` (None without both ends)."""
        lo, hi = self.max_rate_at_slo_req_s, self.failed_at_req_s
        return hi / lo - 1.0 if lo > 0 and hi is not None else None

    def metrics(self) -> dict[str, float]:
        """What a trial logs: the metrics of the highest level that met the SLO (or of the
        lowest level measured when none did), e.g. ``ttft_ms_p99``, ``tpot_ms_p99``,
        ``goodput_req_s``; ``load_levels``; ``load_search_converged`` (1/0);
        ``slo_failed_at_req_s`` (when a level failed above the highest met one);
        ``max_rate_at_slo_bracket_rel`` (:attr:`bracket_rel`, when there is a bracket); and
        either ``max_rate_at_slo_req_s`` (narrowed or capped) or, censored, its bounds
        ``max_rate_at_slo_req_s_upper`` / ``_lower`` (the latter when a level met) and
        ``max_rate_at_slo_req_s_censored`` = 1 (never a 0.0 that was not measured)."""
        met = [lv for lv in self.levels if lv.met]
        shown = max(met, key=lambda lv: lv.rate_req_s) if met else min(self.levels, key=lambda lv: lv.rate_req_s)
        out = {**{k: float(v) for k, v in shown.metrics.items()},
               "load_levels": float(len(self.levels)), "load_search_converged": float(self.converged())}
        if self.failed_at_req_s is not None:
            out["slo_failed_at_req_s"] = self.failed_at_req_s
        if self.bracket_rel is not None:
            out["max_rate_at_slo_bracket_rel"] = self.bracket_rel
        if not self.censored:
            out[RATE] = self.max_rate_at_slo_req_s
            return out
        out[RATE + UPPER] = float(self.failed_at_req_s)  # type: ignore[arg-type]  # censored => a level failed
        if self.max_rate_at_slo_req_s > 0:
            out[RATE + LOWER] = self.max_rate_at_slo_req_s
        out[RATE + CENSORED] = 1.0
        return out

    def curve(self) -> list[tuple[float, Metrics]]:
        """(rate, metrics) of every level, by rate: the throughput–latency curve."""
        return [(lv.rate_req_s, lv.metrics) for lv in sorted(self.levels, key=lambda lv: lv.rate_req_s)]


def censored_text(metrics: Mapping[str, Any], name: str = RATE, unit: str = "req/s") -> str | None:
    """How a censored value reads (``< 2.65 req/s``; ``2.00-4.32 req/s, not narrowed`` when a
    level met below the bracket), or None when ``metrics`` hold no censored ``name``."""
    try:
        if not float(metrics.get(name + CENSORED) or 0.0):
            return None
        hi = float(metrics[name + UPPER])
    except (KeyError, TypeError, ValueError):
        return None
    lo = metrics.get(name + LOWER)
    if lo:
        return f"{float(lo):.2f}-{hi:.2f} {unit}, not narrowed"
    return f"< {hi:.2f} {unit}"


def censored_upper(metrics: Mapping[str, Any], name: str = RATE) -> float | None:
    """The upper bound of a censored ``name`` in ``metrics`` (None: not censored)."""
    if censored_text(metrics, name) is None:
        return None
    return float(metrics[name + UPPER])


def _queue_root(p0: tuple[float, float], p1: tuple[float, float]) -> float | None:
    """Rate at which ``q(r) = a / (1 - r / c)`` through two (rate, q) points reaches 1, or
    None when they do not fit that shape (a queue's latency towards saturation)."""
    (r0, q0), (r1, q1) = sorted([p0, p1])
    if not (0 < q0 < q1 < math.inf) or r1 <= r0:
        return None
    c = (q0 * r0 - q1 * r1) / (q0 - q1)
    return c * (1 - q0 * (1 - r0 / c)) if c > r1 else None


def _saturated(lv: LoadLevel) -> bool:
    """The level was served well below the offered rate (the server was saturated)."""
    served = float(lv.metrics.get("request_throughput_req_s", 0.0))
    return not lv.met and 0 < served < 0.9 * lv.rate_req_s


def _capacity(levels: list[LoadLevel]) -> float | None:
    """The server's request capacity seen at saturated levels; None if a level passed above it."""
    caps = [float(lv.metrics["request_throughput_req_s"]) for lv in levels if _saturated(lv)]
    top_met = max((lv.rate_req_s for lv in levels if lv.met), default=0.0)
    return min(caps) if caps and min(caps) > top_met else None


def _metric_root(key: str, bound: float, met: list[LoadLevel], fail: LoadLevel, cap: float | None,
                 stale: tuple[int, int]) -> float | None:
    """Where metric ``key`` crosses ``bound``: a queueing fit through the two highest met
    levels, else a secant to the lowest failed level (when it was not saturated; Illinois:
    an end that stayed put for ``stale`` = (met, failed) levels has its excess halved that
    many times, so a one-sided approach speeds up), else the queueing shape through the
    highest met level and the saturation capacity."""
    best = met[-1]
    q0, qf = float(best.metrics[key]) / bound, float(fail.metrics[key]) / bound
    r0, rf = best.rate_req_s, fail.rate_req_s
    if len(met) >= 2:
        q_prev = float(met[-2].metrics[key]) / bound
        root = _queue_root((met[-2].rate_req_s, q_prev), (r0, q0))
        if root is not None and r0 < root < rf:
            return root
        if q0 <= 1.02 * q_prev and qf > 2:
            return None  # flat below, far above: a kink no model locates; bisect
    if not _saturated(fail) and 0 < q0 < 1 < qf < math.inf:
        if qf > 4:  # far above the bound: interpolate log q over log r (steep, queue-like)
            x0, xf = math.log(r0), math.log(rf)
            f0, ff = math.log(q0) * 0.5 ** stale[0], math.log(qf) * 0.5 ** stale[1]
            return math.exp(x0 + (xf - x0) * (-f0) / (ff - f0))
        f0, ff = (q0 - 1) * 0.5 ** stale[0], (qf - 1) * 0.5 ** stale[1]
        return r0 + (rf - r0) * (-f0) / (ff - f0)
    if cap is not None and cap > r0 and 0 < q0 < 1:
        return cap * (1 - q0 * (1 - r0 / cap))
    return None


def _guess(levels: list[LoadLevel], slo: Slo) -> float | None:
    """Predicted knee (req/s): the lowest crossing among the metrics that failed at the
    lowest failed level (the others are not what limits the rate there)."""
    met = sorted((lv for lv in levels if lv.met), key=lambda lv: lv.rate_req_s)
    fail = min((lv for lv in levels if not lv.met and lv.rate_req_s > met[-1].rate_req_s), key=lambda lv: lv.rate_req_s)
    cap = _capacity(levels)
    same = next((i for i, lv in enumerate(reversed(levels)) if lv.met != levels[-1].met), len(levels))
    stale = (0, same - 1) if levels[-1].met else (same - 1, 0)
    roots = []
    for key, bound in (("ttft_ms_p99", slo.ttft_ms_p99), ("tpot_ms_p99", slo.tpot_ms_p99)):
        try:
            if float(fail.metrics[key]) <= bound:
                continue
            root = _metric_root(key, bound, met, fail, cap, stale)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
        if root is not None and met[-1].rate_req_s < root < min(fail.rate_req_s, cap or math.inf):
            roots.append(root)  # never at or above the capacity: latency diverges there
    if roots:
        return min(roots)
    if cap is not None and met[-1].rate_req_s < cap < fail.rate_req_s:
        return math.sqrt(met[-1].rate_req_s * cap)  # the knee is below the capacity
    return None


def _bracket(levels: list[LoadLevel]) -> tuple[float, float] | None:
    """(highest met rate, lowest failed rate above it), or None without both."""
    met = [lv.rate_req_s for lv in levels if lv.met]
    if not met:
        return None
    fail = [lv.rate_req_s for lv in levels if not lv.met and lv.rate_req_s > max(met)]
    return (max(met), min(fail)) if fail else None


def _next_rate(levels: list[LoadLevel], slo: Slo, tol_log: float) -> float:
    """Next rate inside the bracket: the model's guess, or the (log) midpoint when there is
    none or the bracket is nearly closed."""
    r0, r1 = _bracket(levels)
    x0, x1 = math.log(r0), math.log(r1)
    width = x1 - x0
    g = None if width <= 2 * tol_log else _guess(levels, slo)
    if g is None:
        return math.exp((x0 + x1) / 2)
    # land just past the predicted knee, away from the side the last level moved, so the
    # next level can close the bracket from the other side; the step doubles each time the
    # same side moved again (the model keeps falling short)
    same = next((i for i, lv in enumerate(reversed(levels)) if lv.met != levels[-1].met), len(levels))
    step = 0.45 * tol_log * 2 ** max(0, same - 2)
    x = math.log(g) + (step if levels[-1].met else -step)
    return math.exp(min(max(x, x0 + 0.5 * tol_log), x1 - 0.5 * tol_log))


def max_rate_at_slo(
    measure: Callable[[float], Metrics],
    slo: Slo,
    *,
    rate_lo: float,
    rate_hi: float,
    incumbent_rate: float | None = None,
    max_levels: int = 6,
    rel_tol: float = 0.05,
) -> LoadSearchResult:
    """Search the highest request rate meeting ``slo`` (see the module docstring).

    Args:
        measure: runs one level at the offered rate (req/s) and returns its metrics
            (needs ``ttft_ms_p99`` and ``tpot_ms_p99``; ``completed``/``failed`` if present).
        slo: the per-level SLO.
        rate_lo, rate_hi: the searched range (req/s), 0 < lo < hi.
        incumbent_rate: the best config's ``max_rate_at_slo_req_s`` so far (clamped to the range).
        max_levels: level budget (>= 2).
        rel_tol: stop once the highest met and lowest failed rates are within this ratio.

    Raises:
        ValueError: bad range, budget or tolerance.
    """
    if not (0 < rate_lo < rate_hi and math.isfinite(rate_hi)):
        raise ValueError(f"need 0 < rate_lo < rate_hi < inf, got {rate_lo!r}, {rate_hi!r}")
    if max_levels < 2 or not rel_tol > 0:
        raise ValueError(f"need max_levels >= 2 and rel_tol > 0, got {max_levels!r}, {rel_tol!r}")
    tol_log = math.log1p(rel_tol)
    lo_x, hi_x = math.log(rate_lo), math.log(rate_hi)
    levels: list[LoadLevel] = []

    def run(x: float) -> bool:
        rate = math.exp(x)
        m = dict(measure(rate))
        levels.append(LoadLevel(rate, m, slo.ratio(m) <= 1.0))
        return levels[-1].met

    def result(**kw: bool) -> LoadSearchResult:
        best = max((lv.rate_req_s for lv in levels if lv.met), default=0.0)
        above = [lv.rate_req_s for lv in levels if not lv.met and lv.rate_req_s > best]
        return LoadSearchResult(best, min(above) if above else None, tuple(levels), rel_tol=rel_tol, **kw)

    first = (lo_x + hi_x) / 2 if incumbent_rate is None else min(max(math.log(incumbent_rate), lo_x), hi_x)
    if not run(first):
        if incumbent_rate is not None:
            return result(stopped_at_incumbent=True)
        if first <= lo_x or not run(lo_x):
            return result()
    elif incumbent_rate is None:
        if first >= hi_x or run(hi_x):
            return result(capped=True)
    else:
        # passed at the incumbent: double until a level fails (a rival of the incumbent sits
        # near it; rate_hi is usually far above and would waste levels bisecting down)
        x = first
        while True:
            if x >= hi_x:
                return result(capped=True)
            if len(levels) >= max_levels:
                return result()
            x = min(x + math.log(2.0), hi_x)
            if not run(x):
                break
    while len(levels) < max_levels:
        bracket = _bracket(levels)
        if bracket is None or bracket[1] <= bracket[0] * (1 + rel_tol):
            break
        run(math.log(_next_rate(levels, slo, tol_log)))
    return result()
