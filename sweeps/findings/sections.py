"""The findings sections that are not about the baseline, dead ends or untried configs:
the counts line, environment, best config with its confirmation, the approaches table and
the earlier sweeps of the document. Each returns its markdown lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sweeps import records as R
from sweeps.findings.context import Context, fp_hash
from sweeps.findings.groups import Group, outcome
from sweeps.findings.text import cfg, fmt, row

MAX_GROUP_ROWS = 40


def counts_line(ctx: Context, recs: Sequence[R.TrialRecord]) -> str:
    """"Updated ...": trials launched by outcome, answered without GPU time, GPU-hours, running."""
    launched = [r for r in recs if r.launched]
    n_ok = sum(r.status == "ok" for r in launched)
    n_fail = sum(r.status == "failed" for r in launched)
    n_infra = sum(r.status in ("infra_error", "interrupted") for r in launched)
    n_rule = sum(r.status == "skipped" and r.duplicate_of is None for r in recs)
    n_dup = sum(r.duplicate_of is not None for r in recs)
    n_inf = sum(r.status == "infeasible" for r in recs)
    n_run = sum(r.state == "RUNNING" for r in recs)
    gpu_h = sum(r.timings.get("gpu_s", 0.0) for r in recs) / 3600.0
    return (f"Updated {ctx.now}. {len(launched)} trials launched ({n_ok} ok, {n_fail} failed, {n_infra} infra/interrupted), "
            f"{n_rule + n_dup + n_inf} answered without GPU time ({n_rule} known dead ends, {n_dup} duplicates, "
            f"{n_inf} infeasible); {gpu_h:.2f} GPU-hours." + (f" **{n_run} trial(s) running.**" if n_run else ""))


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


def confirmation_lines(conf: Mapping[str, Any]) -> list[str]:
    """The "Confirmation" table: every re-measured config with its mean, interval, speedup,
    token comparison and verdict."""
    lv = conf.get("confidence", 0.95)
    out = [f"Top {conf.get('top_k')} configs and the baseline re-measured {conf.get('repeats')}× each "
           f"(fresh launches; the sweep's own measurement is not reused, so a lucky draw cannot win); "
           f"mean decode tok/s with {lv * 100:.0f} % t-intervals; greedy output token ids compared with the "
           f"baseline's for the same prompts.", "",
           "| trial | config | runs | mean tok/s | 95 % CI | speedup (95 % CI) | tokens | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for e in conf.get("entries", []):
        sp = e.get("speedup_mean")
        spci = e.get("speedup_ci") or [None, None]
        tok = "reference" if e.get("is_baseline") else {True: "= baseline", False: "**differ**",
                                                          None: "not compared"}[e.get("tokens_match")]
        out.append(row([
            f"t{e['trial']}" + (" (baseline)" if e.get("is_baseline") else ""), e.get("label", cfg(e.get("config", {}))),
            f"{e.get('n', 0)}/{conf.get('repeats')}", fmt(e.get("mean")),
            f"{fmt(e.get('ci_low'))}–{fmt(e.get('ci_high'))}",
            f"{fmt(sp, 3)} ({fmt(spci[0], 3)}–{fmt(spci[1], 3)})" if sp else "–",
            tok, e.get("verdict", "")]))
    if conf.get("winner_note"):
        out += ["", conf["winner_note"]]
    return out


def _confirmed_line(winner_entry: Mapping[str, Any] | None, conf: Mapping[str, Any] | None) -> str:
    if winner_entry:
        return (f"Confirmed: {fmt(winner_entry.get('mean'))} tok/s mean over {winner_entry.get('n')} fresh runs "
                f"(95 % CI {fmt(winner_entry.get('ci_low'))}–{fmt(winner_entry.get('ci_high'))}); greedy output "
                + {True: "identical to the baseline's.", False: "DIFFERS from the baseline's.",
                   None: "not compared (no token ids)."}[winner_entry.get("tokens_match")])
    if conf and conf.get("winner") is None:
        return "**Not confirmed:** " + str(conf.get("winner_note") or "no config passed the confirmation.")
    return "Measured once in the sweep; not yet confirmed with repeats."


def best_section(best: R.TrialRecord | None, base: float | None, conf: Mapping[str, Any] | None,
                 winner_entry: Mapping[str, Any] | None) -> list[str]:
    """The "Best config" section (the confirmed winner where confirmation ran) and the
    "Confirmation" table."""
    L = ["### Best config", ""]
    if best is None:
        L.append("No successful trial yet.")
    else:
        sp = (best.value / base) if base and best.value else None
        L.append(f"**t{best.number}: {best.value:.1f} tok/s**" + (f", **{sp:.2f}x** the baseline" if sp else "")
                 + f" — {cfg(best.params)}")
        m = best.metrics
        L.append(f"(TTFT p50 {fmt(m.get('ttft_ms_p50'), 0)} ms, ITL p50 {fmt(m.get('itl_ms_p50'))} ms, "
                 f"ITL p99 {fmt(m.get('itl_ms_p99'))} ms, acceptance length {fmt(m.get('accept_length'), 2)})")
        L.append(_confirmed_line(winner_entry, conf))
        L += ["", "```bash", best.launch_command or "(launch command not recorded)", "```"]
    L.append("")
    if conf:
        L += ["### Confirmation", ""] + confirmation_lines(conf) + [""]
    return L


def approaches_section(gk: list[str], groups: dict[tuple, Group], base: float | None) -> list[str]:
    """The "Approaches" table: one row per combination of the grouping knobs (only those
    launched or skipped when there are more than :data:`MAX_GROUP_ROWS`)."""
    if not gk:
        return []
    L = [f"### Approaches ({' × '.join(gk)})", "",
         "| " + " | ".join(gk) + " | best tok/s | speedup | launched | skipped | outcome |",
         "|" + "---|" * (len(gk) + 5)]
    rows = list(groups.values())
    if len(rows) > MAX_GROUP_ROWS:
        rows = [g for g in rows if g.launched or g.skipped]
    for g in rows:
        bv = max((r.value for r in g.ok if r.value is not None), default=None)
        bt = max(g.ok, key=lambda r: r.value or 0).number if g.ok else None
        L.append(row([*g.key, f"{fmt(bv)} (t{bt})" if bv is not None else "–",
                      f"{bv / base:.2f}x" if bv is not None and base else "–",
                      g.launched, len(g.skipped), outcome(g, base)]))
    L.append("")
    return L


def earlier_sweeps_section(prev: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "Earlier sweeps in this document" table (empty without earlier sweeps)."""
    if not prev:
        return []
    L = ["### Earlier sweeps in this document", "", "| sweep | date | launched | baseline tok/s | best tok/s | best config |",
         "|---|---|---|---|---|---|"]
    for e in prev[-10:]:
        L.append(row([e.get("study"), e.get("date"), e.get("launched", ""), fmt(e.get("baseline_tok_s")),
                      fmt(e.get("best_tok_s")), cfg(e.get("best_config") or {})]))
    L.append("")
    return L
