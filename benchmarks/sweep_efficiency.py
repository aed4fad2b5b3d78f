"""Sweep efficiency on emulated landscapes: GPU-hours to reach 98 % of the best objective.

    .venv/bin/python benchmarks/sweep_efficiency.py            # every landscape, 11 seeds, writes benchmarks/results/
    .venv/bin/python benchmarks/sweep_efficiency.py --landscapes campaign,stale --seeds 3   # quicker look
    .venv/bin/python benchmarks/sweep_efficiency.py --space goodput_slo --node rtx_pro_6000x8   # one custom landscape
    .venv/bin/python benchmarks/sweep_efficiency.py --landscapes stale --set sweep.approaches=null   # an override

A landscape is a sweep (``conf/sweep/`` or ``benchmarks/landscapes/sweep/``) on a node
(``conf/node/`` or ``benchmarks/landscapes/node/``); :data:`LANDSCAPES` lists the ones run by
default, side by side: the campaign, a 2x larger space, the goodput space, a node whose
capabilities changed under an unchanged fingerprint (stale knowledge), and a node whose optimum
is several knobs from the baseline. Each runs on the ``instant`` emulator (the performance model
the emulated server paces tokens with, no sleeping). Every feasible config of the space is
evaluated once (noise-free model rate and GPU-seconds at time_scale 1) to find the best
achievable decode tok/s; a strategy reaches
the target when it *launches* a config whose noise-free rate is >= ``--target`` (0.98) x
that best (configs whose allreduce level silently fell back, ``allreduce_path_degraded``,
never count: they are not the level they name). Its cost is the emulated GPU-hours of
every launch up to and including that one (failed launches cost their time to failure;
duplicates and rule skips are free only where the strategy answers them without a launch).

Strategies (same seeds 0..n-1 for each):
- ``grid``: every feasible config in a shuffled order (constraint violations are never
  launched); the mean over the seeds' shuffles, and the exact expectation over all orders
  (sum over non-target configs of gpu_s/(K+1) + mean gpu_s of the K target configs).
- ``random``: Optuna ``RandomSampler``; constraint violations told FAIL at no cost; every
  other proposal launched (duplicates too).
- ``tpe_plain``: Optuna TPE with servesweep's sampler settings (multivariate, group,
  constant liar, ``n_startup_trials`` from the sweep) but plain Optuna usage: a failed
  launch is told FAIL (TPE ignores it), no seeds, no rules, duplicates launched again.
- ``tpe_worst``: the same TPE with the one-line change any user would make: a failed launch
  is told the worst value seen so far (0 before any success), so TPE learns to avoid it; no
  seeds or knowledge, duplicates launched again.
- ``servesweep``: the driver's own loop (:class:`sweeps.app.inprocess.InProcessDriver`, Ray
  replaced by an inline executor): seed trials, failure rules, duplicate answering,
  degraded-level skips, failures told PRUNED + violated constraint. Sampler seed varied. Its
  study and rules live in SQLite files of a temporary directory (the lease-renewal thread
  cannot reach an in-memory database), and it runs for as long as the landscape needs.

A run that does not reach the target within ``--cap-trials`` launches is censored: its
cost is reported as ">= spent" and counted at the spent GPU-hours in the mean (a lower
bound). Output: ``benchmarks/results/sweep_efficiency.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from sweeps.store import records  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
#: Goal of issue 5: servesweep <= 1/10 of grid and <= 1/2 of plain TPE (GPU-hours to target).
GOAL_VS_GRID = 0.10
GOAL_VS_TPE = 0.50
#: Goals of issue 15 (probe launches), by medians: <= 1/3 of the better of random and plain
#: TPE, <= 3x the physical limit (baseline + winner full launches), and the GPU-seconds spent
#: on configs that fail at startup <= 15 % of what their full launches cost.
GOAL_VS_BEST_PLAIN = 1 / 3
GOAL_VS_PHYSICAL = 3.0
GOAL_DEAD_END_FRACTION = 0.15
#: Goals of issue 25 (medians), per landscape: servesweep / the best of random, plain TPE and
#: tpe_worst, and servesweep / the physical limit (None: no goal on that landscape).
GOALS_25: dict[str, tuple[float, float | None]] = {
    "campaign": (0.20, 2.0), "stale": (0.33, 4.0), "large": (0.33, None), "goodput": (0.33, 4.0), "far": (0.33, None),
}
#: Landscape configs of this benchmark only (Hydra search path), beside conf/.
LANDSCAPE_DIR = REPO / "benchmarks" / "landscapes"
#: name -> (sweep, extra Hydra overrides): what ``--landscapes`` picks from.
LANDSCAPES: dict[str, tuple[str, list[str]]] = {
    "campaign": ("eagle3_allreduce", []),
    "large": ("bench_large", []),
    "goodput": ("goodput_slo", []),
    "stale": ("eagle3_allreduce", ["node=bench_stale"]),
    "far": ("eagle3_allreduce", ["node=bench_far"]),
}
#: The landscape being benchmarked (set by :func:`use_landscape` in the parent and in each worker).
SWEEP = "eagle3_allreduce"
EXTRA: list[str] = []


@dataclass
class Row:
    """One feasible config of the space: noise-free model rate (tok/s) and cost (GPU-s)."""

    key: str
    params: dict[str, Any]
    status: str
    failure_class: str | None
    true_tok_s: float
    gpu_s: float
    degraded: bool


def _spec(extra: list[str] | None = None):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sweeps.config.spec import load_spec

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra.searchpath=[file://{LANDSCAPE_DIR}]", "backend=instant",
                                           f"sweep={SWEEP}", *EXTRA, *(extra or [])])
    GlobalHydra.instance().clear()
    return load_spec(cfg)


_W: dict[str, Any] = {}


def use_landscape(sweep: str, extra: list[str]) -> None:
    """Benchmark ``sweep`` with ``extra`` overrides from now on (this process; clears its cache)."""
    global SWEEP, EXTRA
    SWEEP, EXTRA = sweep, list(extra)
    _W.clear()


def _init_landscape_worker(sweep: str, extra: list[str]) -> None:
    use_landscape(sweep, extra)
    _init_worker()


def _init_worker() -> None:
    from sweeps.app.driver import emulator_profile
    from sweeps.config.spec import backend_dict

    spec = _spec()
    _W.update(spec=spec, prof=emulator_profile(spec), backend=backend_dict(spec), bench=spec.bench_spec(),
              node=spec.node.model_dump(), model=spec.model.model_dump())


def _objective_value(out: dict[str, Any], noise_free: bool = False) -> float:
    """The sweep's objective in a simulate() result: decode tok/s noise-free from the model's
    prediction; another objective (e.g. the goodput sweep's max_rate_at_slo_req_s, found by the
    load search) as measured at that seed."""
    name = _W["spec"].objective_set.primary.name
    if name == "decode_tok_s" and noise_free:
        return float(out["prediction"].get("decode_tok_s") or 0.0)
    return float((out.get("metrics") or {}).get(name) or 0.0)


def _evaluate(cfg: dict[str, Any]) -> Row:
    from tasks.backends.sglang.knobs import render_launch
    from tasks.emulator.instant import simulate

    if not _W:
        _init_worker()
    argv, env, _ = render_launch(cfg, _W["node"], _W["model"], _W["backend"])
    out = simulate(_W["prof"], argv, env, _W["bench"], seed=0)
    true = _objective_value(out, noise_free=True) if out["status"] == "ok" else 0.0
    return Row(key=records.config_key(cfg), params=cfg, status=out["status"], failure_class=out.get("failure_class"),
               true_tok_s=true, gpu_s=float(out["gpu_s"]), degraded=records.DEGRADED in (out.get("perf_tags") or []))


def space_table(workers: int = 2, cache: Path | None = None) -> list[Row]:
    """Evaluate every feasible config of the campaign space once (seed 0).

    Returns:
        Rows in the space's declaration order. Cached as JSON in ``cache`` when given
        (reused only while tasks/emulator/*.py and conf/*/*.yaml are unchanged).
    """
    import hashlib

    spec = _spec()
    cfgs = list(spec.space.enumerate())
    src = sorted((REPO / "tasks" / "emulator").glob("*.py")) + sorted((REPO / "conf").glob("*/*.yaml")) \
        + sorted(LANDSCAPE_DIR.glob("*/*.yaml"))
    stamp = hashlib.sha256(b"".join(f.read_bytes() for f in src) + repr((SWEEP, EXTRA)).encode()).hexdigest()[:16]
    if cache is not None and cache.exists():
        data = json.loads(cache.read_text())
        if isinstance(data, dict) and data.get("stamp") == stamp and len(data["rows"]) == len(cfgs):
            return [Row(**d) for d in data["rows"]]
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_landscape_worker, initargs=(SWEEP, EXTRA)) as ex:
        rows = list(ex.map(_evaluate, cfgs, chunksize=256))
    if cache is not None:
        cache.write_text(json.dumps({"stamp": stamp, "rows": [asdict(r) for r in rows]}))
    return rows


# ---------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------
@dataclass
class RunResult:
    strategy: str
    seed: int
    reached: bool
    gpu_hours: float
    launches: int
    asks: int
    failed_launches: int
    best_true_tok_s: float
    #: GPU-s spent on configs that fail at startup, and what their full launches cost
    dead_end_gpu_s: float = 0.0
    dead_end_full_gpu_s: float = 0.0
    #: servesweep launches drawn by sweeps/search/untried.py in place of a skipped proposal, their GPU-h
    untried_launches: int = 0
    untried_gpu_hours: float = 0.0


def grid_run(rows: list[Row], target: float, seed: int) -> RunResult:
    """Exhaustive grid in a shuffled order (seeded)."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    spent, best, failed = 0.0, 0.0, 0
    for i, r in enumerate(order, 1):
        spent += r.gpu_s
        failed += r.status != "ok"
        if r.status == "ok" and not r.degraded:
            best = max(best, r.true_tok_s)
            if r.true_tok_s >= target:
                return RunResult("grid", seed, True, spent / 3600, i, i, failed, best)
    return RunResult("grid", seed, False, spent / 3600, len(order), len(order), failed, best)


def grid_expected_gpu_hours(rows: list[Row], target: float) -> float:
    """Exact mean over all orders of the GPU-hours a shuffled grid spends to reach the target."""
    hits = [r for r in rows if r.status == "ok" and not r.degraded and r.true_tok_s >= target]
    others = [r for r in rows if r not in hits]
    k = len(hits)
    return (sum(r.gpu_s for r in others) / (k + 1) + sum(r.gpu_s for r in hits) / k) / 3600


def optuna_run(name: str, rows: dict[str, Row], target: float, seed: int, cap_trials: int,
               max_asks: int) -> RunResult:
    """Plain Optuna usage: ``random``, ``tpe_plain`` or ``tpe_worst``; constraint violations told
    FAIL at no cost; a failed launch told FAIL (``tpe_worst``: the worst value seen so far)."""
    from sweeps.app.driver import make_sampler

    spec = _spec([f"sweep.sampler.seed={seed}"])
    space = spec.space
    sampler = optuna.samplers.RandomSampler(seed=seed) if name == "random" else make_sampler(spec)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    spent, best, launches, failed, asks = 0.0, 0.0, 0, 0, 0
    told: list[float] = []
    from tasks.backends.sglang.knobs import render_launch
    from tasks.emulator.instant import simulate

    if not _W:
        _init_worker()
    while launches < cap_trials and asks < max_asks:
        asks += 1
        t = study.ask()
        cfg = space.sample(t)
        if space.violated(cfg):
            study.tell(t, state=TrialState.FAIL)
            continue
        row = rows[records.config_key(cfg)]
        launches += 1
        spent += row.gpu_s
        if row.status != "ok":
            failed += 1
            if name == "tpe_worst":
                study.tell(t, min(told, default=0.0))
            else:
                study.tell(t, state=TrialState.FAIL)
            continue
        argv, env, _ = render_launch(cfg, _W["node"], _W["model"], _W["backend"])
        measured = simulate(_W["prof"], argv, env, _W["bench"], seed=seed * 100_000 + t.number)
        told.append(_objective_value(measured))
        study.tell(t, told[-1])
        if not row.degraded:
            best = max(best, row.true_tok_s)
            if row.true_tok_s >= target:
                return RunResult(name, seed, True, spent / 3600, launches, asks, failed, best)
    return RunResult(name, seed, False, spent / 3600, launches, asks, failed, best)


def servesweep_run(rows: dict[str, Row], target: float, seed: int, cap_trials: int, max_asks: int) -> RunResult:
    """The driver's own loop (in process, instant backend), stopped once the target is launched."""
    from sweeps.app.inprocess import InProcessDriver

    class _Bench(InProcessDriver):
        reached = False

        def _record(self, f: Any, res: Any) -> None:
            super()._record(f, res)
            row = rows.get(records.config_key(f.params))
            if res.status == "ok" and row is not None and not row.degraded and row.true_tok_s >= target:
                self.reached = True
                self.stop_reason = "target reached"

    with tempfile.TemporaryDirectory(prefix="servesweep-bench-") as tmp:
        spec = _spec([f"sweep.sampler.seed={seed}", f"sweep.budget.trials={cap_trials}", "sweep.budget.wall_time_s=null",
                      f"sweep.budget.max_asks={max_asks}", "sweep.budget.max_consecutive_skips=200",
                      f"tracking.store_dir={tmp}", f"tracking.findings_dir={tmp}/findings",
                      f"tracking.optuna_storage=sqlite:///{tmp}/optuna.db", f"tracking.rules_db=sqlite:///{tmp}/rules.db",
                      f"backend.emulator.seed={seed}"])
        drv = _Bench(spec)
        drv.setup()
        drv.loop()
        recs = records.load_records(drv.study)
    launched = [r for r in recs if r.launched]
    spent = sum(float(r.timings.get("gpu_s", 0.0)) for r in launched)
    dead = [(float(r.timings.get("gpu_s", 0.0)), rows[k].gpu_s) for r in launched
            if (k := records.config_key(r.params)) in rows and rows[k].status != "ok"]
    attrs = {t.number: t.user_attrs for t in drv.study.get_trials(deepcopy=False)}
    untried = [float(r.timings.get("gpu_s", 0.0)) for r in launched if attrs.get(r.number, {}).get("untried_draw")]
    best = max((rows[records.config_key(r.params)].true_tok_s for r in launched
                if r.status == "ok" and records.config_key(r.params) in rows and records.counts_for_level(r)), default=0.0)
    return RunResult("servesweep", seed, drv.reached, spent / 3600, len(launched), len(recs),
                     sum(r.status != "ok" for r in launched), best,
                     sum(d[0] for d in dead), sum(d[1] for d in dead), len(untried), sum(untried) / 3600)


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------
def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def summarize(results: list[RunResult], grid_exact: float) -> dict[str, Any]:
    """Per-strategy mean GPU-hours to target (censored runs at their spend: a lower bound)."""
    out: dict[str, Any] = {}
    for name in ("grid", "random", "tpe_plain", "tpe_worst", "servesweep"):
        rs = [r for r in results if r.strategy == name]
        out[name] = {
            "mean_gpu_hours": _mean([r.gpu_hours for r in rs]),
            "median_gpu_hours": statistics.median([r.gpu_hours for r in rs]) if rs else float("nan"),
            "reached": sum(r.reached for r in rs), "runs": len(rs),
            "mean_launches": _mean([r.launches for r in rs]),
            "mean_failed_launches": _mean([r.failed_launches for r in rs]),
            "per_seed_gpu_hours": [round(r.gpu_hours, 3) for r in rs],
        }
    out["grid"]["exact_expected_gpu_hours"] = grid_exact
    ss = [r for r in results if r.strategy == "servesweep"]
    full = sum(r.dead_end_full_gpu_s for r in ss)
    out["servesweep"]["dead_end_cost_fraction"] = sum(r.dead_end_gpu_s for r in ss) / full if full else float("nan")
    out["servesweep"]["mean_untried_launches"] = _mean([r.untried_launches for r in ss])
    out["servesweep"]["mean_untried_gpu_hours"] = _mean([r.untried_gpu_hours for r in ss])
    return out


def physical_limit_gpu_hours(rows: list[Row], spec: Any, target: float) -> float:
    """The least any strategy can spend: the baseline's full launch plus the cheapest full
    launch of a config at the target (GPU-h, time_scale 1)."""
    base = _evaluate(dict(spec.sweep.baseline))
    hits = [r.gpu_s for r in rows if r.status == "ok" and not r.degraded and r.true_tok_s >= target]
    return (base.gpu_s + min(hits, default=0.0)) / 3600


def seeding(spec: Any) -> dict[str, Any]:
    """What servesweep launches before its sampler: the sweep's seed configs (the baseline,
    ``seed_trials``, one per level of ``seed_each_level_of``), and which of them are the
    space's startup dead ends (each costs a probe)."""
    from sweeps.config.space import seed_configs

    sw = spec.sweep
    configs = seed_configs(spec.space, sw.baseline, sw.seed_trials, sw.seed_each_level_of)
    return {"configs": len(configs), "seed_trials": len(sw.seed_trials),
            "seed_each_level_of": list(sw.seed_each_level_of),
            "dead_ends": sum(_evaluate(c).status != "ok" for c in configs)}


def _verdict(ratio: float, goal: float) -> str:
    if ratio != ratio:
        return "not measured"
    return "met" if ratio <= goal else f"MISSED by {ratio / goal:.2f}x"


def _probe_goals(summary: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """The probe-launch goals (medians), each ratio stated met or missed."""
    sm = summary["servesweep"]["median_gpu_hours"]
    plain = {k: summary[k]["median_gpu_hours"] for k in ("random", "tpe_plain", "tpe_worst") if summary[k]["runs"]}
    lines = ["", "## Goals with probe launches (medians)", ""]
    if plain:
        name, ref = min(plain.items(), key=lambda kv: kv[1])
        r = sm / ref if ref else float("nan")
        lines.append(f"- servesweep / best of random, plain TPE and tpe_worst ({name}) = {sm:.2f} / {ref:.2f} = {r:.3f} "
                     f"(goal <= {GOAL_VS_BEST_PLAIN:.3f}): {_verdict(r, GOAL_VS_BEST_PLAIN)}")
    phys = meta["physical_limit_gpu_hours"]
    r = sm / phys if phys else float("nan")
    lines.append(f"- servesweep / physical limit (baseline + cheapest target config, full launches) = {sm:.2f} / "
                 f"{phys:.2f} = {r:.2f} (goal <= {GOAL_VS_PHYSICAL}): {_verdict(r, GOAL_VS_PHYSICAL)}")
    f = summary["servesweep"].get("dead_end_cost_fraction", float("nan"))
    lines.append(f"- GPU-s on configs that fail at startup / their full launches' cost = {f:.3f} "
                 f"(goal <= {GOAL_DEAD_END_FRACTION}): {_verdict(f, GOAL_DEAD_END_FRACTION)}")
    s = summary["servesweep"]
    sd = meta.get("seeding") or {}
    lines += ["", f"Where servesweep's GPU-hours go: the {sd.get('configs', '?')} seed trials (the baseline, "
              f"{sd.get('seed_trials', '?')} `seed_trials`, one per level of "
              f"{', '.join(sd.get('seed_each_level_of') or []) or 'no knob'}; a non-baseline level of a seeded "
              f"knob or a config a shipped dead end names is launched as a probe first, a passing probe "
              f"then in full; {sd.get('dead_ends', '?')} of the seeds are startup dead ends), then the "
              f"sampler's launches. Of those, a mean {s.get('mean_untried_launches', 0):.1f} per run "
              f"({s.get('mean_untried_gpu_hours', 0):.2f} GPU-h) were untried configs drawn in place of "
              f"proposals answered without a launch (sweeps/search/untried.py: nearest the proposal after a "
              f"duplicate, nearest the incumbent after a dead end, or the proposal with its dead levels "
              f"repaired when the level model rates that higher); a uniform draw would mostly land on "
              f"EAGLE-3 configs, which never reach the target on this node."]
    if meta["objective"] != "decode_tok_s":
        lines += ["", f"This space's objective `{meta['objective']}` has no noise-free model value: each config's "
                  f"value is its seed-0 measurement (a load search), so the best is a lucky draw and only "
                  f"{meta['target_configs']} config(s) reach 98 % of it; a strategy reaches the target only by "
                  f"launching one of those, which the physical limit (one launch) assumes it knows."]
    return lines


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The results table plus the goals and by how much each is met or missed."""
    lines = [
        "# Sweep efficiency: emulated GPU-hours to reach 98 % of the best achievable tok/s",
        "",
        f"Landscape `{meta.get('landscape', 'campaign')}`: space `{meta['sweep']}` {' '.join(meta.get('overrides', []))} "
        f"({meta['feasible_configs']} feasible configs, "
        f"{meta['failing_configs']} of them fail at startup), instant emulator, {meta['seeds']} seeds. "
        f"Objective `{meta['objective']}`; best achievable: {meta['best_tok_s']:.2f} (`{meta['best_config']}`); "
        f"target >= {meta['target_tok_s']:.2f}, reached by {meta['target_configs']} configs. "
        f"Cap: {meta['cap_trials']} launches per run (censored runs count at their spend).",
        "",
        "| strategy | mean GPU-h to target | median | reached | mean launches | mean failed launches | per seed GPU-h |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['mean_gpu_hours']:.2f} | {s['median_gpu_hours']:.2f} | {s['reached']}/{s['runs']} | "
                     f"{s['mean_launches']:.1f} | {s['mean_failed_launches']:.1f} | "
                     f"{', '.join(f'{x:.2f}' for x in s['per_seed_gpu_hours'])} |")
    g = summary["grid"]["exact_expected_gpu_hours"]
    lines += ["", f"Grid, exact expectation over all orders: {g:.2f} GPU-h.", "", "## Goals", ""]
    ss = summary["servesweep"]["mean_gpu_hours"]
    for label, ref, goal in (("grid (exact expectation)", g, GOAL_VS_GRID),
                             ("plain TPE", summary["tpe_plain"]["mean_gpu_hours"], GOAL_VS_TPE)):
        ratio = ss / ref if ref else float("nan")
        verdict = "met" if ratio <= goal else f"MISSED by {ratio / goal:.2f}x (ratio {ratio:.3f} vs goal {goal})"
        lines.append(f"- servesweep / {label} = {ss:.2f} / {ref:.2f} = {ratio:.3f} (goal <= {goal}): {verdict}")
    sm = summary["servesweep"]["median_gpu_hours"]
    for label, ref, goal in (("grid (median of the seeds' shuffles)", summary["grid"]["median_gpu_hours"], GOAL_VS_GRID),
                             ("plain TPE (median)", summary["tpe_plain"]["median_gpu_hours"], GOAL_VS_TPE)):
        ratio = sm / ref if ref else float("nan")
        verdict = "met" if ratio <= goal else f"MISSED by {ratio / goal:.2f}x (ratio {ratio:.3f} vs goal {goal})"
        lines.append(f"- by medians: servesweep / {label} = {sm:.2f} / {ref:.2f} = {ratio:.3f} (goal <= {goal}): {verdict}")
    lines += _probe_goals(summary, meta)
    lines += ["", "Notes: plain TPE treats failures as FAIL, which TPE ignores, so it stays in its random "
              "start-up phase (Optuna's RandomSampler with the same seed) until it has "
              "`n_startup_trials` successes: on most seeds it is the random arm, and a run that "
              "keeps landing in dead regions (seed 0) does not recover. servesweep pays a fixed "
              "cost for its seed trials (above): with probe launches "
              "(sweeps/search/probes.py) the dead ends and the silently degraded custom level cost a probe "
              "(dummy weights, no weight load, capture scaled by layers) instead of a full launch; "
              "a lucky random draw can still beat it (the first random launch can hit the target)."]
    cens = {k: s["runs"] - s["reached"] for k, s in summary.items() if s["runs"] - s["reached"]}
    if cens:
        lines += ["", "Censored runs (target not reached within the cap; their mean is a lower bound): "
                  + ", ".join(f"{k}: {v}" for k, v in cens.items()) + "."]
    lines += ["", f"Generated by `benchmarks/sweep_efficiency.py` in {meta['elapsed_s']:.0f} s.", ""]
    return "\n".join(lines)


def run_landscape(name: str, sweep: str, extra: list[str], a: argparse.Namespace) -> dict[str, Any]:
    """Benchmark every strategy on one landscape; writes its ``sweep_efficiency[_<name>]`` files.

    Returns:
        ``{"meta": ..., "summary": ...}`` as written to the landscape's JSON.
    """
    use_landscape(sweep, extra)
    t0 = time.monotonic()
    rows = space_table(a.workers, a.cache.with_name(f"{a.cache.stem}-{name}{a.cache.suffix}"))
    by_key = {r.key: r for r in rows}
    good = [r for r in rows if r.status == "ok" and not r.degraded]
    best = max(good, key=lambda r: r.true_tok_s)
    target = a.target * best.true_tok_s
    strategies = a.strategies.split(",")
    results: list[RunResult] = []
    for seed in range(a.seeds):
        if "grid" in strategies:
            results.append(grid_run(rows, target, seed))
        for strat in ("random", "tpe_plain", "tpe_worst"):
            if strat in strategies:
                results.append(optuna_run(strat, by_key, target, seed, a.cap_trials, a.max_asks))
        if "servesweep" in strategies:
            results.append(servesweep_run(by_key, target, seed, a.cap_trials, a.max_asks))
        for r in results[-len(strategies):]:
            print(f"{name} seed {seed} {r.strategy:10s} reached={r.reached} {r.gpu_hours:8.2f} GPU-h "
                  f"launches={r.launches} asks={r.asks} failed={r.failed_launches}", flush=True)
    summary = summarize(results, grid_expected_gpu_hours(rows, target))
    spec = _spec()
    base = dict(spec.sweep.baseline)
    meta = {"landscape": name, "sweep": sweep, "overrides": extra,
            "physical_limit_gpu_hours": physical_limit_gpu_hours(rows, spec, target),
            "feasible_configs": len(rows), "failing_configs": sum(r.status != "ok" for r in rows), "seeds": a.seeds,
            "objective": spec.objective_set.primary.name,
            "best_tok_s": best.true_tok_s, "best_config": best.key,
            "best_knobs_from_baseline": sum(best.params.get(k) != v for k, v in base.items())
            + sum(k not in base for k in best.params),
            "target_tok_s": target, "target_fraction": a.target,
            "target_configs": sum(r.true_tok_s >= target for r in good),
            "cap_trials": a.cap_trials, "seeding": seeding(spec), "elapsed_s": time.monotonic() - t0}
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "sweep_efficiency" if name == "campaign" else f"sweep_efficiency_{name}"
    (a.out / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "runs": [asdict(r) for r in results]}, indent=1, default=str))
    (a.out / f"{stem}.md").write_text(markdown(summary, meta))
    return {"meta": meta, "summary": summary}


def _ratio(num: float, den: float) -> float:
    return num / den if den and den == den and num == num else float("nan")


def landscapes_markdown(done: dict[str, dict[str, Any]]) -> str:
    """Every landscape side by side: medians, servesweep's ratio to the best peer and to the
    physical limit, the dead-end cost fraction, and issue 25's goals met or missed."""
    peers = ("random", "tpe_plain", "tpe_worst")
    lines = ["# Sweep efficiency on every landscape (medians of emulated GPU-hours to 98 % of the best)", "",
             "| landscape | sweep / overrides | feasible | knobs best is from baseline | limit | random | tpe_plain "
             "| tpe_worst | servesweep | / best peer | x limit | dead-end cost | goals |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, d in done.items():
        m, s = d["meta"], d["summary"]
        med = {k: s[k]["median_gpu_hours"] for k in (*peers, "servesweep") if s[k]["runs"]}
        ss = med.get("servesweep", float("nan"))
        peer = min((v for k, v in med.items() if k in peers), default=float("nan"))
        vs_peer, vs_limit = _ratio(ss, peer), _ratio(ss, m["physical_limit_gpu_hours"])
        dead = s["servesweep"].get("dead_end_cost_fraction", float("nan"))
        goal_peer, goal_limit = GOALS_25.get(name, (None, None))
        verdicts = []
        if goal_peer is not None:
            verdicts.append(f"peer <= {goal_peer}: {_verdict(vs_peer, goal_peer)}")
        if goal_limit is not None:
            verdicts.append(f"limit <= {goal_limit}: {_verdict(vs_limit, goal_limit)}")
        if name == "campaign":
            verdicts.append(f"dead-end <= {GOAL_DEAD_END_FRACTION}: {_verdict(dead, GOAL_DEAD_END_FRACTION)}")
        fmt = {k: f"{med[k]:.2f}" if k in med else "-" for k in (*peers, "servesweep")}
        lines.append(f"| {name} | `{m['sweep']}` {' '.join(m['overrides'])} | {m['feasible_configs']} | "
                     f"{m['best_knobs_from_baseline']} | {m['physical_limit_gpu_hours']:.2f} | {fmt['random']} | "
                     f"{fmt['tpe_plain']} | {fmt['tpe_worst']} | {fmt['servesweep']} | {vs_peer:.3f} | {vs_limit:.2f} | "
                     f"{dead:.3f} | {'; '.join(verdicts)} |")
    seeds = {d["meta"]["seeds"] for d in done.values()}
    lines += ["", f"Seeds per landscape: {', '.join(map(str, sorted(seeds)))}. Each landscape's own file "
              "(`sweep_efficiency[_<landscape>].md`) has its per-seed GPU-hours and censored runs.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on every chosen landscape; writes each landscape's JSON/.md and
    ``sweep_efficiency_landscapes.json``/``.md`` (side by side) under ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--seeds", type=int, default=11, help="runs per strategy and landscape (seeds 0..N-1); medians over them")
    ap.add_argument("--landscapes", default=",".join(LANDSCAPES), help=f"any of {', '.join(LANDSCAPES)}")
    ap.add_argument("--space", default=None, help="one custom landscape: this sweep (conf/sweep/ or "
                    "benchmarks/landscapes/sweep/) instead of --landscapes")
    ap.add_argument("--node", default=None, help="one custom landscape's node (conf/node/ or benchmarks/landscapes/node/)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra Hydra override for every landscape (repeatable), e.g. sweep.approaches=null to "
                    "measure servesweep without the approach quota")
    ap.add_argument("--target", type=float, default=0.98, help="fraction of the best achievable objective")
    ap.add_argument("--cap-trials", type=int, default=300, help="launches per run before it is censored")
    ap.add_argument("--max-asks", type=int, default=3000,
                    help="sampler asks per run before it is censored (asks answered without a launch count too)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes running seeds in parallel")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "servesweep-space-table.json",
                    help="cache of each evaluated space (reused while the model and configs are unchanged)")
    ap.add_argument("--strategies", default="grid,random,tpe_plain,tpe_worst,servesweep",
                    help="comma-separated arms: the peers and servesweep itself")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and markdown results go")
    a = ap.parse_args(argv)
    if a.space or a.node:
        chosen = {f"{a.space or 'eagle3_allreduce'}@{a.node or 'default'}":
                  (a.space or "eagle3_allreduce", [f"node={a.node}"] if a.node else [])}
    else:
        unknown = [n for n in a.landscapes.split(",") if n not in LANDSCAPES]
        if unknown:
            ap.error(f"--landscapes: unknown {unknown}; choose from {', '.join(LANDSCAPES)}")
        chosen = {n: LANDSCAPES[n] for n in a.landscapes.split(",")}
    chosen = {n: (sw, [*extra, *a.overrides]) for n, (sw, extra) in chosen.items()}
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    import logging
    logging.getLogger("servesweep").setLevel(logging.ERROR)
    done = {name: run_landscape(name, sweep, extra, a) for name, (sweep, extra) in chosen.items()}
    md = landscapes_markdown(done)
    if len(done) > 1:
        (a.out / "sweep_efficiency_landscapes.json").write_text(json.dumps(done, indent=1, default=str))
        (a.out / "sweep_efficiency_landscapes.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
