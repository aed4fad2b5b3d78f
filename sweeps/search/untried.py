"""Every proposal is a config not yet measured.

When the sampler proposes a finished config or a known dead end, the driver answers it
without GPU time (Optuna is told, so the sampler learns) and then launches an UNTRIED
FEASIBLE config drawn here instead, as an enqueued (fixed) trial. The draw walks the space
in a seeded random order: a finite space is enumerated once (:meth:`SearchSpace.enumerate`,
constraints applied) and shuffled; a space with a continuous float, or one larger than
:data:`ENUMERATE_LIMIT`, is rejection-sampled (:data:`SAMPLE_DRAWS` draws). A candidate
must not be taken (finished, running or queued), must not hit a learned rule on this node
or a silently degraded allreduce level. Among those, the one NEAREST the sampler's proposal
(fewest knobs changed; a change a constraint forces counts with the change that forced
it: :meth:`UntriedDraw.move_distance`) is taken, so the redirect stays in the region the sampler chose instead of
spending launches on a uniform draw. Among equally near candidates an additive surrogate of the
study's measurements (:class:`LevelModel`: main effects plus an exploration bonus) ranks them, so
the draw changes knobs that were seen to matter or barely tried first; among equal gains, a knob
whose tried levels differed and that was not seen to make no difference at the anchor itself
(:meth:`LevelModel.knob_ranges`); then the seeded order. "Exhausted" means nothing untried and
feasible is left.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from sweeps.config.objective import ObjectiveSet
from sweeps.config.space import SearchSpace, is_number
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
        self._coded: _Coded | None = None
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

    def move_distance(self, cand: Mapping[str, Any], near: Mapping[str, Any]) -> int:
        """Knobs ``cand`` changes from ``near`` (:func:`distance`), counting a change a constraint
        forced as part of the change that forced it: two knobs changed, one of which alone breaks a
        constraint at ``near``, is one move. (From EAGLE-3's 3 steps / top-k 1 / 4 draft tokens, one
        step alone breaks ``num_draft_tokens <= topk x num_steps + 1``; one step with the draft
        tokens it allows is one move, not two.)"""
        d = distance(cand, near)
        if d != 2 or self.space.violated(near):  # from an infeasible anchor every change "repairs"
            return d
        moved = [k for k in cand if near.get(k) != cand[k]]
        if len(moved) != 2 or any(k not in near for k in moved):
            return d
        for k in moved:
            if self.space.violated({**near, k: cand[k]}):
                return 1
        return d

    def draw(self, taken: set[str], allowed: Callable[[Mapping[str, Any]], bool],
             near: Mapping[str, Any] | None = None,
             model: LevelModel | None = None) -> dict[str, Any] | None:
        """The candidate nearest ``near`` (fewest differing knobs) that is not in ``taken`` and
        that ``allowed`` accepts; None when none is left (exhaustive for an enumerated space,
        after :data:`SAMPLE_DRAWS` draws otherwise). Among equally near candidates, the one whose
        new levels are worth most to ``model`` (:meth:`LevelModel.gain`) comes first; among equal
        gains (typically untried levels of different knobs), the one changing a knob whose tried
        levels were seen to differ most at ``near`` (:meth:`LevelModel.knob_ranges`); then the seeded
        order.

        The ranking is computed on the candidates' level codes at once (:class:`_Coded`): rating
        each of the campaign space's ~37k configs one by one took ~2.7 s a draw, most of a
        200-ask in-process sweep's 6 minutes."""
        if not near:
            for cfg in self._candidates():
                if trial_records.config_key(cfg) not in taken and allowed(cfg):
                    return dict(cfg)
            return None
        if self._order is None or self._coded is None:
            cands = list(self._candidates())  # the sampled draws are coded afresh each time
            coded = _Coded(self.space, cands)
            if self._order is not None:
                self._coded = coded
        else:
            cands, coded = self._order, self._coded
        for i in coded.ranking(near, model):
            cfg = cands[i]
            if trial_records.config_key(cfg) not in taken and allowed(cfg):
                return dict(cfg)
        return None


class _Coded:
    """Candidate configs as a matrix of level codes, one column per knob of the space, for
    ranking them all against one anchor at once.

    A code stands for a level as Python's ``==`` sees it (a dict per knob: ``64`` and ``64.0``
    share one); ``-1`` is a knob the candidate leaves inactive (``cfg.get(knob)`` is None), so a
    column compares as :func:`distance` compares two configs."""

    def __init__(self, space: SearchSpace, cands: list[dict[str, Any]]):
        self.space = space
        self.names = list(space.names)
        self.column = {k: j for j, k in enumerate(self.names)}
        self.codes: list[dict[Any, int]] = [{} for _ in self.names]
        self.levels: list[list[Any]] = [[] for _ in self.names]
        self.m = np.full((len(cands), len(self.names)), -1, dtype=np.int32)
        for j, name in enumerate(self.names):
            codes, levels = self.codes[j], self.levels[j]
            col = self.m[:, j]
            for i, cfg in enumerate(cands):
                v = cfg.get(name)
                if v is None:
                    continue
                c = codes.get(v)
                if c is None:
                    c = codes[v] = len(levels)
                    levels.append(v)
                col[i] = c

    def _code(self, j: int, value: Any) -> int:
        if value is None:
            return -1
        try:
            return self.codes[j].get(value, -2)
        except TypeError:  # an unhashable value equals no level
            return -2

    def ranking(self, near: Mapping[str, Any], model: LevelModel | None) -> np.ndarray:
        """Candidate indices in :meth:`UntriedDraw.draw`'s order: by (move distance from ``near``,
        -gain rounded to 9 decimals, -largest knob range moved), ties in the candidates' order.

        The gain is summed knob by knob in the space's order, as the candidate's own levels
        are, so its rounding ties exactly where :meth:`LevelModel.gain` summed per config ties."""
        m, n = self.m, len(self.m)
        anchor = np.array([self._code(j, near.get(k)) for j, k in enumerate(self.names)], dtype=np.int32)
        diff = m != anchor  # (n, knobs): where a candidate differs from the anchor
        own = diff & (m >= 0)  # ... at a level the candidate itself sets
        # a knob only the anchor sets, outside the space, differs from every candidate
        extra = sum(v is not None for k, v in near.items() if k not in self.column)
        dist = diff.sum(axis=1) + extra
        gain = np.zeros(n)
        moved = np.zeros(n)
        ranges = model.knob_ranges(near) if model is not None else {}
        for j, k in enumerate(self.names):
            if model is not None:
                worth = np.array([model.effect(k, v) + model.bonus(k, v) for v in self.levels[j]] + [0.0])
                gain += np.where(own[:, j], worth[m[:, j]], 0.0)  # code -1 reads the trailing 0
            moved = np.maximum(moved, np.where(own[:, j], ranges.get(k, 0.0), 0.0))
        move = dist.copy()
        if not self.space.violated(near):
            move[self._constraint_moves(dist, own, near)] = 1
        rounded = np.array([round(g, 9) for g in gain.tolist()]) if model is not None else gain
        return np.lexsort((-moved, -rounded, move))  # the last key sorts first; lexsort is stable

    def _constraint_moves(self, dist: np.ndarray, own: np.ndarray, near: Mapping[str, Any]) -> np.ndarray:
        """Rows two knobs from ``near`` of which one alone breaks a constraint at ``near``
        (:meth:`UntriedDraw.move_distance`'s one move)."""
        rows = np.flatnonzero((dist == 2) & (own.sum(axis=1) == 2))
        out = np.zeros(len(self.m), dtype=bool)
        breaks: dict[tuple[int, int], bool] = {}
        for i in rows.tolist():
            cols = np.flatnonzero(own[i]).tolist()
            if any(self.names[j] not in near for j in cols):
                continue
            for j in cols:
                key = (j, int(self.m[i, j]))
                if key not in breaks:
                    breaks[key] = bool(self.space.violated({**near, self.names[j]: self.levels[j][key[1]]}))
                if breaks[key]:
                    out[i] = True
                    break
        return out


@dataclass(frozen=True)
class LevelModel:
    """What each knob level is worth to the draw: an additive surrogate of the primary objective.

    Attributes:
        effects: ``{(knob, repr(level)): ridge main effect}`` in objective units, fit on the
            rankable trials (one-hot levels, penalty :data:`RIDGE_LAMBDA`; values negated for
            ``minimize`` so higher is better).
        counts: ``{(knob, repr(level)): rankable trials that ran the level}``.
        spread: standard deviation of those trials' values (objective units; 0 with none).
        measured: the rankable trials themselves, ``({knob: repr(level)}, value)`` in the same
            units, for the direct comparisons of :meth:`knob_ranges`.
        ordinal: ``{knob: ((level, main effect), ...)}`` of the ordered knobs (the space's
            ``int`` and ``float`` params and its categoricals declared ``ordered``),
            their tried levels in ascending order: what :meth:`effect` reads an untried level
            of an ordered knob from.

    :meth:`gain` scores a candidate by its new levels' effects plus an optimism bonus that shrinks
    with each level's count (an upper confidence bound, :data:`EXPLORE_KAPPA`). Among equally near
    candidates the draw therefore changes a knob whose levels were seen to matter, or were barely
    tried, before a knob whose levels were tried often and made no difference: on the ``far``
    landscape of benchmarks/sweep_efficiency.py the draw otherwise spent a quarter of its launches
    swapping NCCL's algorithm and protocol around an EAGLE-3 incumbent whose draft shape was the
    knob that mattered."""

    effects: Mapping[tuple[str, str], float]
    counts: Mapping[tuple[str, str], int]
    spread: float
    measured: tuple[tuple[Mapping[str, str], float], ...] = field(default=(), compare=False)
    ordinal: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict, compare=False)

    def effect(self, knob: str, level: Any) -> float:
        """Main effect of ``knob=level`` (objective units).

        A tried level has its fitted effect. An untried level of an ordered knob with two or
        more tried levels is read from its ordered neighbours: between two tried levels, their mean;
        beyond the tried range, the edge level's effect plus one step of the trend from the level
        next to the edge (one step only, however far beyond: a trend seen over a few levels says
        little about levels far past them). Any other untried level is worth 0. The draft shape
        of EAGLE-3 is such a knob: three, four and five draft steps measured in falling order say
        that two are worth trying before another topk. On the ``far`` landscape of
        benchmarks/sweep_efficiency.py (its optimum is one draft step, top-k 2) this took the
        median from 4.25 to 3.44 emulated GPU-h over 11 seeds (3.89 -> 3.77 over 21, whose mean
        rose 4.78 -> 5.14 with two seeds near 11 GPU-h); the other landscapes did not move, and
        goodput's 21-seed median fell 4.48 -> 3.99."""
        key = (knob, repr(level))
        if key in self.effects:
            return self.effects[key]
        tried = self.ordinal.get(knob, ())
        if not _numeric(level):
            return 0.0
        x = float(level)
        same = next((e for v, e in tried if v == x), None)
        if same is not None:  # a tried level written otherwise (64.0 for 64)
            return same
        if len(tried) < 2:
            return 0.0
        below = [(v, e) for v, e in tried if v < x]
        above = [(v, e) for v, e in tried if v > x]
        if below and above:
            return (below[-1][1] + above[0][1]) / 2
        if above:  # below the tried range: the lowest level plus one step of the trend toward it
            return 2 * above[0][1] - above[1][1]
        return 2 * below[-1][1] - below[-2][1]

    def bonus(self, knob: str, level: Any) -> float:
        """Optimism for ``knob=level``: ``EXPLORE_KAPPA x spread / sqrt(1 + trials at the level)``."""
        return EXPLORE_KAPPA * self.spread / math.sqrt(1 + self.counts.get((knob, repr(level)), 0))

    def knob_ranges(self, near: Mapping[str, Any] | None = None) -> dict[str, float]:
        """``{knob: max - min of the main effects of its tried levels}`` (objective units; 0 for a
        knob with one tried level), lowered to what the knob was seen to change at ``near``.

        The draw's tie-break among equal gains: two untried levels of two knobs earn the same
        optimism, and the knob whose levels were seen to differ is the one more likely to hold the
        next gain. On the campaign landscape of benchmarks/sweep_efficiency.py the first draw after
        the seeds ties ``nccl_algo=Ring`` with the untried graph sizes (both unseen, gain 4.76
        each); the graph size differed between the baseline and the EAGLE-3 seed, NCCL's algorithm
        never did.

        The main effects are fit across trials that differ in many knobs at once, so a knob can
        carry a difference that another knob made (the graph size shares the EAGLE-3 seed's
        levels). Where a measured trial differs from ``near`` (itself measured) in that knob alone,
        the knob's range is at most the largest such difference to ``near``'s mean value: a knob
        seen to change nothing at the anchor is changed last there. On the ``far`` landscape (21
        seeds) the draw otherwise ran every graph size around an EAGLE-3 incumbent whose graph size
        had been swapped with no effect: median 7.27 -> 6.33 GPU-h, the other landscapes unchanged.
        The direct difference only lowers a range: letting it raise one as well made the draw
        return to the all-reduce the incumbent had just won with (``stale``, 21 seeds: 3.43 ->
        3.80 GPU-h)."""
        levels: dict[str, list[float]] = {}
        for (knob, _), e in self.effects.items():
            levels.setdefault(knob, []).append(e)
        ranges = {k: max(es) - min(es) for k, es in levels.items()}
        if near is None:
            return ranges
        anchor = {k: repr(v) for k, v in near.items()}  # measured levels are reprs
        at = [v for p, v in self.measured if distance(p, anchor) == 0]
        if not at:
            return ranges
        base = sum(at) / len(at)
        seen: dict[str, float] = {}
        for p, v in self.measured:
            moved = [k for k in set(p) | set(anchor) if p.get(k) != anchor.get(k)]
            if len(moved) == 1:
                seen[moved[0]] = max(seen.get(moved[0], 0.0), abs(v - base))
        for k, d in seen.items():
            ranges[k] = min(ranges.get(k, d), d)
        return ranges

    def worth(self, cfg: Mapping[str, Any], other: Mapping[str, Any]) -> float:
        """Optimistic worth of the whole of ``cfg`` against ``other`` (objective units relative to
        the measured mean): every level's main effect, and the optimism bonus of the knobs active
        in both. A knob only ``cfg`` turns on (EAGLE-3's draft shape beside a plain config) adds
        its effect and no optimism: three untried draft knobs would otherwise outweigh the
        measured effect of the approach that turns them on, however badly it measured."""
        return sum(self.effect(k, v) + (self.bonus(k, v) if k in other else 0.0) for k, v in cfg.items())

    def gain(self, cand: Mapping[str, Any], near: Mapping[str, Any]) -> float:
        """Optimistic worth of the levels ``cand`` sets where it differs from ``near`` (objective
        units; a knob ``cand`` leaves inactive adds 0).

        The anchor's own levels are not subtracted. Candidates at one distance share the anchor,
        and with few trials the ridge credits the anchor's unique levels with its whole lead (the
        baseline's ``cuda_graph_max_bs=512`` carries the baseline's lead over the first sampled
        trial), so subtracting them made the draw leave the levels that carry no credit, the
        irrelevant knobs, first: the campaign landscape's median rose from 1.55 to 2.46 GPU-h."""
        return sum(self.effect(k, v) + self.bonus(k, v) for k, v in cand.items() if near.get(k) != v)


#: ridge penalty of :func:`level_model`, in trials: a level run once keeps half its residual
RIDGE_LAMBDA = 1.0
#: optimism of :meth:`LevelModel.bonus` in standard deviations of the measured values. Chosen
#: on benchmarks/sweep_efficiency.py's landscapes (11 seeds): 0.5 took the ``far`` median from
#: 10.83 to 5.92 GPU-h and left the campaign, large, goodput and stale medians where they were or
#: lower; 0.25 gave 6.79 on ``far``, 1.0 gave 6.84.
EXPLORE_KAPPA = 0.5


def level_model(records: Iterable[trial_records.TrialRecord], objectives: ObjectiveSet,
                ordered: Iterable[str] = ()) -> LevelModel:
    """Fit :class:`LevelModel` on the rankable trials of ``records`` (an empty model without any).

    Args:
        records: the study's trial records (only rankable ones with a primary value count).
        objectives: whose primary objective is modelled (its direction sets the sign).
        ordered: the knobs whose levels are ordered (:func:`ordered_knobs` of the space); the
            others' untried levels are worth 0.
    Returns:
        the fitted model; ``LevelModel({}, {}, 0.0)`` when no trial is rankable, which makes
        every gain 0 (the seeded order decides)."""
    obj = objectives.primary
    rows: list[tuple[list[tuple[str, str]], float]] = []
    ranked = trial_records.ranked_records(list(records), objectives)
    for r in ranked:
        v = obj.value(r.metrics)
        if v is not None:
            rows.append(([(k, repr(lv)) for k, lv in r.params.items()], v if obj.maximize else -v))
    if not rows:
        return LevelModel({}, {}, 0.0)
    keys = sorted({key for levels, _ in rows for key in levels})
    col = {key: i for i, key in enumerate(keys)}
    x = np.zeros((len(rows), len(keys)))
    for i, (levels, _) in enumerate(rows):
        x[i, [col[key] for key in levels]] = 1.0
    y = np.array([v for _, v in rows])
    y = y - y.mean()
    b = np.linalg.solve(x.T @ x + RIDGE_LAMBDA * np.eye(len(keys)), x.T @ y)
    counts = x.sum(axis=0)
    effects = {key: float(b[col[key]]) for key in keys}
    ordinal: dict[str, dict[float, float]] = {}
    ordered = set(ordered)
    for r in ranked:
        for k, lv in r.params.items():
            if k in ordered and _numeric(lv) and (k, repr(lv)) in effects:
                ordinal.setdefault(k, {})[float(lv)] = effects[(k, repr(lv))]
    return LevelModel(effects, {key: int(counts[col[key]]) for key in keys}, float(y.std()),
                      tuple((dict(levels), v) for levels, v in rows),
                      {k: tuple(sorted(vs.items())) for k, vs in ordinal.items()})


def ordered_knobs(space: SearchSpace) -> frozenset[str]:
    """The params whose levels are ordered (:attr:`sweeps.config.space.ParamSpec.is_ordered`): int
    and float ones, and a categorical declared ``ordered`` (its choices are otherwise unordered, as
    Optuna's samplers treat them)."""
    return frozenset(p.name for p in space.params if p.is_ordered)


def _numeric(level: Any) -> bool:
    """An ordered level: an int or a finite float, never a bool."""
    return is_number(level) and math.isfinite(level)


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
    neighbours of a dead end are mostly dead ends too). After a rule (a shipped or learned dead
    end, which names the levels that are dead), the proposal *repaired* (the allowed config
    nearest it: the dead levels swapped, the sampler's other choices kept) is drawn instead when
    :func:`level_model` rates it above the incumbent's neighbour (:meth:`LevelModel.worth`): a
    sampler that proposes an optimum several knobs away together with a dead level otherwise never
    gets there. On the ``far`` landscape of benchmarks/sweep_efficiency.py
    (EAGLE-3 with a short draft shape is the optimum, six knobs from the baseline) this took the
    median from 4.78 to 3.89 emulated GPU-h (21 seeds); the ``goodput`` median rose from 3.99 to
    4.48 (21 seeds; 3.99 either way over the benchmark's 11), the campaign, large and stale did
    not move."""
    keep = dict(within or {})

    def inside(p: Mapping[str, Any]) -> bool:
        return all(p.get(k) == v for k, v in keep.items())
    recs = trial_records.load_records(study)
    model = level_model(recs, objectives, ordered_knobs(drawer.space))
    taken = taken_keys(study, running)
    ok = allowed if not keep else (lambda c: inside(c) and allowed(c))
    repair = None
    if gate != "duplicate":
        if gate == "rule" and proposal:
            repair = drawer.draw(taken, ok, near=proposal, model=model)
        best = trial_records.best_record([r for r in recs if inside(r.params)], objectives)
        proposal = best.params if best is not None else proposal
    cfg = drawer.draw(taken, ok, near=proposal, model=model)
    if repair is not None and (cfg is None or model.worth(repair, cfg) > model.worth(cfg, repair)):
        cfg = repair
    if cfg is None:
        return False
    attrs = {A_UNTRIED: True}
    study.enqueue_trial(cfg, user_attrs={**attrs, "enqueue_attrs": attrs})
    return True
