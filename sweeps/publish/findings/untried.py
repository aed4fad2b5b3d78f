"""The "Still untried" and "Coverage" sections: knob levels never launched (each with the
real reason: the rule that answered its proposals, named by its knobs), approaches never
tried, how many configs of the space are left once known dead ends are excluded, and how
the launches split over the sweep's approaches and each knob's levels."""

from __future__ import annotations

import re

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweeps.config.spec import ApproachesConfig
from sweeps.publish.findings.context import Context
from sweeps.publish.findings.groups import Group, outcome
from sweeps.search.coverage import Coverage, equal_footing_lines, quota_lines, release_lines
from sweeps.search.untried import knowledge_filter
from sweeps.store import records as trial_records

ENUM_LIMIT = 200_000  # configs enumerated to count what is left untried (the campaign space: 37 296)

# Enumerating a space costs seconds on the campaign space; once per space object.
_ENUM_CACHE: dict[int, list[dict[str, Any]] | None] = {}


def _enumerated(space: Any) -> list[dict[str, Any]] | None:
    key = id(space)
    if key not in _ENUM_CACHE:
        try:
            cfgs = list(space.enumerate(limit=ENUM_LIMIT + 1))
            _ENUM_CACHE[key] = cfgs if len(cfgs) <= ENUM_LIMIT else None
        except Exception:  # noqa: BLE001 - continuous float param
            _ENUM_CACHE[key] = None
    return _ENUM_CACHE[key]


def _fingerprint_hash(ctx: Context) -> str | None:
    if not (ctx.rules and ctx.fingerprint):
        return None
    try:
        from sweeps.rules.store import fingerprint_hash

        return fingerprint_hash(ctx.fingerprint)
    except ValueError:
        return None


def knowledge(ctx: Context, records: Sequence[trial_records.TrialRecord]) -> Callable[[Mapping[str, Any]], bool]:
    """True for knob values (a whole config or an approach's few knobs) no known dead end
    excludes: a silently degraded allreduce level, or a rule whose every knob they set."""
    return knowledge_filter(records, ctx.rules, _fingerprint_hash(ctx), ctx.model.get("name"), ctx.study)


def open_approaches(ctx: Context, records: Sequence[trial_records.TrialRecord], groups: dict[tuple, Group],
                    gk: list[str]) -> list[str]:
    """``k=v × k=v`` of the approaches never launched that no known dead end excludes."""
    keys = [key for key, g in groups.items() if outcome(g, None) == "untried"]
    ok = knowledge(ctx, records)
    return [" × ".join(f"{k}={v}" for k, v in zip(gk, key)) for key in keys if ok(dict(zip(gk, key)))]


def remaining(ctx: Context, records: Sequence[trial_records.TrialRecord]) -> tuple[int, int, int, int] | None:
    """(feasible configs, launched, excluded by rules/degraded levels or answered without GPU
    time, untried and not excluded): a partition, the last three add up to the first. None for
    an infinite or huge space (over :data:`ENUM_LIMIT` configs)."""
    cfgs = _enumerated(ctx.space)
    if cfgs is None:
        return None
    launched = {trial_records.config_key(r.params) for r in records if r.launched}
    skipped = {trial_records.config_key(r.params) for r in records if r.status == "skipped"}
    ok = knowledge(ctx, records)
    n_launched = left = excluded = 0
    for c in cfgs:
        k = trial_records.config_key(c)
        if k in launched:
            n_launched += 1
        elif not ok(c) or k in skipped:
            excluded += 1
        else:
            left += 1
    return len(cfgs), n_launched, excluded, left


def _rule_text(rules_by_id: Mapping[str, Any], rule_id: str | None) -> str:
    """``rule #4 (moe_a2a_backend=flashinfer)`` for a learned rule, or the stored reason
    (a silently degraded allreduce level is stored as its reason text)."""
    if rule_id is None:
        return "a known dead end"
    m = re.fullmatch(r"degraded:(\w+)=(.+)@t(\d+)", str(rule_id))
    if m:  # the degraded gate's stored reason (sweeps.search.gates.degraded)
        return f"{m.group(1)}={m.group(2)} fell back to NCCL in t{m.group(3)} (silently degraded)"
    r = rules_by_id.get(str(rule_id))
    if r is None:
        return f"rule #{rule_id}" if str(rule_id).isdigit() else str(rule_id)
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(r.knobs.items()))
    return f"rule #{r.id} ({knobs}, {r.failure_class})"


def _answered(ctx: Context, records: Sequence[trial_records.TrialRecord], knob: str, level: Any
              ) -> tuple[dict[str, int], list[str]]:
    """The rules that answered ``knob=level``'s proposals without a launch: (rule text ->
    proposals answered, the texts of those rules that name the knob itself)."""
    rules_by_id = {str(r.id): r for r in ctx.rules}
    hit: dict[str, int] = {}
    own: list[str] = []
    for r in records:
        if r.status == "skipped" and r.duplicate_of is None and r.params.get(knob) == level:
            t = _rule_text(rules_by_id, r.skipped_by_rule)
            hit[t] = hit.get(t, 0) + 1
            rule = rules_by_id.get(str(r.skipped_by_rule))
            if rule is not None and knob in rule.knobs:
                own.append(t)
    return hit, own


def level_is_dead_end(ctx: Context, records: Sequence[trial_records.TrialRecord], knob: str, level: Any,
                      ok: Callable[[Mapping[str, Any]], bool]) -> bool:
    """True when a known dead end of ``knob=level`` itself excludes it: a rule naming the knob
    answered one of its proposals, or the knowledge filter ``ok`` excludes the level alone. A
    level whose proposals were skipped only for other knobs' dead ends is no dead end."""
    return bool(_answered(ctx, records, knob, level)[1]) or not ok({knob: level})


def level_reason(ctx: Context, records: Sequence[trial_records.TrialRecord], knob: str, level: Any,
                 ok: Callable[[Mapping[str, Any]], bool]) -> str:
    """Why no trial launched ``knob=level``: the rules (named by their knobs) that answered its
    proposals, the dead end that excludes the level on its own, or that it was not drawn yet.

    Args:
        ctx: the findings context (its rules).  records: every trial.  ok: :func:`knowledge`."""
    hit, own = _answered(ctx, records, knob, level)
    if hit:
        why = "; ".join(f"{t} ×{n}" if n > 1 else t for t, n in sorted(hit.items(), key=lambda kv: -kv[1]))
        if own:
            return f"a dead end of this level itself: {why}"
        return f"its proposals were skipped by dead ends on other knobs: {why}"
    if not ok({knob: level}):
        rules_by_id = {str(r.id): r for r in ctx.rules}
        own = [_rule_text(rules_by_id, str(r.id)) for r in ctx.rules if r.knobs == {knob: level}]
        return "excluded by a known dead end: " + ("; ".join(own) if own else f"{knob}={level} degraded")
    return "not proposed yet"


def _owed_note(ctx: Context, launched: Sequence[trial_records.TrialRecord],
               when: Mapping[str, Any] | None) -> str:
    """For a knob active only under an approach whose quota is still owed (or was not paid):
    ``; `speculative=eagle3` is still owed 5 of its 9 launches`` (with ``: the sweep stopped
    (<reason>)`` once it has), '' otherwise. Its levels were proposed in fewer launches than
    the quota will give them, which is part of why one is not launched."""
    ap = ctx.approaches
    if not ap or not when or ap.get("knob") not in when or ctx.trial_budget is None or ctx.space is None:
        return ""
    cov = Coverage(ApproachesConfig(**dict(ap)), ctx.space, ctx.objective, ctx.trial_budget)
    if sum(cov.counts(launched, ()).values()) >= ctx.trial_budget:
        return ""
    owed = {v: n for v, n in cov.owed(launched, ()).items() if v in tuple(when[ap["knob"]])}
    if not owed:
        return ""
    what = ", ".join(f"`{ap['knob']}={v}` is still owed {n} of its {cov.quota()} launches" for v, n in owed.items())
    return f"; {what}" + (f": the sweep stopped ({ctx.stop_reason})" if ctx.stop_reason else "")


def _knob_lines(ctx: Context, records: Sequence[trial_records.TrialRecord],
                launched: Sequence[trial_records.TrialRecord]) -> list[str]:
    lines: list[str] = []
    ok = knowledge(ctx, records)
    for p in ctx.space.params:
        try:
            lv = p.levels()
        except Exception:  # noqa: BLE001 - a continuous float: report the tried range instead
            vals = [float(r.params[p.name]) for r in launched if p.name in r.params]
            lines.append(f"- `{p.name}` (continuous {p.low}..{p.high}): tried "
                         + (f"{min(vals):g}..{max(vals):g} in {len(vals)} trials" if vals else "nothing yet"))
            continue
        tried = {r.params.get(p.name) for r in launched if p.name in r.params}
        never = [v for v in lv if v not in tried]
        if not never:
            continue
        owed = _owed_note(ctx, launched, p.when)
        parts = [f"{v} ({level_reason(ctx, records, p.name, v, ok)}{owed})" for v in never]
        cond = f" (when {', '.join(f'{k}={list(v)}' for k, v in p.when.items())})" if p.when else ""
        lines.append(f"- `{p.name}`{cond}: never launched: {', '.join(parts)}")
    return lines


def coverage_lines(ctx: Context, launched: Sequence[trial_records.TrialRecord]) -> list[str]:
    """Launches per approach (``sweep.approaches``) and per level of every finite knob.

    Returns ``- approaches (`speculative`, min share 30 % of the 30-launch trial budget, owed by
    its end): none 21 (70 %), eagle3 9 (30 %)``, then the quota still owed or not paid
    (:func:`sweeps.search.coverage.quota_lines`), the evidence of a released quota, each
    equal-footing comparison that ran (:func:`sweeps.search.coverage.equal_footing_lines`), and one
    ``- `knob`: level n (share), ...`` line per knob (levels in the space's order; a conditional
    knob's shares are of the launches that set it)."""
    lines: list[str] = []
    n = len(launched)
    if not n or ctx.space is None:
        return lines
    ap = ctx.approaches
    for p in ctx.space.params:
        try:
            lv = p.levels()
        except Exception:  # noqa: BLE001 - a continuous float has no levels to count
            continue
        counts = [(v, sum(1 for r in launched if r.params.get(p.name) == v)) for v in lv]
        active = sum(c for _, c in counts)  # a conditional knob: the share of the launches that set it
        if not active:
            continue
        cells = ", ".join(f"{v} {c} ({100 * c / active:.0f} %)" for v, c in counts)
        if ap and p.name == ap.get("knob"):
            share = float(ap.get("min_share", 0))
            budget = ctx.trial_budget
            if budget is not None:
                quota = Coverage(ApproachesConfig(**dict(ap)), ctx.space, ctx.objective, budget).quota()
                short = [str(v) for v, c in counts if quota is not None and c < quota]
                of = f" of the {budget}-launch trial budget ({quota} launches), owed by its end"
            else:
                short = [str(v) for v, c in counts if c / active < share]
                of = ""
            note = f"; below the share: {', '.join(short)}" if short else ""
            lines.insert(0, f"- approaches (`{p.name}`, min share {100 * share:.0f} %{of}): {cells}{note}")
            lines[1:1] = [*quota_lines(ap, ctx.space, launched, budget, ctx.stop_reason, ctx.objective),
                          *release_lines(ap, ctx.space, launched, ctx.objective),
                          *equal_footing_lines(launched, ctx.objective)]
        else:
            lines.append(f"- `{p.name}`: {cells}")
    return lines


def untried_section(ctx: Context, records: Sequence[trial_records.TrialRecord], groups: dict[tuple, Group],
                    gk: list[str]) -> list[str]:
    """The "Still untried" section."""
    lines: list[str] = []
    launched = [r for r in records if r.launched]
    probes = [r for r in launched if r.requestion]  # re-question probes: launched, outside the trial budget
    if ctx.space is not None:
        lines = _knob_lines(ctx, records, launched)
        combos = open_approaches(ctx, records, groups, gk) if gk else []
        if combos:
            lines.append("- approaches never tried (no known dead end): " + "; ".join(combos))
        left = remaining(ctx, records)
        if left is not None:
            total, n_launched, excluded, rest = left
            n_probes = len({trial_records.config_key(r.params) for r in probes})
            what = f" (with {n_probes} re-question probe{'s' if n_probes != 1 else ''})" if n_probes else ""
            lines.append(f"- configs: {total} feasible in the space = {n_launched} launched{what} + {excluded} excluded "
                         f"by known dead ends + **{rest} not yet tried**")
    cov = coverage_lines(ctx, [r for r in launched if not r.requestion])
    if cov and probes:  # the trial budget's launches only, as the quota counts them
        cov.append(f"- not counted above: {len(probes)} re-question probe{'s' if len(probes) != 1 else ''} "
                   f"({', '.join(f't{r.number}' for r in probes)}), one probe-only launch each of a known dead end "
                   f"(outside the trial budget; see Dead ends)")
    out = ["### Still untried", "", *(lines or ["Every level of every knob has been launched at least once."]), ""]
    if cov:
        out += ["### Coverage (launched trials per approach and level)", "", *cov, ""]
    return out
