"""Driver-side glue of the serving-under-load objectives.

* :func:`with_incumbent`: the trial's bench carries the best ``max_rate_at_slo_req_s`` so far,
  so a candidate that fails the SLO at that rate stops its load search there
  (:func:`tasks.load_search.max_rate_at_slo`).
* :func:`derived`: per-GPU / per-user rates and ``cost_usd_per_mtok`` from ``node.gpu_hour_usd``
  (:func:`tasks.trial_load.derived_metrics`), added to every ok trial's metrics.
* :func:`mlflow_metric_keys`: the load metrics MLflow child runs carry;
  :func:`sweeps.findings.load.break_even_metrics` (re-exported): the parent run's break-even metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps import records as R
from sweeps.findings.load import break_even_metrics
from sweeps.objective import ObjectiveSet
from sweeps.study import SweepError
from tasks.trial_load import CURVE_KEYS, LEVEL_KEYS, derived_metrics
from tasks.types import BenchSpec

__all__ = ["break_even_metrics", "derived", "incumbent_rate", "mlflow_metric_keys", "trial_bench", "with_incumbent"]

RATE = "max_rate_at_slo_req_s"
#: what a load-search trial logs to MLflow beyond the objectives
LOAD_KEYS = (RATE, "goodput_req_s", "ttft_ms_p99", "tpot_ms_p99", "tpot_ms_p50", "slo_failed_at_req_s", "load_levels",
             "load_search_converged", "slo_attainment", "output_throughput_tok_s", "request_throughput_req_s",
             "output_tok_s_per_gpu", "tok_s_per_user", "cost_usd_per_mtok")


def incumbent_rate(records: Sequence[R.TrialRecord]) -> float | None:
    """The highest ``max_rate_at_slo_req_s`` an ok trial reached (None: none yet, or 0)."""
    vals = [float(r.metrics[RATE]) for r in records if r.status == "ok" and r.metrics.get(RATE)]
    return max(vals) if vals else None


def with_incumbent(bench: BenchSpec, records_fn: Any, objectives: ObjectiveSet) -> BenchSpec:
    """``bench`` with ``incumbent_rate`` set when the sweep maximises ``max_rate_at_slo_req_s``
    with a load search (``records_fn()`` -> the study's records; only called then)."""
    if bench.load_search is None or RATE not in objectives.names:
        return bench
    return dataclasses.replace(bench, incumbent_rate=incumbent_rate(records_fn()))


def trial_bench(drv: Any) -> BenchSpec:
    """The bench of the next trial the driver (:class:`sweeps.loop.Driver`) launches."""
    return with_incumbent(drv.spec.bench_spec(), lambda: R.load_records(drv.study), drv.objectives)


#: metrics the driver adds after :func:`derived` (the ratio to the baseline)
LATER_KEYS = frozenset({"speedup_vs_baseline"})


class ObjectiveMissing(SweepError):
    """A benchmarked trial logs no metric the objective (or a constraint) names (exit 2)."""

    exit_code = 2


def derived(metrics: Mapping[str, float], spec: Any) -> dict[str, float]:
    """``metrics`` plus :func:`tasks.trial_load.derived_metrics` for ``spec``'s GPUs per trial and
    ``node.gpu_hour_usd`` (existing keys win).

    Raises:
        ObjectiveMissing: ``metrics`` come from a benchmark (not empty) but lack a metric
            ``sweep.objective`` or ``sweep.objective_constraints`` names: a misspelled objective
            would otherwise rank nothing for the whole sweep.
    """
    out = {**derived_metrics(metrics, spec.gpus_per_trial, spec.node.gpu_hour_usd), **metrics}
    objs = spec.objective_set.objectives
    wanted = {o.name for o in objs} | {c.metric for o in objs for c in o.constraints}
    missing = sorted(wanted - set(out) - LATER_KEYS)
    if metrics and missing:
        raise ObjectiveMissing(f"sweep.objective / sweep.objective_constraints: {missing} is not a metric this "
                               f"sweep's trials log (the first benchmarked trial logged {sorted(out)}); fix the "
                               f"metric name (or set node.gpu_hour_usd for cost_usd_per_mtok) and run the same "
                               f"command again: nothing was ranked by it, so the study takes the fixed one")
    return out


def mlflow_metric_keys(bench: BenchSpec) -> set[str]:
    """Metric names a child run logs for this bench: :data:`LOAD_KEYS`, the curve levels
    (``load_<m>_L<i>``) and the per-concurrency ones (``<m>_c<N>``)."""
    keys = set(LOAD_KEYS)
    if bench.load_search is not None:
        for i in range(bench.load_search.max_levels):
            keys |= {f"load_rate_req_s_L{i}", f"load_met_L{i}", *(f"load_{k}_L{i}" for k in CURVE_KEYS)}
    for c in bench.concurrency_levels:
        keys |= {f"{name}_c{c}" for name in LEVEL_KEYS.values()}
    return keys
