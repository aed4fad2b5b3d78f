"""The baseline section: this sweep's baseline, its history across the sweeps of one
document, and drift (82.0 -> 89.5 tok/s is called out with what changed).

Every value is the sweep's objective; a history entry remembers which objective it
measured (entries without one are ``decode_tok_s``, the only objective of older
documents), and drift compares entries of the same objective only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.findings.best import Measured, baseline_measured, best_of, measured
from sweeps.publish.findings.context import Context, fp_hash
from sweeps.publish.findings.text import cfg, fmt, row, trials
from sweeps.store import records as trial_records

# A baseline that moved by more than this fraction between sweeps is called out. Source:
# the emulated node's run-to-run noise is 1.5 % (conf/backend/emulated.yaml, real nodes
# 1-2 %); 3 % is two standard deviations of one measurement.
DRIFT_THRESHOLD = 0.03
LEGACY_OBJECTIVE = measure.DECODE  # what a data-block entry without "objective" measured


def entry_value(e: Mapping[str, Any], obj: Objective) -> float | None:
    """The value of a data-block baseline entry when it measured ``obj`` (else None)."""
    if e.get("objective", LEGACY_OBJECTIVE) != obj.name:
        return None
    v = e.get("value", e.get("tok_s"))
    return float(v) if isinstance(v, int | float) else None


def baseline_entry(ctx: Context, records: Sequence[trial_records.TrialRecord]) -> dict[str, Any] | None:
    """This sweep's baseline as a data-block entry (study, date, objective, value — the
    confirmation's mean where it re-measured the baseline, else the sweep's measurement;
    also as ``tok_s`` when the objective is decode_tok_s —, ``confirmed_runs`` (0: single
    measurement), config, trials, fingerprint and its hash), or None when the baseline has
    not run ok yet."""
    obj = ctx.objective
    bm = baseline_measured(records, ctx.confirmation, obj)
    val = bm.value
    if val is None:
        return None
    runs = [r for r in records if r.is_baseline and measure.value_of(r, obj) is not None]
    config = runs[0].params if runs else dict(ctx.baseline_config)
    e = {"study": ctx.study, "date": ctx.now, "objective": obj.name, "value": round(val, 3), "config": config,
         "trials": [r.number for r in runs], "fingerprint": dict(ctx.fingerprint),
         "fingerprint_hash": fp_hash(ctx.fingerprint), "confirmed_runs": bm.n}
    if obj.name == LEGACY_OBJECTIVE:
        e["tok_s"] = e["value"]
    return e


def baseline_history(old: Mapping[str, Any], cur: dict[str, Any] | None, study: str) -> list[dict[str, Any]]:
    """Earlier sweeps' baselines (from the old data block, whatever their objective) plus
    this sweep's, oldest first; this study's earlier entry is replaced by ``cur``."""
    hist = [dict(e) for e in (old.get("baselines") or []) if isinstance(e, dict) and ("tok_s" in e or "value" in e)]
    if cur is None:
        return hist
    return [e for e in hist if e.get("study") != study] + [cur]


def _changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def baseline_drift(hist: Sequence[Mapping[str, Any]], study: str, obj: Objective | None = None) -> dict[str, Any] | None:
    """Compare this study's baseline with the most recent earlier sweep's that measured
    the same objective (default decode_tok_s).

    Returns:
        None without both, else ``{"from", "to" (the objective's unit), "change"
        (fraction), "moved" (bool: beyond :data:`DRIFT_THRESHOLD` or config/environment
        changed), "since" (study), "date", "config_changes" [(knob, old, new)],
        "env_changes" [(key, old, new)]}``.
    """
    obj = obj or Objective()
    same = [e for e in hist if entry_value(e, obj) is not None]
    cur = next((e for e in reversed(same) if e.get("study") == study), None)
    prev = next((e for e in reversed(same) if e.get("study") != study), None)
    if cur is None or prev is None or not entry_value(prev, obj):
        return None
    a, b = entry_value(prev, obj), entry_value(cur, obj)
    cfg_changes = _changes(prev.get("config") or {}, cur.get("config") or {})
    env_changes = _changes(prev.get("fingerprint") or {}, cur.get("fingerprint") or {})
    change = b / a - 1.0
    return {"from": a, "to": b, "change": change, "since": prev.get("study"), "date": prev.get("date"),
            "moved": abs(change) > DRIFT_THRESHOLD or bool(cfg_changes) or bool(env_changes),
            "config_changes": cfg_changes, "env_changes": env_changes, "prev": dict(prev), "cur": dict(cur)}


def _how(e: Mapping[str, Any] | None) -> str:
    """How a data-block baseline entry was measured (entries without ``confirmed_runs``
    predate confirmation: a single measurement)."""
    n = int((e or {}).get("confirmed_runs") or 0)
    return Measured(0.0, n=n).how()


def _measured_note(drift: Mapping[str, Any]) -> str:
    a, b = _how(drift.get("prev")), _how(drift.get("cur"))
    return f"both {a}s" if a == b == "single measurement" else f"{fmt(drift['from'])}: {a}; {fmt(drift['to'])}: {b}"


def _drift_lines(drift: Mapping[str, Any] | None, obj: Objective) -> list[str]:
    if not drift:
        return []
    a, b = fmt(drift["from"]), measure.value_text(drift["to"], obj)
    if not drift["moved"]:
        return ["", f"Baseline unchanged within ±{DRIFT_THRESHOLD * 100:.0f} % since sweep `{drift['since']}` "
                    f"({a} -> {b}) — {_measured_note(drift)}."]
    why = []
    if drift["config_changes"]:
        why.append("baseline config changed: " + ", ".join(f"{k} {x} -> {y}" for k, x, y in drift["config_changes"]))
    if drift["env_changes"]:
        why.append("environment changed: " + ", ".join(f"{k} {x} -> {y}" for k, x, y in drift["env_changes"]))
    if not why:
        why.append("same config and environment: node state or run-to-run variation")
    return ["", f"**Baseline moved: {a} -> {b} ({drift['change'] * 100:+.1f} %) "
                f"since sweep `{drift['since']}` ({drift['date']}).** " + "; ".join(why)
                + f" (measured: {_measured_note(drift)})."]


def _plain(r: trial_records.TrialRecord) -> bool:
    return r.params.get("speculative", "none") in ("none", None)


def plain_reference(ctx: Context, recs: Sequence[trial_records.TrialRecord]) -> tuple[trial_records.TrialRecord | None, bool]:
    """(the plain-decoding config the findings propose as the reference, whether it is the
    confirmation's winner). The confirmation's winner when it decodes plainly: the race's pick
    (its tie-break chooses within a tie group), never second-guessed by a tie-group member's
    higher mean or the best single measurement. Otherwise the best plain config judged by
    :func:`~sweeps.publish.findings.best.measured`. ``(None, False)`` without a plain config."""
    conf = ctx.confirmation or {}
    if conf.get("winner") is not None:
        from sweeps.search.confirm import config_record

        w = config_record(list(recs), conf, conf["winner"])
        if w is not None and _plain(w):
            return w, True
    plain = [r for r in recs if r.duplicate_of is None and _plain(r)]
    return best_of(plain, ctx.confirmation, ctx.objective), False


def _plain_reference_lines(ctx: Context, recs: Sequence[trial_records.TrialRecord], base: float | None) -> list[str]:
    """A plain-decoding config that beat the declared baseline by more than the noise: the
    reference speculative configs must beat (:func:`plain_reference`: the confirmed winner when
    it decodes plainly). Judged on confirmed means where confirmation re-measured a config
    (:func:`~sweeps.publish.findings.best.measured`), so a lucky draw that did not hold up is
    never quoted."""
    obj = ctx.objective
    bp, is_winner = plain_reference(ctx, recs)
    if not base or bp is None or bp.is_baseline:
        return []
    m = measured(bp, ctx.confirmation, obj)
    v = m.value
    if v is None or not obj.ratio(v, base) > 1 + DRIFT_THRESHOLD:
        return []
    diff = [(k, ctx.baseline_config.get(k), x) for k, x in bp.params.items() if ctx.baseline_config.get(k) != x]
    if not diff:  # the baseline's own config (a race-added config equal to it): nothing to adopt
        return []
    change = ", ".join(f"{k} {a} -> {b}" for k, a, b in diff)
    ties = [int(t) for t in ((ctx.confirmation or {}).get("tie_group") or [])]
    which = (f"t{bp.number}, the confirmed winner" + (f", picked in its tie group {trials(ties)}" if len(ties) > 1 else "")
             if is_winner else f"t{bp.number}")
    if not m.confirmed:  # one lucky draw is not a reference to adopt
        return ["", f"A plain-decoding config measured {measure.value_text(v, obj)} once ({obj.ratio(v, base):.2f}x the "
                    f"baseline; single measurement, not confirmed) with {change} (t{bp.number}). It is not "
                    "advised as `sweep.baseline`: confirm it first (a larger `sweep.confirm.top_k`)."]
    return ["", f"**The plain-decoding reference moved in this sweep: {fmt(base)} -> {measure.value_text(v, obj)} "
                f"({obj.ratio(v, base):.2f}x; {m.how()}) with {change}"
                + f" ({which}).** Speculative configs must beat this, not only the declared baseline; "
                "consider it as `sweep.baseline` for the next sweep."]


def baseline_section(ctx: Context, recs: Sequence[trial_records.TrialRecord], base: float | None,
                     cur_entry: Mapping[str, Any] | None, hist: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "Baseline" section: the measured baseline (or why it is missing), drift since
    the previous sweep of the document, a plain config that beat it, the history table
    (entries of the same objective)."""
    obj = ctx.objective
    L = ["### Baseline", ""]
    if base is None:
        L.append(f"Not measured yet in this sweep (declared: {cfg(ctx.baseline_config)}). Speedups are computed "
                 "against the baseline measured in the same sweep.")
    else:
        b_trials = [r.number for r in recs if r.is_baseline and r.status == "ok"]
        bm = baseline_measured(recs, ctx.confirmation, obj)
        how = (f"{bm.how()}; the sweep's own measurement: {measure.value_text(measure.baseline_value(recs, obj), obj)}, "
               f"{trials(b_trials)}" if bm.confirmed else
               f"measured in this sweep, {trials(b_trials)}; "
               + ("single measurement" if len(b_trials) == 1 else f"median of {len(b_trials)} runs"))
        L.append(f"**{measure.value_text(base, obj)}** — {cfg(cur_entry['config'] if cur_entry else ctx.baseline_config)} "
                 f"({how}). Every speedup below is against this number.")
    failed_base = [r for r in recs if r.is_baseline and r.status in ("failed", "infra_error")]
    if base is None and failed_base:
        L.append(f"The baseline did not run: {failed_base[-1].failure_class} ({trials(r.number for r in failed_base)}).")
    L += _drift_lines(baseline_drift(hist, ctx.study, obj), obj)
    L += _plain_reference_lines(ctx, recs, base)
    same = [e for e in hist if entry_value(e, obj) is not None]
    if len(same) > 1:
        L += ["", f"| sweep | date | baseline {measure.column(obj)} | config | fingerprint |", "|---|---|---|---|---|"]
        for e in same[-10:]:
            L.append(row([e.get("study"), e.get("date"), fmt(entry_value(e, obj)), cfg(e.get("config") or {}),
                          e.get("fingerprint_hash", "")]))
    L.append("")
    return L
