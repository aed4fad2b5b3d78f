"""Instant mode under load: a workload through the same batching scheduler and step times the
emulated server serves with, simulated (no server, no sleeps).

``simulate_load(profile, argv, env, bench, seed)`` takes a healthy launch and the
benchmark's ``workload`` / ``slo`` / ``load_search`` / ``concurrency_levels``
(:class:`tasks.types.BenchSpec`) and returns per-level metrics
(:func:`tasks.serving_metrics.summarize`, SGLang 0.5.23's definitions):

* ``load_search`` + ``slo``: :func:`tasks.load_search.max_rate_at_slo` with a measure
  closure over :func:`tasks.emulator.batch_sim.simulate` (the whole search of a goodput
  trial): ``max_rate_at_slo_req_s``, ``goodput_req_s``, ``ttft_ms_p99``, ``tpot_ms_p99``, ...
  of the highest level that met the SLO (:meth:`LoadSearchResult.metrics`);
* ``concurrency_levels``: one closed-loop level per entry, metrics keyed ``<metric>_c<N>``.

The metric keys and artifact shapes are those of :mod:`tasks.trial_load` (a live server's).

Each request reaches the scheduler ``http_overhead_ms`` after it is sent, as on the server.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.emulator.batch_sim import simulate
from tasks.emulator.engine import accept_model, scheduler_config
from tasks.emulator.launch import LaunchConfig, parse_launch
from tasks.emulator.model import evaluate
from tasks.emulator.prediction import Prediction
from tasks.emulator.scheduler import AcceptModel, SchedulerConfig
from tasks.emulator.steptime import StepModel
from tasks.load_search import Slo, max_rate_at_slo
from tasks.serving_metrics import summarize
from tasks.trial_load import LEVEL_KEYS, curve_metrics, slo_ms, workload_of
from tasks.types import BenchSpec
from tasks.workloads import Workload, build_requests


@dataclass
class LoadModel:
    """What a healthy launch serves with: step times, batching config, EAGLE acceptance."""

    launch: LaunchConfig
    pred: Prediction
    steps: StepModel
    config: SchedulerConfig
    accept: AcceptModel | None
    http_overhead_s: float

    def level(self, workload: Workload, slos_ms: Mapping[str, float] | None = None) -> dict[str, float]:
        """One load level: the workload's requests through the scheduler; its metrics
        (``duration_s`` = first send -> last end)."""
        plan = build_requests(workload)
        res = simulate(plan.requests, self.config, self.steps.step_time_s, max_concurrency=plan.max_concurrency,
                       accept=self.accept, submit_delay_s=self.http_overhead_s)
        return summarize(res.records(), res.duration_s, slos_ms=slos_ms)


def load_model(profile: dict, argv: list[str], env: dict, seed: int = 0) -> LoadModel | None:
    """The :class:`LoadModel` of a launch (the profile's seed replaced by ``seed``), or None
    when the launch fails (see :func:`tasks.emulator.instant.simulate` for its failure)."""
    prof = copy.deepcopy(profile)
    prof["emulator"]["seed"] = int(seed)
    launch = parse_launch(argv, env, sglang_version=str(prof["emulator"]["sglang_version"]))
    pred = evaluate(prof, launch)
    if pred.outcome != "ok":
        return None
    http_s = float(prof["node"]["emulator"]["startup"]["http_overhead_ms"]) / 1000.0
    return LoadModel(launch, pred, StepModel(prof, launch, pred), scheduler_config(launch, pred),
                     accept_model(pred, int(seed)), http_s)


def simulate_load(profile: dict, argv: list[str], env: dict, bench: BenchSpec,
                  seed: int = 0) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """What :func:`tasks.trial_load.run_load` measures on a live server, simulated:
    ``(metrics, artifacts)`` with the same keys and shapes (load search: its
    :meth:`LoadSearchResult.metrics` plus :func:`tasks.trial_load.curve_metrics`; concurrency
    levels: ``<metric>_c<N>``); each artifact also has ``bench_s``, its levels' modelled wall time.

    Args:
        profile, argv, env, seed: as :func:`tasks.emulator.instant.simulate`.
        bench: with ``workload`` and ``load_search`` + ``slo`` and/or ``concurrency_levels``.

    Raises:
        ValueError: no workload, a launch that does not serve, or a bad workload.
    """
    w = workload_of(bench)
    lm = load_model(profile, argv, env, seed)
    if lm is None:
        raise ValueError("the launch does not serve (instant.simulate reports its failure)")
    slos = slo_ms(bench.slo)
    metrics: dict[str, float] = {}
    arts: list[dict[str, Any]] = []
    if bench.load_search is not None and bench.slo is not None:
        ls, slo = bench.load_search, bench.slo
        res = max_rate_at_slo(lambda rate: lm.level(w.at_rate(rate), slos), Slo(slo.ttft_ms_p99, slo.tpot_ms_p99),
                              rate_lo=ls.rate_lo, rate_hi=ls.rate_hi, incumbent_rate=bench.incumbent_rate,
                              max_levels=ls.max_levels, rel_tol=ls.rel_tol)
        met = {lv.rate_req_s: lv.met for lv in res.levels}
        art = {"kind": "load_search", "slo": vars(slo), "stopped_at_incumbent": res.stopped_at_incumbent,
               "capped": res.capped,
               "levels": [{"rate_req_s": r, "met": met[r], "metrics": dict(m)} for r, m in res.curve()]}
        metrics |= res.metrics() | curve_metrics(art)
        arts.append(art)
    if bench.concurrency_levels:
        levels = []
        for c in bench.concurrency_levels:
            m = lm.level(w.at_concurrency(int(c)), slos)
            metrics |= {f"{name}_c{c}": float(m[src]) for src, name in LEVEL_KEYS.items() if src in m}
            levels.append({"concurrency": c, "metrics": m})
        arts.append({"kind": "concurrency", "levels": levels})
    for a in arts:
        a["bench_s"] = sum(float(lv["metrics"].get("duration_s", 0.0)) for lv in a["levels"])
    return metrics, arts
