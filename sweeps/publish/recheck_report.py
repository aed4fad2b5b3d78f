"""What a recheck re-ran and what it saw: dead ends, outcomes and the markdown report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeps.store import records

#: user attr of each recheck trial: the dead end (or canary) it re-runs, see :class:`DeadEnd`.
A_RECHECK = "recheck"
A_DISTS = "recheck_distributions"
SOURCE_ATTR = "recheck_source"

FIXED = "fixed"
STILL_FAILING = "still failing"
NEW_CLASS = "still failing (new class)"
#: a dead end of a silently replaced all-reduce path that ran again on the replacement: it served
#: (ok, its tok/s shown) and the path is still off, so it is not fixed, nor a failure
STILL_DEGRADED = "still degraded"
STILL_OK = "still ok"
NEWLY_FAILING = "newly failing"
NOT_RERUN = "not re-run (same environment)"
INCONCLUSIVE = "inconclusive"
PENDING = "pending"


@dataclass
class DeadEnd:
    """One thing a recheck re-runs.

    Attributes:
        kind: ``rule`` (a failure rule), ``degraded`` (an allreduce level silently
            replaced) or ``canary`` (the source's baseline / best config).
        failure_class: the class it failed with (``allreduce_path_degraded`` for degraded,
            None for canaries).
        knobs: implicated knob values (a rule's ``knobs``; ``{"allreduce": level}``;
            the full config for canaries).
        params: the full config re-run (from the source trial).
        source_trial: the source trial number the config comes from.
        rule_ids: rules merged into this dead end (same class and knobs, any fingerprint).
        fingerprint_hash: environment the dead end was observed on.
        source_value: the canary's objective in the source (tok/s), else None.
        label: short description for the report.
    """

    kind: str
    failure_class: str | None
    knobs: dict[str, Any]
    params: dict[str, Any]
    source_trial: int
    rule_ids: list[int] = field(default_factory=list)
    fingerprint_hash: str | None = None
    source_value: float | None = None
    label: str = ""

    @property
    def key(self) -> str:
        """Distinctness key: (kind, class, implicated knobs)."""
        return json.dumps([self.kind if self.kind != "canary" else f"canary:{self.label}", self.failure_class,
                           self.knobs], sort_keys=True, default=str)


@dataclass
class Outcome:
    """A dead end and what the recheck saw (``outcome`` is one of the module constants)."""

    dead_end: DeadEnd
    outcome: str
    trial: int | None = None
    status: str | None = None
    failure_class: str | None = None
    value: float | None = None


def outcomes(study: optuna.Study, not_rerun: list[DeadEnd] | None = None) -> list[Outcome]:
    """Classify each recheck trial of ``study`` against the dead end it re-ran.

    A dead end re-run twice (a resumed recheck after an interruption) takes its last
    conclusive trial.
    """
    res: dict[str, Outcome] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        raw = t.user_attrs.get(A_RECHECK)
        if not raw:
            continue
        d = DeadEnd(**raw)
        r = records.record_from_trial(t)
        if t.state in (TrialState.WAITING, TrialState.RUNNING):
            o = Outcome(d, PENDING, t.number)
        elif r.status in ("infra_error", "interrupted") or r.status not in ("ok", "failed"):
            o = Outcome(d, INCONCLUSIVE, t.number, r.status, r.failure_class)
        elif d.kind == "canary":
            o = Outcome(d, STILL_OK if r.status == "ok" else NEWLY_FAILING, t.number, r.status, r.failure_class, r.value)
        elif r.status == "ok" and records.counts_for_level(r):
            o = Outcome(d, FIXED, t.number, r.status, None, r.value)
        elif r.status == "ok":  # ran, but the allreduce level was silently replaced
            o = Outcome(d, STILL_DEGRADED if d.failure_class == records.DEGRADED else NEW_CLASS, t.number, r.status,
                        records.DEGRADED, r.value)
        else:
            o = Outcome(d, STILL_FAILING if r.failure_class == d.failure_class else NEW_CLASS, t.number, r.status,
                        r.failure_class)
        prev = res.get(d.key)
        if prev is None or prev.outcome in (PENDING, INCONCLUSIVE) or o.outcome not in (PENDING, INCONCLUSIVE):
            res[d.key] = o
    for d in not_rerun or []:
        res.setdefault(d.key, Outcome(d, NOT_RERUN))
    return list(res.values())


def _counts(outs: list[Outcome]) -> dict[str, int]:
    c: dict[str, int] = {}
    for o in outs:
        c[o.outcome] = c.get(o.outcome, 0) + 1
    return c


def report_markdown(study_name: str, source: str, fingerprint: dict[str, Any], outs: list[Outcome]) -> str:
    """The recheck report: environment, counts, one row per dead end."""
    fp = ", ".join(f"{k}={v}" for k, v in sorted(fingerprint.items())) or "(unknown)"
    counts = _counts(outs)
    lines = [f"# Recheck of `{source}` ({study_name})", "", f"Environment now: {fp}", "",
             "Outcomes: " + (", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "(none)"), "",
             "| dead end | class before | source trial | outcome | now | recheck trial |",
             "|---|---|---:|---|---|---:|"]
    for o in outs:
        d = o.dead_end
        what = f"{d.kind}: {d.label}" if d.kind != "canary" else f"canary ({d.label})"
        before = d.failure_class or (f"ok {d.source_value:.1f} tok/s" if d.source_value else "ok")
        if o.status == "ok":
            now = f"ok {o.value:.1f} tok/s" if o.value is not None else "ok"
            if o.failure_class:
                now += f" [{o.failure_class}]"
        else:
            now = o.failure_class or o.status or "-"
        lines.append(f"| {what} | {before} | {d.source_trial} | {o.outcome} | {now} | "
                     f"{'' if o.trial is None else o.trial} |")
    return "\n".join(lines + [""] + _verdicts(outs) + [""])


def _verdicts(outs: list[Outcome]) -> list[str]:
    """Which dead ends the upgrade fixed, and whether the speculative canary now beats the baseline."""
    fixed = [o.dead_end.label for o in outs if o.outcome == FIXED]
    out = [f"Dead ends fixed by the upgrade: {', '.join(fixed) if fixed else 'none'}."]
    canary = {o.dead_end.label: o for o in outs if o.dead_end.kind == "canary"}
    base, spec = canary.get("baseline"), canary.get("best speculative") or canary.get("best")
    if base and spec and base.value and spec.value and spec.dead_end.params.get("speculative") not in (None, "none"):
        ratio = spec.value / base.value
        out.append(f"Speculative decoding (source trial {spec.dead_end.source_trial}) vs the baseline now: "
                   f"{spec.value:.1f} vs {base.value:.1f} tok/s = {ratio:.2f}x: "
                   f"{'beats' if ratio > 1.0 else 'does not beat'} the baseline.")
    return out
