"""Confirm the winner before declaring it.

``confirm_top(driver, k, repeats)`` re-launches the top ``k`` configs of the study and the
baseline ``repeats`` times each through the driver's executor (fresh launches; the
sweep's own single measurement is *not* reused, so the selection's luck -- the winner's
curse -- does not carry over), and reports per config the mean decode tok/s with a
t-distribution confidence interval (scipy), the speedup over the baseline's mean with
its interval, and whether the greedy output token ids equal the baseline's for the same
prompts. Speculative decoding is lossless: a config whose tokens differ is flagged
``output_mismatch`` and cannot win however fast it is.

The result is stored in the study user attribute ``confirmation`` (read by the findings
document and the report); :func:`mismatched_trials` lists the flagged trials.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from sweeps import records as R
from sweeps.executor import Executor, RayExecutor, collect
from sweeps.objective import Objective, ObjectiveSet
from sweeps.preflight import launch_profile
from sweeps.progress import metric_text
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep.confirm")
ATTR = "confirmation"
# Confirmation runs use trial numbers CONFIRM_BASE + trial * 100 + repeat (work dirs and
# the instant backend's noise seed); far above any study's trial numbers.
CONFIRM_BASE = 10_000_000


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of a two-sided Student-t interval for the mean.

    Args:
        values: measurements (tok/s); at least 2 for an interval.
        confidence: e.g. 0.95.
    Returns:
        ``(mean, nan, nan)`` for fewer than 2 values; ``(mean, mean, mean)`` for zero spread.
    """
    from scipy import stats

    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan"), float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def ratio_interval(a: list[float], b: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Speedup mean(a)/mean(b) with a delta-method t interval (df = min(n) - 1, conservative).

    Returns:
        ``(ratio, low, high)``; NaN bounds with fewer than 2 values on either side.
    """
    from scipy import stats

    if not a or not b:
        return float("nan"), float("nan"), float("nan")
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    r = ma / mb
    if len(a) < 2 or len(b) < 2:
        return r, float("nan"), float("nan")
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = r * math.sqrt(va / ma**2 + vb / mb**2)
    half = float(stats.t.ppf((1 + confidence) / 2, min(len(a), len(b)) - 1)) * se
    return r, r - half, r + half


def _outputs(res: TrialResult) -> list[list[int]]:
    """Greedy output token ids per measured request (request index = prompt index)."""
    return [list(b.get("output_ids") or []) for b in (res.bench or [])]


def compare_tokens(base: list[list[list[int]]], runs: list[list[list[int]]]) -> tuple[bool | None, str]:
    """Compare output ids of a config's runs with the baseline's, prompt by prompt.

    Args:
        base / runs: per run, per request index, the output token ids.
    Returns:
        ``(None, reason)`` when either side has no token ids (e.g. the instant backend),
        ``(True, "")`` when every compared request matches, else ``(False, detail)`` naming
        the first differing request and token position.
    """
    ref: dict[int, list[int]] = {}
    for run in base:
        for i, ids in enumerate(run):
            if ids and i not in ref:
                ref[i] = ids
    if not ref:
        return None, "baseline returned no token ids"
    compared = 0
    for run in runs:
        for i, ids in enumerate(run):
            if not ids or i not in ref:
                continue
            compared += 1
            if ids != ref[i]:
                pos = next((j for j, (x, y) in enumerate(zip(ids, ref[i])) if x != y), min(len(ids), len(ref[i])))
                got = ids[pos] if pos < len(ids) else None
                exp = ref[i][pos] if pos < len(ref[i]) else None
                return False, f"prompt {i}: first difference at output token {pos} (baseline {exp}, got {got})"
    if not compared:
        return None, "no token ids to compare"
    return True, ""


def _label(params: Mapping[str, Any]) -> str:
    from sweeps.tracking import run_name

    return run_name(R.TrialRecord(number=0, state="", params=dict(params), status="ok")).split(" ", 1)[1]


def candidates(records: list[R.TrialRecord], k: int, objective: Objective | ObjectiveSet | None = None,
               ) -> tuple[list[R.TrialRecord], R.TrialRecord | None]:
    """(top ``k`` distinct configs by ``objective`` (default decode_tok_s, maximize) among the
    :func:`sweeps.records.rankable` trials, the baseline trial)."""
    ok = R.ranked_records(records, objective)
    top: list[R.TrialRecord] = []
    seen: set[str] = set()
    for r in ok:
        key = R.config_key(r.params)
        if key not in seen:
            seen.add(key)
            top.append(r)
        if len(top) >= k:
            break
    base = next((r for r in records if r.is_baseline and r.status == "ok"), None)
    return top, base


def confirm_top(driver: Any, k: int = 3, repeats: int = 5, confidence: float = 0.95,
                extra_env: Mapping[str, Mapping[str, str]] | Callable[[dict], Mapping[str, str]] | None = None,
                force: bool = False) -> dict[str, Any]:
    """Re-measure the top ``k`` configs and the baseline ``repeats`` times; pick the winner.

    Args:
        driver: a set-up :class:`sweeps.loop.Driver` (uses its study, spec, profile, backend
            and executor, see :func:`executor_of`).
        k: configs to confirm (0 = skip).  repeats: fresh launches per config (>= 2 for an interval).
        confidence: interval level (0.95).
        extra_env: extra server environment per config (``{config_key: env}`` or a function
            of the params), e.g. ``{"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}`` in tests.
        force: re-run even when the study holds a confirmation of the same candidates.
    Returns:
        ``{"top_k", "repeats", "confidence", "candidates", "baseline_trial", "entries": [{"trial",
        "config", "label", "is_baseline", "values" (tok/s), "n", "mean", "ci_low", "ci_high",
        "speedup_mean", "speedup_ci", "tokens_match", "mismatch_detail", "failures", "verdict"}],
        "winner" (trial number or None), "winner_note", "date", "wall_s"}``; {} when
        there is nothing to confirm.
    """
    recs = R.load_records(driver.study)
    obj = driver.spec.objective_set.primary
    top, base = candidates(recs, k, obj)
    if k <= 0 or not top:
        return {}
    todo: list[tuple[R.TrialRecord, bool]] = ([(base, True)] if base is not None else []) + \
        [(r, False) for r in top if base is None or r.number != base.number]
    cand_ids = [r.number for r, _ in todo]
    old = driver.study.user_attrs.get(ATTR)
    if not force and old and old.get("candidates") == cand_ids and old.get("repeats") == repeats:
        log.info("confirmation of trials %s already done; reusing it", cand_ids)
        return old
    t0 = time.monotonic()
    rounds = int(old.get("round", 0)) + 1 if old else 0  # a re-confirmation draws noise of its own
    jobs = _jobs(driver, todo, repeats, extra_env, rounds)
    log.info("confirming %d config(s) x %d repeats (%d launches)", len(todo), repeats, len(jobs))
    results = run_jobs(executor_of(driver), jobs, len(todo), lambda: bool(getattr(driver, "interrupted", False)),
                       on_done=_progress_line(driver, todo, len(jobs), obj))
    if getattr(driver, "interrupted", False):
        log.warning("confirmation interrupted; nothing stored")
        return {}
    out = summarize(todo, results, repeats, confidence, obj)
    out.update(top_k=k, candidates=cand_ids, round=rounds, date=_dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
               wall_s=round(time.monotonic() - t0, 2))
    _store(driver.study, out)
    return out


def executor_of(driver: Any) -> Executor:
    """The driver's executor (a driver-like object with Ray parts gets a :class:`RayExecutor` over them)."""
    ex = getattr(driver, "executor", None)
    if ex is not None:
        return ex
    return RayExecutor(driver.ray, driver._trial_task, None, str(driver.spec.store_dir / "work"),
                       max(1, int(getattr(driver, "max_inflight", 1))))


def _jobs(driver: Any, todo: list[tuple[R.TrialRecord, bool]], repeats: int,
          extra_env: Mapping[str, Mapping[str, str]] | Callable[[dict], Mapping[str, str]] | None,
          rounds: int = 0) -> list[tuple[int, TrialSpec, dict[str, Any] | None]]:
    """One fresh launch per (config, repeat): ``(config index, spec, profile with its own noise
    seed)``; ``rounds`` = earlier confirmations of this study (their launches are not replayed)."""
    from tasks.backends import get_backend

    spec = driver.spec
    jobs: list[tuple[int, TrialSpec, dict[str, Any] | None]] = []
    for idx, (r, _) in enumerate(todo):
        argv, env, expected = get_backend(spec.backend.kind).render(r.params, spec.node.model_dump(),
                                                                    spec.model.model_dump(), driver.backend)
        env = dict(env)
        if extra_env is not None:
            env.update(extra_env(r.params) if callable(extra_env) else extra_env.get(R.config_key(r.params), {}))
        for rep in range(repeats):
            ts = TrialSpec(sweep=f"{driver.study_name}-confirm", trial_number=CONFIRM_BASE + r.number * 100 + rep,
                           params=r.params, argv=argv, env=env, backend=spec.backend.kind, gpus=spec.gpus_per_trial,
                           bench=spec.bench_spec(), timeouts=spec.timeouts(), container_name=spec.backend.container_name,
                           expected_paths=expected)
            # a fresh launch draws fresh noise, also in a later confirmation round of the same study
            key = f"{driver.study_name}/confirm{rounds}/{r.number}/{rep}"
            jobs.append((idx, ts, launch_profile(driver.profile, key)))
    return jobs


def _progress_line(driver: Any, todo: list[tuple[R.TrialRecord, bool]], total: int,
                   obj: Objective) -> Callable[[int, TrialResult], None] | None:
    """A callback printing one line per finished confirmation launch (None without a progress printer)."""
    progress = getattr(driver, "progress", None)
    if progress is None or not hasattr(progress, "confirm_event"):
        return None
    done = [0]

    def line(idx: int, res: TrialResult) -> None:
        done[0] += 1
        r = todo[idx][0]
        got = metric_text(obj.name, obj.value(res.metrics)) if res.status == "ok" else \
            f"{res.status} {res.failure_class or ''}".strip()
        progress.confirm_event(done[0], total, f"t{r.number} {_label(r.params)}", got)
    return line


def run_jobs(executor: Executor, jobs: list[tuple[int, TrialSpec, dict[str, Any] | None]], n_configs: int,
             interrupted: Callable[[], bool],
             on_done: Callable[[int, TrialResult], None] | None = None) -> dict[int, list[TrialResult]]:
    """Run ``jobs`` through ``executor`` (its slots full); results per config index. A task
    that raised counts as ``infra_error`` (a missing run). On interruption running tasks are
    cancelled. ``on_done(config index, result)`` is called per finished launch."""
    results: dict[int, list[TrialResult]] = {i: [] for i in range(n_configs)}
    pending = list(jobs)
    inflight: dict[Any, int] = {}
    while pending or inflight:
        while pending and len(inflight) < executor.slots and not interrupted():
            idx, ts, prof = pending.pop(0)
            inflight[executor.submit(ts, prof)] = idx
        if not inflight:
            break
        for ref in executor.wait(list(inflight), timeout=1.0):
            idx = inflight.pop(ref)
            results[idx].append(collect(executor, ref))
            if on_done is not None:
                on_done(idx, results[idx][-1])
        if interrupted() and not pending:
            for ref in list(inflight):
                executor.cancel(ref)
            inflight.clear()
    return results


def _entry(r: R.TrialRecord, is_base: bool, vals: list[float], base_vals: list[float] | None,
           runs: list[TrialResult], obj: Objective, confidence: float) -> dict[str, Any]:
    """One config's statistics: mean and t-interval of its repeats, the speedup over the
    baseline (``Objective.ratio`` of the means: > 1 = better) with its interval."""
    mean, lo, hi = t_interval(vals, confidence)
    e: dict[str, Any] = {"trial": r.number, "config": r.params, "label": _label(r.params), "is_baseline": is_base,
                         "sweep_value": R.value_of(r, obj), "values": [round(v, 4) for v in vals], "n": len(vals),
                         "mean": mean, "ci_low": lo, "ci_high": hi,
                         "failures": sorted({x.failure_class or x.status for x in runs if x.status != "ok"})}
    ok = [x.metrics for x in runs if x.status == "ok"]
    # the constrained metrics' means over the repeats must meet the objective's constraints
    means = {c.metric: sum(m.get(c.metric, float("nan")) for m in ok) / len(ok) for c in obj.constraints} if ok else {}
    e["violated"] = [str(c) for c in obj.constraints if ok and not c.holds(means)]
    if base_vals:
        sp, slo, shi = ratio_interval(vals, base_vals, confidence) if obj.maximize else \
            ratio_interval(base_vals, vals, confidence)
        e.update(speedup_mean=sp, speedup_ci=[slo, shi])
    return e


def _note(winner: dict[str, Any] | None, eligible: list[dict[str, Any]], todo: list[tuple[R.TrialRecord, bool]],
          obj: Objective, confidence: float) -> str:
    """The winner's sentence: overlapping intervals, a speedup indistinguishable from 1, a lucky sweep best."""
    if winner is None:
        return "No config passed the confirmation (all failed on re-run or changed the output)."
    ru = eligible[1] if len(eligible) > 1 else None
    parts = [f"Winner t{winner['trial']}: {metric_text(obj.name, winner['mean'])} mean over {winner['n']} runs."]
    # the winner's interval reaches into the runner-up's (towards worse)
    w_edge, r_edge = (winner["ci_low"], ru["ci_high"]) if obj.maximize and ru else \
        ((winner["ci_high"], ru["ci_low"]) if ru else (float("nan"), float("nan")))
    if ru is not None and math.isfinite(w_edge) and math.isfinite(r_edge) and not obj.better(w_edge, r_edge):
        parts.append(f"Its {confidence * 100:.0f} % interval overlaps t{ru['trial']}'s "
                     f"({metric_text(obj.name, ru['mean'])}): the two are not distinguishable at this many repeats.")
    spci = winner.get("speedup_ci") or [float("nan")] * 2
    if not winner["is_baseline"] and math.isfinite(spci[0]) and spci[0] <= 1.0:
        parts.append("Its speedup interval includes 1.0: not distinguishable from the baseline.")
    sweep_best = obj.best([r for r, _ in todo], lambda r: R.value_of(r, obj)) or todo[0][0]
    if sweep_best.number != winner["trial"]:
        parts.append(f"The sweep's single best measurement (t{sweep_best.number}, "
                     f"{metric_text(obj.name, R.value_of(sweep_best, obj))}) did not hold up under repeats.")
    return " ".join(parts)


def summarize(todo: list[tuple[R.TrialRecord, bool]], results: Mapping[int, list[TrialResult]], repeats: int,
              confidence: float, objective: Objective | str = "decode_tok_s") -> dict[str, Any]:
    """Statistics, token comparison, verdicts and the winner (pure; see :func:`confirm_top`).

    ``objective``: what the repeats measure and rank by (a metric name means maximise it).
    """
    obj = Objective(objective) if isinstance(objective, str) else objective
    base_idx = next((i for i, (_, b) in enumerate(todo) if b), None)
    ok_vals = {i: [v for x in rs if x.status == "ok" and (v := obj.value(x.metrics)) is not None]
               for i, rs in results.items()}
    outs = {i: [_outputs(x) for x in rs if x.status == "ok"] for i, rs in results.items()}
    base_vals = ok_vals.get(base_idx) if base_idx is not None else None
    entries: list[dict[str, Any]] = []
    for i, (r, is_base) in enumerate(todo):
        e = _entry(r, is_base, ok_vals.get(i, []), base_vals, results.get(i, []), obj, confidence)
        if is_base:
            e["tokens_match"], e["mismatch_detail"] = None, "reference"
        elif base_idx is None or not outs.get(base_idx):
            e["tokens_match"], e["mismatch_detail"] = None, "no baseline token ids"
        else:
            e["tokens_match"], e["mismatch_detail"] = compare_tokens(outs[base_idx], outs.get(i, []))
        entries.append(e)
    eligible = obj.ranked([e for e in entries if e["n"] >= 1 and e["tokens_match"] is not False
                           and not e["violated"] and math.isfinite(e["mean"])], lambda e: e["mean"])
    winner = eligible[0] if eligible else None
    for e in entries:
        if e["tokens_match"] is False:
            e["verdict"] = "output_mismatch: cannot win"
        elif e["violated"]:
            e["verdict"] = "violates " + ", ".join(e["violated"]) + ": cannot win"
        elif e["n"] == 0:
            e["verdict"] = "failed on re-run: " + ", ".join(e["failures"])
        elif e is winner:
            e["verdict"] = "winner"
        else:
            e["verdict"] = f"#{eligible.index(e) + 1}" if e in eligible else ""
    return {"repeats": repeats, "confidence": confidence,
            "baseline_trial": todo[base_idx][0].number if base_idx is not None else None,
            "entries": entries, "winner": winner["trial"] if winner else None,
            "winner_note": _note(winner, eligible, todo, obj, confidence)}


def _store(study: Any, out: dict[str, Any]) -> None:
    import json

    # finished Optuna trials are immutable: the per-trial flags live in this study attribute
    study.set_user_attr(ATTR, json.loads(json.dumps(out, default=str).replace("NaN", "null")))


def mismatched_trials(confirmation: Mapping[str, Any] | None) -> set[int]:
    """Trial numbers flagged ``output_mismatch`` by a stored confirmation."""
    return {e["trial"] for e in (confirmation or {}).get("entries", []) if e.get("tokens_match") is False}
