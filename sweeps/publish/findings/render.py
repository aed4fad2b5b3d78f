"""The servesweep section, rendered from the records and a :class:`Context`: pure (no
filesystem, no storage); :func:`sweeps.publish.findings.update_findings` writes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.findings.baseline import LEGACY_OBJECTIVE, baseline_entry, baseline_history, baseline_section
from sweeps.publish.findings.best import baseline_measured, best_of, measured
from sweeps.publish.findings.break_even import break_even_section
from sweeps.publish.findings.context import Context
from sweeps.publish.findings.dead_ends import dead_ends_section
from sweeps.publish.findings.document import BEGIN, END, HEADER, data_line
from sweeps.publish.findings.groups import build_groups
from sweeps.publish.findings.load import load_section
from sweeps.publish.findings.losers import losers_section
from sweeps.publish.findings.next_steps import next_steps_section
from sweeps.publish.findings.sections import (
    approaches_section,
    best_section,
    counts_line,
    earlier_sweeps_section,
    environment_section,
)
from sweeps.publish.findings.untried import untried_section
from sweeps.store import records as trial_records

DATA_VERSION = 1
SWEEPS_KEPT = 20  # earlier sweeps remembered in the data block


def _winner(recs: Sequence[trial_records.TrialRecord], conf: Mapping[str, Any] | None, obj: Objective
            ) -> tuple[trial_records.TrialRecord | None, Mapping[str, Any] | None]:
    """(the best record on ``obj``: the confirmed winner where confirmation named one; its
    confirmation entry)."""
    best = best_of(recs, conf, obj)
    if conf and conf.get("winner") is not None:
        from sweeps.search.confirm import config_record

        best = config_record(list(recs), conf, conf["winner"]) or best
        return best, next((e for e in conf.get("entries", []) if e.get("trial") == conf["winner"]), None)
    return best, None


def _sweeps_data(ctx: Context, recs: Sequence[trial_records.TrialRecord], best: trial_records.TrialRecord | None,
                 base: float | None,
                 old_data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(earlier sweeps of the document, the remembered sweeps including this one)."""
    prev = [e for e in (old_data.get("sweeps") or []) if isinstance(e, dict) and e.get("study") != ctx.study]
    obj = ctx.objective
    best_v = measured(best, ctx.confirmation, obj).value if best else None
    this = {"study": ctx.study, "date": ctx.now, "objective": obj.name, "best_value": best_v,
            "best_config": best.params if best else None, "best_trial": best.number if best else None,
            "baseline_value": base, "launched": sum(r.budgeted for r in recs)}
    if obj.name == LEGACY_OBJECTIVE:
        this.update(best_tok_s=best_v, baseline_tok_s=base)
    return prev, (prev + [this])[-SWEEPS_KEPT:]


def render_section(ctx: Context, records: Sequence[trial_records.TrialRecord],
                   old_data: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """Render the servesweep section (markers included, ends with a newline) and its data block.

    Args:
        ctx: sweep context (environment, space, rules, confirmation).
        records: every trial of the study (:func:`sweeps.store.records.load_records`).
        old_data: the data block of the previous document (baseline history), or None.
    Returns:
        ``(section_text, data)``.
    """
    old_data = old_data or {}
    recs = list(records)
    obj = ctx.objective
    conf = ctx.confirmation or None
    base = baseline_measured(recs, conf, obj).value  # the one baseline: confirmed mean where re-measured
    cur_entry = baseline_entry(ctx, recs)
    hist = baseline_history(old_data, cur_entry, ctx.study)
    best, winner_entry = _winner(recs, conf, obj)
    gk, groups = build_groups(ctx.space, recs)
    prev, sweeps = _sweeps_data(ctx, recs, best, base, old_data)

    L: list[str] = [BEGIN, HEADER, f"## servesweep findings: {ctx.study}", ""]
    if ctx.description:
        L += [f"_{ctx.description.strip()}_", ""]
    from sweeps.publish.summary import build_summary  # summary reads findings.best: imported late

    summary = None if ctx.objectives is not None and getattr(ctx.objectives, "multi", False) else build_summary(
        ctx.study, obj, recs, conf, ctx.serving, deploy=lambda p: ctx.deploy_command(p, "")[0],
        emulated=ctx.emulated)
    L += [counts_line(ctx, recs, summary), "", measure.describe(obj), ""]
    if ctx.emulated:
        L += [f"Every measurement below is the emulated {ctx.node_label()}'s: "
              "the emulator's performance model, not a real node; the deployable command is for the real one.", ""]
    L += environment_section(ctx)
    L += baseline_section(ctx, recs, base, cur_entry, hist)
    L += best_section(best, base, conf, winner_entry, obj, ctx, summary)
    L += approaches_section(gk, groups, base, obj, conf, best)
    L += losers_section(ctx, recs, best, base)
    L += break_even_section(recs, conf, obj)
    L += load_section(ctx, recs)
    L += dead_ends_section(ctx, recs, base)
    L += untried_section(ctx, recs, groups, gk)
    L += next_steps_section(ctx, recs, groups, gk)
    L += earlier_sweeps_section(prev, obj)
    data = {"version": DATA_VERSION, "study": ctx.study, "updated": ctx.now, "baselines": hist, "sweeps": sweeps}
    L += [data_line(data), END]
    return "\n".join(L) + "\n", data
