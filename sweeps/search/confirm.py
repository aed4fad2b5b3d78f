"""Confirm the winner before declaring it.

``confirm_top(driver, k, repeats)`` re-launches the top ``k`` configs of the study and the
baseline ``repeats`` times each through a :class:`~sweeps.run.runner.Runner` over the sweep's executor (fresh launches; the
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

import contextlib
import datetime as _dt
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import optuna

from sweeps.config.objective import Objective, ObjectiveSet, metric_text
from sweeps.run.runner import Runner
from sweeps.search import decision as decision_stats
from sweeps.search.interfaces import ConfirmHost
from sweeps.store import records as trial_records
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep.confirm")
ATTR = "confirmation"
# Confirmation runs use trial numbers CONFIRM_BASE + trial * 100 + repeat (work dirs and
# the instant backend's noise seed); far above any study's trial numbers.
CONFIRM_BASE = 10_000_000
#: Measured configs simpler than the leader that join the race (:func:`simplifications`), at
#: most 2 x ``repeats`` extra launches plus racing. Two, chosen not tuned: on the campaign it
#: took the seeds' distinct winners from 4 to 3 (benchmarks/results/decision_stability.md);
#: only measured configs can join, which is what still lets the winner vary by seed.
SIMPLER_MAX = 2
#: Configs the race itself adds (:func:`one_step_simplifications` of its pick) that no study
#: trial measured are numbered from here: far above a study's trial numbers (``max_asks`` is at
#: most thousands), and CONFIRM_BASE + number * 100 + repeat stays unique.
DERIVED_BASE = 90_000


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


def ratio_interval(a: list[float], b: list[float], confidence: float = 0.95) -> tuple[float, float, float | None]:
    """Speedup mean(a)/mean(b) with Fieller's interval, never below 0
    (:func:`sweeps.search.decision.fieller_ratio`: ``high`` None when unbounded).

    Returns:
        ``(ratio, low, high)``; NaN bounds with fewer than 2 values on either side.
    """
    return decision_stats.fieller_ratio(a, b, confidence)


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
    from sweeps.store.tracking import run_name

    return run_name(trial_records.TrialRecord(number=0, state="", params=dict(params), status="ok")).split(" ", 1)[1]


def candidates(records: list[trial_records.TrialRecord], k: int, objective: Objective | ObjectiveSet | None = None,
               ) -> tuple[list[trial_records.TrialRecord], trial_records.TrialRecord | None]:
    """(top ``k`` distinct configs by ``objective`` (default decode_tok_s, maximize) among the
    :func:`sweeps.store.records.rankable` trials, the baseline trial)."""
    ok = trial_records.ranked_records(records, objective)
    top: list[trial_records.TrialRecord] = []
    seen: set[str] = set()
    for r in ok:
        key = trial_records.config_key(r.params)
        if key not in seen:
            seen.add(key)
            top.append(r)
        if len(top) >= k:
            break
    base = next((r for r in records if r.is_baseline and r.status == "ok"), None)
    return top, base


def _between(v: Any, lead: Any, base: Any) -> bool:
    """``v`` is the leader's value, the baseline's, or (numbers) lies between them."""
    if v == lead or v == base:
        return True
    return all(decision_stats.is_number(x) for x in (v, lead, base)) and min(lead, base) <= v <= max(lead, base)


def simplifications(records: list[trial_records.TrialRecord], leader: trial_records.TrialRecord,
                    base: trial_records.TrialRecord | None, n: int = SIMPLER_MAX,
                    objective: Objective | ObjectiveSet | None = None,
                    exclude: set[str] | None = None) -> list[trial_records.TrialRecord]:
    """Up to ``n`` measured configs simpler than ``leader``: each knob keeps the leader's value,
    reverts to the baseline's, or (numbers) lies between the two; at least one knob moved, and
    not the baseline itself. The best ``n`` by the sweep's measurement among the
    :func:`sweeps.store.records.rankable` trials, one per config.

    Why: the sweep's best is the largest of noisy single measurements, so on a plateau of
    equivalent configs it is a different member from seed to seed. Racing the leader against
    its measured simplifications lets the tie-break (fewer non-default settings, nearer the
    baseline) choose the same member whichever one the seed measured best.

    Args:
        records: the study's trials.  leader: the sweep's best config.  base: the baseline
            trial (None: no simplifications).  exclude: config keys already in the race.
    Returns:
        trial records, best first; [] without a baseline or when ``n <= 0``.
    """
    if base is None or n <= 0:
        return []
    keys = set(exclude or ()) | {trial_records.config_key(leader.params), trial_records.config_key(base.params)}
    out: list[trial_records.TrialRecord] = []
    for r in trial_records.ranked_records(records, objective):
        key = trial_records.config_key(r.params)
        if key in keys or r.is_baseline:
            continue
        knobs = set(r.params) | set(leader.params) | set(base.params)
        if all(_between(r.params.get(k), leader.params.get(k), base.params.get(k)) for k in knobs):
            keys.add(key)
            out.append(r)
            if len(out) >= n:
                break
    return out


def one_step_simplifications(params: Mapping[str, Any], base: Mapping[str, Any], space: Any,
                              ) -> list[tuple[dict[str, Any], str]]:
    """The configs one step simpler than ``params``: per knob that differs from ``base``, the
    knob moved one level toward the baseline's value (numbers: the nearest level of the knob's
    grid strictly between the two) and the knob reverted to the baseline's value. Conditional
    knobs follow their parent (:meth:`sweeps.config.space.SearchSpace.normalize`); a config
    that breaks a constraint of the space or has no valid value is left out.

    Args:
        params / base: a config and the baseline config (knob -> value).
        space: the sweep's :class:`sweeps.config.space.SearchSpace`.
    Returns:
        ``(config, step)`` pairs in the space's knob order, the step as ``"knob a -> b"``.
    """
    from sweeps.config.space import SpaceError

    out: list[tuple[dict[str, Any], str]] = []
    seen: set[str] = set()
    for p in space.params:
        k = p.name
        v, b = params.get(k), base.get(k)
        if k not in params or k not in base or v == b:
            continue
        moves = [b]
        if decision_stats.is_number(v) and decision_stats.is_number(b):
            try:
                levels = [x for x in p.levels() if decision_stats.is_number(x) and min(v, b) < x < max(v, b)]
            except SpaceError:  # a continuous float has no next level: only the revert
                levels = []
            if levels:
                moves.insert(0, min(levels, key=lambda x: abs(x - v)))
        for m in moves:
            cand = {**base, **params, k: m}
            try:
                cand = space.normalize(cand)
            except SpaceError:
                continue
            key = trial_records.config_key(cand)
            if space.violated(cand) or key in seen:
                continue
            seen.add(key)
            out.append((cand, f"{k} {v} -> {m}"))
    return out


def _derived_records(stored: list[Mapping[str, Any]], recs: list[trial_records.TrialRecord],
                     ) -> list[trial_records.TrialRecord]:
    """The race-added configs of a stored confirmation (``derived``) as records to race again:
    the study's trial where one measured it, else a record of the config alone."""
    by = {r.number: r for r in recs}
    return [by[int(d["trial"])] if d.get("in_study") and int(d["trial"]) in by
            else trial_records.TrialRecord(int(d["trial"]), "CONFIRMATION", dict(d["config"]), "ok") for d in stored]


def _descend(out: Mapping[str, Any], todo: list[tuple[trial_records.TrialRecord, bool]],
             derived: list[dict[str, Any]], recs: list[trial_records.TrialRecord], space: Any, limit: int) -> int:
    """Add the race's pick's :func:`one_step_simplifications` that are not in the race yet
    (to ``todo`` and ``derived``), at most ``limit`` race-added configs in all; a config some
    study trial already measured joins under that trial's number, one the sweep saw fail (and
    never succeed) is left out, any other joins under a new :data:`DERIVED_BASE` number.
    Returns how many were added (0: the descent is over)."""
    pick = out.get("winner")
    base = next((r for r, b in todo if b), None)
    lead = next((r for r, _ in todo if r.number == pick), None)
    if base is None or lead is None or len(derived) >= limit:
        return 0
    have = {trial_records.config_key(r.params) for r, _ in todo}
    study: dict[str, trial_records.TrialRecord] = {}
    failed: set[str] = set()
    for r in recs:  # the same config measured in the sweep joins as that trial
        if r.status == "ok" and not r.is_baseline:
            study.setdefault(trial_records.config_key(r.params), r)
        elif r.status == "failed":  # a config the sweep saw fail is not launched again here
            failed.add(trial_records.config_key(r.params))
    used = {r.number for r, _ in todo}
    added = 0
    for cand, step in one_step_simplifications(lead.params, base.params, space):
        key = trial_records.config_key(cand)
        if key in have or len(derived) >= limit or (key in failed and key not in study):
            continue
        rec = study.get(key)
        if rec is None:
            num = max([DERIVED_BASE - 1, *(n for n in used if n >= DERIVED_BASE)]) + 1
            rec = trial_records.TrialRecord(num, "CONFIRMATION", cand, "ok")
        have.add(key)
        used.add(rec.number)
        todo.append((rec, False))
        derived.append({"trial": rec.number, "config": dict(rec.params), "from": lead.number, "step": step,
                        "in_study": rec.number < DERIVED_BASE})
        log.info("confirmation: t%d (%s) joins the race, one step simpler than the pick t%d", rec.number, step,
                 lead.number)
        added += 1
    return added


def confirm_top(driver: ConfirmHost, k: int = 3, repeats: int = 5, confidence: float = 0.95,
                extra_env: Mapping[str, Mapping[str, str]] | Callable[[dict[str, Any]], Mapping[str, str]] | None = None,
                force: bool = False, margin: float = 0.01, max_repeats: int | None = None,
                serving_check: Callable[[Mapping[str, Any]], bool | None] | None = None,
                simpler_max: int = SIMPLER_MAX, descend: int = 0, futility: bool = True) -> dict[str, Any]:
    """Race the top ``k`` configs, up to ``simpler_max`` measured :func:`simplifications` of
    the best of them, and the baseline: ``repeats`` launches each, then one more
    repeat of the leader and of each contender it is neither separated from nor equivalent to
    (within ``margin``), until the race is decided or each has ``max_repeats`` launches.
    With ``descend`` > 0, a decided race then adds the :func:`one_step_simplifications` of its
    pick that are not in it yet (measured in the sweep or not) and races on, until the pick's
    every one-step simplification is in the race (each separated below it, or the pick would
    have moved to it by the tie-break) or ``descend`` configs were added. The added configs
    are stored in the confirmation (``derived``: trial, config, from, step, in_study), so a
    rerun races the same configs and launches nothing.

    Repeats accumulate in the study (``launches`` of the stored confirmation): a later call
    adds to them and launches nothing when the stored evidence already answers the race at
    these settings (raise ``repeats`` or ``max_repeats`` for more). The evidence is stored after
    every round (marked ``in_progress``), so a driver killed mid-race resumes with the finished
    launches and launches only the missing ones.

    Args:
        driver: a set-up sweep (:class:`ConfirmHost`: its study, spec, profile, backend and
            executor; a ``progress`` with ``confirm_event`` gets one line per launch).
        k: configs to confirm (0 = skip).  repeats: launches per config before the race (>= 2).
        confidence: interval level (0.95).
        extra_env: extra server environment per config (``{config_key: env}`` or a function
            of the params), e.g. ``{"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}`` in tests.
        force: discard the stored evidence and start a new evidence set (a new ``epoch``).
        margin: relative equivalence margin (0.01 = 1 %, ``sweep.confirm.margin``).
        max_repeats: launches per config at most (default ``repeats``: no race).
        serving_check: the serving-check hook, ``entry -> passed`` (None: not checked); read
            by the tie-break (see :mod:`sweeps.search.decision`). None = no check.
        simpler_max: simplifications of the leader that join the race (0 = none).
        descend: one-step simplifications of the pick the race may add (0 = none;
            ``sweep.confirm.descend``); each costs at least ``repeats`` launches.
    Returns:
        the confirmation (shape: :mod:`sweeps.search.decision`'s docstring); {} when there is
        nothing to confirm or the race was interrupted before it stored anything.
    """
    recs = trial_records.load_records(driver.study)
    obj = driver.spec.objective_set.primary
    top, base = candidates(recs, k, obj)
    if k <= 0 or not top:
        return {}
    todo: list[tuple[trial_records.TrialRecord, bool]] = ([(base, True)] if base is not None else []) + \
        [(r, False) for r in top if base is None or r.number != base.number]
    simpler = simplifications(recs, top[0], base, simpler_max, obj,
                              exclude={trial_records.config_key(r.params) for r, _ in todo})
    todo += [(r, False) for r in simpler]
    cap = max(repeats, max_repeats or repeats)
    old = driver.study.user_attrs.get(ATTR) or {}
    ev = Evidence.from_stored(old, obj, new_epoch=force)
    half = driver.study.user_attrs.get(ROUND_ATTR)
    # the configs an earlier run of this race added (its evidence is theirs too), while still wanted
    derived = [dict(d) for d in (old.get("derived") or [])] if descend > 0 and not force else []
    have = {trial_records.config_key(r.params) for r, _ in todo}
    derived = [d for d in derived if trial_records.config_key(d["config"]) not in have][:descend]
    todo += [(r, False) for r in _derived_records(derived, recs)]
    if not force:
        # the stored race's tie group (the configs it could not tell from its pick) stays in the race
        # of a continued study: their repeats are evidence, and a new top k by single runs drops them
        by = {r.number: r for r in recs}
        have = {trial_records.config_key(r.params) for r, _ in todo}
        tied = [by[t] for t in old.get("tie_group") or [] if t in by and by[t].status == "ok"
                and trial_records.config_key(by[t].params) not in have]
        todo += [(r, False) for r in tied]
    space = driver.spec.space if descend > 0 else None
    if half and not force:  # launches a killed driver finished in a round it did not close: kept
        _merge_half_round(ev, todo, half, obj)
    t0 = time.monotonic()
    renders = _renders(driver, todo, extra_env)
    nondef = non_default_counts(renders, next((i for i, (_, b) in enumerate(todo) if b), None))
    launched_round = False
    runner: Runner[int] | None = None
    while not driver.interrupted:
        out = ev.summarize(todo, repeats, confidence, obj, margin=margin, max_repeats=cap,
                           non_default=nondef, serving_check=serving_check, futility=futility)
        need = ev.needed(todo, repeats, out)
        if not need and space is not None and _descend(out, todo, derived, recs, space, descend):
            renders = _renders(driver, todo, extra_env)
            nondef = non_default_counts(renders, next((i for i, (_, b) in enumerate(todo) if b), None))
            continue
        if not need:
            break
        if runner is None:
            # the sweep's executor (its slots, its Ray); a repeat lost to a transient failure is a missing
            # value, launched again by the next round (Evidence.needed)
            runner = Runner(driver.executor, driver.profile, driver.spec.backend.retries_transient)
        rnd = ev.next_round  # each batch of launches is a round of its own: ev.add advances ev.round
        jobs = _jobs(driver, todo, need, ev, renders, rnd)
        log.info("confirmation round %d: %d launch(es) (%s)", rnd, len(jobs),
                 ", ".join(f"t{todo[i][0].number} x{n}" for i, n in need.items()))
        results = run_jobs(runner, [(i, ts, key) for i, ts, key, _ in jobs], len(todo),
                           lambda: bool(driver.interrupted),
                           on_done=_checkpointed(driver.study, ev, todo, rnd,
                                                 _progress_line(getattr(driver, "progress", None), todo, len(jobs), obj)))
        ev.add(todo, jobs, results, rnd, obj)
        launched_round = True
        if driver.interrupted:
            break
        # stored after every round: a driver killed later (SIGKILL, OOM) resumes from here and
        # launches only what is missing; the final store below replaces it
        part = ev.summarize(todo, repeats, confidence, obj, margin=margin, max_repeats=cap, non_default=nondef,
                            serving_check=serving_check, futility=futility)
        _mark_derived(part, derived)
        part.update(top_k=k, derived=derived, candidates=[r.number for r, _ in todo], round=rnd, in_progress=True,
                    date=_dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
                    wall_s=round(time.monotonic() - t0 + (0.0 if force else float(old.get("wall_s") or 0.0)), 2),
                    winner_note="Race in progress: " + str(part.get("winner_note") or ""))
        _store(driver.study, part)
        _clear_half_round(driver.study)
    if driver.interrupted and not launched_round and not old:
        log.warning("confirmation interrupted; nothing stored")
        return {}
    out = ev.summarize(todo, repeats, confidence, obj, margin=margin, max_repeats=cap, non_default=nondef,
                       serving_check=serving_check, futility=futility)
    cand_ids = [r.number for r, _ in todo]
    _mark_derived(out, derived)
    if (not launched_round and old and not old.get("in_progress") and old.get("candidates") == cand_ids
            and ev.same_decision(old, out)):
        log.info("confirmation of trials %s already answered by %d stored launch(es); nothing launched",
                 cand_ids, len(ev.launches))
        return old  # type: ignore[no-any-return]
    out.update(top_k=k, derived=derived, candidates=cand_ids, round=max(ev.round, 0),
               date=_dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat() if launched_round
               else old.get("date", _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()),
               wall_s=round(time.monotonic() - t0 + (0.0 if force else float(old.get("wall_s") or 0.0)), 2))
    if driver.interrupted:
        out["winner_note"] = "Interrupted: " + str(out.get("winner_note") or "")
    _store(driver.study, out)
    _clear_half_round(driver.study)
    return out


#: the study attribute holding the finished launches of a round not yet closed: a driver killed
#: mid-round (SIGKILL, OOM) loses none of them; the next run merges them before it launches
ROUND_ATTR = "confirmation_round"


def _checkpointed(study: optuna.Study, ev: Evidence, todo: list[tuple[trial_records.TrialRecord, bool]], rnd: int,
                  then: Callable[[int, TrialResult], None] | None) -> Callable[[int, TrialResult], None]:
    """``run_jobs``' per-launch callback: store the launch in :data:`ROUND_ATTR` (its trial, status,
    objective and constrained metrics, failure, times and output token ids), then ``then``."""
    done: dict[str, list[dict[str, Any]]] = {}

    def on_done(idx: int, res: TrialResult) -> None:
        if res.status != "interrupted":
            done.setdefault(str(todo[idx][0].number), []).append(
                {"status": res.status, "metrics": dict(res.metrics), "failure_class": res.failure_class,
                 "wall_s": res.wall_s, "gpu_s": res.gpu_s, "outputs": _outputs(res) if res.status == "ok" else []})
            with contextlib.suppress(Exception):  # a checkpoint that cannot be written costs only a relaunch
                _store_attr(study, ROUND_ATTR, {"epoch": ev.epoch, "round": rnd, "done": done})
        if then is not None:
            then(idx, res)
    return on_done


def _merge_half_round(ev: Evidence, todo: list[tuple[trial_records.TrialRecord, bool]], half: Mapping[str, Any],
                      obj: Objective) -> None:
    """Add the launches of a round a killed driver did not close (:data:`ROUND_ATTR`) to ``ev``, in
    :meth:`Evidence.add`'s order (the baseline's first: its outputs are the reference); nothing when
    they belong to another evidence set or a round ``ev`` already holds."""
    if int(half.get("epoch", -1)) != ev.epoch or int(half.get("round", -1)) <= ev.round:
        return
    rnd = int(half["round"])
    by_trial = {str(r.number): i for i, (r, _) in enumerate(todo)}
    jobs: list[tuple[int, Any, str, int]] = []
    results: dict[int, list[TrialResult]] = {}
    for t, runs in (half.get("done") or {}).items():
        if t not in by_trial:
            continue
        idx = by_trial[t]
        first = ev.launched(int(t))
        for k, x in enumerate(runs):
            res = TrialResult(status=x.get("status") or "infra_error", metrics=dict(x.get("metrics") or {}),
                              failure_class=x.get("failure_class"),
                              bench=[{"output_ids": ids} for ids in x.get("outputs") or []])
            res.wall_s, res.gpu_s = float(x.get("wall_s") or 0.0), float(x.get("gpu_s") or 0.0)
            results.setdefault(idx, []).append(res)
            jobs.append((idx, None, "", first + k))
    if results:
        ev.add(todo, jobs, results, rnd, obj)
        log.info("confirmation: %d launch(es) of round %d, finished before the last run stopped, kept",
                 sum(len(v) for v in results.values()), rnd)


def _clear_half_round(study: optuna.Study) -> None:
    if study.user_attrs.get(ROUND_ATTR):
        with contextlib.suppress(Exception):
            study.set_user_attr(ROUND_ATTR, {})


Render = tuple[list[str], dict[str, str], Any]  # argv, env, expected paths (as the backend renders them)


def _renders(driver: ConfirmHost, todo: list[tuple[trial_records.TrialRecord, bool]],
             extra_env: Mapping[str, Mapping[str, str]] | Callable[[dict[str, Any]], Mapping[str, str]] | None,
             ) -> list[Render]:
    """Per config its launch ``(argv, env, expected paths)`` as the backend renders it (plus
    ``extra_env``)."""
    from tasks.backends import get_backend

    spec = driver.spec
    out: list[Render] = []
    for r, _ in todo:
        argv, env, expected = get_backend(spec.backend.kind).render(r.params, spec.node.model_dump(),
                                                                    spec.model.model_dump(), driver.backend)
        env = dict(env)
        if extra_env is not None:
            env.update(extra_env(r.params) if callable(extra_env) else extra_env.get(trial_records.config_key(r.params), {}))
        out.append((list(argv), env, expected))
    return out


def _options(argv: list[str]) -> dict[str, str | None]:
    """``--flag [value]`` pairs of a launch command line (positional tokens before the first
    flag, e.g. ``python -m sglang.launch_server``, are not settings)."""
    opts: dict[str, str | None] = {}
    i = next((j for j, t in enumerate(argv) if t.startswith("--")), len(argv))
    while i < len(argv):
        flag = argv[i].split("=", 1)
        if len(flag) == 2:
            opts[flag[0]] = flag[1]
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            opts[flag[0]] = argv[i + 1]
            i += 2
        else:
            opts[flag[0]] = None
            i += 1
    return opts


def non_default_counts(renders: list[Render], base_idx: int | None) -> list[int]:
    """Per config the settings its launch sets differently from the baseline's: environment
    variables and command-line flags added, removed or given another value (the tie-break's
    "fewer non-default settings"). All 0 without a baseline."""
    if base_idx is None:
        return [0] * len(renders)
    bargv, benv, _ = renders[base_idx]
    bopt = _options(bargv)

    def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
        return sum(1 for k in set(a) | set(b) if k not in a or k not in b or a[k] != b[k])
    return [diff(env, benv) + diff(_options(argv), bopt) for argv, env, _ in renders]


def _jobs(driver: ConfirmHost, todo: list[tuple[trial_records.TrialRecord, bool]], need: Mapping[int, int],
          ev: Evidence, renders: list[Render], rnd: int) -> list[tuple[int, TrialSpec, str, int]]:
    """One fresh launch per (config, new repeat): ``(config index, spec, key of its launch
    profile: its own noise seed, repeat)``; a repeat index counts the config's launches over
    all rounds, so no two launches of a study share a seed or a name."""
    spec = driver.spec
    jobs: list[tuple[int, TrialSpec, str, int]] = []
    for idx, n in sorted(need.items()):
        r = todo[idx][0]
        argv, env, expected = renders[idx]
        first = ev.launched(r.number)
        for rep in range(first, first + n):
            ts = TrialSpec(sweep=f"{driver.study_name}-confirm", trial_number=CONFIRM_BASE + r.number * 100 + rep,
                           params=r.params, argv=argv, env=env, backend=spec.backend.kind, gpus=spec.gpus_per_trial,
                           bench=spec.bench_spec(), timeouts=spec.timeouts(), container_name=spec.backend.container_name,
                           expected_paths=expected)
            # a fresh launch draws fresh noise: the seed key names the evidence set, round and repeat
            jobs.append((idx, ts, f"{driver.study_name}/confirm{rnd}/e{ev.epoch}/{r.number}/{rep}", rep))
    return jobs


def _missing(launch: Mapping[str, Any]) -> bool:
    """A stored confirmation launch that measured nothing for a reason outside the config: failed
    with a transient or infra class (``tasks.failures.KIND``), or an infra error."""
    if launch.get("status") == "ok":  # ran to its end (a value the objective could not take is still its result)
        return False
    if launch.get("status") == "infra_error":
        return True
    from tasks.failures import KIND

    return KIND.get(str(launch.get("failure") or ""), "transient") in ("transient", "infra")


class Evidence:
    """The confirmation launches of one evidence set (``epoch``) of a study, over all rounds:
    per launch its trial, repeat, round, status, objective value, constrained metrics and wall
    time; the baseline's reference token ids and each config's token verdict. Built from the
    stored confirmation (:meth:`from_stored`), grown by :meth:`add`."""

    def __init__(self, epoch: int = 0, round_: int = -1, launches: list[dict[str, Any]] | None = None,
                 ref_ids: dict[str, list[int]] | None = None, tokens: dict[str, list[Any]] | None = None):
        self.epoch, self.round = epoch, round_
        self.launches: list[dict[str, Any]] = list(launches or [])
        self.ref_ids: dict[str, list[int]] = dict(ref_ids or {})
        self.tokens: dict[str, list[Any]] = dict(tokens or {})

    @classmethod
    def from_stored(cls, old: Mapping[str, Any], obj: Objective, new_epoch: bool = False) -> Evidence:
        """The evidence of a stored confirmation; a confirmation stored before launches were
        kept contributes its entries' values as launches of its round. ``new_epoch``: start
        over (the old launches no longer count), in a round after the stored one."""
        if not old:
            return cls()
        rnd = int(old.get("round") or 0)
        if new_epoch:
            return cls(int(old.get("epoch") or 0) + 1, rnd)
        if "launches" in old:
            return cls(int(old.get("epoch") or 0), rnd, old.get("launches"), old.get("ref_ids"), old.get("tokens"))
        launches = [{"trial": int(e["trial"]), "repeat": i, "round": rnd, "status": "ok", "value": v,
                     "failure": None, "metrics": {}, "wall_s": None}
                    for e in old.get("entries", []) for i, v in enumerate(e.get("values") or [])]
        tokens = {str(e["trial"]): [e.get("tokens_match"), e.get("mismatch_detail") or ""]
                  for e in old.get("entries", []) if not e.get("is_baseline")}
        return cls(0, rnd, launches, None, tokens)

    @property
    def next_round(self) -> int:
        return self.round + 1

    def launched(self, trial: int) -> int:
        """Launches of ``trial`` so far (ok or not)."""
        return sum(1 for x in self.launches if x["trial"] == trial)

    def counted(self, trial: int) -> int:
        """Launches of ``trial`` that count as repeats: measured ones, and failures of a
        deterministic class (the config fails on re-run: that is its verdict). A transient or infra
        failure (a server that crashed, a stalled stream, a lost node) measured nothing about the
        config: a missing value, launched again (:meth:`lost`)."""
        return sum(1 for x in self.launches if x["trial"] == trial and not _missing(x))

    def lost(self, trial: int) -> int:
        """Launches of ``trial`` that measured nothing (:meth:`counted`'s complement)."""
        return sum(1 for x in self.launches if x["trial"] == trial and _missing(x))

    def results(self, todo: list[tuple[trial_records.TrialRecord, bool]], obj: Objective) -> dict[int, list[TrialResult]]:
        """Per config index its launches as results (objective value and constrained metrics)."""
        out: dict[int, list[TrialResult]] = {}
        for i, (r, _) in enumerate(todo):
            out[i] = []
            for x in self.launches:
                if x["trial"] != r.number:
                    continue
                ok = x["status"] == "ok" and x.get("value") is not None
                metrics = {**(x.get("metrics") or {}), **({obj.name: x["value"]} if ok else {})}
                res = TrialResult(status="ok" if ok else "infra_error", metrics=metrics,
                                  failure_class=None if ok else (x.get("failure") or x["status"]))
                res.wall_s = float(x.get("wall_s") or 0.0)
                out[i].append(res)
        return out

    def add(self, todo: list[tuple[trial_records.TrialRecord, bool]], jobs: list[tuple[int, TrialSpec, str, int]],
            results: Mapping[int, list[TrialResult]], rnd: int, obj: Objective) -> None:
        """Record a round's results (a cancelled launch is not recorded: it is launched again)
        and compare their token ids with the baseline's."""
        reps: dict[int, list[int]] = {}
        for idx, _, _, rep in jobs:
            reps.setdefault(idx, []).append(rep)
        order = sorted(results, key=lambda i: not todo[i][1])  # the baseline first: its ids are the reference
        for idx in order:
            r, is_base = todo[idx]
            got = [x for x in results[idx] if x.status != "interrupted"]
            for rep, res in zip(reps.get(idx, []), got):
                ok = res.status == "ok" and obj.value(res.metrics) is not None
                self.launches.append({
                    "trial": r.number, "repeat": rep, "round": rnd, "status": res.status, "objective": obj.name,
                    "value": obj.value(res.metrics) if ok else None,
                    "failure": None if ok else (res.failure_class or res.status),
                    "metrics": {c.metric: res.metrics[c.metric] for c in obj.constraints if c.metric in res.metrics},
                    "wall_s": round(res.wall_s, 3), "gpu_s": round(float(res.gpu_s or 0.0), 3)})
            outs = [_outputs(x) for x in got if x.status == "ok"]
            if is_base:
                for run in outs:
                    for i, ids in enumerate(run):
                        if ids and str(i) not in self.ref_ids:
                            self.ref_ids[str(i)] = ids
            elif outs:
                self._compare(r.number, outs)
        if any(results.get(i) for i in results):
            self.round = max(self.round, rnd)

    def _compare(self, trial: int, outs: list[list[list[int]]]) -> None:
        """Fold a round's token comparison into ``trial``'s verdict (False sticks)."""
        if not self.ref_ids:
            match, detail = None, "no baseline token ids"
        else:
            n = max(int(i) for i in self.ref_ids) + 1
            match, detail = compare_tokens([[self.ref_ids.get(str(i), []) for i in range(n)]], outs)
        prev = self.tokens.get(str(trial))
        if prev is not None and prev[0] is False:
            return
        if prev is not None and prev[0] is True and match is None:
            return
        self.tokens[str(trial)] = [match, detail]

    def needed(self, todo: list[tuple[trial_records.TrialRecord, bool]], repeats: int, out: Mapping[str, Any]) -> dict[int, int]:
        """Launches to make next, per config index: the initial ``repeats`` first, then one more
        of each config the race asks for (``decision["more"]``)."""
        # a config whose launches keep failing for transient reasons is relaunched until as many have
        # been lost as the repeats asked for; it then stands on what it measured
        live = {i: r.number for i, (r, _) in enumerate(todo) if self.lost(r.number) < max(repeats, 1)}
        first = {i: repeats - self.counted(t) for i, t in live.items() if self.counted(t) < repeats}
        if first:
            return first
        more = set((out.get("decision") or {}).get("more") or [])
        return {i: 1 for i, t in live.items() if t in more}

    def summarize(self, todo: list[tuple[trial_records.TrialRecord, bool]], repeats: int, confidence: float, obj: Objective,
                  **kw: Any) -> dict[str, Any]:
        """:func:`summarize` of this evidence, with its launches, epoch and reference ids."""
        res = self.results(todo, obj)
        tokens: dict[int, tuple[bool | None, str]] = {}
        for i, (r, is_base) in enumerate(todo):
            if is_base:
                continue
            t = self.tokens.get(str(r.number))
            tokens[i] = (t[0], str(t[1])) if t else (None, "no baseline token ids")
        out = summarize(todo, res, repeats, confidence, obj, tokens=tokens, **kw)
        out.update(epoch=self.epoch, launches=self.launches, ref_ids=self.ref_ids, tokens=self.tokens)
        return out

    @staticmethod
    def same_decision(old: Mapping[str, Any], out: Mapping[str, Any]) -> bool:
        """Whether ``out`` says what the stored ``old`` says (winner, tie group, repeats per config)."""
        if "launches" not in old:
            return False
        ns = lambda c: {e["trial"]: e.get("n") for e in c.get("entries", [])}  # noqa: E731
        return bool(old.get("winner") == out.get("winner") and old.get("tie_group") == out.get("tie_group")
                    and ns(old) == ns(out) and old.get("margin") == out.get("margin")
                    and old.get("max_repeats") == out.get("max_repeats"))


class _ConfirmProgress(Protocol):
    def confirm_event(self, done: int, total: int, label: str, result: str) -> None: ...


def _progress_line(progress: _ConfirmProgress | None, todo: list[tuple[trial_records.TrialRecord, bool]], total: int,
                   obj: Objective) -> Callable[[int, TrialResult], None] | None:
    """A callback printing one line per finished confirmation launch (None without a progress printer)."""
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


def run_jobs(runner: Runner[int], jobs: list[tuple[int, TrialSpec, str]], n_configs: int,
             interrupted: Callable[[], bool],
             on_done: Callable[[int, TrialResult], None] | None = None) -> dict[int, list[TrialResult]]:
    """Run ``jobs`` (``(config index, spec, launch-profile key)``) through ``runner`` (its slots
    full); results per config index. A task that raised counts as ``infra_error`` (a missing
    run). On interruption running tasks are cancelled. ``on_done(config index, result)`` is
    called per finished launch."""
    results: dict[int, list[TrialResult]] = {i: [] for i in range(n_configs)}
    pending = list(jobs)
    while pending or runner.inflight:
        while pending and runner.has_room() and not interrupted():
            idx, ts, key = pending.pop(0)
            runner.submit(ts, key, idx)
        if not runner.inflight:
            break
        for ref in runner.wait(timeout=1.0):
            idx, res = runner.take(ref)
            results[idx].append(res)
            if on_done is not None:
                on_done(idx, res)
        if interrupted() and not pending:
            runner.cancel_all()
            runner.drop_all()
    return results


def _entry(r: trial_records.TrialRecord, is_base: bool, vals: list[float], base_vals: list[float] | None,
           runs: list[TrialResult], obj: Objective, confidence: float) -> dict[str, Any]:
    """One config's statistics: mean and t-interval of its repeats, the speedup over the
    baseline (``Objective.ratio`` of the means: > 1 = better) with its Fieller interval."""
    mean, lo, hi = t_interval(vals, confidence)
    e: dict[str, Any] = {"trial": r.number, "config": r.params, "label": _label(r.params), "is_baseline": is_base,
                         "sweep_value": trial_records.value_of(r, obj), "values": [round(v, 4) for v in vals], "n": len(vals),
                         "launched": len(runs), "mean": mean, "ci_low": lo, "ci_high": hi, "interval": [lo, hi],
                         "failures": sorted({x.failure_class or x.status for x in runs if x.status != "ok"})}
    ok = [x.metrics for x in runs if x.status == "ok"]
    # the constrained metrics' means over the repeats must meet the objective's constraints
    means = {c.metric: sum(m.get(c.metric, float("nan")) for m in ok) / len(ok) for c in obj.constraints} if ok else {}
    e["violated"] = [str(c) for c in obj.constraints if ok and not c.holds(means)]
    walls = [x.wall_s for x in runs if x.status == "ok" and x.wall_s]
    e["cost"] = round(sum(walls) / len(walls), 3) if walls else 0.0
    if base_vals:
        sp, slo, shi = ratio_interval(vals, base_vals, confidence) if obj.maximize else \
            ratio_interval(base_vals, vals, confidence)
        e.update(speedup_mean=sp, speedup_ci=[slo, shi], ratio_interval=[slo, shi])
    return e


def _note(winner: dict[str, Any] | None, eligible: list[dict[str, Any]], todo: list[tuple[trial_records.TrialRecord, bool]],
          obj: Objective, confidence: float, decision: decision_stats.Decision | None = None) -> str:
    """The winner's sentence: the race's decision (separated, equivalent, budget spent: the tie
    group and the tie-break), a speedup indistinguishable from 1, a lucky sweep best."""
    if winner is None:
        return "No config passed the confirmation (all failed on re-run or changed the output)."
    parts = [f"Winner t{winner['trial']}: {metric_text(obj.name, winner['mean'])} mean over {winner['n']} runs."]
    if decision is not None and decision.reason:
        parts.append(decision.reason)
    spci = winner.get("speedup_ci") or [float("nan")] * 2
    if not winner["is_baseline"] and spci[0] is not None and math.isfinite(spci[0]) and spci[0] <= 1.0:
        parts.append("Its speedup interval includes 1.0: not distinguishable from the baseline.")
    sweep_best = obj.best([r for r, _ in todo], lambda r: trial_records.value_of(r, obj)) or todo[0][0]
    if sweep_best.number != winner["trial"] and sweep_best.number not in (decision.tie_group if decision else []):
        parts.append(f"The sweep's single best measurement (t{sweep_best.number}, "
                     f"{metric_text(obj.name, trial_records.value_of(sweep_best, obj))}) did not hold up under repeats.")
    return " ".join(parts)


def summarize(todo: list[tuple[trial_records.TrialRecord, bool]], results: Mapping[int, list[TrialResult]], repeats: int,
              confidence: float, objective: Objective | str = "decode_tok_s", *, margin: float = 0.01,
              max_repeats: int | None = None, tokens: Mapping[int, tuple[bool | None, str]] | None = None,
              non_default: list[int] | None = None,
              serving_check: Callable[[Mapping[str, Any]], bool | None] | None = None,
              futility: bool = True) -> dict[str, Any]:
    """Statistics, token comparison, the race's decision, verdicts and the pick (pure; see
    :func:`confirm_top` and the shape in :mod:`sweeps.search.decision`).

    Args:
        objective: what the repeats measure and rank by (a metric name means maximise it).
        margin / max_repeats: the race's equivalence margin and repeat budget (default
            ``repeats``: the race is decided on what was launched).
        tokens: per config index its token verdict ``(match, detail)``; default: compared
            here from the results' output ids.
        non_default: per config index its non-default settings (tie-break; default 0).
        serving_check: ``entry -> passed`` or None (the serving-check hook of the tie-break).
    """
    obj = Objective(objective) if isinstance(objective, str) else objective
    cap = max(repeats, max_repeats or repeats)
    base_idx = next((i for i, (_, b) in enumerate(todo) if b), None)
    ok_vals = {i: [v for x in rs if x.status == "ok" and (v := obj.value(x.metrics)) is not None]
               for i, rs in results.items()}
    outs = {i: [_outputs(x) for x in rs if x.status == "ok"] for i, rs in results.items()}
    base_vals = ok_vals.get(base_idx) if base_idx is not None else None
    entries: list[dict[str, Any]] = []
    for i, (r, is_base) in enumerate(todo):
        e = _entry(r, is_base, ok_vals.get(i, []), base_vals, results.get(i, []), obj, confidence)
        e["non_default"] = non_default[i] if non_default else 0
        e["departure"] = decision_stats.departure(r.params, todo[base_idx][0].params) if base_idx is not None else 0.0
        if is_base:
            e["tokens_match"], e["mismatch_detail"] = None, "reference"
        elif tokens is not None:
            e["tokens_match"], e["mismatch_detail"] = tokens.get(i, (None, "no baseline token ids"))
        elif base_idx is None or not outs.get(base_idx):
            e["tokens_match"], e["mismatch_detail"] = None, "no baseline token ids"
        else:
            e["tokens_match"], e["mismatch_detail"] = compare_tokens(outs[base_idx], outs.get(i, []))
        e["serving_ok"] = serving_check(e) if serving_check is not None else None
        entries.append(e)
    eligible = obj.ranked([e for e in entries if e["n"] >= 1 and e["tokens_match"] is not False
                           and not e["violated"] and math.isfinite(e["mean"])], lambda e: e["mean"])
    dec = decision_stats.decide([decision_stats.Contender(e["trial"], [float(v) for v in e["values"]], int(e["launched"]),
                                                          e in eligible, e["is_baseline"], int(e["non_default"]),
                                                          float(e["cost"]), e["serving_ok"], float(e["departure"]))
                    for e in entries], obj.maximize, margin, confidence, cap, futility=futility,
                   fmt=lambda v: metric_text(obj.name, v))
    winner = next((e for e in entries if e["trial"] == dec.pick), None)
    for e in entries:
        e["vs_leader"] = dec.relation.get(e["trial"], "out")
        e["in_tie_group"] = e["trial"] in dec.tie_group
        if e["tokens_match"] is False:
            e["verdict"] = "output_mismatch: cannot win"
        elif e["violated"]:
            e["verdict"] = "violates " + ", ".join(e["violated"]) + ": cannot win"
        elif e["n"] == 0:
            e["verdict"] = "failed on re-run: " + ", ".join(e["failures"])
        elif e is winner:
            e["verdict"] = "winner"
        elif e["in_tie_group"]:
            e["verdict"] = "tie group: not picked"
        else:
            e["verdict"] = f"#{eligible.index(e) + 1}" if e in eligible else ""
    status = dec.status if dec.status != "racing" else "interrupted"
    reason = dec.reason if dec.status != "racing" else \
        f"Interrupted while racing: t{dec.leader} leads, {', '.join(f't{t}' for t in dec.more if t != dec.leader)} undecided."
    dec.reason = reason
    return {"repeats": repeats, "max_repeats": cap, "margin": margin, "confidence": confidence,
            "baseline_trial": todo[base_idx][0].number if base_idx is not None else None,
            "entries": entries, "winner": winner["trial"] if winner else None,
            "tie_group": list(dec.tie_group), "decision_reason": reason,
            "decision": {"status": status, "reason": reason, "leader": dec.leader, "pick": dec.pick,
                         "tie_group": list(dec.tie_group), "tie_break": decision_stats.TIE_BREAK, "more": list(dec.more),
                         "settled": list(dec.settled), "needed": dec.needed},
            "winner_note": _note(winner, eligible, todo, obj, confidence, dec)}


def _mark_derived(out: Mapping[str, Any], derived: list[dict[str, Any]]) -> None:
    """Tag the entries of the race-added configs: ``derived_from`` (the pick they simplify),
    ``step`` and ``in_study`` (False: the race's launches are its only measurements)."""
    by = {int(d["trial"]): d for d in derived}
    for e in out.get("entries", []):
        d = by.get(int(e["trial"]))
        if d is not None:
            e.update(derived_from=d["from"], step=d["step"], in_study=bool(d["in_study"]))


def config_record(recs: list[trial_records.TrialRecord], confirmation: Mapping[str, Any] | None,
                  trial: Any) -> trial_records.TrialRecord | None:
    """The record of a confirmed ``trial``: the study's trial, else (a config only the race
    measured, :data:`DERIVED_BASE` up) a record built from its confirmation entry (status ok,
    the objective's confirmed mean as its one metric, the environment fingerprint of the
    study's latest trial that has one: the race ran after the trials, in the same sweep). None
    when neither knows ``trial``."""
    if trial is None:
        return None
    r = next((r for r in recs if r.number == trial), None)
    if r is not None:
        return r
    conf = confirmation or {}
    e = next((e for e in conf.get("entries", []) if e.get("trial") == trial), None)
    if e is None or not isinstance(e.get("config"), dict):
        return None
    name = next((x.get("objective") for x in conf.get("launches") or [] if x.get("objective")), "decode_tok_s")
    mean = e.get("mean")
    metrics = {str(name): float(mean)} if isinstance(mean, int | float) and math.isfinite(mean) else {}
    fp = next((r.fingerprint for r in sorted(recs, key=lambda r: -r.number) if r.fingerprint), {})
    return trial_records.TrialRecord(int(trial), "CONFIRMATION", dict(e["config"]), "ok", metrics, fingerprint=dict(fp))


def _store(study: optuna.Study, out: dict[str, Any]) -> None:
    # finished Optuna trials are immutable: the per-trial flags live in this study attribute
    _store_attr(study, ATTR, out)


def _store_attr(study: optuna.Study, key: str, value: Mapping[str, Any]) -> None:
    import json

    study.set_user_attr(key, json.loads(json.dumps(value, default=str).replace("NaN", "null")))


def mismatched_trials(confirmation: Mapping[str, Any] | None) -> set[int]:
    """Trial numbers flagged ``output_mismatch`` by a stored confirmation."""
    return {e["trial"] for e in (confirmation or {}).get("entries", []) if e.get("tokens_match") is False}
