"""Fair coverage of the approaches a sweep exists to compare (``sweep.approaches``).

A sweep names one categorical knob whose levels are its approaches (the campaign:
``speculative`` none vs eagle3) and a minimum share of launches for each. Left to itself
TPE exploits the first approach that measures well and the other one is barely launched (the
campaign spent 2 of 30 launches on EAGLE-3 although its question was whether EAGLE-3 pays).

The rule is stratified sampling with a running quota: before each free ask of the sampler
(no enqueued trial waiting), an approach is *due* when its launches (finished and in flight)
are fewer than ``min_share`` x (launches + 1), i.e. when launching anything else next would
leave it below its share. The most-behind due approach is pinned for that ask: the trial is
enqueued with only the approach knob fixed, so the sampler (TPE) still chooses every other
knob within the approach from what it has learned. A pinned proposal that a gate answers
(a dead end, a repeat) is redirected to an untried config of the same approach
(:func:`sweeps.search.untried.redirect` with ``within``), so a dead end does not hand the
launch back to the other approach. With every approach at its share the sampler alone decides.

An approach's quota is *released* (it is never due again while this holds) once the
evidence answers the question the quota exists for: it has at least ``release_after`` ok
launches and its best measurement lies more than ``release_below`` (10 %) below another
approach's best (:meth:`Coverage.released`). On the campaign's node EAGLE-3's best is about
35 % below plain decoding's (the emulator's model: 58.4 against 89.4 tok/s), and paying 30 %
of every launch for it cost about 1 GPU-hour per campaign
(``benchmarks/results/sweep_efficiency.md``). The findings' coverage section states the
evidence (:func:`release_lines`). Released is re-evaluated at every ask: a better config of
the approach brings its quota back.
"""

from __future__ import annotations

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


class Coverage:
    """The approach quota of one sweep.

    Args:
        config: ``sweep.approaches``.  space: the sweep's space (the knob's levels, in order).

    Raises:
        ValueError: the knob is not a finite param of the space (``load_spec`` refuses this first).
    """

    def __init__(self, config: ApproachesConfig, space: SearchSpace, objective: Objective | None = None):
        param = next((p for p in space.params if p.name == config.knob), None)
        if param is None:
            raise ValueError(f"sweep.approaches.knob: {config.knob!r} is not a param of the space")
        self.knob = config.knob
        self.min_share = config.min_share
        self.release_below = config.release_below
        self.release_after = config.release_after
        self.objective = objective or Objective()
        self.levels: list[Any] = list(param.levels())

    def bests(self, records: Iterable[trial_records.TrialRecord]) -> dict[Any, tuple[float | None, int, int | None]]:
        """Per level ``(best value, ok launches, its trial)`` over the :func:`sweeps.store.records.rankable`
        trials (``(None, 0, None)`` for a level without one)."""
        out: dict[Any, tuple[float | None, int, int | None]] = {v: (None, 0, None) for v in self.levels}
        obj = self.objective
        for r in records:
            v = r.params.get(self.knob)
            if v not in out or not r.launched or not trial_records.rankable(r, obj):
                continue
            val = trial_records.value_of(r, obj)
            best, n, t = out[v]
            if best is None or (val is not None and obj.sort_key(val) < obj.sort_key(best)):
                best, t = val, r.number
            out[v] = (best, n + 1, t)
        return out

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
                gap = (ob - best) / abs(ob) if self.objective.maximize else (best - ob) / abs(ob)
                if gap > self.release_below and (v not in out or gap > out[v]["gap"]):
                    out[v] = {"best": best, "trial": t, "launches": n, "other": o, "other_best": ob,
                              "other_trial": ot, "gap": gap}
        return out

    def counts(self, records: Iterable[trial_records.TrialRecord], running: Iterable[Mapping[str, Any]]) -> dict[Any, int]:
        """Launches per level: launched trials (finished, not duplicates) plus configs in flight."""
        out = {v: 0 for v in self.levels}
        for r in records:
            if r.launched and r.state not in ("RUNNING", "WAITING") and r.params.get(self.knob) in out:
                out[r.params[self.knob]] += 1
        for p in running:
            if p.get(self.knob) in out:
                out[p[self.knob]] += 1
        return out

    def due(self, records: Iterable[trial_records.TrialRecord], running: Iterable[Mapping[str, Any]]) -> Any | None:
        """The level that must be launched next to keep its share, or None when all are at theirs.

        A level is due when ``count < min_share * (total + 1)`` and its quota is not
        :meth:`released`; among due levels the one furthest below its quota, ties in the knob's
        level order."""
        records = list(records)
        c = self.counts(records, running)
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


def pin(study: optuna.Study, knob: str, level: Any) -> None:
    """Enqueue a trial with only ``knob`` fixed to ``level``: the next ask pops it and the
    sampler chooses the other knobs (Optuna samples the params an enqueued trial leaves open)."""
    attrs = {A_APPROACH_QUOTA: level}
    study.enqueue_trial({knob: level}, user_attrs={**attrs, "enqueue_attrs": attrs})


def waiting(study: optuna.Study) -> bool:
    """True when an enqueued trial waits (the next ask pops it: nothing to pin)."""
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
