"""One consistent "best" and one baseline for the whole document.

Where the winner confirmation ran (study user attribute ``confirmation``,
:func:`sweeps.search.confirm.summarize`), every sentence quotes the confirmed means (fresh
repeats), never a single sweep measurement the Confirmation section says did not hold
up; a value that was never re-measured is labelled "single measurement".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.findings.text import fmt
from sweeps.store import records


@dataclass(frozen=True)
class Measured:
    """A value of the objective and how it was measured.

    Attributes:
        value: the objective's value (its unit), or None.
        trial: the trial it belongs to (None for a median of several baseline runs).
        n: number of fresh confirmation runs (0: a sweep measurement).
        ci: the confirmation's 95 % interval (low, high), or None.
    """

    value: float | None
    trial: int | None = None
    n: int = 0
    ci: tuple[float, float] | None = None

    @property
    def confirmed(self) -> bool:
        """True when the value is a confirmation mean over fresh runs."""
        return self.n > 0

    def how(self) -> str:
        """``confirmed mean of 3 fresh runs, 95 % CI 86.0–93.9`` or ``single measurement``."""
        if not self.confirmed:
            return "single measurement"
        ci = f", 95 % CI {fmt(self.ci[0])}–{fmt(self.ci[1])}" if self.ci else ""
        return f"confirmed mean of {self.n} fresh run{'s' if self.n != 1 else ''}{ci}"

    def text(self, obj: Objective) -> str:
        """``89.9 tok/s (confirmed mean of 3 fresh runs, ...)``."""
        return f"{measure.value_text(self.value, obj)} ({self.how()})"


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def entry_for(conf: Mapping[str, Any] | None, trial: int | None) -> Mapping[str, Any] | None:
    """The confirmation entry of ``trial`` with at least one ok re-run, or None."""
    for e in (conf or {}).get("entries", []):
        if e.get("trial") == trial and e.get("n") and _finite(e.get("mean")) is not None:
            return e
    return None


def measured(r: records.TrialRecord, conf: Mapping[str, Any] | None, obj: Objective) -> Measured:
    """``r``'s value: its confirmed mean where it was re-measured, else its sweep measurement."""
    e = entry_for(conf, r.number)
    if e is not None:
        lo, hi = _finite(e.get("ci_low")), _finite(e.get("ci_high"))
        return Measured(_finite(e["mean"]), r.number, int(e["n"]), (lo, hi) if lo is not None and hi is not None else None)
    return Measured(measure.value_of(r, obj), r.number)


def baseline_measured(recs: Sequence[records.TrialRecord], conf: Mapping[str, Any] | None, obj: Objective) -> Measured:
    """The document's one baseline: the confirmation's baseline mean where it re-measured the
    baseline, else the median of the baseline's ok runs in this sweep (``Measured(None)``
    when it has none)."""
    bt = (conf or {}).get("baseline_trial")
    e = entry_for(conf, bt) if bt is not None else None
    if e is not None:
        r = next((x for x in recs if x.number == bt), None)
        if r is not None:
            return measured(r, conf, obj)
        return Measured(_finite(e["mean"]), bt, int(e["n"]))
    runs = [r for r in recs if r.is_baseline and measure.value_of(r, obj) is not None]
    return Measured(measure.baseline_value(recs, obj), runs[0].number if len(runs) == 1 else None)


def best_of(recs: Sequence[records.TrialRecord], conf: Mapping[str, Any] | None, obj: Objective) -> records.TrialRecord | None:
    """The best of ``recs`` (rankable trials) judging each by :func:`measured`."""
    cands = [r for r in recs if records.rankable(r, obj) and measured(r, conf, obj).value is not None]
    return obj.best(cands, lambda r: measured(r, conf, obj).value) if cands else None
