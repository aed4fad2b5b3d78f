"""The findings sections that are not about the baseline, dead ends or untried configs:
the counts line, environment, best config with its confirmation, the approaches table and
the earlier sweeps of the document. Each returns its markdown lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.findings.best import measured
from sweeps.publish.findings.context import Context, fp_hash
from sweeps.publish.findings.groups import Group, best_in, outcome
from sweeps.publish.findings.text import cfg, code, fmt, row
from sweeps.store import records

MAX_GROUP_ROWS = 40


def counts_line(ctx: Context, recs: Sequence[records.TrialRecord], summary: Any = None) -> str:
    """"Updated ...": trials launched by outcome, answered without GPU time, GPU-hours, running.
    With the study's ``summary`` (:class:`sweeps.publish.summary.StudySummary`) its counts and
    GPU-hours (every launch: confirmations and serving checks too), the console's numbers."""
    n_run = sum(r.state == "RUNNING" for r in recs)
    if summary is not None:
        return (f"Updated {ctx.now}. {summary.counts_text()} {summary.gpu.text()}."
                + (f" **{n_run} trial(s) running.**" if n_run else ""))
    launched = [r for r in recs if r.budgeted]  # re-question probes: not launches of the trial budget
    n_ok = sum(r.status == "ok" for r in launched)
    n_fail = sum(r.status == "failed" for r in launched)
    n_infra = sum(r.status in ("infra_error", "interrupted") for r in launched)
    n_rule = sum(r.status == "skipped" and r.duplicate_of is None for r in recs)
    n_dup = sum(r.duplicate_of is not None for r in recs)
    n_inf = sum(r.status == "infeasible" for r in recs)
    gpu_h = sum(r.timings.get("gpu_s", 0.0) for r in recs) / 3600.0
    return (f"Updated {ctx.now}. {len(launched)} trials launched ({n_ok} ok, {n_fail} failed, {n_infra} infra/interrupted), "
            f"{n_rule + n_dup + n_inf} answered without GPU time ({n_rule} known dead ends, {n_dup} duplicates, "
            f"{n_inf} infeasible); {gpu_h:.2f} GPU-hours"
            + (" on the emulated node (modelled, no real GPU time)." if ctx.emulated else ".")
            + (f" **{n_run} trial(s) running.**" if n_run else ""))


def environment_section(ctx: Context) -> list[str]:
    """The "Environment" section: node, backend, model, fingerprint."""
    node, model, fp = ctx.node, ctx.model, ctx.fingerprint
    L = ["### Environment", "",
         f"- node: `{node.get('name', '?')}` — {node.get('gpus', '?')}× {node.get('gpu_name', '?')} "
         f"(SM {node.get('compute_capability', '?')}, {node.get('interconnect', '?')}); backend `{ctx.backend}`",
         f"- model: `{model.get('name', '?')}` ({model.get('path', '?')})"
         + (f", draft {model['draft_path']}" if model.get("draft_path") else "")]
    if fp:
        L.append("- fingerprint `" + (fp_hash(fp) or "?") + "`: " + ", ".join(f"{k} {v}" for k, v in sorted(fp.items())))
    else:
        L.append("- fingerprint: not collected yet")
    L.append("")
    return L


def confirmation_lines(conf: Mapping[str, Any], obj: Objective | None = None) -> list[str]:
    """The "Confirmation" table: every re-measured config with its mean objective value
    (default decode_tok_s), interval, speedup, token comparison and verdict."""
    obj = obj or Objective()
    lv = conf.get("confidence", 0.95)
    n_derived = len(conf.get("derived") or [])
    entries = conf.get("entries") or []
    # the race also starts with the leader's measured simplifications (sweeps.search.confirm.simplifications)
    n_simpler = 0 if conf.get("top_k") is None else max(
        0, len(entries) - sum(1 for e in entries if e.get("is_baseline")) - int(conf["top_k"])
        - sum(1 for e in entries if e.get("derived_from") is not None))
    simpler = f", {n_simpler} measured config(s) simpler than the leader" if n_simpler else ""
    added = f", and {n_derived} config(s) the race added (see below)," if n_derived else (", " if simpler else "")
    compared = any(e.get("tokens_match") is not None for e in entries if not e.get("is_baseline"))
    tokens = ("greedy output token ids compared with the baseline's for the same prompts." if compared else
              "output token ids not compared: no launch returned any.")
    out = [f"Top {conf.get('top_k')} configs and the baseline{simpler}{added} re-measured {conf.get('repeats')}× each "
           f"(fresh launches; the sweep's own measurement is not reused, so a lucky draw cannot win); "
           f"mean {measure.wording(obj)} with {lv * 100:.0f} % t-intervals; {tokens}", "",
           f"| trial | config | runs | mean {measure.column(obj)} | 95 % CI | speedup (95 % CI) | tokens | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for e in conf.get("entries", []):
        sp = e.get("speedup_mean")
        spci = e.get("speedup_ci") or [None, None]
        tok = "reference" if e.get("is_baseline") else {True: "= baseline", False: "**differ**",
                                                          None: "not compared"}[e.get("tokens_match")]
        out.append(row([
            f"t{e['trial']}" + (" (baseline)" if e.get("is_baseline") else "")
            + (f" (added: t{e['derived_from']}, {e.get('step')})" if e.get("derived_from") is not None else ""),
            e.get("label", cfg(e.get("config", {}))),
            runs_text(int(e.get("n") or 0), int(conf.get("repeats") or 0)), fmt(e.get("mean")),
            f"{fmt(e.get('ci_low'))}–{fmt(e.get('ci_high'))}",
            f"{fmt(sp, 3)} ({fmt(spci[0], 3)}–{fmt(spci[1], 3)})" if sp else "–",
            tok, e.get("verdict", "")]))
    derived = conf.get("derived") or []
    if derived:
        fresh = sum(1 for d in derived if not d.get("in_study"))
        out += ["", f"The race added {len(derived)} config(s) one step simpler than its pick (a knob back to the "
                    f"baseline's value, or a numeric one a level toward it): the pick moves to a simpler config "
                    f"the race cannot separate below it; {fresh} of them no sweep trial had measured (numbered from "
                    f"t{min((int(d['trial']) for d in derived if not d.get('in_study')), default=0)}: their "
                    f"launches are confirmation runs, counted with the confirmation's launches and GPU-hours)."
                if fresh else
                f"The race added {len(derived)} config(s) one step simpler than its pick, all measured in the sweep: "
                f"the pick moves to a simpler config the race cannot separate below it."]
    if conf.get("winner_note"):
        out += ["", conf["winner_note"]]
    return out


def runs_text(n: int, repeats: int) -> str:
    """A confirmation entry's ok runs against the planned ``repeats``: ``3``, ``5 (3 + 2 the race
    added)`` (the race re-measures configs it cannot yet separate), ``2 of 3`` (a repeat failed)."""
    if n > repeats:
        return f"{n} ({repeats} + {n - repeats} the race added)"
    return str(n) if n == repeats else f"{n} of {repeats}"


def _confirmed_line(winner_entry: Mapping[str, Any] | None, conf: Mapping[str, Any] | None, obj: Objective) -> str:
    if winner_entry:
        return (f"Confirmed: {measure.value_text(winner_entry.get('mean'), obj)} mean over {winner_entry.get('n')} fresh runs "
                f"(95 % CI {fmt(winner_entry.get('ci_low'))}–{fmt(winner_entry.get('ci_high'))}); greedy output "
                + {True: "identical to the baseline's.", False: "DIFFERS from the baseline's.",
                   None: "not compared (no token ids)."}[winner_entry.get("tokens_match")])
    if conf and conf.get("winner") is None:
        return "**Not confirmed:** " + str(conf.get("winner_note") or "no config passed the confirmation.")
    return "Measured once in the sweep; not yet confirmed with repeats."


def _metrics_line(m: Mapping[str, float], obj: Objective) -> str:
    """The best config's other metrics (decode tok/s among them when it is not the objective); a
    config no sweep trial measured (one the confirmation's race added) has its objective only."""
    if not any(m.get(k) is not None for k in ("ttft_ms_p50", "itl_ms_p50", "itl_ms_p99")):
        return ("(TTFT and ITL not recorded for this config: its runs are the confirmation's, which records "
                f"{measure.wording(obj)} only; the serving check below gives its p99 latencies when it ran)")
    decode = "" if obj.name == measure.DECODE else f"decode {fmt(m.get('decode_tok_s'))} tok/s, "
    return (f"({decode}TTFT p50 {fmt(m.get('ttft_ms_p50'), 0)} ms, ITL p50 {fmt(m.get('itl_ms_p50'))} ms, "
            f"ITL p99 {fmt(m.get('itl_ms_p99'))} ms, acceptance length {fmt(m.get('accept_length'), 2)})")


def best_section(best: records.TrialRecord | None, base: float | None, conf: Mapping[str, Any] | None,
                 winner_entry: Mapping[str, Any] | None, obj: Objective | None = None,
                 ctx: Context | None = None, summary: Any = None) -> list[str]:
    """The "Best config" section (the confirmed winner where confirmation ran, quoted at its
    confirmed mean; best on the objective, default decode_tok_s, otherwise), its tie group and
    serving check (from the study's ``summary``), its deployable command (``ctx``'s backend; the
    recorded launch command without ``ctx``) and the "Confirmation" table."""
    obj = obj or Objective()
    L = ["### Best config", ""]
    m = measured(best, conf, obj) if best is not None else None
    v = m.value if m else None
    if best is None or v is None:
        L.append("No successful trial yet.")
    else:
        sp = obj.ratio(v, base) if base and v else None
        L.append(f"**t{best.number}: {measure.value_text(v, obj)}**"
                 + (f", **{sp:.2f}x** {measure.versus_baseline(obj)}" if sp else "") + f" — {cfg(best.params)}"
                 + (ctx.where() if ctx else ""))
        L.append(_metrics_line(best.metrics, obj))
        added = next((d for d in (conf or {}).get("derived") or []
                      if int(d.get("trial", -1)) == best.number and not d.get("in_study")), None)
        if not m.confirmed:
            single = ""
        elif added is not None:  # no sweep trial measured it: every run of it is a confirmation run
            single = (f" No sweep trial measured t{best.number}: the confirmation's race added it, one step simpler "
                      f"than t{added.get('from')} ({added.get('step')}).")
        else:
            single = (f" The sweep's single measurement of t{best.number} was "
                      f"{measure.value_text(measure.value_of(best, obj), obj)}.")
        L.append(_confirmed_line(winner_entry, conf, obj) + single)
        if summary is not None:
            extra = [x for x in (summary.tie_text(), summary.serving_text()) if x]
            L += ["", *(f"- {x[0].upper()}{x[1:]}" for x in extra)] if extra else []
        cmd, what = (ctx.deploy_command(best.params, best.launch_command) if ctx
                     else (best.launch_command or "(launch command not recorded)", "recorded launch command"))
        L += ["", f"To deploy it ({what}):", "", "```bash", cmd, "```"]
        if best.launch_command and best.launch_command != cmd:
            L += ["", f"What the sweep launched{ctx.where() if ctx else ''}: {code(best.launch_command)}"]
    L.append("")
    if conf:
        L += ["### Confirmation", ""] + confirmation_lines(conf, obj) + [""]
    return L


def approaches_section(gk: list[str], groups: dict[tuple, Group], base: float | None,
                       obj: Objective | None = None, conf: Mapping[str, Any] | None = None,
                       winner: records.TrialRecord | None = None) -> list[str]:
    """The "Approaches" table: one row per combination of the grouping knobs (only those
    launched or skipped when there are more than :data:`MAX_GROUP_ROWS`), with the best
    objective value (default decode_tok_s; a sweep measurement, followed by its confirmed
    mean when ``conf`` re-measured that trial) and its ratio to the baseline (of the confirmed
    mean when there is one: the number the headline quotes, not the single draw). The approach
    of the confirmed ``winner`` shows the winner when its confirmed mean is the better one (a
    config the confirmation's race added has no sweep trial in any group)."""
    obj = obj or Objective()
    if not gk:
        return []
    L = [f"### Approaches ({' × '.join(gk)})", "",
         "| " + " | ".join(gk) + f" | best {measure.column(obj)} | speedup | launched | skipped | outcome |",
         "|" + "---|" * (len(gk) + 5)]
    rows = list(groups.values())
    if len(rows) > MAX_GROUP_ROWS:
        rows = [g for g in rows if g.launched or g.probes or g.skipped]
    for g in rows:
        bv, bt = best_in(g, obj)
        cm = measured(next(r for r in g.ok if r.number == bt), conf, obj) if bv is not None else None
        best_txt = f"{fmt(bv)} (t{bt})" + (f", confirmed {fmt(cm.value)}" if cm and cm.confirmed else "")
        sv = cm.value if cm and cm.confirmed else bv
        wm = measured(winner, conf, obj) if winner is not None and winner.number != bt else None
        if (wm is not None and wm.confirmed and wm.value is not None
                and tuple(winner.params.get(k) for k in gk) == tuple(g.key)
                and (sv is None or not (cm and cm.confirmed) or obj.better(wm.value, sv))):
            best_txt = f"{fmt(wm.value)} (t{winner.number}, the winner, confirmed)" + (
                f"; best single draw {fmt(bv)} (t{bt})" + (f", confirmed {fmt(cm.value)}" if cm and cm.confirmed else "")
                if bv is not None else "")
            sv, bv = wm.value, wm.value
        L.append(row([*g.key, best_txt if bv is not None else "–",
                      f"{sp:.2f}x" if (sp := measure.ratio(sv, base, obj)) is not None else "–",
                      f"{g.launched}" + (f" (+{g.probes} re-question probe{'s' if g.probes != 1 else ''})"
                                         if g.probes else ""), len(g.skipped), outcome(g, base, obj, sv)]))
    L.append("")
    return L


def _sweep_value(e: Mapping[str, Any], which: str, obj: Objective) -> str:
    """An earlier sweep's ``best``/``baseline`` value; suffixed with its metric when that
    sweep ranked by another objective (entries without one measured decode_tok_s)."""
    v = e.get(f"{which}_value", e.get(f"{which}_tok_s"))
    theirs = e.get("objective", measure.DECODE)
    v = v if isinstance(v, int | float) else None
    return fmt(v) if theirs == obj.name else f"{fmt(v)} ({theirs})"


def earlier_sweeps_section(prev: Sequence[Mapping[str, Any]], obj: Objective | None = None) -> list[str]:
    """The "Earlier sweeps in this document" table (empty without earlier sweeps)."""
    obj = obj or Objective()
    if not prev:
        return []
    col = measure.column(obj)
    L = ["### Earlier sweeps in this document", "",
         f"| sweep | date | launched | baseline {col} | best {col} | best config |", "|---|---|---|---|---|---|"]
    for e in prev[-10:]:
        L.append(row([e.get("study"), e.get("date"), e.get("launched", ""), _sweep_value(e, "baseline", obj),
                      _sweep_value(e, "best", obj), cfg(e.get("best_config") or {})]))
    L.append("")
    return L
