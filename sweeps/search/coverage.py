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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

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

    def __init__(self, config: ApproachesConfig, space: SearchSpace):
        param = next((p for p in space.params if p.name == config.knob), None)
        if param is None:
            raise ValueError(f"sweep.approaches.knob: {config.knob!r} is not a param of the space")
        self.knob = config.knob
        self.min_share = config.min_share
        self.levels: list[Any] = list(param.levels())

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

        A level is due when ``count < min_share * (total + 1)``; among due levels the one
        furthest below its quota, ties in the knob's level order."""
        c = self.counts(records, running)
        need = self.min_share * (sum(c.values()) + 1)
        behind = [(need - n, -i, v) for i, (v, n) in enumerate(c.items()) if n < need]
        return max(behind)[2] if behind else None

    def shares(self, records: Sequence[trial_records.TrialRecord]) -> dict[Any, tuple[int, float]]:
        """``{level: (launches, share of launches)}`` over finished trials (share 0 without any)."""
        c = self.counts(records, ())
        total = sum(c.values())
        return {v: (n, n / total if total else 0.0) for v, n in c.items()}


def pin(study: optuna.Study, knob: str, level: Any) -> None:
    """Enqueue a trial with only ``knob`` fixed to ``level``: the next ask pops it and the
    sampler chooses the other knobs (Optuna samples the params an enqueued trial leaves open)."""
    attrs = {A_APPROACH_QUOTA: level}
    study.enqueue_trial({knob: level}, user_attrs={**attrs, "enqueue_attrs": attrs})


def waiting(study: optuna.Study) -> bool:
    """True when an enqueued trial waits (the next ask pops it: nothing to pin)."""
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
