"""The "What ran and lost" section: one line per knob level that was launched and did
not win, with how far its best trial is from the best config and from the baseline (in
the objective's unit and as a ratio) and why, where the records say: the level's failures
(class), a silent path fallback, speculative decoding's break-even, the metrics that moved
(ITL, TTFT) and the server's own log line naming the level (``env: NCCL_PROTO=Simple``).

Conditional knobs (e.g. ``eagle_num_steps`` only with ``speculative=eagle3``) are compared
with the best trial where they are active: comparing a draft shape with a plain config
would only repeat that speculation lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.findings.baseline import DRIFT_THRESHOLD
from sweeps.publish.findings.best import Measured, best_of, measured
from sweeps.publish.findings.break_even import baseline_ms_per_token, break_even
from sweeps.publish.findings.context import Context
from sweeps.publish.findings.evidence import path_line
from sweeps.publish.findings.text import code, fmt, trials
from sweeps.publish.importance import METHOD, importances, launched_rows
from sweeps.store import records

MAX_LEVELS = 60  # lines listed (a space of many knobs); the rest are counted
GATE = "speculative"  # levels are compared within the best's decoding mode where they ran in it


def _knobs(ctx: Context, recs: Sequence[records.TrialRecord]) -> list[tuple[str, dict[str, list[Any]]]]:
    """(knob, its ``when`` conditions) for every knob: the space's order, else the records'."""
    if ctx.space is not None:
        return [(p.name, dict(p.when or {})) for p in ctx.space.params]
    return [(k, {}) for k in dict.fromkeys(k for r in recs for k in r.params)]


def _delta(v: float, ref: float | None, obj: Objective, what: str) -> str:
    if ref is None or not ref:
        return ""
    ratio = measure.ratio(v, ref, obj)
    return f"{fmt(ratio, 2)}× {what} ({v - ref:+.1f} {measure.unit(obj.name)})".replace(" )", ")")


def _metric_reason(r: records.TrialRecord, ref: records.TrialRecord | None) -> str:
    """The per-token decode time and TTFT that got worse (longer) than the reference trial's:
    a better number is never given as the reason a level lost."""
    if ref is None:
        return ""
    parts = []
    for key, name in (("itl_ms_p50", "ITL p50"), ("ttft_ms_p50", "TTFT p50")):
        a, b = r.metrics.get(key), ref.metrics.get(key)
        if a and b and a / b - 1 > DRIFT_THRESHOLD:
            parts.append(f"{name} {fmt(a)} ms vs {fmt(b)} ms in t{ref.number}")
    return "; ".join(parts)


_UNSET = ("default", "none", "null", "false", "")


def implicated(mapping: Mapping[str, list[str]], cls: str | None, knob: str, level: Any) -> bool:
    """Whether failure class ``cls`` implicates ``knob=level`` (``conf/failure_knobs.yaml``:
    ``knob`` always, ``knob?`` when set to a non-default level, ``*`` or a class not listed:
    the full config)."""
    items = mapping.get(cls or "") or []
    if not items or "*" in items or knob in items:
        return True
    return f"{knob}?" in items and str(level).lower() not in _UNSET


def _reasons(mapping: Mapping[str, list[str]], knob: str, level: Any, runs: Sequence[records.TrialRecord],
             top: records.TrialRecord | None, ref: records.TrialRecord | None, base_ms: float | None) -> list[str]:
    why: list[str] = []
    failed = [r for r in runs if r.status == "failed"]
    mine = [r for r in failed if implicated(mapping, r.failure_class, knob, level)]
    failed = mine if (mine or top is not None) else failed
    if failed:
        c = Counter(r.failure_class or "unknown" for r in failed)
        why.append(f"{len(failed)} of {len(runs)} launches failed: "
                   + ", ".join(f"{k} ({trials(x.number for x in failed if (x.failure_class or 'unknown') == k)})"
                               for k, _ in c.most_common()))
    # a re-question trial is its probe only (sweeps/search/probes.py): it started, measured nothing
    requestioned = [r for r in runs if r.status == "ok" and (r.probe or {}).get("finding")]
    for r in requestioned:
        why.append(f"only a re-question probe ran it (t{r.number}): {(r.probe or {}).get('finding')}")
    if knob == "allreduce" and any(r.status == "ok" and not records.counts_for_level(r) and r not in requestioned
                                   for r in runs):
        why.append(f"the server fell back to NCCL ({records.DEGRADED}): what ran was not {knob}={level}")
    if top is not None:
        if base_ms and top.params.get("speculative") not in (None, "none") and (b := break_even(top, base_ms)):
            why.append(f"acceptance {fmt(b.accept, 2)} vs {fmt(b.needed, 2)} needed to break even")
        if m := _metric_reason(top, ref):
            why.append(m)
        tags = [t for t in top.perf_tags if t != records.DEGRADED]
        if tags:
            why.append("perf tags: " + ", ".join(tags))
        line = path_line(top, knob, level)
        if line:  # evidence the level took effect (not a reason it lost): said as such
            why.append(f"the server log shows the level in effect: {code(line)}")
    return why


def _matched(top: records.TrialRecord, ref: records.TrialRecord | None, knob: str) -> str:
    if ref is None:
        return ""
    diff = [k for k in set(top.params) | set(ref.params) if top.params.get(k) != ref.params.get(k)]
    return " (same config otherwise: a matched comparison)" if diff == [knob] else ""


def _same_mode(runs: Sequence[records.TrialRecord], ref: records.TrialRecord | None, knob: str
               ) -> tuple[list[records.TrialRecord], str]:
    """(the runs in the reference's decoding mode (``speculative``), a note when there are
    none): a level that only ran with speculation lost what speculation lost."""
    mode = ref.params.get(GATE) if ref is not None else None
    if knob == GATE or mode is None:
        return list(runs), ""
    same = [r for r in runs if r.params.get(GATE) == mode]
    others = sorted({str(r.params.get(GATE)) for r in runs} - {str(mode)})
    return same, (f" — ran only with {GATE}={'/'.join(others)}: the gap is mostly {GATE}'s (see its line)"
                  if not same and others else "")


def _level_top(runs: Sequence[records.TrialRecord], conf: Any, obj: Objective) -> records.TrialRecord | None:
    """The level's best trial, a confirmed one first: a confirmation's mean over fresh repeats
    outranks a single sweep measurement of the same level, however high the single draw."""
    confirmed = [r for r in runs if measured(r, conf, obj).confirmed]
    return best_of(confirmed, conf, obj) or best_of(runs, conf, obj)


def _tied(ctx: Context, runs: Sequence[records.TrialRecord], ref_m: Measured, ref: records.TrialRecord | None,
          knob: str) -> tuple[records.TrialRecord, float] | None:
    """(the level's best trial, its value) when it is within run-to-run noise of the reference or
    better: a tie, not a loss; None otherwise."""
    obj, conf = ctx.objective, ctx.confirmation
    same, _ = _same_mode(runs, ref, knob)
    top = _level_top(same, conf, obj) or _level_top(runs, conf, obj)
    if top is None or not ref_m.value:
        return None
    v = measured(top, conf, obj).value
    return (top, v) if v is not None and measure.ratio(v, ref_m.value, obj) > 1 - DRIFT_THRESHOLD else None


def _level_line(ctx: Context, knob: str, level: Any, runs: Sequence[records.TrialRecord], ref_m: Measured,
                ref: records.TrialRecord | None, base: float | None, base_ms: float | None, scope: str) -> str:
    obj, conf = ctx.objective, ctx.confirmation
    same, note = _same_mode(runs, ref, knob)
    top = _level_top(same, conf, obj) or _level_top(runs, conf, obj)
    head = f"- `{knob}={level}`"
    if top is None:
        txt = f"{head}: no credited result in {trials(r.number for r in runs)}"
    else:
        m = measured(top, conf, obj)
        v = m.value
        vs = [x for x in (_delta(v, ref_m.value, obj, scope), _delta(v, base, obj, "the baseline")) if x]
        txt = (f"{head}: best {measure.value_text(v, obj)} (t{top.number}, {m.how()}) = " + ", ".join(vs)
               + _matched(top, ref, knob) + (note if top not in same else ""))
    why = _reasons(ctx.mapping, knob, level, runs, top, ref, base_ms)
    return txt + (". Why: " + "; ".join(why) if why else "")


def _importance_lines(recs: Sequence[records.TrialRecord], obj: Objective) -> list[str]:
    """What matters, in one line: each knob's share of the objective's variance (``sweeps.publish.importance``)."""
    imp = importances(recs, obj)
    shown = [f"{k} {v * 100:.0f} %" for k, v in imp.items() if v >= 0.005][:8]
    if not shown:
        return []
    n = len(launched_rows(recs, obj))
    return [f"Share of the {measure.wording(obj)} variance each knob explains ({METHOD}, n={n}): " + ", ".join(shown)
            + " (the rest under 0.5 %).", ""]


def losers_section(ctx: Context, recs: Sequence[records.TrialRecord], best: records.TrialRecord | None,
                   base: float | None) -> list[str]:
    """The "What ran and lost" section (empty before a best config exists)."""
    obj = ctx.objective
    if best is None:
        return []
    launched = [r for r in recs if r.launched]
    base_ms = baseline_ms_per_token(recs, ctx.confirmation, obj)
    best_m = measured(best, ctx.confirmation, obj)
    lines: list[str] = []
    ties: dict[int | None, list[str]] = {}  # by the trial they tie with: the best, or the best where a knob applies
    refs: dict[int | None, Measured] = {}
    for knob, when in _knobs(ctx, recs):
        active = [r for r in launched if knob in r.params]
        if when and not all(best.params.get(k) in v for k, v in when.items()):
            ref = best_of(active, ctx.confirmation, obj)  # conditional: the best where the knob is active
            ref_m, scope = (measured(ref, ctx.confirmation, obj) if ref else Measured(None)), "the best where it applies"
        else:
            ref, ref_m, scope = best, best_m, "the best"
        win = ref.params.get(knob) if ref is not None else None
        for level in dict.fromkeys(r.params[knob] for r in active):
            if level == win:
                continue
            runs = [r for r in active if r.params[knob] == level]
            tie = _tied(ctx, runs, ref_m, ref, knob)
            if tie is not None:
                key = None if ref is best else (ref.number if ref is not None else None)
                refs.setdefault(key, ref_m)
                ties.setdefault(key, []).append(f"`{knob}={level}` ({measure.value_text(tie[1], obj)}, t{tie[0].number})")
                continue
            lines.append(_level_line(ctx, knob, level, runs, ref_m, ref, base, base_ms, scope))
    # a level within noise of the best did not lose: it is listed once, as a tie; a conditional knob's
    # level is compared with the best config where the knob applies, and says so with that config
    noise = f"within run-to-run noise (±{DRIFT_THRESHOLD * 100:.0f} %)"
    for key, tied in ties.items():
        if key is None:
            lines.append(f"- Not losses: {noise} of the best or better: " + ", ".join(tied))
        else:
            lines.append(f"- Not losses where their knob applies: {noise} of the best such config "
                         f"(t{key}, {measure.value_text(refs[key].value, obj)}) or better: " + ", ".join(tied))
    if not lines:
        return []
    extra = [f"- (+{len(lines) - MAX_LEVELS} more levels)"] if len(lines) > MAX_LEVELS else []
    return ["### What ran and lost", "", *_importance_lines(recs, obj),
            f"Every launched knob level other than the best config's, at its best trial, against the best "
            f"({measure.value_text(best_m.value, obj)}, t{best.number}) and the baseline ({measure.value_text(base, obj)}).", "",
            *lines[:MAX_LEVELS], *extra, ""]

