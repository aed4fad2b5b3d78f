"""Fair coverage of the approaches a sweep exists to compare (``sweep.approaches``).

A sweep names one categorical knob whose levels are its approaches (the campaign:
``speculative`` none vs eagle3) and a minimum share of launches for each. Left to itself
TPE exploits the first approach that measures well and the other one is barely launched (the
campaign spent 2 of 30 launches on EAGLE-3 although its question was whether EAGLE-3 pays).

The quota is owed *by the end of the trial budget* (``sweep.budget.trials``), not first: each
approach is owed ``ceil(min_share x budget)`` launches minus its launches so far (finished and
in flight). While the launches left in the budget exceed the sum of what is owed, the sampler
exploits freely, so the best config is reached as early as without a quota; once they do not,
each free ask is *pinned* to the approach owed most: the trial is enqueued with only the
approach knob fixed, so the sampler (TPE) still chooses every other knob within the approach
(the draft grid of EAGLE-3) from what it has learned. A pinned proposal that a gate answers (a
dead end, a repeat) is redirected to an untried config of the same approach
(:func:`sweeps.search.untried.redirect` with ``within``), so a dead end does not hand the
launch back to the other approach. Paying first cost the campaign about 1 emulated GPU-hour
to its best config (3.38 against 1.55, median of 5 seeds, ``benchmarks/sweep_efficiency.py``).

A sweep stopped before its trial budget (``wall_time_s``, ``gpu_hours``, ``max_asks``) may end
with the quota owed and not paid; the findings' coverage section says so with the stop reason.
A sweep without a trial budget has no end to owe by: there the quota is a running one, due
whenever an approach's launches are fewer than ``min_share`` x (launches + 1).

Approaches still in the race (their bests within ``compare_within``, default 10 %, of the
leader's) are compared on equal footing: before a free ask of the sampler, the best config of
one is launched with one shared knob of the other's best (:meth:`Coverage.crosses`; the
searcher takes the first untried, feasible one the node's knowledge allows). A plain config
and an EAGLE-3 one each measured at different all-reduce paths say little about EAGLE-3, and a
knob's effect is often not the same under both (a faster all-reduce shortens a verify pass of
many tokens more than a plain decode step). On the benchmark's ``far`` landscape (EAGLE-3 with
the custom all-reduce is the optimum, each approach's seed used the other all-reduce) this
took the median to its best from 6.33 to 4.78 emulated GPU-h over 21 seeds. The leading
approach also takes the shared knobs of an approach out of the race (EAGLE-3 far behind on the
campaign's node: the baseline is launched with the 128 CUDA graphs of the team's EAGLE-3 seed),
so the knowledge a user's seed encodes reaches the leader; on the ``stale`` landscape (three
dead ends that work, a faster custom all-reduce) that took the median from 3.76 to 2.10
emulated GPU-h, 11 seeds.

Opt-in (``release_below``, default off): an approach's quota is *released* once it has at least
``release_after`` ok launches and its best measurement lies more than ``release_below`` below
another approach's best (:meth:`Coverage.released`); it then gets only what the sampler gives
it. The findings' coverage section states the evidence (:func:`release_lines`). Released is
re-evaluated at every ask: a better config of the approach brings its quota back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeps.config.objective import Objective
from sweeps.config.space import SearchSpace
from sweeps.config.spec import ApproachesConfig
from sweeps.store import records as trial_records

#: user attr of a trial whose approach knob the coverage quota pinned (the level)
A_APPROACH_QUOTA = "approach_quota"
#: user attr of an equal-footing comparison (:meth:`Coverage.crosses`)
A_EQUAL_FOOTING = trial_records.A_EQUAL_FOOTING


class Coverage:
    """The approach quota of one sweep.

    Args:
        config: ``sweep.approaches``.  space: the sweep's space (the knob's levels, in order).
        objective: what a level's best is ranked by (:meth:`released`; default decode tok/s).
        budget: ``sweep.budget.trials``, the launches the quota is owed by (None: a running quota).

    Raises:
        ValueError: the knob is not a finite param of the space (``load_spec`` refuses this first).
    """

    def __init__(self, config: ApproachesConfig, space: SearchSpace, objective: Objective | None = None,
                 budget: int | None = None):
        param = space.param(config.knob)
        if param is None:
            raise ValueError(f"sweep.approaches.knob: {config.knob!r} is not a param of the space")
        self.knob = config.knob
        self.min_share = config.min_share
        self.release_below = config.release_below
        self.release_after = config.release_after
        self.objective = objective or Objective()
        self.budget = budget
        self.levels: list[Any] = list(param.levels())
        self.compare_within = config.compare_within
        self.space = space

    def bests(self, records: Iterable[trial_records.TrialRecord]) -> dict[Any, tuple[float | None, int, int | None]]:
        """Per level ``(best value, ok launches, its trial)`` over the :func:`sweeps.store.records.rankable`
        trials (``(None, 0, None)`` for a level without one)."""
        ranked = trial_records.ranked_by_level([r for r in records if r.launched], self.knob, self.levels,
                                               self.objective)
        return {v: (trial_records.value_of(rs[0], self.objective), len(rs), rs[0].number) if rs else (None, 0, None)
                for v, rs in ranked.items()}

    def released(self, records: Iterable[trial_records.TrialRecord]) -> dict[Any, dict[str, Any]]:
        """The levels whose quota is released, with the evidence: ``{level: {"best", "trial",
        "launches", "other", "other_best", "other_trial", "gap"}}`` (``gap``: the relative
        shortfall of the level's best against the other's, in the objective's direction).
        Empty when ``release_below`` is null."""
        if self.release_below is None:
            return {}
        b = self.bests(records)
        out: dict[Any, dict[str, Any]] = {}
        for v, (best, n, t) in b.items():
            if best is None or n < self.release_after:
                continue
            for o, (ob, _, ot) in b.items():
                if o == v or ob is None or not ob:
                    continue
                gap = self.shortfall(best, ob)
                if gap > self.release_below and (v not in out or gap > out[v]["gap"]):
                    out[v] = {"best": best, "trial": t, "launches": n, "other": o, "other_best": ob,
                              "other_trial": ot, "gap": gap}
        return out

    def shortfall(self, best: float, other: float) -> float:
        """How far ``best`` falls short of ``other``, relative to ``other``, in the objective's
        direction (> 0: worse). An ``other`` of exactly 0: 0 when ``best`` is 0 too, else inf."""
        if not other:
            return 0.0 if best == other else math.inf
        return ((other - best) if self.objective.maximize else (best - other)) / abs(other)

    def crosses(self, records: Iterable[trial_records.TrialRecord]) -> list[tuple[dict[str, Any], int, int]]:
        """Equal-footing comparisons of the approaches still in the race, as ``(config, its
        approach's best trial, the trial whose shared knob it takes)``.

        An approach is in the race when its best (:meth:`bests`) lies within ``compare_within``
        of the leading best. For each ordered pair of such approaches and each *shared* knob
        (a param that does not depend on the approach knob, through its ``when`` or its parents')
        where their bests differ, the config is the first one's best with that knob set as in the
        second one's best, together with the knobs that level turns on (their values from the
        second one's best too): a comparison of two approaches each measured at different
        settings of the knobs they share says little about the approaches, and a knob's effect is
        often not the same under both (a faster allreduce shortens a speculative verify pass
        more than a plain decode step).

        The leader also takes the shared knobs of an approach out of the race: how another
        approach's best sets a knob they share is evidence about that knob (the team's EAGLE-3
        config runs 128 CUDA graphs where the baseline runs 512), and a launch near the leader's
        best is the one most likely to beat it. Only the knobs that best sets otherwise than the
        baseline (the first ``is_baseline`` record) are evidence: one left at the baseline's
        setting was never chosen for that approach. An approach out of the race takes nothing: a
        fair comparison of it is not the question any more. Ordered by the first approach's
        best, the leader first, then the other approach's best, then the space's knob order. The
        configs are unchecked for feasibility and for being taken (the caller normalises them: a
        knob the change turns off is dropped there). [] when ``compare_within`` is null or fewer
        than two approaches have a best.
        """
        if self.compare_within is None:
            return []
        records = list(records)
        by_number = {r.number: r for r in records}
        b = {v: (best, t) for v, (best, _, t) in self.bests(records).items() if best is not None and t is not None}
        if len(b) < 2:
            return []
        obj = self.objective
        lead = min((best for best, _ in b.values()), key=obj.sort_key)
        race = sorted(((best, t) for best, t in b.values() if self.shortfall(best, lead) <= self.compare_within),
                      key=lambda bt: obj.sort_key(bt[0]))
        under: set[str] = {self.knob}  # the approach knob and every param that depends on it
        for p in self.space.params:
            if p.when and under & set(p.when):
                under.add(p.name)
        shared = [p.name for p in self.space.params if p.name not in under]
        out: list[tuple[dict[str, Any], int, int]] = []
        everyone = sorted(((best, t) for best, t in b.values()), key=lambda bt: obj.sort_key(bt[0]))
        in_race = {t for _, t in race}
        baseline = next((r.params for r in records if r.is_baseline), {})
        leader = race[0][1]
        for _, t in race:
            donors = everyone if t == leader else race  # only the leader takes from approaches out of the race
            for _, o in donors:
                if o == t:
                    continue
                mine, theirs = by_number[t].params, by_number[o].params
                for k in shared:
                    if k not in theirs or theirs[k] == mine.get(k):
                        continue
                    if o not in in_race and k in baseline and theirs[k] == baseline[k]:
                        continue  # the baseline's own setting: no evidence the other approach chose it
                    cfg = {**mine, k: theirs[k]}
                    for p in self.space.params:  # what the new level turns on, as the other set it
                        if p.name not in cfg and p.name in theirs and p.active(cfg):
                            cfg[p.name] = theirs[p.name]
                    out.append((cfg, t, o))
        return out

    def counts(self, records: Iterable[trial_records.TrialRecord], running: Iterable[Mapping[str, Any]]) -> dict[Any, int]:
        """Launches per level: launched trials of the trial budget (finished, not duplicates, not
        re-question probes: those are not launches of the budget) plus configs in flight."""
        out = {v: 0 for v in self.levels}
        for r in records:
            if r.budgeted and r.state not in ("RUNNING", "WAITING") and r.params.get(self.knob) in out:
                out[r.params[self.knob]] += 1
        for p in running:
            if p.get(self.knob) in out:
                out[p[self.knob]] += 1
        return out

    def quota(self) -> int | None:
        """Launches each approach is owed by the end of the trial budget: ``ceil(min_share x
        budget)`` (None without a trial budget)."""
        if self.budget is None:
            return None
        return math.ceil(self.min_share * self.budget - 1e-9)  # 0.3 x 30 is 9, not 10

    def owed(self, records: Iterable[trial_records.TrialRecord], running: Iterable[Mapping[str, Any]]) -> dict[Any, int]:
        """``{level: launches still owed by the end of the trial budget}`` for each level below
        its :meth:`quota` whose quota is not :meth:`released` ({} without a trial budget)."""
        q = self.quota()
        if q is None:
            return {}
        records = list(records)
        c = self.counts(records, running)
        free = self.released(records)
        return {v: q - n for v, n in c.items() if n < q and v not in free}

    def due(self, records: Iterable[trial_records.TrialRecord], running: Iterable[Mapping[str, Any]]) -> Any | None:
        """The level that must be launched next to be paid its quota, or None (the sampler decides).

        With a trial budget: None while the launches left (budget - launches, in flight included)
        exceed the sum of :meth:`owed`; then the level owed most, ties in the knob's level order.
        Without one: a level is due when ``count < min_share * (total + 1)`` and its quota is not
        :meth:`released`, the one furthest below its quota first."""
        records = list(records)
        running = list(running)
        c = self.counts(records, running)
        if self.budget is not None:
            owed = self.owed(records, running)
            left = self.budget - sum(c.values())
            if not owed or left > sum(owed.values()):
                return None
            return max((n, -i, v) for i, (v, n) in enumerate(owed.items()))[2]
        free = self.released(records)
        need = self.min_share * (sum(c.values()) + 1)
        behind = [(need - n, -i, v) for i, (v, n) in enumerate(c.items()) if n < need and v not in free]
        return max(behind)[2] if behind else None

    def shares(self, records: Sequence[trial_records.TrialRecord]) -> dict[Any, tuple[int, float]]:
        """``{level: (launches, share of launches)}`` over finished trials (share 0 without any)."""
        c = self.counts(records, ())
        total = sum(c.values())
        return {v: (n, n / total if total else 0.0) for v, n in c.items()}


def release_lines(config: Mapping[str, Any] | ApproachesConfig, space: SearchSpace | None,
                  records: Sequence[trial_records.TrialRecord], objective: Objective | None = None) -> list[str]:
    """The findings' evidence for each released quota: ``- quota of speculative=eagle3 released:
    its best of 5 ok launches, t12 58.1 tok/s, is 35 % below none's best t7 89.9 tok/s (more
    than the 10 % release margin)``; [] when nothing is released or the space lacks the knob."""
    from sweeps.config.objective import metric_text

    cfg = config if isinstance(config, ApproachesConfig) else ApproachesConfig(**dict(config))
    if space is None or all(p.name != cfg.knob for p in space.params):
        return []
    cov = Coverage(cfg, space, objective)
    name = cov.objective.name
    def launches(n: int) -> str:
        return f"{n} ok launch" + ("es" if n != 1 else "")
    return [f"- quota of `{cfg.knob}={v}` released: its best of {launches(e['launches'])}, "
            f"t{e['trial']} {metric_text(name, e['best'])}, is {100 * e['gap']:.0f} % "
            f"{'below' if cov.objective.maximize else 'above'} {e['other']}'s best t{e['other_trial']} "
            f"{metric_text(name, e['other_best'])} (more than the {100 * float(cfg.release_below or 0):g} % release "
            f"margin, after at least {launches(cfg.release_after)}): the sampler alone chooses from here"
            for v, e in cov.released(records).items()]


#: study user attr: why the sweep's last loop stopped (None while it runs), for the findings
STOP_ATTR = "stop_reason"
#: study user attr: ``sweep.budget.trials`` of its last run (None: no trial budget), for a report
#: rebuilt from storage (``python -m sweeps.report``) without the sweep's overrides
TRIAL_BUDGET_ATTR = "trial_budget"

#: the knob behind each stop reason a sweep loop gives (:meth:`sweeps.search.loop.SweepLoop.budget_left`)
STOP_KNOBS = {"wall-time budget": "sweep.budget.wall_time_s", "GPU-hour budget": "sweep.budget.gpu_hours",
              "max_asks": "sweep.budget.max_asks", "consecutive proposals": "sweep.budget.max_consecutive_skips",
              "circuit breaker": "sweep.circuit_breaker"}


def quota_lines(config: Mapping[str, Any] | ApproachesConfig, space: SearchSpace | None,
                records: Sequence[trial_records.TrialRecord], budget: int | None,
                stop_reason: str | None, objective: Objective | None = None) -> list[str]:
    """The findings' lines on a quota still owed by the end of the trial budget: while the sweep
    runs, ``- quota owed: `speculative=eagle3` 5 more of its 9 launches by the end of the
    30-launch trial budget (21 launched; ...)``; once a sweep stopped before its trial budget,
    ``- quota not paid: ...`` with the stop reason and the knob behind it. [] when nothing is
    owed, the space lacks the knob or there is no trial budget (a running quota)."""
    cfg = config if isinstance(config, ApproachesConfig) else ApproachesConfig(**dict(config))
    if budget is None or space is None or all(p.name != cfg.knob for p in space.params):
        return []
    cov = Coverage(cfg, space, objective, budget)
    q = cov.quota()
    n = sum(cov.counts(records, ()).values())
    if n >= budget:
        return []  # spent: a level still short was redirected or released (the share line says so)
    owed = cov.owed(records, ())
    if not owed:
        return []
    what = ", ".join(f"`{cfg.knob}={v}` {k} more of its {q}" for v, k in owed.items())
    if stop_reason:
        knob = next((k for prefix, k in STOP_KNOBS.items() if prefix in stop_reason), None)
        why = f"{stop_reason}" + (f": `{knob}`" if knob else "")
        return [f"- quota not paid: {what} launches. The sweep stopped after {n} of its {budget}-launch trial "
                f"budget ({why}) before the owed launches fell due: they are launched only once the launches "
                f"left no longer exceed what is owed. Resume the sweep (or raise that limit) to pay them."]
    return [f"- quota owed: {what} launches by the end of the {budget}-launch trial budget ({n} launched; "
            f"the sampler chooses freely while the launches left exceed what is owed)"]


def changed_knobs(config: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """``allreduce=custom, custom_size=2``: the knobs ``config`` sets otherwise than ``base``."""
    return ", ".join(f"{k}={v}" for k, v in config.items() if base.get(k) != v)


def equal_footing_lines(records: Sequence[trial_records.TrialRecord], objective: Objective | None = None) -> list[str]:
    """The findings' lines on each equal-footing comparison that ran: ``- equal footing: t7 ran
    t1's config with allreduce=custom from t2: 115.1 tok/s (t1 100.3 tok/s, t2 94.2 tok/s)``, or
    with its failure class; [] when none ran."""
    from sweeps.config.objective import metric_text

    obj = objective or Objective()
    by_number = {r.number: r for r in records}
    out = []
    for r in records:
        pair = r.equal_footing
        if not pair or len(pair) != 2 or not r.launched or any(n not in by_number for n in pair):
            continue
        t, o = (by_number[n] for n in pair)
        moved = changed_knobs(r.params, t.params)

        def val(x: trial_records.TrialRecord) -> str:
            v = trial_records.value_of(x, obj)
            return metric_text(obj.name, v) if v is not None else f"{x.status} ({x.failure_class or '?'})"
        out.append(f"- equal footing: t{r.number} ran t{t.number}'s config with {moved} from t{o.number}: {val(r)} "
                   f"(t{t.number} {val(t)}, t{o.number} {val(o)})")
    return out


def pin(study: optuna.Study, knob: str, level: Any) -> None:
    """Enqueue a trial with only ``knob`` fixed to ``level``: the next ask pops it and the
    sampler chooses the other knobs (Optuna samples the params an enqueued trial leaves open)."""
    attrs = {A_APPROACH_QUOTA: level}
    study.enqueue_trial({knob: level}, user_attrs={**attrs, "enqueue_attrs": attrs})


def waiting(study: optuna.Study) -> bool:
    """True when an enqueued trial waits (the next ask pops it: nothing to pin)."""
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
