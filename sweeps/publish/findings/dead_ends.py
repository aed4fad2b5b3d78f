"""The dead-ends section: every way a config failed or misled, with its evidence (trials,
the knob values they share, the decisive log line) and what it saved later."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.findings.break_even import baseline_ms_per_token, break_even
from sweeps.publish.findings.context import Context
from sweeps.publish.findings.evidence import decisive_evidence, degraded_line, quoted
from sweeps.publish.findings.text import cfg, code, fmt, trials
from sweeps.store import records


def _shared_knobs(ctx: Context, cls: str, rs: Sequence[records.TrialRecord]) -> dict[str, Any]:
    """Knob values every failing trial of ``cls`` shares (restricted to the class's
    implicated knobs when the mapping names them and that leaves any)."""
    common = dict(rs[0].params)
    for r in rs[1:]:
        common = {k: v for k, v in common.items() if r.params.get(k) == v}
    implicated = ctx.mapping.get(cls)
    if implicated and "*" not in implicated:
        names = {i.rstrip("?") for i in implicated}
        narrowed = {k: v for k, v in common.items() if k in names}
        common = narrowed or common
    return common


def _learned_rule(ctx: Context, cls: str, rs: Sequence[records.TrialRecord]) -> Any:
    """The failure rule this study learned from these trials (its evidence names one of them), or None."""
    numbers = {r.number for r in rs}
    return next((rule for rule in ctx.rules if rule.failure_class == cls and any(
        e.get("sweep") == ctx.study and e.get("trial_number") in numbers for e in rule.evidence)), None)


def _requestioned(r: records.TrialRecord) -> str:
    """What a re-question probe asked again: ``rule 3``, ``shipped knowledge x, y``."""
    asked = (r.probe or {}).get(records.A_REQUESTION) or {}
    what = [f"rule {i}" for i in asked.get("rules") or []]
    if asked.get("entries"):
        what.append("shipped knowledge " + ", ".join(str(e) for e in asked["entries"]))
    return "; ".join(what)


def _trials_text(rs: Sequence[records.TrialRecord]) -> str:
    """The failing trials of one class: ``t7, t9``, and for each re-question probe among them
    ``re-questioned by a probe (t5, of rule 3): it still fails`` (a probe-only launch of a known
    dead end, outside the trial budget), or ``... no answer, the rule stands`` for a probe that failed
    for a node's or passing reason (:func:`sweeps.store.records.requestion_unanswered`)."""
    full = [r for r in rs if not r.requestion]
    parts = [trials(r.number for r in full)] if full else []
    for r in rs:
        if r.requestion:
            asked = _requestioned(r)
            parts.append(f"re-questioned by a probe (t{r.number}" + (f", of {asked}" if asked else "")
                         + "; one probe-only launch, outside the trial budget): "
                         + ("no answer, the rule stands" if records.requestion_unanswered(r.status, r.failure_kind)
                            else "it still fails"))
    return "; ".join(parts)


def failure_lines(ctx: Context, recs: Sequence[records.TrialRecord]) -> tuple[list[str], set[str]]:
    """(one entry per failure class of launched trials, most frequent first; the classes seen)."""
    out: list[str] = []
    by_class: dict[str, list[records.TrialRecord]] = defaultdict(list)
    for r in recs:
        if r.status == "failed" and r.duplicate_of is None:
            by_class[r.failure_class or "unknown"].append(r)
    skipped_by_class = Counter(r.failure_class for r in recs if r.status == "skipped" and r.duplicate_of is None
                               and r.failure_class)
    for cls, rs in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        kind = rs[0].failure_kind or "?"
        phase = Counter(r.phase for r in rs).most_common(1)[0][0]
        sig, how = next((x for x in (decisive_evidence(r) for r in rs) if x[0]), ("", ""))
        skipped = skipped_by_class.get(cls, 0)
        rule = _learned_rule(ctx, cls, rs)  # what was learned, else what the failing trials share
        when = cfg(rule.knobs if rule is not None else _shared_knobs(ctx, cls, rs)) or "any config"
        out.append(f"- **{cls}** ({kind}, {phase}) when {when}" + (f" (rule {rule.id})" if rule is not None else "")
                   + f": {_trials_text(rs)}"
                   + (f"; {skipped} later proposal(s) skipped without GPU time" if skipped else ""))
        if sig:
            out.append(f"  - decisive line ({how}): {code(sig)}")
    return out, set(by_class)


def degraded_lines(recs: Sequence[records.TrialRecord], obj: Objective | None = None) -> list[str]:
    """One entry per allreduce level whose server silently fell back to NCCL (with the best
    objective value measured, default decode_tok_s: NCCL's, never credited to the level)."""
    obj = obj or Objective()
    out: list[str] = []
    degraded: dict[Any, list[records.TrialRecord]] = defaultdict(list)
    for r in recs:
        if r.status == "ok" and not records.counts_for_level(r) and r.duplicate_of is None:
            degraded[r.params.get("allreduce")].append(r)
    for level, rs in degraded.items():
        skipped = sum(1 for r in recs if r.status == "skipped" and r.failure_class == records.DEGRADED
                      and r.params.get("allreduce") == level)
        line = next((x for x in (degraded_line(r) for r in rs) if x), None)
        bv = measure.best_value([measure.value_of(r, obj) for r in rs], obj)
        measured = f"; measured {measure.value_text(bv, obj)} is NCCL's" if bv is not None else ""
        out.append(f"- **allreduce={level} is not what runs** ({records.DEGRADED}): the server silently fell back to NCCL "
                   f"({trials(r.number for r in rs)}{measured}, "
                   f"never credited to {level})" + (f"; {skipped} later proposal(s) skipped" if skipped else ""))
        if line:
            shown, how = quoted(line)
            out.append(f"  - decisive line ({how}): {code(shown)}")
    return out


def speculative_lines(recs: Sequence[records.TrialRecord], base: float | None, obj: Objective | None = None,
                      conf: dict[str, Any] | None = None) -> list[str]:
    """An entry when every speculative config that ran was worse than the baseline on the
    objective (default decode_tok_s), with its best trial's break-even acceptance
    (:mod:`sweeps.publish.findings.break_even`)."""
    obj = obj or Objective()
    spec_ok = [r for r in recs if measure.value_of(r, obj) is not None and r.duplicate_of is None
               and r.params.get("speculative") not in (None, "none") and records.counts_for_level(r)]
    if not (base and spec_ok and all(obj.better(base, measure.value_of(r, obj)) for r in spec_ok)):
        return []
    b = obj.best(spec_ok, lambda r: measure.value_of(r, obj))
    v = measure.value_of(b, obj)
    acc = [r.metrics.get("accept_length") for r in spec_ok if r.metrics.get("accept_length")]
    if not acc:
        return [f"- **speculative decoding never beat the baseline**: best {measure.value_text(v, obj)} in t{b.number}"]
    return [f"- **speculative decoding never beat the baseline** (spec_decode_no_speedup): best "
            f"{measure.value_text(v, obj)} = {obj.ratio(v, base):.2f}x in t{b.number} ({cfg(b.params)}); "
            f"{len(spec_ok)} trials, acceptance length {min(acc):.2f}–{max(acc):.2f}; "
            + _break_even_text(recs, b, conf, obj)]


def _break_even_text(recs: Sequence[records.TrialRecord], b: records.TrialRecord, conf: dict[str, Any] | None,
                     obj: Objective) -> str:
    base_ms = baseline_ms_per_token(recs, conf, obj)
    be = break_even(b, base_ms) if base_ms else None
    if be is None:
        return (f"ITL p99 {fmt(b.metrics.get('itl_ms_p99'))} ms vs p50 {fmt(b.metrics.get('itl_ms_p50'))} ms "
                "(each verify cycle costs far more than one plain step)")
    return (f"its verify cycle takes {fmt(be.cycle_ms)} ms against {fmt(be.base_ms)} ms per plain token, so it needs "
            f"acceptance {fmt(be.needed, 2)} and measured {fmt(be.accept, 2)} (see the break-even section)")


def mismatch_lines(conf: dict[str, Any] | None) -> list[str]:
    """One entry per confirmed config whose greedy output differs from the baseline's."""
    out: list[str] = []
    for e in (conf or {}).get("entries", []):
        if e.get("tokens_match") is False:
            out.append(f"- **t{e['trial']} changes the output** (output_mismatch): greedy token ids differ from the "
                       f"baseline's for the same prompts ({e.get('mismatch_detail', '')}); it cannot win however fast.")
    return out


def earlier_rule_lines(ctx: Context, seen_classes: set[str]) -> list[str]:
    """Rules learned in earlier sweeps on this environment that this sweep did not hit itself."""
    out: list[str] = []
    older = [rule for rule in ctx.rules if rule.failure_class not in seen_classes]
    for rule in older[:20]:
        ev = ", ".join(f"{e.get('sweep')}#t{e.get('trial_number')}" for e in rule.evidence[:5])
        out.append(f"- {rule.failure_class} when {cfg(rule.knobs) or 'any config'} (rule {rule.id}, learned earlier: {ev}); "
                   f"signature (normalized; the raw line is in that sweep's trial log): {code(rule.signature[:200])}")
    return out


def retired_lines(recs: Sequence[records.TrialRecord]) -> list[str]:
    """One entry per re-question probe of this study that passed and so retired its rules and
    shipped entries (``probe.retired``, :mod:`sweeps.search.probes`), with the probe's trial,
    startup time (s) and GPU-seconds, whatever later trials measured at that level."""
    out: list[str] = []
    for r in recs:
        p = r.probe or {}
        q = p.get(records.A_REQUESTION) or {}
        retired = p.get("retired") or ([f"rule {i}" for i in q.get("rules") or []] + list(q.get("entries") or [])
                                       if p.get("finding") else [])
        if r.status != "ok" or not retired:
            continue
        out.append(f"- **retired: {', '.join(retired)}** (dead end no longer reproduces): t{r.number}'s re-question "
                   f"probe reached ready in {fmt(float(p.get('startup_s') or 0.0), 0)} s, "
                   f"{fmt(float(p.get('gpu_s') or 0.0), 0)} GPU-s")
    return out


def dead_ends_section(ctx: Context, recs: Sequence[records.TrialRecord], base: float | None) -> list[str]:
    """The "Dead ends" section (or "None found yet.")."""
    failures, seen = failure_lines(ctx, recs)
    out = failures + degraded_lines(recs, ctx.objective) + speculative_lines(recs, base, ctx.objective, ctx.confirmation)
    out += mismatch_lines(ctx.confirmation)
    out += earlier_rule_lines(ctx, seen)
    out += retired_lines(recs)
    return ["### Dead ends", "", *(out or ["None found yet."]), ""]
