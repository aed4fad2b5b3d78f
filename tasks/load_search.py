"""``max_rate_at_slo_req_s``: the highest offered request rate whose p99 TTFT and p99 TPOT
stay within the SLO, found by a bounded search over load levels on one running server.

The caller passes ``measure(rate) -> metrics`` (a closure that runs one load level against
the live server, or the instant-mode simulation, and returns
:func:`tasks.serving_metrics.summarize`'s dict), so every level reuses the same server.

Search (at most ``max_levels`` levels, stop when the bracket is within ``rel_tol``):

1. The first level is the incumbent's rate when there is one, else the geometric middle of
   ``[rate_lo, rate_hi]``. A candidate that fails at the incumbent's rate cannot beat it:
   it stops there (``stopped_at_incumbent``), reporting the highest rate it met (0: none).
2. Then the opposite end of the range (``rate_hi`` after a pass, ``rate_lo`` after a
   failure) brackets the knee; passing at ``rate_hi`` reports it (``capped``: the true
   value is at least that), failing at ``rate_lo`` reports 0.
3. Inside the bracket (highest met, lowest failed rate), each level is placed at a
   predicted knee, nudged by half the tolerance away from the side that moved last so the
   next level can close the bracket from the other side (the nudge doubles when the same
   side keeps moving). The prediction, for each p99 metric that failed at the lowest
   failed level: a queueing fit ``a / (1 - r / c)`` through the two highest met levels;
   else a secant to the failed level (log-log when it is far above the bound; Illinois:
   an end that stayed put is down-weighted) when that level was not saturated; else the
   queueing shape through the highest met level and the capacity a saturated level served
   (``request_throughput_req_s`` well below the offered rate). Never at or above that
   capacity; a log midpoint when nothing predicts (e.g. flat below a kink).

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

Metrics = Mapping[str, float]


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
    """

    max_rate_at_slo_req_s: float
    failed_at_req_s: float | None
    levels: tuple[LoadLevel, ...] = field(default_factory=tuple)
    stopped_at_incumbent: bool = False
    capped: bool = False

    def converged(self, rel_tol: float = 0.05) -> bool:
        """The knee is bracketed within ``rel_tol`` (or pinned to a bound)."""
        if self.capped or self.failed_at_req_s is None:
            return self.capped
        if self.max_rate_at_slo_req_s <= 0:
            return False
        return self.failed_at_req_s <= self.max_rate_at_slo_req_s * (1 + rel_tol)

    def metrics(self) -> dict[str, float]:
        """What a trial logs: ``max_rate_at_slo_req_s``, ``slo_failed_at_req_s`` (0: none
        failed), ``load_levels``, ``load_search_converged`` (1/0), and the metrics of the
        highest level that met the SLO (or of the lowest level measured when none did), e.g.
        ``ttft_ms_p99``, ``tpot_ms_p99``, ``goodput_req_s``."""
        met = [lv for lv in self.levels if lv.met]
        shown = max(met, key=lambda lv: lv.rate_req_s) if met else min(self.levels, key=lambda lv: lv.rate_req_s)
        return {**{k: float(v) for k, v in shown.metrics.items()},
                "max_rate_at_slo_req_s": self.max_rate_at_slo_req_s,
                "slo_failed_at_req_s": self.failed_at_req_s or 0.0,
                "load_levels": float(len(self.levels)), "load_search_converged": float(self.converged())}

    def curve(self) -> list[tuple[float, Metrics]]:
        """(rate, metrics) of every level, by rate: the throughput–latency curve."""
        return [(lv.rate_req_s, lv.metrics) for lv in sorted(self.levels, key=lambda lv: lv.rate_req_s)]


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
        return LoadSearchResult(best, min(above) if above else None, tuple(levels), **kw)

    first = (lo_x + hi_x) / 2 if incumbent_rate is None else min(max(math.log(incumbent_rate), lo_x), hi_x)
    if not run(first):
        if incumbent_rate is not None:
            return result(stopped_at_incumbent=True)
        if first <= lo_x or not run(lo_x):
            return result()
    elif first >= hi_x or run(hi_x):
        return result(capped=True)
    while len(levels) < max_levels:
        bracket = _bracket(levels)
        if bracket is None or bracket[1] <= bracket[0] * (1 + rel_tol):
            break
        run(math.log(_next_rate(levels, slo, tol_log)))
    return result()
