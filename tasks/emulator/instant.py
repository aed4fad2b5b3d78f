"""Instant mode: what a trial on the emulated node would return, without a server or sleeps.

``simulate(profile, argv, env, bench, seed)`` evaluates the same model the server paces
tokens with (``tasks.emulator.model``), applies the same seeded run-to-run noise, and
replays the same acceptance draws (golden-ratio low-discrepancy sequence over the
per-position acceptance model) to get ITL percentiles.
"""

from __future__ import annotations

import copy
import math
import random
import zlib
from collections.abc import Iterable
from typing import Any

from tasks.emulator.eagle import accepted_from_uniform
from tasks.emulator.flags import LaunchArgError
from tasks.emulator.instant_load import simulate_load
from tasks.emulator.launch import parse_launch
from tasks.emulator.model import evaluate, evaluate_argv
from tasks.emulator.physics import run_factor
from tasks.stats import percentile
from tasks.trial_load import wants_load
from tasks.types import BenchSpec

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _token_itls(probs: list[float], interval_ms: float, output_len: int, spec: bool, seed: int) -> list[float]:
    """Per-token ITL (ms) as sglang.bench_serving counts it: a chunk of n tokens after a gap g
    contributes n values g/n."""
    if not spec:
        return [interval_ms] * max(output_len - 1, 0)
    u0 = random.Random(seed).random()
    out: list[float] = []
    pos, k = 1, 0
    while pos < output_len:
        k += 1
        n = min(accepted_from_uniform(probs, (u0 + k * GOLDEN) % 1.0), output_len - pos)
        out += [interval_ms / n] * n
        pos += n
    return out


def simulate(profile: dict, argv: list[str], env: dict, bench: BenchSpec, seed: int) -> dict[str, Any]:
    """One trial's outcome in microseconds of CPU.

    Args:
        profile: from ``build_profile`` (its ``emulator.seed`` is replaced by ``seed``).
        argv: SGLang launch argv (a leading ``python -m sglang.launch_server`` is ignored).
        env: server environment (NCCL_ALGO, NCCL_PROTO).
        bench: the benchmark (input/output lengths, warmup, repeats, concurrency).
        seed: run seed (noise and acceptance draws).

    Returns:
        ``{"status": "ok"|"failed", "metrics": {decode_tok_s, output_tok_s, ttft_ms_p50,
        itl_ms_p50, itl_ms_p99, accept_length, + with a load workload (``trial_load.wants_load``)
        the load search's / concurrency levels' metrics (:func:`instant_load.simulate_load`)},
        "load_artifacts" (their curves, as a live trial's ``{"load": ...}`` records), "failure_class", "failure_signature",
        "exit_code", "phase", "log" (text), "startup_s", "bench_s", "gpu_s", "perf_tags",
        "allreduce_path", "prediction" (dict)}``; times in s at time_scale 1, gpu_s =
        GPUs held (tp × dp) × (startup + bench + teardown).
    """
    prof = copy.deepcopy(profile)
    prof["emulator"]["seed"] = int(seed)
    kw = dict(batch=max(1, int(bench.concurrency)), input_len=int(bench.input_len), output_len=int(bench.output_len))
    pred = evaluate_argv(prof, argv, env, **kw)
    teardown = float(prof["node"]["emulator"]["startup"]["teardown_s"])
    try:
        launch = parse_launch(argv, env, sglang_version=str(prof["emulator"]["sglang_version"]))
        gpus = max(1, launch.tp) * max(1, launch.dp)
    except LaunchArgError:
        launch, gpus = None, int(prof["node"].get("gpus", 8))
    log = "\n".join(pred.log_lines)
    base = {"log": log, "perf_tags": list(pred.perf_tags), "allreduce_path": pred.allreduce_path,
            "prediction": pred.to_dict()}
    if pred.outcome != "ok":
        f = pred.failure
        startup = f.time_to_failure_s
        return {**base, "status": "failed", "metrics": {}, "failure_class": f.failure_class,
                "failure_signature": f.signature, "exit_code": f.exit_code, "phase": f.phase,
                "startup_s": startup, "bench_s": 0.0, "gpu_s": gpus * (startup + teardown)}
    factor = run_factor(prof, launch)
    decode = pred.decode_tok_s * factor
    ttft_ms = pred.ttft_ms / factor
    interval = (pred.t_cycle_ms if launch.speculative else pred.itl_ms) / factor
    itls = _token_itls(pred.spec.get("position_probs", []), interval, bench.output_len, launch.speculative,
                       zlib.crc32(f"{seed}|itl".encode()))
    gen_ms = sum(itls)
    decode_meas = (len(itls) / gen_ms * 1000.0) if gen_ms > 0 else decode
    e2e_s = (ttft_ms + gen_ms) / 1000.0
    warm_s = bench.warmup_requests * (ttft_ms + max(bench.warmup_output_len - 1, 0) * 1000.0 / decode) / 1000.0
    bench_s = warm_s + bench.repeats * e2e_s
    startup = pred.startup_s["total"]
    load: list[dict] = []
    if wants_load(bench):  # the load search / concurrency levels, through the batching scheduler
        load_metrics, load = simulate_load(profile, argv, env, bench, seed)
        bench_s += sum(a["bench_s"] for a in load)
    metrics = {"decode_tok_s": decode_meas, "output_tok_s": bench.output_len * bench.concurrency / e2e_s,
               "ttft_ms_p50": ttft_ms, "itl_ms_p50": percentile(itls, 0.5, empty=0.0),
               "itl_ms_p99": percentile(itls, 0.99, empty=0.0),
               "accept_length": pred.accept_length, "e2e_s_p50": e2e_s, **(load_metrics if load else {})}
    return {**base, "status": "ok", "metrics": metrics, "load_artifacts": load, "failure_class": None,
            "failure_signature": None,
            "exit_code": None, "phase": None, "startup_s": startup, "bench_s": bench_s,
            "gpu_s": gpus * (startup + bench_s + teardown)}


def estimate_gpu_hours(profile: dict, trials: Iterable[tuple[list[str], dict]], bench: BenchSpec,
                       seed: int = 0) -> float:
    """GPU-hours a list of (argv, env) trials would cost on the emulated node (time_scale 1)."""
    return sum(simulate(profile, a, e, bench, seed + i)["gpu_s"] for i, (a, e) in enumerate(trials)) / 3600.0


def estimate_sweep(profile: dict, configs_argv_env: Iterable[tuple[list[str], dict]], bench: BenchSpec,
                   seed: int = 0) -> dict[str, Any]:
    """What launching each (argv, env) once would cost on the real node (time_scale 1).

    Every config is run through ``simulate`` (same model as the emulated server): an ok
    config costs startup + warmup/bench + teardown, a failing one its time to failure +
    teardown, each × the GPUs it holds (tp × dp). Noise does not change the cost.

    Args:
        profile: from ``build_profile``.
        configs_argv_env: (SGLang argv, server env) pairs, e.g. a sample of a sweep's space.
        bench: the benchmark each trial runs.
        seed: base seed (config i uses seed + i).

    Returns:
        ``{"n": configs, "gpu_s": [per config, GPU-seconds], "mean_gpu_s", "mean_gpu_s_ok" (over
        the configs that serve), "failure_class": [per config, None when it serves],
        "perf_tags": [per config, e.g. ["allreduce_path_degraded"]], "total_gpu_hours",
        "wall_s": [per config, s: startup + bench + teardown], "mean_wall_s", "mean_startup_s",
        "failed_fraction", "failure_classes": {class: count}}``; means are 0.0 when ``n`` is 0.
    """
    gpu_s: list[float] = []
    ok_gpu_s: list[float] = []
    classes: list[str | None] = []
    tags: list[list[str]] = []
    wall: list[float] = []
    startup: list[float] = []
    fails: dict[str, int] = {}
    for i, (argv, env) in enumerate(configs_argv_env):
        out = simulate(profile, list(argv), dict(env or {}), bench, seed + i)
        teardown = float(profile["node"]["emulator"]["startup"]["teardown_s"])
        gpu_s.append(float(out["gpu_s"]))
        wall.append(float(out["startup_s"]) + float(out["bench_s"]) + teardown)
        startup.append(float(out["startup_s"]))
        classes.append(None if out["status"] == "ok" else str(out["failure_class"]))
        tags.append(list(out["perf_tags"]))
        if out["status"] == "ok":
            ok_gpu_s.append(float(out["gpu_s"]))
        else:
            fails[str(out["failure_class"])] = fails.get(str(out["failure_class"]), 0) + 1
    n = len(gpu_s)

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    return {"n": n, "gpu_s": gpu_s, "mean_gpu_s": mean(gpu_s), "mean_gpu_s_ok": mean(ok_gpu_s),
            "failure_class": classes, "perf_tags": tags, "wall_s": wall,
            "total_gpu_hours": sum(gpu_s) / 3600.0,
            "mean_wall_s": mean(wall), "mean_startup_s": mean(startup),
            "failed_fraction": (sum(fails.values()) / n) if n else 0.0, "failure_classes": fails}


def predict(profile: dict, argv: list[str], env: dict | None = None, **kw):
    """Convenience: the raw ``Prediction`` for argv/env (see ``tasks.emulator.model.evaluate``)."""
    return evaluate_argv(profile, argv, env or {}, **kw)


__all__ = ["simulate", "estimate_gpu_hours", "estimate_sweep", "predict", "evaluate"]
