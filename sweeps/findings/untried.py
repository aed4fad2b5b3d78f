"""The "Still untried" section: knob levels never launched, approaches never tried, and
how many configs of the space are left once known dead ends are excluded."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweeps import records as R
from sweeps.findings.context import Context
from sweeps.findings.groups import Group, outcome
from sweeps.untried import knowledge_filter

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
        from sweeps.rules import fingerprint_hash

        return fingerprint_hash(ctx.fingerprint)
    except ValueError:
        return None


def _knowledge(ctx: Context, records: Sequence[R.TrialRecord]) -> Callable[[Mapping[str, Any]], bool]:
    """True for knob values (a whole config or an approach's few knobs) no known dead end
    excludes: a silently degraded allreduce level, or a rule whose every knob they set."""
    return knowledge_filter(records, ctx.rules, _fingerprint_hash(ctx), ctx.model.get("name"), ctx.study)


def open_approaches(ctx: Context, records: Sequence[R.TrialRecord], groups: dict[tuple, Group],
                    gk: list[str]) -> list[str]:
    """``k=v × k=v`` of the approaches never launched that no known dead end excludes."""
    keys = [key for key, g in groups.items() if outcome(g, None) == "untried"]
    ok = _knowledge(ctx, records)
    return [" × ".join(f"{k}={v}" for k, v in zip(gk, key)) for key in keys if ok(dict(zip(gk, key)))]


def remaining(ctx: Context, records: Sequence[R.TrialRecord]) -> tuple[int, int, int] | None:
    """(feasible configs, untried and not excluded, excluded by rules/degraded levels), or
    None for an infinite or huge space (over :data:`ENUM_LIMIT` configs)."""
    cfgs = _enumerated(ctx.space)
    if cfgs is None:
        return None
    tried = {R.config_key(r.params) for r in records if r.launched or r.status == "skipped"}
    ok = _knowledge(ctx, records)
    left = excluded = 0
    for c in cfgs:
        if not ok(c):
            excluded += 1
        elif R.config_key(c) not in tried:
            left += 1
    return len(cfgs), left, excluded


def _knob_lines(ctx: Context, records: Sequence[R.TrialRecord], launched: Sequence[R.TrialRecord]) -> list[str]:
    lines: list[str] = []
    for p in ctx.space.params:
        try:
            lv = p.levels()
        except Exception:  # noqa: BLE001 - a continuous float: report the tried range instead
            vals = [float(r.params[p.name]) for r in launched if p.name in r.params]
            lines.append(f"- `{p.name}` (continuous {p.low}..{p.high}): tried "
                         + (f"{min(vals):g}..{max(vals):g} in {len(vals)} trials" if vals else "nothing yet"))
            continue
        tried = {r.params.get(p.name) for r in launched if p.name in r.params}
        skipped = {r.params.get(p.name) for r in records if r.status == "skipped" and r.duplicate_of is None
                   and p.name in r.params} - tried
        never = [v for v in lv if v not in tried]
        if not never:
            continue
        parts = [f"{v} (only skipped by a known dead end)" if v in skipped else str(v) for v in never]
        cond = f" (when {', '.join(f'{k}={list(v)}' for k, v in p.when.items())})" if p.when else ""
        lines.append(f"- `{p.name}`{cond}: never launched: {', '.join(parts)}")
    return lines


def untried_section(ctx: Context, records: Sequence[R.TrialRecord], groups: dict[tuple, Group], gk: list[str]) -> list[str]:
    """The "Still untried" section."""
    lines: list[str] = []
    launched = [r for r in records if r.launched]
    if ctx.space is not None:
        lines = _knob_lines(ctx, records, launched)
        combos = open_approaches(ctx, records, groups, gk) if gk else []
        if combos:
            lines.append("- approaches never tried (no known dead end): " + "; ".join(combos))
        left = remaining(ctx, records)
        if left is not None:
            total, rest, excluded = left
            lines.append(f"- configs: {total} feasible in the space, {len({R.config_key(r.params) for r in launched})} "
                         f"launched, {excluded} excluded by known dead ends, **{rest} not yet tried**")
    return ["### Still untried", "", *(lines or ["Every level of every knob has been launched at least once."]), ""]
