"""How the findings and the plots read a sweep's objective off its records, and how they
word it: the metric's name and unit in headings, table columns and axes, "x the baseline"
as the objective's ratio (a latency halved is 2x better).

The record helpers are ``sweeps.store.records``' (value of a trial, the baseline's value, the best
trial) with the :class:`~sweeps.config.objective.Objective` always passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sweeps.config.objective import Objective, ObjectiveSet
from sweeps.publish.findings.text import fmt
from sweeps.store import records as trial_records

# The unit of a metric, read off its name's suffix (the metric keys trials log:
# tasks.types / sweeps.store.records.TrialRecord.metrics). First match wins.
_UNIT_SUFFIXES = (("_tok_s", "tok/s"), ("tok_s_per_user", "tok/s"), ("_req_s", "req/s"), ("_usd_per_mtok", "$/Mtok"),
                  ("_ms", "ms"), ("_s", "s"), ("accept_length", "tokens"))
# The default objective. Its wording is kept from the decode-throughput findings ("88.0
# tok/s", "best tok/s"), and a data-block entry without "objective" measured it.
DECODE = "decode_tok_s"


def objective_of(spec: Any) -> Objective:
    """The primary objective of a :class:`~sweeps.config.spec.SweepSpec`: its ``objective_set``
    when it has one, else built from ``sweep.objective`` / ``sweep.direction`` (and
    ``sweep.objective_constraints`` when declared).

    Raises:
        ValueError: the direction or a constraint does not parse (from
            :meth:`ObjectiveSet.from_config`).
    """
    oset = getattr(spec, "objective_set", None)
    if isinstance(oset, ObjectiveSet):
        return oset.primary
    sw = spec.sweep
    return ObjectiveSet.from_config(sw.objective, getattr(sw, "direction", "maximize"),
                                    getattr(sw, "objective_constraints", None) or ()).primary


def unit(name: str) -> str:
    """The unit of metric ``name`` ('' when its name does not say): ``decode_tok_s`` ->
    ``tok/s``, ``ttft_ms_p50`` -> ``ms``, ``accept_length`` -> ``tokens``."""
    for suffix, u in _UNIT_SUFFIXES:
        if name.endswith(suffix) or f"{suffix}_" in name:
            return u
    return ""


def value_of(r: trial_records.TrialRecord, obj: Objective) -> float | None:
    """The objective's value of an ok trial, else None (:func:`sweeps.store.records.value_of`)."""
    return trial_records.value_of(r, obj)


def baseline_value(records: Sequence[trial_records.TrialRecord], obj: Objective) -> float | None:
    """The baseline's objective measured in this study, or None (:func:`sweeps.store.records.baseline_value`)."""
    return trial_records.baseline_value(list(records), obj)


def best_record(records: Sequence[trial_records.TrialRecord], obj: Objective) -> trial_records.TrialRecord | None:
    """The ok, launched trial with the best objective that ran the path it names and meets
    the objective's constraints, or None (:func:`sweeps.store.records.best_record`)."""
    return trial_records.best_record(list(records), obj)


def best_value(values: Sequence[float | None], obj: Objective) -> float | None:
    """The best of ``values`` (None ignored), or None."""
    return obj.best(values, lambda v: v)


def ratio(v: float | None, base: float | None, obj: Objective) -> float | None:
    """``obj.ratio(v, base)`` (>1 = better than the baseline), or None when either is
    missing or the ratio's denominator is 0."""
    if v is None or not base or (not obj.maximize and not v):
        return None
    return obj.ratio(v, base)


def column(obj: Objective) -> str:
    """The objective in a table header: ``tok/s`` for decode throughput (``best tok/s``),
    else the metric and its unit (``ttft_ms_p50 (ms)``)."""
    if obj.name == DECODE:
        return "tok/s"
    u = unit(obj.name)
    return f"{obj.name} ({u})" if u else obj.name


def axis(obj: Objective) -> str:
    """The objective on a plot axis: ``decode tok/s`` or ``ttft_ms_p50 (ms, lower is better)``."""
    if obj.name == DECODE:
        return "decode tok/s"
    u = unit(obj.name)
    better = "higher" if obj.maximize else "lower"
    return f"{obj.name} ({u + ', ' if u else ''}{better} is better)"


def wording(obj: Objective) -> str:
    """The objective in prose: ``decode tok/s`` or ``ttft_ms_p50``."""
    return "decode tok/s" if obj.name == DECODE else obj.name


def value_text(v: float | None, obj: Objective, nd: int = 1) -> str:
    """``88.0 tok/s``, ``412.0 ms`` (an en dash when missing)."""
    u = unit(obj.name)
    return f"{fmt(v, nd)} {u}" if u and v is not None else fmt(v, nd)


def versus_baseline(obj: Objective) -> str:
    """What the ratio is of: ``the baseline`` (throughput: value / baseline) or ``better
    than the baseline`` (minimised: baseline / value)."""
    return "the baseline" if obj.maximize else "better than the baseline"


def slower(obj: Objective) -> str:
    """The word for "worse than the baseline" (``slower`` for speed and latency metrics)."""
    return "slower" if unit(obj.name) in ("tok/s", "ms", "s") else "worse"


def describe(obj: Objective) -> str:
    """One line naming the objective, its direction, unit and constraints."""
    u = unit(obj.name)
    cons = "; constraints: " + ", ".join(f"`{c}`" for c in obj.constraints) if obj.constraints else ""
    return f"Objective: `{obj.name}` ({obj.direction}{', ' + u if u else ''}){cons}."
