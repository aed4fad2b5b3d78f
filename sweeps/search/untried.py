"""Every proposal is a config not yet measured.

When the sampler proposes a finished config or a known dead end, the driver answers it
without GPU time (Optuna is told, so the sampler learns) and then launches an UNTRIED
FEASIBLE config drawn here instead, as an enqueued (fixed) trial. The draw walks the space
in a seeded random order: a finite space is enumerated once (:meth:`SearchSpace.enumerate`,
constraints applied) and shuffled; a space with a continuous float, or one larger than
:data:`ENUMERATE_LIMIT`, is rejection-sampled (:data:`SAMPLE_DRAWS` draws). A candidate
must not be taken (finished, running or queued), must not hit a learned rule on this node
or a silently degraded allreduce level. Among those, the one NEAREST the sampler's proposal
(fewest knobs changed; ties in the seeded order) is taken, so the redirect stays in the region
the sampler chose instead of spending launches on a uniform draw. "Exhausted" means nothing
untried and feasible is left.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeps.config.objective import ObjectiveSet
from sweeps.config.space import SearchSpace
from sweeps.rules.store import RuleStore
from sweeps.search import gates
from sweeps.store import records as trial_records

#: enumerate a finite space up to this many feasible configs (the campaign space: ~37k, 0.7 s once)
ENUMERATE_LIMIT = 200_000
#: random draws before a space that cannot be enumerated is declared exhausted
SAMPLE_DRAWS = 5_000
#: the attribute marking a trial launched in place of a repeated proposal
A_UNTRIED = "untried_draw"
EXHAUSTED = "the space is exhausted: no untried feasible config is left"
#: statuses whose config is measured or a known dead end (as the duplicate gate counts them)
TAKEN_STATUSES = ("ok", "failed", "skipped", "infeasible")


def taken_keys(study: optuna.Study, running: list[Mapping[str, Any]]) -> set[str]:
    """Config keys not to propose again: finished trials measured or known dead (ok, failed,
    skipped, infeasible; not an infra error, not a re-question's passed probe: it measured
    nothing), configs in flight (``running``) and queued trials."""
    keys = {trial_records.config_key(dict(p)) for p in running}
    for r in trial_records.load_records(study):
        if r.status in TAKEN_STATUSES and r.state not in ("RUNNING", "WAITING") and not gates.probe_only(r.status, r.probe):
            keys.add(trial_records.config_key(r.params))
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        keys.add(trial_records.config_key(dict(t.system_attrs.get("fixed_params") or t.params)))
    return keys


def _random_config(space: SearchSpace, rng: random.Random) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    for p in space.params:
        if not p.active(cfg):
            continue
        if p.type == "categorical" or (p.type == "float" and p.step):
            cfg[p.name] = rng.choice(p.levels())
        elif p.type == "int":
            cfg[p.name] = rng.choice(p.levels())
        else:
            cfg[p.name] = rng.uniform(p.low, p.high)  # type: ignore[arg-type]
    return cfg


class UntriedDraw:
    """Seeded draws of untried feasible configs from one space (the enumeration is cached).

    Args:
        space: the sweep's space.  seed: RNG seed (``sweep.sampler.seed``): the same sweep draws the same order.
    """

    def __init__(self, space: SearchSpace, seed: int | None):
        self.space = space
        self.rng = random.Random(seed)
        self._order: list[dict[str, Any]] | None = None
        self.exact = all(p.type != "float" or p.step for p in space.params)

    def _candidates(self) -> Iterator[dict[str, Any]]:
        if self.exact and self._order is None:
            order = list(self.space.enumerate(limit=ENUMERATE_LIMIT + 1))
            if len(order) > ENUMERATE_LIMIT:
                self.exact = False
            else:
                self.rng.shuffle(order)
                self._order = order
        if self._order is not None:
            yield from self._order
            return
        for _ in range(SAMPLE_DRAWS):
            cfg = _random_config(self.space, self.rng)
            if not self.space.violated(cfg):
                yield cfg

    def draw(self, taken: set[str], allowed: Callable[[Mapping[str, Any]], bool],
             near: Mapping[str, Any] | None = None,
             scores: tuple[Mapping[tuple[str, str], float], float] | None = None) -> dict[str, Any] | None:
        """The candidate nearest ``near`` (fewest differing knobs) that is not in ``taken`` and
        that ``allowed`` accepts; None when none is left (exhaustive for an enumerated space,
        after :data:`SAMPLE_DRAWS` draws otherwise). Among equally near candidates, the one whose
        changed levels did best elsewhere in the study (``scores``: :func:`level_scores`) comes
        first, then the seeded order."""
        cands: Iterator[dict[str, Any]] | list[dict[str, Any]] = self._candidates()
        if near:
            sc, fill = scores or ({}, 0.0)

            def gain(c: Mapping[str, Any]) -> float:
                return sum(sc.get((k, repr(v)), fill) - sc.get((k, repr(near.get(k))), fill)
                           for k, v in c.items() if near.get(k) != v)
            cands = sorted(cands, key=lambda c: (distance(c, near), -gain(c)))  # stable: ties keep the seeded order
        for cfg in cands:
            if trial_records.config_key(cfg) not in taken and allowed(cfg):
                return dict(cfg)
        return None


def level_scores(records: Iterable[trial_records.TrialRecord], objectives: ObjectiveSet
                 ) -> tuple[dict[tuple[str, str], float], float]:
    """``({(knob, repr(level)): the best primary-objective value of a rankable trial with that
    level}, the median value of the rankable trials: what a level no trial ran is expected to
    give)``, values negated for ``minimize`` so higher is better: the combination move of the draw.
    Where the optimum combines levels that each won in different trials (the ``far`` landscape of
    benchmarks/sweep_efficiency.py: EAGLE-3 won in one approach, the custom all-reduce in the
    other), the untried config one knob from the incumbent that adds the other's winning level
    comes first instead of a uniformly drawn neighbour."""
    obj = objectives.primary
    out: dict[tuple[str, str], float] = {}
    values: list[float] = []
    for r in trial_records.ranked_records(list(records), objectives):
        v = obj.value(r.metrics)
        if v is None:
            continue
        v = v if obj.maximize else -v
        values.append(v)
        for k, lv in r.params.items():
            key = (k, repr(lv))
            out[key] = max(out.get(key, v), v)
    return out, statistics.median(values) if values else 0.0


def distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    """Knobs whose values differ between two configs (a knob active in one only counts)."""
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b))


def knowledge_filter(records: Iterable[trial_records.TrialRecord], rules: Iterable[Any], fp_hash: str | None, model: str | None,
                     sweep: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """A check that knob values (a whole config, or an approach's few knobs) hit no allreduce
    level this study saw silently degraded (:func:`sweeps.search.gates.degraded_levels`) and no
    learned rule whose every knob they set, for the node of ``fp_hash`` (None: no rule applies)."""
    dead_levels = gates.degraded_levels(records)
    live = list(rules) if fp_hash else []

    def ok(values: Mapping[str, Any]) -> bool:
        if values.get("allreduce") in dead_levels:
            return False
        return not any(r.applies_to(fp_hash, model, values, sweep) for r in live)
    return ok


def allowed_by_knowledge(rules: RuleStore, fingerprint: Mapping[str, Any], study: optuna.Study, model: str,
                         sweep: str) -> Callable[[Mapping[str, Any]], bool]:
    """A check that a config hits no learned rule on the node of ``fingerprint`` (no hit is
    recorded) and no allreduce level ``study`` saw silently degraded (:func:`knowledge_filter`)."""
    live = rules.rules_for_fingerprint(fingerprint) if fingerprint else []
    fp_hash = None
    if live:
        from sweeps.rules.match import fingerprint_hash

        fp_hash = fingerprint_hash(fingerprint)
    return knowledge_filter(trial_records.load_records(study), live, fp_hash, model, sweep)


def redirect(study: optuna.Study, drawer: UntriedDraw, running: list[Mapping[str, Any]],
             allowed: Callable[[Mapping[str, Any]], bool], objectives: ObjectiveSet,
             proposal: Mapping[str, Any] | None = None, gate: str = "duplicate",
             within: Mapping[str, Any] | None = None) -> bool:
    """Enqueue an untried feasible config in place of a proposal that was answered without a
    launch (the next ask returns it). False when the space is exhausted.

    Args:
        study: the sweep's study (taken configs; the enqueue).  drawer: the sweep's seeded draw.
        running: configs in flight.  allowed: :func:`allowed_by_knowledge` of the sweep's node.
        objectives: what the incumbent best is best at.
        proposal / gate: the answered proposal and the gate that answered it.
        within: knob values the draw must keep (an approach the coverage quota pinned:
            :mod:`sweeps.search.coverage`); the incumbent is then the best within them.

    The draw is the untried config nearest the proposal when the proposal repeated a measured
    config (``gate`` ``duplicate``: the sampler's region is a good one), and nearest the
    incumbent best when it hit a dead end (``rule``, ``degraded``, ``infeasible``: the
    neighbours of a dead end are mostly dead ends too)."""
    keep = dict(within or {})

    def inside(p: Mapping[str, Any]) -> bool:
        return all(p.get(k) == v for k, v in keep.items())
    if gate != "duplicate":
        best = trial_records.best_record([r for r in trial_records.load_records(study) if inside(r.params)], objectives)
        proposal = best.params if best is not None else proposal
    ok = allowed if not keep else (lambda c: inside(c) and allowed(c))
    cfg = drawer.draw(taken_keys(study, running), ok, near=proposal,
                      scores=level_scores(trial_records.load_records(study), objectives))
    if cfg is None:
        return False
    attrs = {A_UNTRIED: True}
    study.enqueue_trial(cfg, user_attrs={**attrs, "enqueue_attrs": attrs})
    return True
