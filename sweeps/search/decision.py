"""The statistics of the confirmation race: pure functions over repeat values (no I/O).

:mod:`sweeps.search.confirm` re-launches the top configs and the baseline and calls these to
decide, after each batch of repeats, whether the leader has separated from every other
contender, is equivalent to some of them within a practical margin, or needs more repeats.

The confirmation result (study user attribute ``confirmation``, returned by
:func:`sweeps.search.confirm.confirm_top`) has this shape; fields marked *new* are added by
the race, the others are as before::

    {"top_k", "repeats" (initial repeats per config), "confidence", "candidates" (trials),
     "baseline_trial", "winner" (the pick: trial or None), "winner_note", "date", "wall_s",
     "round" (confirmation rounds that launched something, 0-based: the current one),
     "max_repeats" (new: repeat budget per config), "margin" (new: relative equivalence margin),
     "epoch" (new: evidence set; only ``force`` starts a new one),
     "tie_group" (new: trials the decision cannot separate, the pick first),
     "decision": {"status": "separated" | "equivalent" | "pick_decided" | "budget_spent" |
                            "undecidable" | "single",
                  "reason": str, "leader": trial, "pick": trial, "tie_group": [trials],
                  "tie_break": str, "settled": [trials: undecided, but more repeats could not
                  change the pick]} (new),
     "decision_reason" (new: == decision["reason"]),
     "launches" (new): [{"trial", "repeat" (0-based, per trial, over all rounds), "round",
                         "status", "value", "failure", "metrics", "wall_s",
                         "gpu_s" (GPU-seconds the launch held)}],
     "derived" (new: configs the race added, one step simpler than its pick, ``descend``):
               [{"trial" (the study's, or DERIVED_BASE up: only the race measured it),
                 "config", "from" (the pick it simplifies), "step" ("knob a -> b"), "in_study"}],
     "entries": [{"trial", "config", "label", "is_baseline", "sweep_value", "values", "n",
                  "mean", "ci_low", "ci_high", "speedup_mean", "speedup_ci", "tokens_match",
                  "mismatch_detail", "failures", "violated", "verdict",
                  "interval" (new: [ci_low, ci_high]),
                  "ratio_interval" (new: Fieller interval of the speedup, == speedup_ci, >= 0,
                                    high None when unbounded),
                  "vs_leader" (new: "leader" | "separated" | "equivalent" | "undecided" | "out"),
                  "in_tie_group" (new: bool), "non_default" (new: settings differing from the
                  baseline's render: env vars + flags), "departure" (new: :func:`departure`),
                  "cost" (new: mean launch wall s),
                  "serving_ok" (new: True / False / None = no serving check),
                  "derived_from", "step", "in_study" (new: a race-added config only)}]}

Tests: a contender is *separated* when the Welch interval of the difference of means excludes
0 on the leader's side (for a contender the tie-break ranks ahead of the leader, :func:`rank_key`,
its mean must also lie more than ``margin`` x the leader's below, so a simpler config leaves the
tie group only when shown worse and estimated practically worse, :func:`_beyond`), at
``confidence`` Bonferroni-adjusted over the leader's comparisons
(``1 - (1 - confidence) / (contenders - 1)``): the leader is the largest of several noisy means,
so "better than every other" is a family of comparisons made after selecting it (the
multiple-comparisons-with-the-best setting, Hsu 1984, for which Bonferroni is a conservative
bound); unadjusted, each extra plateau member in the race adds a chance of a false separation; *equivalent* when the two one-sided
tests (TOST, Schuirmann 1987: the ``1 - 2*alpha`` Welch interval of the difference lies
within ``+-margin * |leader mean|``) pass; otherwise *undecided*, and it gets more repeats (with
the leader and the pick) only while they could change the pick (:func:`can_change_pick`): a
contender ranked after the pick by the tie-break stops once the pick is shown non-inferior to
it (one-sided, :func:`non_inferior`), and the decision is then ``pick_decided``. With
``futility`` a contender that the repeat budget cannot decide is not raced on either: projected
to ``max_repeats`` repeats with its and the leader's means so far and the race's pooled spread
(:func:`projected`, :func:`pooled_cv2`), it would still be neither separated nor equivalent (nor the pick
non-inferior to it): stochastic curtailment of a sequential test with the observed effect; the
decision is then ``undecidable`` (a larger ``max_repeats`` or ``margin`` can decide it).
The tie group is the leader and every contender not separated from it. The pick within it:
passes the serving check (True before None before False), then fewer non-default settings,
then the smaller departure from the baseline's numeric settings (:func:`departure`), then
cheaper (a mean launch wall time at least :data:`COST_TIE` shorter), then the better mean.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sweeps.config.space import is_number

#: What the tie-break says, in order (quoted by the summary and the findings).
TIE_BREAK = ("passes the serving check, then fewer non-default settings (env vars, flags), "
             "then numeric settings nearer the baseline's (log2 steps), "
             "then cheaper (a launch at least 10 % shorter), then the better mean")
#: In the tie-break, launch costs (mean wall s of a config's confirmation launches) within this
#: fraction of the cheapest count as equal. A launch's wall time varies run to run (server
#: start-up, graph capture, the machine's load; on the instant backend it is the milliseconds
#: the model takes), so a smaller difference is no evidence that one config is cheaper, and
#: deciding on it made the same seeded study pick different winners from run to run.
COST_TIE = 0.10


def _mean_var(v: Sequence[float]) -> tuple[float, float]:
    """(mean, sample variance) of ``v`` (variance 0 for fewer than 2 values)."""
    n = len(v)
    m = sum(v) / n
    return m, (sum((x - m) ** 2 for x in v) / (n - 1) if n > 1 else 0.0)


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """Two-sided Welch interval of ``mean(a) - mean(b)`` (Welch-Satterthwaite df; scipy's t).

    Args:
        a, b: measurements, at least 2 each.
        confidence: e.g. 0.95.
    Returns:
        ``(difference, low, high)``; ``(d, d, d)`` when both samples have zero spread.
    Raises:
        ValueError: fewer than 2 values on either side.
    """
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch_interval needs >= 2 values per side, got {len(a)} and {len(b)}")
    ma, va = _mean_var(a)
    mb, vb = _mean_var(b)
    d = ma - mb
    sa, sb = va / len(a), vb / len(b)
    se = math.sqrt(sa + sb)
    if se == 0:
        return d, d, d
    df = (sa + sb) ** 2 / ((sa**2 / (len(a) - 1) if sa else 0.0) + (sb**2 / (len(b) - 1) if sb else 0.0))
    half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
    return d, d - half, d + half


def fieller_ratio(a: Sequence[float], b: Sequence[float], confidence: float = 0.95,
                  ) -> tuple[float, float, float | None]:
    """Ratio ``mean(a) / mean(b)`` of two independent positive samples with Fieller's interval
    (Fieller 1954; df = min(n) - 1, conservative), clipped at 0: a ratio of rates is never
    negative. When the denominator's mean is not significantly above 0 (``g >= 1``) the
    interval is unbounded: ``(ratio, 0.0, None)``.

    Returns:
        ``(ratio, low, high)``; NaN bounds with fewer than 2 values on either side.
    """
    from scipy import stats

    if not a or not b:
        return float("nan"), float("nan"), float("nan")
    ma, va = _mean_var(a)
    mb, vb = _mean_var(b)
    r = ma / mb if mb else float("nan")
    if len(a) < 2 or len(b) < 2 or not math.isfinite(r):
        return r, float("nan"), float("nan")
    sa, sb = va / len(a), vb / len(b)  # variances of the means
    t = float(stats.t.ppf((1 + confidence) / 2, min(len(a), len(b)) - 1))
    g = t * t * sb / (mb * mb)
    if g >= 1:
        return r, 0.0, None
    half = (t / abs(mb)) * math.sqrt(sa * (1 - g) + r * r * sb)
    lo, hi = (r - half) / (1 - g), (r + half) / (1 - g)
    return r, max(0.0, lo), max(0.0, hi)


def tost_equivalent(a: Sequence[float], b: Sequence[float], margin: float, confidence: float) -> bool:
    """Two one-sided tests: ``mean(a)`` and ``mean(b)`` are equivalent within ``+-margin``
    (absolute, same unit) at level ``alpha = 1 - confidence`` (the ``1 - 2*alpha`` Welch
    interval of the difference lies inside the margin). False with fewer than 2 values."""
    if len(a) < 2 or len(b) < 2 or margin <= 0:
        return False
    _, lo, hi = welch_interval(a, b, 1 - 2 * (1 - confidence))
    return -margin < lo and hi < margin


def separation_confidence(confidence: float, comparisons: int) -> float:
    """The Bonferroni-adjusted level of each of the leader's ``comparisons`` separation tests:
    ``1 - (1 - confidence) / comparisons`` (``confidence`` itself for one comparison or none)."""
    return 1 - (1 - confidence) / max(1, comparisons)


def compare(leader: Sequence[float], other: Sequence[float], maximize: bool, margin: float,
            confidence: float, separation: float | None = None, beyond: float = 0.0) -> str:
    """``"separated"`` (the leader is better: the interval at ``separation``, default
    ``confidence``, excludes 0, and its mean lead exceeds ``beyond``, absolute in the objective's
    unit, default 0),
    ``"equivalent"`` (within ``margin``, relative to the leader's mean, TOST at ``confidence``) or
    ``"undecided"`` (more repeats needed)."""
    if len(leader) < 2 or len(other) < 2:
        return "undecided"
    d, lo, hi = welch_interval(leader, other, separation if separation is not None else confidence)
    if (lo > 0 and d > beyond) if maximize else (hi < 0 and d < -beyond):
        return "separated"
    m = abs(sum(leader) / len(leader)) * margin
    return "equivalent" if tost_equivalent(leader, other, m, confidence) else "undecided"


@dataclass
class Contender:
    """One config in the race: its trial number, values (ok repeats), launches so far
    (ok or not), whether it may win, the baseline flag and the tie-break keys."""

    trial: int
    values: list[float]
    launched: int
    eligible: bool = True
    is_baseline: bool = False
    non_default: int = 0
    cost: float = 0.0
    serving_ok: bool | None = None
    departure: float = 0.0

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else float("nan")


@dataclass
class Decision:
    """The race's state: ``status`` (``"separated"``, ``"equivalent"``, ``"budget_spent"``,
    ``"single"`` or ``"racing"``), the leader, per trial its relation to the leader, the
    tie group (pick first), the pick, the trials that need another repeat, and the undecided
    contenders more repeats could not change the pick for (``settled``: ranked after the pick,
    which is non-inferior to them; :func:`can_change_pick`). For an ``undecidable`` race,
    ``needed``: the smallest cap of the ladder :data:`NEEDED_LADDER` x ``max_repeats`` at which,
    projected the same way, every open contender would be decided (None: none up to its top)."""

    status: str
    leader: int | None
    relation: dict[int, str] = field(default_factory=dict)
    tie_group: list[int] = field(default_factory=list)
    pick: int | None = None
    more: list[int] = field(default_factory=list)
    reason: str = ""
    settled: list[int] = field(default_factory=list)
    needed: int | None = None


#: the caps an ``undecidable`` race is projected to (multiples of its ``max_repeats``) for the
#: repeats that would decide it: beyond 8x, a difference the node's noise hides that well is
#: one no deployment would notice either, and the advice is a wider margin, not more launches
NEEDED_LADDER = (2, 4, 8)


def departure(params: Mapping[str, object], baseline: Mapping[str, object]) -> float:
    """How far a config's numeric settings are from the baseline's: the sum over knobs of
    ``|log2(value / baseline value)|`` where both are positive numbers and differ, rounded to
    0.01 (``cuda_graph_max_bs`` 128 against 512: 2.0; 32: 4.0). Other knobs count 0 here (they
    are counted by the non-default settings).

    Why a tie-break: on a plateau of equivalent configs (``cuda_graph_max_bs`` 8 to 128 on the
    campaign's node) the member nearest the configuration people run today is the smallest
    change to deploy, and it is the same member whichever of them a seed happened to measure
    best, so the decision stops depending on the sampler's seed."""
    total = 0.0
    for k, v in params.items():
        b = baseline.get(k)
        if not (is_number(v) and is_number(b)) or v == b or v <= 0 or b <= 0:
            continue
        total += abs(math.log2(float(v) / float(b)))
    return round(total, 2)


def _beyond(c: Contender, lead: Contender, margin: float) -> float:
    """How far above ``c``'s mean the leader's must lie, besides being shown better, for ``c`` to
    leave the tie group (absolute, the objective's unit): ``margin x |leader mean|`` when ``c``
    ranks ahead of the leader on :func:`rank_key` (a simpler config: fewer settings, or nearer the
    baseline's), else 0.

    A simpler config is the one the tie-break would deploy, so it is dropped only when shown worse
    and estimated *practically* worse (a lead beyond the equivalence margin). On a plateau of equal
    rates (``cuda_graph_max_bs`` 64 and 128 on the campaign's node) a noisy leader otherwise
    separates from its simpler neighbour by a fraction of the margin in some seeds and not in
    others, and the deployed config followed the noise. Requiring the whole interval beyond the
    margin instead kept configs 2-3 % worse in the group (at 1.5 % noise, 5-10 repeats: a simpler
    config 2 % worse deployed in 150 of 200 simulated races, 64 with this rule, as without one)."""
    return abs(lead.mean) * margin if rank_key(c) < rank_key(lead) else 0.0


def rank_key(c: Contender) -> tuple[int, int, float]:
    """The tie-break's keys that do not depend on the repeats: serving check (passed 0,
    unchecked 1, failed 2), non-default settings, :func:`departure` (smaller first)."""
    return {True: 0, None: 1, False: 2}[c.serving_ok], c.non_default, c.departure


def can_change_pick(c: Contender, chosen: Contender, maximize: bool, margin: float, confidence: float) -> bool:
    """Whether more repeats of the undecided contender ``c`` could change the pick ``chosen``
    of a tie group (the race goes on only for those):

    - ``c`` is the pick: it may yet separate below the leader and leave the group;
    - ``c`` ties the pick on :func:`rank_key`: the launch cost and the mean, which repeats move,
      decide between them;
    - ``c`` ranks after the pick but the pick is not yet shown non-inferior to it: ``c`` might be
      better than the pick by more than ``margin`` (it could become the leader and separate the
      pick below it).

    A contender ranked after the pick to which the pick is non-inferior within ``margin``
    (:func:`non_inferior`, one-sided at ``confidence``) cannot change it: shown equivalent it
    stays behind the pick, separated it leaves the group, and the pick is the same either way.
    Unlike equivalence (TOST) this needs no proof that ``c`` is not *worse*, which is what kept
    plateau configs racing to the repeat budget at 1-2 % noise against a 1 % margin."""
    if c is chosen or rank_key(c) == rank_key(chosen):
        return True
    return not non_inferior(chosen.values, c.values, abs(chosen.mean) * margin, maximize, confidence)


def non_inferior(pick: Sequence[float], other: Sequence[float], margin: float, maximize: bool,
                 confidence: float) -> bool:
    """One-sided non-inferiority of ``pick`` to ``other`` within ``margin`` (absolute, the
    objective's unit): the upper ``confidence`` Welch bound of how much better ``other`` is than
    ``pick`` (``mean(other) - mean(pick)``, the reverse when minimising) lies below ``margin``.
    One side of :func:`tost_equivalent` (Schuirmann 1987). False with fewer than 2 values."""
    if len(pick) < 2 or len(other) < 2 or margin <= 0:
        return False
    a, b = (other, pick) if maximize else (pick, other)
    _, _, hi = welch_interval(a, b, 1 - 2 * (1 - confidence))
    return hi < margin


def pooled_cv2(groups: Sequence[Sequence[float]]) -> float | None:
    """The pooled squared coefficient of variation of several configs' repeats: ``sum((n_i - 1)
    s_i^2 / m_i^2) / sum(n_i - 1)`` over those with 2 or more values and a non-zero mean (None
    when none has). The run-to-run noise of one node, relative to the rate, as every config in
    the race shows it (the emulated node: one 1.5 % lognormal for all, tasks/emulator/profile.py)."""
    num = den = 0.0
    for g in groups:
        if len(g) < 2:
            continue
        m, v = _mean_var(g)
        if m:
            num += (len(g) - 1) * v / (m * m)
            den += len(g) - 1
    return num / den if den else None


def projected(values: Sequence[float], n: int, cv2: float | None = None) -> list[float]:
    """``n`` values with the mean and sample variance of ``values``: what the race would see after
    ``n`` repeats if its mean and spread so far held (pairs ``mean +- a``, the mean itself once
    when ``n`` is odd). With ``cv2`` (:func:`pooled_cv2`) the spread is ``cv2 x mean^2`` instead of
    the values' own. ``values`` itself when it has ``n`` or more, or fewer than 2."""
    if len(values) >= n or len(values) < 2:
        return list(values)
    m, v = _mean_var(values)
    if cv2 is not None:
        v = cv2 * m * m
    k = n // 2
    a = math.sqrt(v * (n - 1) / (2 * k))
    return [m + a] * k + [m - a] * k + ([m] if n % 2 else [])


def pick(members: Sequence[Contender], maximize: bool) -> Contender:
    """The tie-break (:data:`TIE_BREAK`): the member that passes the serving check (unchecked
    next, failed last), then with the fewest non-default settings, then the smallest
    :func:`departure` from the baseline, then among those within
    :data:`COST_TIE` of the cheapest launch, the better mean (then the lower trial number).

    Raises:
        ValueError: ``members`` is empty.
    """
    if not members:
        raise ValueError("pick() needs at least one member")

    best = min(rank_key(c) for c in members)
    same = [c for c in members if rank_key(c) == best]
    cheapest = min(c.cost for c in same)
    close = [c for c in same if c.cost <= cheapest * (1 + COST_TIE)]
    return min(close, key=lambda c: (-c.mean if maximize else c.mean, c.trial))


def decided_by(members: Sequence[Contender], chosen: Contender) -> str:
    """Which step of :data:`TIE_BREAK` set ``chosen`` (:func:`pick`'s choice) apart from the
    other ``members``: ``"the serving check"``, ``"fewer non-default settings"``, ``"settings
    nearer the baseline's"``, ``"a cheaper launch"`` or ``"the better mean"``."""
    def serving(c: Contender) -> int:
        return {True: 0, None: 1, False: 2}[c.serving_ok]
    rest = [c for c in members if c is not chosen and serving(c) == serving(chosen)]
    if not rest:
        return "the serving check" if len(members) > 1 else "the only member"
    same = [c for c in rest if c.non_default == chosen.non_default]
    if not same:
        return "fewer non-default settings"
    same = [c for c in same if c.departure == chosen.departure]
    if not same:
        return "settings nearer the baseline's"
    if all(c.cost > chosen.cost * (1 + COST_TIE) for c in same):
        return "a cheaper launch"
    return "the better mean"


def pick_sentence(trial: int, by: str) -> str:
    """The tie-break sentence of a decision's reason (:func:`decide`, :func:`repick`)."""
    return f"pick t{trial} by the tie-break ({TIE_BREAK}): {by} decided it."


_PICK_SENTENCE = re.compile(r"pick t\d+ by the tie-break(?: \(" + re.escape(TIE_BREAK) + r"\): [^.]* decided it\.|: "
                            + re.escape(TIE_BREAK) + r"\.)")


#: the first sentence of a stored ``winner_note`` (sweeps.search.confirm): "Winner t13: 90.6 tok/s mean over 8 runs."
_WINNER_SENTENCE = re.compile(r"^Winner t\d+: (?P<val>-?\d+(?:\.(?P<dec>\d+))?)(?P<unit>.*?) mean over \d+ runs\.")


def _winner_sentence(m: re.Match[str], c: Contender) -> str:
    """The winner sentence for ``c``, in the number format and unit of the one it replaces."""
    digits = len(m.group("dec") or "")
    return f"Winner t{c.trial}: {c.mean:.{digits}f}{m.group('unit')} mean over {len(c.values)} runs."


def decide(contenders: Sequence[Contender], maximize: bool, margin: float, confidence: float,
           max_repeats: int, fmt: Callable[[float], str] = lambda v: f"{v:.4g}", futility: bool = True) -> Decision:
    """Decide the race from the repeats so far (pure).

    Args:
        contenders: the confirmed configs; only ``eligible`` ones with a value compete.
        maximize: the objective's direction.  margin: relative equivalence margin (0.01 = 1 %).
        confidence: interval level.  max_repeats: launches per config before its budget is spent.
        fmt: formats a value for the reason sentence.
        futility: stop racing a contender the repeat budget cannot decide (projected from the
            means and spreads so far: ``decidable`` below); False races it to the budget.
    Returns:
        a :class:`Decision`; ``status == "racing"`` with ``more`` = trials to repeat again
        while some contender is undecided and both it and the leader have budget left.
    """
    live = [c for c in contenders if c.eligible and c.values]
    if not live:
        return Decision("none", None, reason="No config passed the confirmation.")
    live.sort(key=lambda c: -c.mean if maximize else c.mean)
    lead = live[0]
    rel = {lead.trial: "leader"}
    family = separation_confidence(confidence, len(live) - 1)
    for c in live[1:]:
        rel[c.trial] = compare(lead.values, c.values, maximize, margin, confidence, family, _beyond(c, lead, margin))
    for c in contenders:
        rel.setdefault(c.trial, "out")
    undecided = [c for c in live[1:] if rel[c.trial] == "undecided"]
    group = [lead] + [c for c in live[1:] if rel[c.trial] != "separated"]
    chosen = pick(group, maximize)
    tie = [chosen.trial] + [c.trial for c in group if c is not chosen]
    # race on only what can change the pick (can_change_pick): the leader and each such
    # undecided contender get one more repeat while their budget lasts
    open_ = [c for c in undecided if can_change_pick(c, chosen, maximize, margin, confidence)]

    cv2 = pooled_cv2([c.values for c in live])

    def decidable(c: Contender, n: int = max_repeats) -> bool:
        """Whether ``c`` could stop mattering within the repeat budget: projected to
        ``n`` (``max_repeats``) with its (and the leader's and the pick's) mean so far and the race's
        pooled spread (:func:`pooled_cv2`; one config's spread at 3 repeats rests on 2 degrees of
        freedom and can be twice the node's, which stopped races a few launches from deciding),
        it separates from the leader, is equivalent to it, or the pick is non-inferior to it."""
        pl, pc = projected(lead.values, n, cv2), projected(c.values, n, cv2)
        if compare(pl, pc, maximize, margin, confidence, family, _beyond(c, lead, margin)) != "undecided":
            return True
        if c is chosen or rank_key(c) == rank_key(chosen):
            return False
        pp = projected(chosen.values, n, cv2)
        return non_inferior(pp, pc, abs(chosen.mean) * margin, maximize, confidence)
    hopeless = [c for c in open_ if futility and not decidable(c)]
    racing = [c for c in open_ if c not in hopeless]
    racers = [lead] + [c for c in [chosen, *racing] if c is not lead] if racing else []
    more = list(dict.fromkeys(c.trial for c in racers if c.launched < max_repeats))
    if more:
        return Decision("racing", lead.trial, rel, tie, chosen.trial, more, "racing")
    pct = f"{margin * 100:g} %"
    needed: int | None = None
    left = [c for c in undecided if c not in open_]
    if len(live) == 1:
        status, reason = "single", f"t{lead.trial} is the only config that passed the confirmation."
    elif open_ and all(c.launched >= max_repeats for c in open_):
        names = ", ".join(f"t{c.trial}" for c in open_)
        status = "budget_spent"
        reason = (f"Repeat budget spent ({max_repeats} per config): t{lead.trial} "
                  f"({fmt(lead.mean)}) is not distinguishable from {names} at {confidence * 100:.0f} %, "
                  f"nor shown equivalent within {pct}.")
    elif open_:
        names = ", ".join(f"t{c.trial}" for c in open_)
        status = "undecidable"
        needed = next((k * max_repeats for k in NEEDED_LADDER
                       if all(decidable(c, k * max_repeats) for c in open_)), None)
        then = (f"projected the same way, {needed} repeats per config would decide it "
                f"(sweep.confirm.max_repeats={needed})" if needed else
                f"no cap up to {NEEDED_LADDER[-1] * max_repeats} would (a difference this far below the "
                f"run-to-run noise: a larger sweep.confirm.margin decides it, more repeats do not)")
        reason = (f"Not decidable within the repeat budget ({max_repeats} per config): t{lead.trial} "
                  f"({fmt(lead.mean)}) is not distinguishable from {names} at {confidence * 100:.0f} %, "
                  f"nor shown equivalent within {pct}, and projected from their means and spreads so far "
                  f"it would still be neither at {max_repeats} repeats (not raced on); {then}.")
    elif left:
        status = "pick_decided"
        how = ("is the leader" if chosen is lead
               else f"is equivalent to the leader t{lead.trial} ({fmt(lead.mean)}) within {pct} (TOST)")
        reason = (f"The pick t{chosen.trial} ({fmt(chosen.mean)}) {how}; "
                  f"{', '.join(f't{c.trial}' for c in left)} neither separated from t{lead.trial} "
                  f"nor shown equivalent, but ranked after the pick by the tie-break and not better than "
                  f"it by more than {pct} (non-inferiority at {confidence * 100:.0f} %), so more repeats "
                  f"could not change the pick (not raced on).")
    elif len(group) > 1:
        status = "equivalent"
        names = ", ".join(f"t{c.trial}" for c in group[1:])
        reason = f"t{lead.trial} ({fmt(lead.mean)}) is equivalent to {names} within {pct} (TOST)."
    else:
        status = "separated"
        reason = (f"t{lead.trial} ({fmt(lead.mean)}) separated from every other contender "
                  f"at {confidence * 100:.0f} % (Welch"
                  + (f", Bonferroni over {len(live) - 1} comparisons)." if len(live) > 2 else ")."))
        simpler = [c for c in live[1:] if _beyond(c, lead, margin)]
        if simpler:
            reason += (f" {', '.join(f't{c.trial}' for c in simpler)}, ranked ahead of it by the tie-break, "
                       f"by more than the {pct} margin.")
    if status in ("budget_spent", "undecidable"):
        reason += _rest_of_group(group, open_, left, rel, lead, pct, confidence)
    if len(group) > 1:
        reason += f" Tie group {', '.join(f't{t}' for t in tie)}; {pick_sentence(chosen.trial, decided_by(group, chosen))}"
    return Decision(status, lead.trial, rel, tie, chosen.trial, [], reason, [c.trial for c in left], needed)


def _rest_of_group(group: Sequence[Contender], open_: Sequence[Contender], left: Sequence[Contender],
                   rel: Mapping[int, str], lead: Contender, pct: str, confidence: float) -> str:
    """The sentence on the tie group's members a budget-spent or undecidable reason has not
    named (its sentence names only those still open: ``open_``): those equivalent to the leader
    and those the pick is non-inferior to; "" when there are none, so every member is accounted for."""
    named = {c.trial for c in open_} | {lead.trial}
    eq = [c for c in group if c.trial not in named and rel.get(c.trial) == "equivalent"]
    members = {c.trial for c in group}
    after = [c for c in left if c.trial not in named and c.trial in members]
    parts = []
    if after:
        parts.append(f"{', '.join(f't{c.trial}' for c in after)} neither separated from t{lead.trial} nor shown "
                     f"equivalent, but ranked after the pick by the tie-break and not better than it by more than "
                     f"{pct} (non-inferiority at {confidence * 100:.0f} %; not raced on)")
    if eq:
        parts.append(f"{', '.join(f't{c.trial}' for c in eq)} equivalent to t{lead.trial} within {pct} (TOST)")
    return (" " + "; ".join(parts) + ".") if parts else ""


def repick(confirmation: Mapping[str, object], serving: Mapping[int, bool | None],
           maximize: bool = True) -> dict[str, object]:
    """The confirmation with the serving check applied: ``serving`` = ``{trial: passed}``;
    re-picks within the stored tie group by :data:`TIE_BREAK` and moves ``winner``,
    ``tie_group``, ``decision["pick"]`` and the verdicts. Returns a new dict (input untouched).

    For the serving check (it runs after the race, on the tie group or the winner)."""
    import copy

    conf: dict[str, object] = copy.deepcopy(dict(confirmation))
    entries = conf.get("entries") or []
    assert isinstance(entries, list)
    group = list(conf.get("tie_group") or [])  # type: ignore[call-overload]
    if not group:
        return conf
    by = {int(e["trial"]): e for e in entries}
    for e in entries:
        if int(e["trial"]) in serving:
            e["serving_ok"] = serving[int(e["trial"])]
    members = [Contender(t, list(by[t].get("values") or []), int(by[t].get("n") or 0),
                         non_default=int(by[t].get("non_default") or 0), cost=float(by[t].get("cost") or 0.0),
                         serving_ok=by[t].get("serving_ok"), departure=float(by[t].get("departure") or 0.0))
               for t in group if t in by]
    if not members:
        return conf
    winner = pick(members, maximize)
    chosen = winner.trial
    sentence = pick_sentence(chosen, decided_by(members, winner))
    for holder in (conf, conf.get("decision")):
        for k in ("decision_reason", "reason", "winner_note"):
            if isinstance(holder, dict) and isinstance(holder.get(k), str):
                holder[k] = _PICK_SENTENCE.sub(sentence, holder[k])
    note = conf.get("winner_note")
    if isinstance(note, str) and chosen != conf.get("winner") and winner.values:
        conf["winner_note"] = _WINNER_SENTENCE.sub(lambda m: _winner_sentence(m, winner), note, count=1)
    old = conf.get("winner")
    conf["tie_group"] = [chosen] + [t for t in group if t != chosen]
    conf["winner"] = chosen
    dec = conf.get("decision")
    if isinstance(dec, dict):
        dec["pick"], dec["tie_group"] = chosen, conf["tie_group"]
    for e in entries:
        if e["trial"] == chosen:
            e["verdict"] = "winner"
        elif e["trial"] == old and old != chosen:
            e["verdict"] = "tie group: not picked"
    return conf
