"""Driver-side glue of the serving-under-load objectives.

* :func:`with_incumbent`: the trial's bench carries the best ``max_rate_at_slo_req_s`` so far,
  so a candidate that fails the SLO at that rate stops its load search there
  (:func:`tasks.load_search.max_rate_at_slo`).
* :func:`derived`: per-GPU / per-user rates and ``cost_usd_per_mtok`` from ``node.gpu_hour_usd``
  (:func:`tasks.trial_load.derived_metrics`), added to every ok trial's metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from sweeps.config.objective import DRIVER_METRICS, ObjectiveSet
from sweeps.config.spec import SweepSpec
from sweeps.errors import ConfigurationError, SweepError
from sweeps.store import records as trial_records
from tasks.load_search import RATE, censored_text
from tasks.trial_load import derived_metrics
from tasks.types import BenchSpec

__all__ = ["RATE", "derived", "incumbent_rate", "trial_bench", "with_incumbent"]


def incumbent_rate(records: Sequence[trial_records.TrialRecord]) -> float | None:
    """The highest ``max_rate_at_slo_req_s`` an ok trial reached (None: none yet, or 0); a
    censored trial logs no rate (only bounds), so it never becomes the incumbent."""
    vals = [float(r.metrics[RATE]) for r in records if r.status == "ok" and r.metrics.get(RATE)]
    return max(vals) if vals else None


def with_incumbent(bench: BenchSpec, records_fn: Any, objectives: ObjectiveSet) -> BenchSpec:
    """``bench`` with ``incumbent_rate`` set when the sweep maximises ``max_rate_at_slo_req_s``
    with a load search (``records_fn()`` -> the study's records; only called then)."""
    if bench.load_search is None or RATE not in objectives.names:
        return bench
    return dataclasses.replace(bench, incumbent_rate=incumbent_rate(records_fn()))


def trial_bench(spec: SweepSpec, study: optuna.Study, objectives: ObjectiveSet) -> BenchSpec:
    """The bench of the next trial a sweep of ``spec`` over ``study`` launches (:func:`with_incumbent`)."""
    return with_incumbent(spec.bench_spec(), lambda: trial_records.load_records(study), objectives)


#: metrics the driver adds after :func:`derived` (the ratio to the baseline)
LATER_KEYS = DRIVER_METRICS


class ObjectiveMissing(ConfigurationError, SweepError):
    """A benchmarked trial logs no metric the objective (or a constraint) names (exit 2)."""


def derived(metrics: Mapping[str, float], spec: Any) -> dict[str, float]:
    """``metrics`` plus :func:`tasks.trial_load.derived_metrics` for ``spec``'s GPUs per trial and
    ``node.gpu_hour_usd`` (existing keys win).

    Raises:
        ObjectiveMissing: ``metrics`` come from a benchmark (not empty) but lack a metric
            ``sweep.objective`` or ``sweep.objective_constraints`` names (a censored value,
            :func:`tasks.load_search.censored_text`, is not missing): a misspelled objective
            would otherwise rank nothing for the whole sweep.
    """
    out = {**derived_metrics(metrics, spec.gpus_per_trial, spec.node.gpu_hour_usd), **metrics}
    objs = spec.objective_set.objectives
    wanted = {o.name for o in objs} | {c.metric for o in objs for c in o.constraints}
    # a censored load search logs the objective's bounds instead of a value it did not measure
    missing = sorted(n for n in wanted - set(out) - LATER_KEYS if censored_text(out, n) is None)
    if metrics and missing:
        raise ObjectiveMissing(f"sweep.objective / sweep.objective_constraints: {missing} is not a metric this "
                               f"sweep's trials log (the first benchmarked trial logged {sorted(out)}); fix the "
                               f"metric name (or set node.gpu_hour_usd for cost_usd_per_mtok) and run the same "
                               f"command again: nothing was ranked by it, so the study takes the fixed one")
    return out
