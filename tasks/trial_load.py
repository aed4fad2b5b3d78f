"""Serving-under-load measurements inside a real-server trial (the server already healthy).

:func:`run_load` runs what the trial's :class:`tasks.types.BenchSpec` asks beyond the fixed
benchmark, reusing the running server for every level:

* ``load_search``: :func:`tasks.load_search.max_rate_at_slo` with a ``measure(rate)`` closure
  that offers ``bench.workload`` at that rate (:func:`tasks.load_client.run_level`); the trial
  gets :meth:`tasks.load_search.LoadSearchResult.metrics` (``max_rate_at_slo_req_s``, or its
  censored bounds, ``goodput_req_s``, ``ttft_ms_p99``, ``tpot_ms_p99``, ``slo_failed_at_req_s``,
  ``load_levels``, ...), and the curve (every level's rate and metrics) goes to the artifact.
* ``concurrency_levels``: the workload closed-loop at each level, metrics keyed
  ``<metric>_c<N>`` (``output_tok_s_c16``, ``tpot_ms_p50_c16``, ...; no ``@``: MLflow metric
  names allow letters, digits, ``_ - . / :`` and spaces only).

:func:`derived_metrics` adds per-GPU / per-user rates and the cost per million output tokens.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any, get_args

from tasks.load_client import Api, Target, run_level
from tasks.load_search import RESULT_KEYS, Slo, max_rate_at_slo
from tasks.types import BenchSpec, SloSpec
from tasks.workloads import Workload, parse_workload

log = logging.getLogger(__name__)

#: the per-level metrics logged per concurrency (<name>_c<N>), renamed from summarize's keys
LEVEL_KEYS = {"output_throughput_tok_s": "output_tok_s", "request_throughput_req_s": "request_req_s",
              "tpot_ms_p50": "tpot_ms_p50", "ttft_ms_p50": "ttft_ms_p50", "itl_ms_p50": "itl_ms_p50",
              "tpot_ms_p99": "tpot_ms_p99", "ttft_ms_p99": "ttft_ms_p99"}


#: what :func:`tasks.serving_metrics.summarize` returns for one load level (``{ttft,tpot,itl,
#: itl_chunk,e2e_latency}_ms_{mean,p50,p90,p99}`` and the counts/rates), plus the two keys
#: :func:`tasks.load_client.run_level` adds; with SLOs also :data:`LEVEL_SLO_KEYS`.
LEVEL_SUMMARY_KEYS = frozenset({
    "completed", "failed", "duration_s", "request_throughput_req_s", "input_throughput_tok_s",
    "output_throughput_tok_s", "total_throughput_tok_s", "concurrency", "offered_rate_req_s",
    *(f"{m}_ms_{s}" for m in ("ttft", "tpot", "itl", "itl_chunk", "e2e_latency") for s in ("mean", "p50", "p90", "p99")),
})
#: the goodput keys of a level measured against SLOs (``slo_attainment_<ttft|tpot|e2el>``)
LEVEL_SLO_KEYS = frozenset({"goodput_req_s", "slo_attainment", "slo_attainment_ttft", "slo_attainment_tpot",
                            "slo_attainment_e2el"})
#: what :meth:`tasks.load_search.LoadSearchResult.metrics` adds to the shown level's metrics (a
#: censored result logs ``max_rate_at_slo_req_s_upper`` / ``_lower`` / ``_censored`` instead of the rate)
SEARCH_KEYS = RESULT_KEYS
#: what :func:`derived_metrics` can add (``cost_usd_per_mtok`` only with a GPU-hour price)
DERIVED_KEYS = frozenset({"output_tok_s_per_gpu", "tok_s_per_user", "cost_usd_per_mtok"})


def load_metric_names(bench: BenchSpec) -> frozenset[str]:
    """Every metric name :func:`run_load` (or the instant model's ``simulate_load``) can add to a
    trial for ``bench``: the load search's (:data:`SEARCH_KEYS`, the shown level's
    :data:`LEVEL_SUMMARY_KEYS` / :data:`LEVEL_SLO_KEYS` and the curve ``load_rate_req_s_L<i>``,
    ``load_met_L<i>``, ``load_<m>_L<i>`` for ``i < load_search.max_levels``) and the concurrency
    levels' ``<m>_c<N>``; empty for a bench that asks for neither."""
    out: set[str] = set()
    if bench.load_search is not None:
        out |= SEARCH_KEYS | LEVEL_SUMMARY_KEYS | LEVEL_SLO_KEYS
        for i in range(bench.load_search.max_levels):
            out |= {f"load_rate_req_s_L{i}", f"load_met_L{i}", *(f"load_{k}_L{i}" for k in CURVE_KEYS)}
    for c in bench.concurrency_levels:
        out |= {f"{name}_c{c}" for name in LEVEL_KEYS.values()}
    return frozenset(out)


def slo_ms(slo: SloSpec | None) -> dict[str, float] | None:
    """The per-request goodput SLOs (``sglang/benchmark/goodput.py`` keys ``ttft``, ``tpot``,
    ``e2el``, ms) of an :class:`tasks.types.SloSpec`, or None."""
    if slo is None:
        return None
    out = {"ttft": slo.ttft_ms_p99, "tpot": slo.tpot_ms_p99}
    if slo.e2e_ms is not None:
        out["e2el"] = slo.e2e_ms
    return out


def workload_of(bench: BenchSpec) -> Workload:
    """The bench's workload (validated again: it crossed a process boundary as a mapping).

    Raises:
        ValueError: no workload, or an invalid one (names ``bench.workload.<field>``).
    """
    if bench.workload is None:
        raise ValueError("bench.workload is not set")
    return parse_workload(bench.workload, where="bench.workload")


def wants_load(bench: BenchSpec) -> bool:
    """True when the bench asks for a load search or concurrency levels."""
    return bench.workload is not None and (bench.load_search is not None or bool(bench.concurrency_levels))


def _level_deadline(deadline_at: float | None) -> float | None:
    """Time left for a level, s; once the bench budget is spent a level sends nothing and fails
    (so the search ends with the levels it measured) instead of overrunning the trial."""
    if deadline_at is None:
        return None
    left = deadline_at - time.monotonic()
    if left <= 0:
        log.warning("the trial's benchmark time (backend.timeouts.bench_s) ran out during the load levels")
    return max(left, 1e-3)


def search_rate(target: Target, bench: BenchSpec, deadline_at: float | None = None) -> tuple[dict[str, float], dict]:
    """The in-trial load search: ``(metrics, artifact)``; ``artifact["levels"]`` is the curve
    (``[{"rate_req_s", "met", "metrics"}, ...]`` by rate).

    A level after the bench deadline (``time.monotonic()`` value) sends nothing and fails.
    """
    w, ls, slo = workload_of(bench), bench.load_search, bench.slo
    slos = slo_ms(slo)
    levels_sent = 0

    def measure(rate: float) -> dict[str, float]:
        nonlocal levels_sent
        levels_sent += 1
        m, _ = run_level(target, w.at_rate(rate), slos_ms=slos, seed=bench.seed, level=levels_sent,
                         request_timeout_s=bench.request_timeout_s, deadline_s=_level_deadline(deadline_at))
        log.info("load level %.3f req/s: goodput_req_s=%.3f ttft_ms_p99=%.1f tpot_ms_p99=%.2f", rate,
                 m.get("goodput_req_s", 0.0), m.get("ttft_ms_p99", math.nan), m.get("tpot_ms_p99", math.nan))
        return m

    res = max_rate_at_slo(measure, Slo(slo.ttft_ms_p99, slo.tpot_ms_p99), rate_lo=ls.rate_lo, rate_hi=ls.rate_hi,
                          incumbent_rate=bench.incumbent_rate, max_levels=ls.max_levels, rel_tol=ls.rel_tol)
    metrics = res.metrics()
    met = {lv.rate_req_s: lv.met for lv in res.levels}
    curve = [{"rate_req_s": r, "met": met[r], "metrics": dict(m)} for r, m in res.curve()]
    return metrics, {"kind": "load_search", "slo": vars(slo), "stopped_at_incumbent": res.stopped_at_incumbent,
                     "capped": res.capped, "censored": res.censored, "bracket_rel": res.bracket_rel, "levels": curve,
                     "prompt_sets": levels_sent}


def sweep_concurrency(target: Target, bench: BenchSpec, deadline_at: float | None = None,
                      first_level: int = 1) -> tuple[dict[str, float], dict]:
    """The closed-loop levels: ``(metrics keyed <metric>_c<N>, artifact with every level)``.

    A level after the bench deadline sends nothing and fails. ``first_level``: the number of the
    first level on this server (levels already sent to it used the ones below; each has its own
    prompts, :func:`tasks.load_client.prompt_ids`).
    """
    w = workload_of(bench)
    metrics: dict[str, float] = {}
    levels = []
    for level, c in enumerate(bench.concurrency_levels, start=first_level):
        m, _ = run_level(target, w.at_concurrency(c), slos_ms=slo_ms(bench.slo), seed=bench.seed, level=level,
                         request_timeout_s=bench.request_timeout_s, deadline_s=_level_deadline(deadline_at))
        for src, name in LEVEL_KEYS.items():
            if src in m:
                metrics[f"{name}_c{c}"] = float(m[src])
        levels.append({"concurrency": c, "metrics": m})
        log.info("concurrency %d: output_tok_s=%.1f tpot_ms_p50=%.2f", c, m["output_throughput_tok_s"],
                 m["tpot_ms_p50"])
    return metrics, {"kind": "concurrency", "levels": levels, "prompt_sets": len(levels)}


def run_load(base_url: str, api: str, bench: BenchSpec,
             deadline_s: float | None = None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Everything :func:`wants_load` asks, against ``base_url`` (``api``: ``sglang`` or
    ``openai``): ``(metrics, artifacts)`` (one artifact per part, JSON-able).

    Raises:
        ValueError: a bad workload, or another ``api``. Levels past ``deadline_s`` (s from now)
            send nothing and fail.
    """
    if api not in get_args(Api):
        raise ValueError(f"api={api!r}: use one of {list(get_args(Api))}")
    target = Target(base_url, api)  # type: ignore[arg-type]
    deadline_at = time.monotonic() + deadline_s if deadline_s else None
    metrics: dict[str, float] = {}
    arts: list[dict[str, Any]] = []
    if bench.load_search is not None and bench.slo is not None:
        m, a = search_rate(target, bench, deadline_at)
        metrics |= m
        arts.append(a)
    if bench.concurrency_levels:
        m, a = sweep_concurrency(target, bench, deadline_at,
                                 first_level=1 + sum(x["prompt_sets"] for x in arts))
        metrics |= m
        arts.append(a)
    return metrics, arts


def derived_metrics(metrics: Mapping[str, float], gpus: int, gpu_hour_usd: float | None = None) -> dict[str, float]:
    """Rates per GPU / per user and cost, from a trial's metrics.

    * ``output_tok_s_per_gpu`` = ``output_tok_s`` (else ``output_throughput_tok_s``) / gpus.
    * ``tok_s_per_user`` = 1000 / ``tpot_ms_p50`` (one request's decode speed, tok/s), else
      ``decode_tok_s`` (batch 1: the single user's rate).
    * ``cost_usd_per_mtok`` = gpu_hour_usd × gpus / 3600 / output tok/s × 1e6 ($ per million
      output tokens at that throughput), only with a price.
    """
    out: dict[str, float] = {}
    tput = metrics.get("output_tok_s", metrics.get("output_throughput_tok_s"))
    if tput is not None and math.isfinite(tput) and tput > 0:
        out["output_tok_s_per_gpu"] = float(tput) / max(1, gpus)
        if gpu_hour_usd:
            out["cost_usd_per_mtok"] = gpu_hour_usd * gpus / 3600.0 / float(tput) * 1e6
    tpot = metrics.get("tpot_ms_p50")
    if tpot is not None and math.isfinite(tpot) and tpot > 0:
        out["tok_s_per_user"] = 1000.0 / float(tpot)
    elif metrics.get("decode_tok_s"):
        out["tok_s_per_user"] = float(metrics["decode_tok_s"])
    return out


def curve_metrics(artifact: Mapping[str, Any]) -> dict[str, float]:
    """A load search's levels as flat metrics, by rate: ``load_rate_req_s_L<i>`` and
    ``load_<m>_L<i>`` for ``m`` in :data:`CURVE_KEYS` (what the throughput–latency plot reads
    from the records; i = 0 is the lowest rate)."""
    out: dict[str, float] = {}
    for i, lv in enumerate(artifact.get("levels") or []):
        out[f"load_rate_req_s_L{i}"] = float(lv["rate_req_s"])
        out[f"load_met_L{i}"] = float(bool(lv["met"]))
        for k in CURVE_KEYS:
            if k in lv["metrics"]:
                out[f"load_{k}_L{i}"] = float(lv["metrics"][k])
    return out


#: per-level metrics kept in the curve
CURVE_KEYS = ("output_throughput_tok_s", "request_throughput_req_s", "goodput_req_s", "ttft_ms_p99", "tpot_ms_p99",
              "tpot_ms_p50")


def with_load(api: str, base_url: str, bench: BenchSpec, metrics: dict[str, float], records: list[dict[str, Any]],
              started_at: float, deadline_s: float | None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The trial's fixed-benchmark ``(metrics, records)`` plus :func:`run_load`'s through ``api``
    (the backend's ``Backend.load_api``; the curve as :func:`curve_metrics`; each artifact
    appended to the records as ``{"load": artifact}``).
    ``started_at``: ``time.monotonic()`` when the benchmark began; ``deadline_s`` its budget.

    Levels past the bench budget send nothing and fail (see :func:`run_load`).
    """
    left = None if deadline_s is None else max(1e-3, deadline_s - (time.monotonic() - started_at))
    m, arts = run_load(base_url, api, bench, left)
    out = {**metrics, **m}
    for a in arts:
        if a["kind"] == "load_search":
            out |= curve_metrics(a)
    return out, [*records, *({"load": a} for a in arts)]
