"""Pre-launch GPU-hour estimate of a sweep (issue 3), from the emulator's instant model.

``estimate_gpu_hours(spec)`` prices the sweep's budget on the *real* node: the seed trials
(baseline, ``seed_trials``, one per level of ``seed_each_level_of``) exactly, and the rest of
the trial budget at the mean cost of a random sample of the space's feasible configs, each
priced by :func:`tasks.emulator.instant.estimate_sweep` at time_scale 1 (startup, warmup +
benchmark, teardown; a failing config costs its time to failure). It works for every
backend: the emulated node's constants come from the ``emulator:`` blocks of conf/node and
conf/model, so ``backend=sglang`` gets the same model's estimate of the real node.

Rule skips are accounted for: a sampled config failing with a class the seeds already hit
is left out of the mean (the driver skips it without GPU time). Not modelled: the sampler
concentrating on good regions after its random startup trials, failure classes first met
after the seeds (priced as launched every time), transient retries.
"""

from __future__ import annotations

import math
import random
from typing import Any

from sweeps.config.space import SearchSpace, seed_configs
from sweeps.config.spec import SweepSpec, backend_dict
from tasks.backends import emulated_engines, get_backend
from tasks.backends.sglang.knobs import render_launch

DEFAULT_SAMPLE = 100  # configs priced; ~12 ms each (instant model), so ~1.2 s


def _profile(spec: SweepSpec) -> dict[str, Any]:
    """Emulator profile of the node/model, noise off, time_scale 1 (real-node cost).

    Raises:
        ValueError: the node or model config lacks the emulator constants (names the field).
    """
    from tasks.emulator.profile import build_profile

    emu: dict[str, Any] = {"noise": 0.0, "time_scale": 1.0}
    be = get_backend(spec.backend.kind)
    if be.engine in emulated_engines():  # the emulator takes the flags of the version this backend targets
        emu[be.version_key] = be.engine_version(backend_dict(spec))
    caps = (spec.backend.emulator or {}).get("capabilities")
    if caps:
        emu["capabilities"] = dict(caps)
    return build_profile(spec.node.model_dump(), spec.model.model_dump(), emu)


def _seed_configs(spec: SweepSpec, space: SearchSpace) -> list[dict[str, Any]]:
    """The configs the driver enqueues first (see :func:`sweeps.config.space.seed_configs`)."""
    sw = spec.sweep
    if sw.mode != "search":
        return []
    return seed_configs(space, sw.baseline, sw.seed_trials, sw.seed_each_level_of)


def sample_feasible(space: SearchSpace, n: int, seed: int = 0, max_draws_factor: int = 50) -> list[dict[str, Any]]:
    """Up to ``n`` random feasible configs, each param drawn independently in declaration
    order (as the sampler's random startup phase does); infeasible draws are rejected.
    Gives fewer than ``n`` only if ``n * max_draws_factor`` draws found fewer."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(n * max_draws_factor):
        if len(out) >= n:
            break
        cfg: dict[str, Any] = {}
        for p in space.params:
            if not p.active(cfg):
                continue
            if p.type == "float" and not p.step:
                cfg[p.name] = (math.exp(rng.uniform(math.log(p.low), math.log(p.high))) if p.log
                               else rng.uniform(p.low, p.high))
            else:
                cfg[p.name] = rng.choice(p.levels())
        if not space.violated(cfg):
            out.append(cfg)
    return out


def _render(spec: SweepSpec, configs: list[dict[str, Any]]) -> list[tuple[list[str], dict[str, str]]]:
    # launcher [] : the emulator parses SGLang flags only (a container prefix would not parse)
    backend = {**backend_dict(spec), "launcher": []}
    node, model = spec.node.model_dump(), spec.model.model_dump()
    out = []
    for c in configs:
        argv, env, _ = render_launch(c, node, model, backend)
        out.append((argv, env))
    return out


def _probed_seed_costs(spec: SweepSpec, profile: dict[str, Any], seeds: list[dict[str, Any]],
                       est: dict[str, Any], seed: int) -> list[float]:
    """The seeds' GPU-seconds with probe launches priced as the driver runs them: the first
    launch of a non-baseline level of ``seed_each_level_of`` is a probe (dummy weights, fewer
    layers); one that fails with a class a probe reveals, or shows a silent fallback, ends
    there; one that passes is followed by the full launch (probe + full)."""
    from tasks.emulator.instant import estimate_sweep
    from tasks.probe import probe_argv, probe_classes

    base, knobs = spec.sweep.baseline, spec.sweep.seed_each_level_of
    support = get_backend(spec.backend.kind).probe
    out = list(est["gpu_s"])
    for i, cfg in enumerate(seeds):
        if not any(cfg.get(k) is not None and cfg.get(k) != base.get(k) for k in knobs):
            continue
        argv, env = _render(spec, [cfg])[0]
        try:
            p_argv = probe_argv(argv, support, spec.model.model_dump(), cfg)
        except ValueError:  # the model cannot be cut: the driver launches in full
            continue
        p = estimate_sweep(profile, [(p_argv, env)], spec.bench_spec(), seed + i)
        cls, tags = p["failure_class"][0], p["perf_tags"][0]
        ends = (cls is not None and probe_classes().reveals(cls)) or "allreduce_path_degraded" in tags
        out[i] = p["gpu_s"][0] + (0.0 if ends else est["gpu_s"][i])
    return out


def _learned(est: dict[str, Any], n: int) -> set[str]:
    """Failure classes (and the degraded-allreduce tag) the first ``n`` priced configs teach
    the driver: later configs failing the same way are rule-skipped without GPU time."""
    out = {c for c in est["failure_class"][:n] if c}
    out |= {t for tags in est["perf_tags"][:n] for t in tags if t == "allreduce_path_degraded"}
    return out


def estimate_gpu_hours(spec: SweepSpec, sample: int = DEFAULT_SAMPLE, seed: int = 0,
                       launches: int | None = None) -> tuple[float, str]:
    """Estimated GPU-hours the sweep would spend on the real node, and a one-line message.

    estimate = Σ gpu_s(seed trials within the trial budget)
               + max(trials − seeds, 0) × mean gpu_s of a launched non-seed trial,
    where the mean is over ``sample`` random feasible configs, leaving out those that fail
    with a class the seeds already hit (or run a degraded allreduce path a seed already ran):
    the driver skips them by rule without GPU time, and ``budget.trials`` counts launched
    trials only. Capped by ``budget.gpu_hours`` when set; with no trial budget the trial count
    is ``budget.max_asks`` (an upper bound). GPU-seconds = GPUs per trial (tp × dp) × trial
    wall time at real speed (emulator model, time_scale 1: startup, warmup + bench, teardown).

    Args:
        spec: the validated sweep (``sweeps.config.spec.load_spec``).
        sample: feasible configs priced for the mean (>= 1); ~12 ms each.
        seed: sampling seed.
        launches: the launches the sweep will make when known in advance (a recheck: its dead
            ends and canaries, :func:`sweeps.app.recheck.planned_launches`); None: the budget's.

    Returns:
        (GPU-hours, message). When the node/model configs lack the emulator constants, or no
        feasible config is found, the estimate is unavailable: (``math.nan``, a message saying
        why). Never raises for those.
    """
    try:
        profile = _profile(spec)
    except ValueError as e:
        return math.nan, f"GPU-hour estimate unavailable: {e}"
    from tasks.emulator.instant import estimate_sweep

    space = spec.space
    bench = spec.bench_spec()
    b = spec.sweep.budget
    seeds = _seed_configs(spec, space)
    samples = sample_feasible(space, max(1, sample), seed)
    if not samples:
        return math.nan, "GPU-hour estimate unavailable: no feasible config found by sampling the space"
    est_seed = estimate_sweep(profile, _render(spec, seeds), bench, seed)
    est_rest = estimate_sweep(profile, _render(spec, samples), bench, seed + 10_000)
    trials = launches if launches is not None else b.trials if b.trials is not None else b.max_asks
    n_seed = min(len(seeds), trials)
    learned = _learned(est_seed, n_seed)
    launched = [(g, w) for g, w, c, t in zip(est_rest["gpu_s"], est_rest["wall_s"], est_rest["failure_class"],
                                             est_rest["perf_tags"])
                if not ((c and c in learned) or ("allreduce_path_degraded" in t and t and
                                                 "allreduce_path_degraded" in learned))]
    if not launched:  # every sampled config is a known dead end: price them as launched
        launched = list(zip(est_rest["gpu_s"], est_rest["wall_s"]))
    mean_gpu = sum(g for g, _ in launched) / len(launched)
    mean_wall = sum(w for _, w in launched) / len(launched)
    rest = max(trials - n_seed, 0)
    be = get_backend(spec.backend.kind)
    if be.probe is not None and be.engine in emulated_engines():  # probes the emulator's model can price
        est_seed["gpu_s"] = _probed_seed_costs(spec, profile, seeds, est_seed, seed)
    gpu_s = sum(est_seed["gpu_s"][:n_seed]) + rest * mean_gpu
    wall_s = sum(est_seed["wall_s"][:n_seed]) + rest * mean_wall
    hours = gpu_s / 3600.0
    capped = b.gpu_hours is not None and hours > b.gpu_hours
    if capped:
        wall_s *= float(b.gpu_hours) / hours
        hours = float(b.gpu_hours)
    per = spec.gpus_per_trial
    wall_h = wall_s / max(1, spec.node.gpus // per) / 3600.0
    skipped = 1.0 - len(launched) / len(samples)
    what = (f"{trials} launches" if launches is not None else f"{trials} trials" if b.trials is not None
            else f"up to {trials} trials (no trial budget: max_asks)")
    msg = (f"Estimated cost on the real node (a projection from the emulator's model): {what} ~ {hours:.1f} "
           f"GPU-hours{' (capped by budget.gpu_hours)' if capped else ''} "
           f"on {spec.node.name} ({per} GPUs/trial, ~{wall_h:.1f} h on one node): {n_seed} seed trials "
           f"{sum(est_seed['gpu_s'][:n_seed]) / 3600:.1f} GPU-h + {rest} x {mean_gpu / 3600:.2f} = "
           f"{rest * mean_gpu / 3600:.1f} GPU-h, modelled "
           f"at real speed over {len(samples)} sampled configs ({100 * skipped:.0f} % of them would be skipped by "
           f"the seeds' failure rules, without GPU time)")
    msg += _after_the_trials(spec, est_seed["gpu_s"][0] if est_seed["gpu_s"] else mean_gpu, gpu_s)
    if spec.sweep.mode == "recheck":
        msg += ("; recheck: the source's dead ends and canaries to re-run, each priced at a sampled config's mean"
                if launches is not None else
                "; recheck: the number of old dead ends is known once set up, priced here at budget.trials")
    if be.emulated:
        msg += (f"; backend={spec.backend.kind} runs on the emulated node, no real GPU is used (the GPU-hours its "
                f"summary books are that run's, not this projection)")
    return hours, msg


def _after_the_trials(spec: SweepSpec, launch_gpu_s: float, trials_gpu_s: float) -> str:
    """The launches after the trial budget, priced at one full launch of the baseline
    (``launch_gpu_s``): the confirmation's (its ``top_k`` configs, up to
    :data:`sweeps.search.confirm.SIMPLER_MAX` simplifications and the baseline, ``repeats`` each at
    least, up to its repeat budget each with the race and ``descend`` more configs at most) and the
    serving check's two. "" for a recheck, or with the confirmation off and no serving check."""
    from sweeps.search.confirm import SIMPLER_MAX

    sw = spec.sweep
    c = sw.confirm
    if sw.mode != "search" or (c.top_k == 0 and not sw.serving_check):
        return ""
    lo = hi = 0
    parts = []
    if c.top_k:
        lo = (c.top_k + 1) * c.repeats
        hi = (c.top_k + 1 + SIMPLER_MAX + c.descend) * c.repeat_budget
        parts.append(f"the confirmation {lo}-{hi} launches ({c.top_k} configs and the baseline x {c.repeats} repeats, up "
                     f"to {c.repeat_budget} each with the race, with simplifications and descent)")
    if sw.serving_check:
        lo, hi = lo + 2, hi + 2
        parts.append("the serving check 2")
    per = launch_gpu_s / 3600
    total_lo, total_hi = (trials_gpu_s + lo * launch_gpu_s) / 3600, (trials_gpu_s + hi * launch_gpu_s) / 3600
    return (f"; after the trials, {' and '.join(parts)}, each ~{per:.2f} GPU-h: "
            f"~{total_lo:.1f}-{total_hi:.1f} GPU-hours in all")


__all__ = ["estimate_gpu_hours", "sample_feasible", "DEFAULT_SAMPLE"]
