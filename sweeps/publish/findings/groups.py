"""Trials grouped by approach (e.g. allreduce backend × speculation) and one outcome per
group: what the approaches table and the untried analysis read."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.findings.text import trials
from sweeps.store import records as trial_records

# Knobs that group the approaches table, in order of preference (DESIGN.md § Findings
# document: "allreduce backend x speculation").
GROUP_PREFERENCE = ("allreduce", "speculative", "moe_a2a_backend", "nccl_algo")


def group_knobs(space: Any, records: Sequence[trial_records.TrialRecord]) -> list[str]:
    """The categorical knobs that group the approaches table: those of
    :data:`GROUP_PREFERENCE` in the space (at most two), else the first two string-valued
    categorical knobs."""
    names: list[str] = []
    if space is not None:
        cats = [p for p in space.params if p.type == "categorical" and not p.when]
        by_name = {p.name: p for p in cats}
        names = [k for k in GROUP_PREFERENCE if k in by_name][:2]
        if not names:
            names = [p.name for p in cats if all(isinstance(c, str) for c in p.choices)][:2]
    else:
        keys = {k for r in records for k in r.params}
        names = [k for k in GROUP_PREFERENCE if k in keys][:2]
    return names


def levels(space: Any, knob: str, records: Sequence[trial_records.TrialRecord]) -> list[Any]:
    """Every level of ``knob``: the space's, else those seen in the records (in order)."""
    param = space.param(knob) if space is not None else None
    if param is not None:
        return list(param.levels())
    seen: list[Any] = []
    for r in records:
        if knob in r.params and r.params[knob] not in seen:
            seen.append(r.params[knob])
    return seen


@dataclass
class Group:
    """The trials of one approach (one combination of the grouping knobs' levels), by outcome."""

    key: tuple[Any, ...]
    ok: list[trial_records.TrialRecord] = field(default_factory=list)
    degraded: list[trial_records.TrialRecord] = field(default_factory=list)
    failed: list[trial_records.TrialRecord] = field(default_factory=list)
    infra: list[trial_records.TrialRecord] = field(default_factory=list)
    skipped: list[trial_records.TrialRecord] = field(default_factory=list)
    infeasible: list[trial_records.TrialRecord] = field(default_factory=list)
    running: list[trial_records.TrialRecord] = field(default_factory=list)

    @property
    def launched(self) -> int:
        """Launches of the trial budget (re-question probes are not: :attr:`probes`)."""
        return sum(not r.requestion for r in (*self.ok, *self.degraded, *self.failed, *self.infra))

    @property
    def probes(self) -> int:
        """Re-question probes (one probe-only launch each of a known dead end, outside the trial budget)."""
        return sum(r.requestion for r in (*self.ok, *self.degraded, *self.failed, *self.infra))

    def add(self, r: trial_records.TrialRecord) -> None:
        """File ``r`` under its outcome (duplicates are not counted)."""
        if r.duplicate_of is not None:
            return
        if r.status == "ok":
            (self.ok if trial_records.counts_for_level(r) else self.degraded).append(r)
        elif r.status == "failed":
            self.failed.append(r)
        elif r.status in ("infra_error", "interrupted"):
            self.infra.append(r)
        elif r.status == "skipped":
            self.skipped.append(r)
        elif r.status == "infeasible":
            self.infeasible.append(r)
        elif r.state == "RUNNING":
            self.running.append(r)


def build_groups(space: Any, records: Sequence[trial_records.TrialRecord]) -> tuple[list[str], dict[tuple, Group]]:
    """(grouping knobs, key -> :class:`Group`): every combination of the knobs' levels,
    plus any combination seen in the records; ``([], {})`` when nothing groups."""
    gk = group_knobs(space, records)
    groups: dict[tuple, Group] = {}
    if not gk:
        return gk, groups
    for key in itertools.product(*[levels(space, k, records) for k in gk]):
        groups[key] = Group(key)
    for r in records:
        key = tuple(r.params.get(k) for k in gk)
        if key not in groups:
            if any(v is None for v in key):
                continue
            groups[key] = Group(key)
        groups[key].add(r)
    return gk, groups


def _failures_text(g: Group) -> str:
    """``class (t3, t7; re-question probe t9)`` per failure class, most frequent first: a
    re-question probe is named as one (it is no launch of the trial budget, which the console's
    count of failed trials is)."""
    fails = Counter(r.failure_class or "failed" for r in g.failed)

    def of(c: str) -> str:
        rs = [x for x in g.failed if (x.failure_class or "failed") == c]
        full, probes = [x.number for x in rs if not x.requestion], [x.number for x in rs if x.requestion]
        probe_txt = f"re-question probe{'s' if len(probes) > 1 else ''} {trials(probes)}" if probes else ""
        return "; ".join(t for t in (trials(full) if full else "", probe_txt) if t)
    return ", ".join(f"{c} ({of(c)})" for c, _ in fails.most_common())


def best_in(g: Group, obj: Objective) -> tuple[float | None, int | None]:
    """(the group's best objective value, its trial number), or (None, None)."""
    best = measure.best_record(g.ok, obj)
    return (measure.value_of(best, obj), best.number) if best else (None, None)


def outcome(g: Group, base: float | None, obj: Objective | None = None, value: float | None = None) -> str:
    """One phrase for the group: works (and how its best compares with ``base`` on the
    objective, default decode_tok_s), falls back, fails (by class), no result
    (infrastructure), skipped, running, infeasible or untried. ``value``: the group's value
    the caller quotes beside the phrase (a confirmed mean), compared in place of its best
    single draw so the phrase and the quoted speedup agree."""
    obj = obj or Objective()
    fails_txt = _failures_text(g)
    if g.ok:
        bv = value if value is not None else best_in(g, obj)[0]
        txt = "works"
        if base and bv is not None and obj.better(base, bv):
            txt += f", {measure.slower(obj)} than baseline ({obj.ratio(bv, base):.2f}x)"
        if fails_txt:
            txt += f"; some configs fail: {fails_txt}"
        if g.degraded:
            txt += f"; {trial_records.DEGRADED} in {trials(r.number for r in g.degraded)}"
        return txt
    if g.degraded:
        return f"silently falls back to NCCL ({trial_records.DEGRADED}, {trials(r.number for r in g.degraded)})"
    if fails_txt:
        return f"fails: {fails_txt}"
    if g.infra:
        c = Counter(r.failure_class or r.status for r in g.infra)
        return "no result: " + ", ".join(f"{k} ({v})" for k, v in c.most_common()) + " (infrastructure, not the config)"
    skip_classes = Counter(r.failure_class for r in g.skipped if r.failure_class)
    if skip_classes:
        # the proposals' dead ends, which may lie in a knob outside the group's (an EAGLE-3 config
        # with the FlashInfer all-to-all), not the combination the row names
        return "not launched: its proposals hit known dead ends: " + \
            ", ".join(f"{k} ({v})" for k, v in skip_classes.most_common())
    if g.running:
        return "running"
    if g.infeasible:
        return "infeasible (constraints)"
    return "untried"
