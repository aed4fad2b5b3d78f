"""The findings document: one markdown file per sweep, read before it is written.

``update_findings(spec, study_name, records, fingerprint, rules)`` rewrites only the
servesweep section of ``spec.findings_path`` (default ``findings/<sweep>.md`` at the repo
root), between the markers::

    <!-- servesweep:begin -->
    ...generated...
    <!-- servesweep:data {...json...} -->
    <!-- servesweep:end -->

Everything outside the section is kept byte for byte, so people can write notes above
and below it. A file without markers gets the section appended (nothing lost); a
malformed section (a lone begin or end marker, several sections) is recreated once,
never duplicated. The file is replaced atomically (temp file + ``os.replace``), so a
driver killed mid-write leaves the previous complete document.

The ``servesweep:data`` line is a JSON block the next write reads back: the baseline
history across sweeps (so drift such as 82.0 -> 89.5 tok/s is called out) and the
best configs of earlier sweeps.

Rendering is pure (:func:`render_section` over records + context); only
:func:`update_findings` touches the filesystem and the study storage.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps import records as R
from tasks.redact import redact_text

log = logging.getLogger("servesweep.findings")

BEGIN = "<!-- servesweep:begin -->"
END = "<!-- servesweep:end -->"
HEADER = "<!-- servesweep:generated: edits inside this section are overwritten; write notes above or below it -->"
DATA_PREFIX = "<!-- servesweep:data "
DATA_VERSION = 1
# A baseline that moved by more than this fraction between sweeps is called out. Source:
# the emulated node's run-to-run noise is 1.5 % (conf/backend/emulated.yaml, real nodes
# 1-2 %); 3 % is two standard deviations of one measurement.
DRIFT_THRESHOLD = 0.03
# Knobs that group the approaches table, in order of preference (DESIGN.md § Findings
# document: "allreduce backend x speculation").
GROUP_PREFERENCE = ("allreduce", "speculative", "moe_a2a_backend", "nccl_algo")
MAX_GROUP_ROWS = 40
ENUM_LIMIT = 200_000  # configs enumerated to count what is left untried (the campaign space: 37 296)

_BEGIN_RE = re.compile(r"^[ \t]*<!--\s*servesweep:begin\b[^\n]*-->[ \t]*\r?$", re.M)
_END_RE = re.compile(r"^[ \t]*<!--\s*servesweep:end\b[^\n]*-->[ \t]*\r?$", re.M)
_DATA_RE = re.compile(r"^[ \t]*<!--\s*servesweep:data (\{.*\})\s*-->[ \t]*\r?$", re.M)
_HEADER_RE = re.compile(r"^[ \t]*<!--\s*servesweep:generated\b[^\n]*-->[ \t]*\r?$", re.M)


# ---------------------------------------------------------------------------------------
# the marked section inside an arbitrary document
# ---------------------------------------------------------------------------------------
def _line_span(text: str, m: re.Match) -> tuple[int, int]:
    """(start, end) of the whole line holding ``m``, end past its newline."""
    s = text.rfind("\n", 0, m.start()) + 1
    e = text.find("\n", m.end())
    return s, (len(text) if e < 0 else e + 1)


def find_sections(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of every servesweep section in ``text``.

    A begin marker pairs with the next end marker before the next begin. A lone begin
    ends at its section's data line (the generated last line before the end marker) or,
    if that is missing too, at the next begin / end of file. A lone end starts at the
    generator header line before it (else the span is the marker line alone). Spans
    include their trailing newline and never overlap.
    """
    begins = [_line_span(text, m) for m in _BEGIN_RE.finditer(text)]
    ends = [_line_span(text, m) for m in _END_RE.finditer(text)]
    datas = [_line_span(text, m) for m in _DATA_RE.finditer(text)]
    headers = [_line_span(text, m) for m in _HEADER_RE.finditer(text)]
    spans: list[tuple[int, int]] = []
    used_ends: set[int] = set()
    for i, (bs, be) in enumerate(begins):
        limit = begins[i + 1][0] if i + 1 < len(begins) else len(text)
        end = next((e for e in ends if e[0] >= be and e[1] <= limit and e[0] not in used_ends), None)
        if end is not None:
            used_ends.add(end[0])
            spans.append((bs, end[1]))
            continue
        data = [d for d in datas if d[0] >= be and d[1] <= limit]
        spans.append((bs, data[-1][1] if data else limit))
    for es, ee in ends:
        if es in used_ends or any(s <= es < e for s, e in spans):
            continue
        prev_end = max([e for s, e in spans if e <= es], default=0)
        hdr = [h for h in headers if prev_end <= h[0] < es]
        spans.append((hdr[0][0] if hdr else es, ee))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def splice_section(text: str, section: str) -> str:
    """``text`` with its servesweep section replaced by ``section`` (which must start with
    :data:`BEGIN` and end with :data:`END` + newline).

    Text outside the section(s) is kept byte for byte. The first section found is replaced
    in place, any further ones are removed; with none, ``section`` is appended after a
    blank line.
    """
    spans = find_sections(text)
    if not spans:
        if not text:
            return section
        sep = "" if text.endswith("\n") else "\n"
        return text + sep + "\n" + section
    out: list[str] = []
    pos = 0
    for i, (s, e) in enumerate(spans):
        out.append(text[pos:s])
        if i == 0:
            out.append(section)
        pos = e
    out.append(text[pos:])
    return "".join(out)


def read_data_block(text: str) -> dict[str, Any]:
    """The JSON of the first section's ``servesweep:data`` line ({} when absent or unreadable)."""
    spans = find_sections(text)
    for s, e in spans or [(0, len(text))]:
        m = _DATA_RE.search(text, s, e)
        if m:
            try:
                data = json.loads(m.group(1))
                return data if isinstance(data, dict) else {}
            except ValueError:
                log.warning("findings: unreadable servesweep:data block; baseline history starts afresh")
                return {}
    return {}


def _data_line(data: Mapping[str, Any]) -> str:
    # '<' and '>' escaped so the JSON can never close the HTML comment early
    body = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    body = body.replace("<", "\\u003c").replace(">", "\\u003e")
    return f"{DATA_PREFIX}{body} -->"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory + ``os.replace``
    (a reader or a killed writer never sees a half-written file). Keeps the old mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8", "surrogateescape"))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        except OSError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------------------------------
# context the renderer needs (built from the SweepSpec, or by hand in tests)
# ---------------------------------------------------------------------------------------
@dataclass
class Context:
    """Everything besides the records that the section shows.

    Attributes:
        study: study name.  sweep: sweep config name.  description: sweep description.
        node: ``{"name", "gpus", "gpu_name", "interconnect", "compute_capability"}``.
        model: ``{"name", "path", "draft_path"}``.  backend: backend kind.
        fingerprint: environment fingerprint (GPU arch, driver, CUDA, NCCL, torch, SGLang, FlashInfer).
        objective: metric name (tok/s).  baseline_config: the declared baseline params.
        space: the :class:`~sweeps.space.SearchSpace` (None: no untried analysis).
        rules: failure rules known for this environment (``sweeps.rules.Rule``).
        mapping: failure class -> implicated knobs (``conf/failure_knobs.yaml``).
        confirmation: the winner confirmation (``sweeps.confirm``), or None.
        now: timestamp shown as "updated" (ISO-8601).
    """

    study: str
    sweep: str = ""
    description: str = ""
    node: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    backend: str = ""
    fingerprint: dict[str, str] = field(default_factory=dict)
    objective: str = "decode_tok_s"
    baseline_config: dict[str, Any] = field(default_factory=dict)
    space: Any = None
    rules: list[Any] = field(default_factory=list)
    mapping: dict[str, list[str]] = field(default_factory=dict)
    confirmation: dict[str, Any] | None = None
    now: str = ""


def _fp_hash(fp: Mapping[str, Any]) -> str:
    try:
        from sweeps.rules import fingerprint_hash

        return fingerprint_hash(fp)[:12]
    except (ValueError, ImportError):
        return ""


# ---------------------------------------------------------------------------------------
# rendering helpers
# ---------------------------------------------------------------------------------------
def _fmt(v: float | None, nd: int = 1) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.{nd}f}"


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _cfg(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _trials(ns: Iterable[int], limit: int = 12) -> str:
    ns = sorted(set(ns))
    s = ", ".join(f"t{n}" for n in ns[:limit])
    return s + (f" (+{len(ns) - limit} more)" if len(ns) > limit else "")


def _code(s: str) -> str:
    s = s.replace("\n", " ")
    tick = "``" if "`" in s else "`"
    return f"{tick}{s}{tick}"


def group_knobs(space: Any, records: Sequence[R.TrialRecord]) -> list[str]:
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


def _levels(space: Any, knob: str, records: Sequence[R.TrialRecord]) -> list[Any]:
    if space is not None:
        for p in space.params:
            if p.name == knob:
                return list(p.levels())
    seen: list[Any] = []
    for r in records:
        if knob in r.params and r.params[knob] not in seen:
            seen.append(r.params[knob])
    return seen


def _degraded_line(r: R.TrialRecord) -> str | None:
    try:
        from tasks.failures import detect_perf_findings

        for f in detect_perf_findings(r.log_tail or ""):
            if f.tag == R.DEGRADED:
                return f.line.strip()
    except ImportError:
        pass
    return None


@dataclass
class _Group:
    key: tuple[Any, ...]
    ok: list[R.TrialRecord] = field(default_factory=list)
    degraded: list[R.TrialRecord] = field(default_factory=list)
    failed: list[R.TrialRecord] = field(default_factory=list)
    infra: list[R.TrialRecord] = field(default_factory=list)
    skipped: list[R.TrialRecord] = field(default_factory=list)
    infeasible: list[R.TrialRecord] = field(default_factory=list)
    running: list[R.TrialRecord] = field(default_factory=list)

    @property
    def launched(self) -> int:
        return len(self.ok) + len(self.degraded) + len(self.failed) + len(self.infra)


def _classify(r: R.TrialRecord, g: _Group) -> None:
    if r.duplicate_of is not None:
        return
    if r.status == "ok":
        (g.ok if R.counts_for_level(r) else g.degraded).append(r)
    elif r.status == "failed":
        g.failed.append(r)
    elif r.status in ("infra_error", "interrupted"):
        g.infra.append(r)
    elif r.status == "skipped":
        g.skipped.append(r)
    elif r.status == "infeasible":
        g.infeasible.append(r)
    elif r.state == "RUNNING":
        g.running.append(r)


def _outcome(g: _Group, base: float | None) -> str:
    fails = Counter(r.failure_class or "failed" for r in g.failed)
    fails_txt = ", ".join(f"{c} ({_trials(x.number for x in g.failed if (x.failure_class or 'failed') == c)})"
                          for c, _ in fails.most_common())
    skip_classes = Counter(r.failure_class for r in g.skipped if r.failure_class)
    if g.ok:
        best = max(g.ok, key=lambda r: r.value or 0)
        txt = "works"
        if base and best.value is not None and best.value < base:
            txt += f", slower than baseline ({best.value / base:.2f}x)"
        if fails:
            txt += f"; some configs fail: {fails_txt}"
        if g.degraded:
            txt += f"; {R.DEGRADED} in {_trials(r.number for r in g.degraded)}"
        return txt
    if g.degraded:
        return f"silently falls back to NCCL ({R.DEGRADED}, {_trials(r.number for r in g.degraded)})"
    if fails:
        return f"fails: {fails_txt}"
    if g.infra:
        c = Counter(r.failure_class or r.status for r in g.infra)
        return "no result: " + ", ".join(f"{k} ({v})" for k, v in c.most_common()) + " (infrastructure, not the config)"
    if skip_classes:
        return "skipped by known dead end: " + ", ".join(f"{k} ({v})" for k, v in skip_classes.most_common())
    if g.running:
        return "running"
    if g.infeasible:
        return "infeasible (constraints)"
    return "untried"


# ---------------------------------------------------------------------------------------
# the section
# ---------------------------------------------------------------------------------------
def _baseline_entry(ctx: Context, records: Sequence[R.TrialRecord]) -> dict[str, Any] | None:
    val = R.baseline_value(list(records))
    if val is None:
        return None
    runs = [r for r in records if r.is_baseline and r.status == "ok" and r.value is not None]
    cfg = runs[0].params if runs else dict(ctx.baseline_config)
    return {"study": ctx.study, "date": ctx.now, "tok_s": round(val, 3), "config": cfg,
            "trials": [r.number for r in runs], "fingerprint": dict(ctx.fingerprint),
            "fingerprint_hash": _fp_hash(ctx.fingerprint)}


def baseline_history(old: Mapping[str, Any], cur: dict[str, Any] | None, study: str) -> list[dict[str, Any]]:
    """Earlier sweeps' baselines (from the old data block) plus this sweep's, oldest first;
    this study's earlier entry is replaced by ``cur``."""
    hist = [dict(e) for e in (old.get("baselines") or []) if isinstance(e, dict) and "tok_s" in e]
    if cur is None:
        return hist
    return [e for e in hist if e.get("study") != study] + [cur]


def baseline_drift(hist: Sequence[Mapping[str, Any]], study: str) -> dict[str, Any] | None:
    """Compare this study's baseline with the most recent earlier sweep's.

    Returns:
        None without both, else ``{"from", "to" (tok/s), "change" (fraction), "moved"
        (bool: beyond :data:`DRIFT_THRESHOLD` or config/environment changed), "since"
        (study), "date", "config_changes" [(knob, old, new)], "env_changes" [(key, old, new)]}``.
    """
    cur = next((e for e in reversed(hist) if e.get("study") == study), None)
    prev = next((e for e in reversed(hist) if e.get("study") != study), None)
    if cur is None or prev is None or not prev.get("tok_s"):
        return None
    a, b = float(prev["tok_s"]), float(cur["tok_s"])
    pc, cc = prev.get("config") or {}, cur.get("config") or {}
    cfg_changes = [(k, pc.get(k), cc.get(k)) for k in sorted(set(pc) | set(cc)) if pc.get(k) != cc.get(k)]
    pf, cf = prev.get("fingerprint") or {}, cur.get("fingerprint") or {}
    env_changes = [(k, pf.get(k), cf.get(k)) for k in sorted(set(pf) | set(cf)) if pf.get(k) != cf.get(k)]
    change = b / a - 1.0
    return {"from": a, "to": b, "change": change, "since": prev.get("study"), "date": prev.get("date"),
            "moved": abs(change) > DRIFT_THRESHOLD or bool(cfg_changes) or bool(env_changes),
            "config_changes": cfg_changes, "env_changes": env_changes}


def _untried(ctx: Context, records: Sequence[R.TrialRecord], groups: dict[tuple, _Group], gk: list[str]) -> list[str]:
    lines: list[str] = []
    launched = [r for r in records if r.launched]
    if ctx.space is None:
        return lines
    for p in ctx.space.params:
        try:
            levels = p.levels()
        except Exception:  # noqa: BLE001 - a continuous float: report the tried range instead
            vals = [float(r.params[p.name]) for r in launched if p.name in r.params]
            lines.append(f"- `{p.name}` (continuous {p.low}..{p.high}): tried "
                         + (f"{min(vals):g}..{max(vals):g} in {len(vals)} trials" if vals else "nothing yet"))
            continue
        tried = {r.params.get(p.name) for r in launched if p.name in r.params}
        skipped = {r.params.get(p.name) for r in records if r.status == "skipped" and r.duplicate_of is None
                   and p.name in r.params} - tried
        never = [v for v in levels if v not in tried]
        if not never:
            continue
        parts = []
        for v in never:
            parts.append(f"{v} (only skipped by a known dead end)" if v in skipped else str(v))
        cond = f" (when {', '.join(f'{k}={list(v)}' for k, v in p.when.items())})" if p.when else ""
        lines.append(f"- `{p.name}`{cond}: never launched: {', '.join(parts)}")
    untried_groups = [k for k, g in groups.items() if _outcome(g, None) == "untried"]
    if gk and untried_groups:
        lines.append("- approaches never tried: " + "; ".join(
            " × ".join(f"{k}={v}" for k, v in zip(gk, key)) for key in untried_groups))
    left = _remaining(ctx, records)
    if left is not None:
        total, remaining, excluded = left
        lines.append(f"- configs: {total} feasible in the space, {len({R.config_key(r.params) for r in launched})} "
                     f"launched, {excluded} excluded by known dead ends, **{remaining} not yet tried**")
    return lines


_ENUM_CACHE: dict[int, list[dict[str, Any]] | None] = {}


def _remaining(ctx: Context, records: Sequence[R.TrialRecord]) -> tuple[int, int, int] | None:
    """(feasible configs, untried and not excluded, excluded by rules/degraded levels), or
    None for an infinite or huge space."""
    key = id(ctx.space)
    if key not in _ENUM_CACHE:
        try:
            cfgs = list(ctx.space.enumerate(limit=ENUM_LIMIT + 1))
            _ENUM_CACHE[key] = cfgs if len(cfgs) <= ENUM_LIMIT else None
        except Exception:  # noqa: BLE001 - continuous float param
            _ENUM_CACHE[key] = None
    cfgs = _ENUM_CACHE[key]
    if cfgs is None:
        return None
    tried = {R.config_key(r.params) for r in records if r.launched or r.status == "skipped"}
    degraded_levels = {r.params.get("allreduce") for r in records
                       if r.status == "ok" and not R.counts_for_level(r) and r.params.get("allreduce") not in (None, "nccl")}
    fp_hash = None
    if ctx.rules and ctx.fingerprint:
        try:
            from sweeps.rules import fingerprint_hash

            fp_hash = fingerprint_hash(ctx.fingerprint)
        except ValueError:
            fp_hash = None
    model = ctx.model.get("name")
    remaining = excluded = 0
    for c in cfgs:
        if c.get("allreduce") in degraded_levels or (
                fp_hash and any(rule.applies_to(fp_hash, model, c, ctx.study) for rule in ctx.rules)):
            excluded += 1
        elif R.config_key(c) not in tried:
            remaining += 1
    return len(cfgs), remaining, excluded


def _confirmation_lines(conf: Mapping[str, Any]) -> list[str]:
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
        out.append("| " + " | ".join(_cell(x) for x in [
            f"t{e['trial']}" + (" (baseline)" if e.get("is_baseline") else ""), e.get("label", _cfg(e.get("config", {}))),
            f"{e.get('n', 0)}/{conf.get('repeats')}", _fmt(e.get("mean")),
            f"{_fmt(e.get('ci_low'))}–{_fmt(e.get('ci_high'))}",
            f"{_fmt(sp, 3)} ({_fmt(spci[0], 3)}–{_fmt(spci[1], 3)})" if sp else "–",
            tok, e.get("verdict", "")]) + " |")
    if conf.get("winner_note"):
        out += ["", conf["winner_note"]]
    return out


def render_section(ctx: Context, records: Sequence[R.TrialRecord], old_data: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """Render the servesweep section (markers included, ends with a newline) and its data block.

    Args:
        ctx: sweep context (environment, space, rules, confirmation).
        records: every trial of the study (:func:`sweeps.records.load_records`).
        old_data: the data block of the previous document (baseline history), or None.
    Returns:
        ``(section_text, data)``.
    """
    old_data = old_data or {}
    recs = list(records)
    base = R.baseline_value(recs)
    cur_entry = _baseline_entry(ctx, recs)
    hist = baseline_history(old_data, cur_entry, ctx.study)
    drift = baseline_drift(hist, ctx.study)
    conf = ctx.confirmation or None
    best = R.best_record(recs)
    winner_entry = None
    if conf and conf.get("winner") is not None:
        best = next((r for r in recs if r.number == conf["winner"]), best)
        winner_entry = next((e for e in conf.get("entries", []) if e.get("trial") == conf["winner"]), None)
    launched = [r for r in recs if r.launched]
    n_ok = sum(r.status == "ok" for r in launched)
    n_fail = sum(r.status == "failed" for r in launched)
    n_infra = sum(r.status in ("infra_error", "interrupted") for r in launched)
    n_rule = sum(r.status == "skipped" and r.duplicate_of is None for r in recs)
    n_dup = sum(r.duplicate_of is not None for r in recs)
    n_inf = sum(r.status == "infeasible" for r in recs)
    n_run = sum(r.state == "RUNNING" for r in recs)
    gpu_h = sum(r.timings.get("gpu_s", 0.0) for r in recs) / 3600.0

    L: list[str] = [BEGIN, HEADER, f"## servesweep findings: {ctx.study}", ""]
    if ctx.description:
        L += [f"_{ctx.description.strip()}_", ""]
    L.append(f"Updated {ctx.now}. {len(launched)} trials launched ({n_ok} ok, {n_fail} failed, {n_infra} infra/interrupted), "
             f"{n_rule + n_dup + n_inf} answered without GPU time ({n_rule} known dead ends, {n_dup} duplicates, "
             f"{n_inf} infeasible); {gpu_h:.2f} GPU-hours." + (f" **{n_run} trial(s) running.**" if n_run else ""))
    L.append("")

    # -- environment
    node, model = ctx.node, ctx.model
    L += ["### Environment", ""]
    L.append(f"- node: `{node.get('name', '?')}` — {node.get('gpus', '?')}× {node.get('gpu_name', '?')} "
             f"(SM {node.get('compute_capability', '?')}, {node.get('interconnect', '?')}); backend `{ctx.backend}`")
    L.append(f"- model: `{model.get('name', '?')}` ({model.get('path', '?')})"
             + (f", draft {model['draft_path']}" if model.get("draft_path") else ""))
    fp = ctx.fingerprint
    if fp:
        L.append("- fingerprint `" + (_fp_hash(fp) or "?") + "`: " + ", ".join(f"{k} {v}" for k, v in sorted(fp.items())))
    else:
        L.append("- fingerprint: not collected yet")
    L.append("")

    # -- baseline
    L += ["### Baseline", ""]
    if base is None:
        L.append(f"Not measured yet in this sweep (declared: {_cfg(ctx.baseline_config)}). Speedups are computed "
                 "against the baseline measured in the same sweep.")
    else:
        b_trials = [r.number for r in recs if r.is_baseline and r.status == "ok"]
        L.append(f"**{base:.1f} tok/s** — {_cfg(cur_entry['config'] if cur_entry else ctx.baseline_config)} "
                 f"(measured in this sweep, {_trials(b_trials)}). Every speedup below is against this number.")
    failed_base = [r for r in recs if r.is_baseline and r.status in ("failed", "infra_error")]
    if base is None and failed_base:
        L.append(f"The baseline did not run: {failed_base[-1].failure_class} ({_trials(r.number for r in failed_base)}).")
    if drift:
        if drift["moved"]:
            why = []
            if drift["config_changes"]:
                why.append("baseline config changed: " + ", ".join(f"{k} {a} -> {b}" for k, a, b in drift["config_changes"]))
            if drift["env_changes"]:
                why.append("environment changed: " + ", ".join(f"{k} {a} -> {b}" for k, a, b in drift["env_changes"]))
            if not why:
                why.append("same config and environment: node state or run-to-run variation")
            L.append("")
            L.append(f"**Baseline moved: {drift['from']:.1f} -> {drift['to']:.1f} tok/s ({drift['change'] * 100:+.1f} %) "
                     f"since sweep `{drift['since']}` ({drift['date']}).** " + "; ".join(why) + ".")
        else:
            L.append("")
            L.append(f"Baseline unchanged within ±{DRIFT_THRESHOLD * 100:.0f} % since sweep `{drift['since']}` "
                     f"({drift['from']:.1f} -> {drift['to']:.1f} tok/s).")
    plain = [r for r in recs if r.status == "ok" and r.value is not None and R.counts_for_level(r)
             and r.duplicate_of is None and r.params.get("speculative", "none") in ("none", None)]
    if base and plain:
        bp = max(plain, key=lambda r: r.value)
        if not bp.is_baseline and bp.value > base * (1 + DRIFT_THRESHOLD):
            diff = [(k, ctx.baseline_config.get(k), v) for k, v in bp.params.items() if ctx.baseline_config.get(k) != v]
            L.append("")
            L.append(f"**The plain-decoding reference moved in this sweep: {base:.1f} -> {bp.value:.1f} tok/s "
                     f"({bp.value / base:.2f}x) with " + ", ".join(f"{k} {a} -> {b}" for k, a, b in diff)
                     + f" (t{bp.number}).** Speculative configs must beat this, not only the declared baseline; "
                     "consider it as `sweep.baseline` for the next sweep.")
    if len(hist) > 1:
        L += ["", "| sweep | date | baseline tok/s | config | fingerprint |", "|---|---|---|---|---|"]
        for e in hist[-10:]:
            L.append("| " + " | ".join(_cell(x) for x in [e.get("study"), e.get("date"), _fmt(e.get("tok_s")),
                                                              _cfg(e.get("config") or {}), e.get("fingerprint_hash", "")]) + " |")
    L.append("")

    # -- best
    L += ["### Best config", ""]
    if best is None:
        L.append("No successful trial yet.")
    else:
        sp = (best.value / base) if base and best.value else None
        L.append(f"**t{best.number}: {best.value:.1f} tok/s**" + (f", **{sp:.2f}x** the baseline" if sp else "")
                 + f" — {_cfg(best.params)}")
        m = best.metrics
        L.append(f"(TTFT p50 {_fmt(m.get('ttft_ms_p50'), 0)} ms, ITL p50 {_fmt(m.get('itl_ms_p50'))} ms, "
                 f"ITL p99 {_fmt(m.get('itl_ms_p99'))} ms, acceptance length {_fmt(m.get('accept_length'), 2)})")
        if winner_entry:
            L.append(f"Confirmed: {_fmt(winner_entry.get('mean'))} tok/s mean over {winner_entry.get('n')} fresh runs "
                     f"(95 % CI {_fmt(winner_entry.get('ci_low'))}–{_fmt(winner_entry.get('ci_high'))}); greedy output "
                     + {True: "identical to the baseline's.", False: "DIFFERS from the baseline's.",
                        None: "not compared (no token ids)."}[winner_entry.get("tokens_match")])
        elif conf and conf.get("winner") is None:
            L.append("**Not confirmed:** " + str(conf.get("winner_note") or "no config passed the confirmation."))
        else:
            L.append("Measured once in the sweep; not yet confirmed with repeats.")
        L += ["", "```bash", best.launch_command or "(launch command not recorded)", "```"]
    L.append("")
    if conf:
        L += ["### Confirmation", ""] + _confirmation_lines(conf) + [""]

    # -- approaches
    gk = group_knobs(ctx.space, recs)
    groups: dict[tuple, _Group] = {}
    if gk:
        levels = [_levels(ctx.space, k, recs) for k in gk]
        import itertools

        combos = list(itertools.product(*levels))
        for key in combos:
            groups[key] = _Group(key)
        for r in recs:
            key = tuple(r.params.get(k) for k in gk)
            if key not in groups:
                if any(v is None for v in key):
                    continue
                groups[key] = _Group(key)
            _classify(r, groups[key])
        L += [f"### Approaches ({' × '.join(gk)})", "",
              "| " + " | ".join(gk) + " | best tok/s | speedup | launched | skipped | outcome |",
              "|" + "---|" * (len(gk) + 5)]
        rows = list(groups.values())
        if len(rows) > MAX_GROUP_ROWS:
            rows = [g for g in rows if g.launched or g.skipped]
        for g in rows:
            bv = max((r.value for r in g.ok if r.value is not None), default=None)
            bt = max(g.ok, key=lambda r: r.value or 0).number if g.ok else None
            L.append("| " + " | ".join(_cell(x) for x in [*g.key,
                                                            f"{_fmt(bv)} (t{bt})" if bv is not None else "–",
                                                            f"{bv / base:.2f}x" if bv is not None and base else "–",
                                                            g.launched, len(g.skipped), _outcome(g, base)]) + " |")
        L.append("")

    # -- dead ends
    L += ["### Dead ends", ""]
    dead = _dead_ends(ctx, recs, base)
    L += dead if dead else ["None found yet."]
    L.append("")

    # -- untried
    L += ["### Still untried", ""]
    un = _untried(ctx, recs, groups, gk)
    L += un if un else ["Every level of every knob has been launched at least once."]
    L.append("")

    # -- previous sweeps
    prev_best = [e for e in (old_data.get("sweeps") or []) if isinstance(e, dict) and e.get("study") != ctx.study]
    this_best = {"study": ctx.study, "date": ctx.now, "best_tok_s": best.value if best else None,
                 "best_config": best.params if best else None, "best_trial": best.number if best else None,
                 "baseline_tok_s": base, "launched": len(launched)}
    sweeps = (prev_best + [this_best])[-20:]
    if prev_best:
        L += ["### Earlier sweeps in this document", "", "| sweep | date | launched | baseline tok/s | best tok/s | best config |",
              "|---|---|---|---|---|---|"]
        for e in prev_best[-10:]:
            L.append("| " + " | ".join(_cell(x) for x in [e.get("study"), e.get("date"), e.get("launched", ""),
                                                              _fmt(e.get("baseline_tok_s")), _fmt(e.get("best_tok_s")),
                                                              _cfg(e.get("best_config") or {})]) + " |")
        L.append("")
    data = {"version": DATA_VERSION, "study": ctx.study, "updated": ctx.now, "baselines": hist, "sweeps": sweeps}
    L += [_data_line(data), END]
    return "\n".join(L) + "\n", data


def _dead_ends(ctx: Context, recs: Sequence[R.TrialRecord], base: float | None) -> list[str]:
    out: list[str] = []
    by_class: dict[str, list[R.TrialRecord]] = defaultdict(list)
    for r in recs:
        if r.status == "failed" and r.duplicate_of is None:
            by_class[r.failure_class or "unknown"].append(r)
    skipped_by_class = Counter(r.failure_class for r in recs if r.status == "skipped" and r.duplicate_of is None
                               and r.failure_class)
    for cls, rs in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        # knob values every failing trial of this class shares (restricted to the implicated ones when known)
        common = dict(rs[0].params)
        for r in rs[1:]:
            common = {k: v for k, v in common.items() if r.params.get(k) == v}
        implicated = ctx.mapping.get(cls)
        if implicated and "*" not in implicated:
            names = {i.rstrip("?") for i in implicated}
            narrowed = {k: v for k, v in common.items() if k in names}
            common = narrowed or common
        kind = rs[0].failure_kind or "?"
        phase = Counter(r.phase for r in rs).most_common(1)[0][0]
        sig = next((r.failure_signature for r in rs if r.failure_signature), "")
        skipped = skipped_by_class.get(cls, 0)
        out.append(f"- **{cls}** ({kind}, {phase}) when {_cfg(common) or 'any config'}: {_trials(r.number for r in rs)}"
                   + (f"; {skipped} later proposal(s) skipped without GPU time" if skipped else ""))
        if sig:
            out.append(f"  - decisive line: {_code(sig[:300])}")
    degraded: dict[Any, list[R.TrialRecord]] = defaultdict(list)
    for r in recs:
        if r.status == "ok" and not R.counts_for_level(r) and r.duplicate_of is None:
            degraded[r.params.get("allreduce")].append(r)
    for level, rs in degraded.items():
        skipped = sum(1 for r in recs if r.status == "skipped" and r.failure_class == R.DEGRADED
                      and r.params.get("allreduce") == level)
        line = next((x for x in (_degraded_line(r) for r in rs) if x), None)
        out.append(f"- **allreduce={level} is not what runs** ({R.DEGRADED}): the server silently fell back to NCCL "
                   f"({_trials(r.number for r in rs)}; measured {_fmt(max(r.value or 0 for r in rs))} tok/s is NCCL's, "
                   f"never credited to {level})" + (f"; {skipped} later proposal(s) skipped" if skipped else ""))
        if line:
            out.append(f"  - decisive line: {_code(line[:300])}")
    spec_ok = [r for r in recs if r.status == "ok" and r.value is not None and r.duplicate_of is None
               and r.params.get("speculative") not in (None, "none") and R.counts_for_level(r)]
    if base and spec_ok and all(r.value < base for r in spec_ok):
        b = max(spec_ok, key=lambda r: r.value)
        acc = [r.metrics.get("accept_length") for r in spec_ok if r.metrics.get("accept_length")]
        out.append(f"- **speculative decoding never beat the baseline** (spec_decode_no_speedup): best "
                   f"{b.value:.1f} tok/s = {b.value / base:.2f}x in t{b.number} ({_cfg(b.params)}); "
                   f"{len(spec_ok)} trials, acceptance length {min(acc):.2f}–{max(acc):.2f}; "
                   f"ITL p99 {_fmt(b.metrics.get('itl_ms_p99'))} ms vs p50 {_fmt(b.metrics.get('itl_ms_p50'))} ms "
                   "(each verify cycle costs far more than one plain step)" if acc else
                   f"- **speculative decoding never beat the baseline**: best {b.value:.1f} tok/s in t{b.number}")
    if ctx.confirmation:
        for e in ctx.confirmation.get("entries", []):
            if e.get("tokens_match") is False:
                out.append(f"- **t{e['trial']} changes the output** (output_mismatch): greedy token ids differ from the "
                           f"baseline's for the same prompts ({e.get('mismatch_detail', '')}); it cannot win however fast.")
    # rules learned in earlier sweeps on this environment that this sweep did not hit itself
    seen_classes = set(by_class)
    older = [rule for rule in ctx.rules if rule.failure_class not in seen_classes]
    for rule in older[:20]:
        ev = ", ".join(f"{e.get('sweep')}#t{e.get('trial_number')}" for e in rule.evidence[:5])
        out.append(f"- {rule.failure_class} when {_cfg(rule.knobs) or 'any config'} (rule {rule.id}, learned earlier: {ev}); "
                   f"decisive line: {_code(rule.signature[:200])}")
    return out


# ---------------------------------------------------------------------------------------
# entry point used by the driver and the report CLI
# ---------------------------------------------------------------------------------------
_STORAGES: dict[str, Any] = {}


def study_user_attrs(storage_url: str, study_name: str) -> dict[str, Any]:
    """The study's user attributes read from its RDB storage ({} when it does not exist)."""
    import optuna

    st = _STORAGES.get(storage_url)
    if st is None:
        st = optuna.storages.RDBStorage(storage_url, engine_kwargs={"connect_args": {"timeout": 30}}
                                        if storage_url.startswith("sqlite") else {})
        _STORAGES[storage_url] = st
    try:
        sid = st.get_study_id_from_name(study_name)
    except KeyError:
        return {}
    return dict(st.get_study_user_attrs(sid))


def context_from_spec(spec: Any, study_name: str, fingerprint: Mapping[str, str] | None, rules: Any,
                      confirmation: Mapping[str, Any] | None = None) -> Context:
    """Build the :class:`Context` from a :class:`~sweeps.config.SweepSpec` and a RuleStore (or None)."""
    fp = dict(fingerprint or {})
    rule_list: list[Any] = []
    mapping: dict[str, list[str]] = {}
    if rules is not None:
        try:
            mapping = dict(rules.mapping)
            if fp:
                rule_list = [r for r in rules.list(fingerprint=fp)
                             if (r.model is None or r.model == spec.model.name)
                             and (r.scope_sweep is None or r.scope_sweep == study_name)]
        except Exception as e:  # noqa: BLE001 - rules are context, not essential
            log.warning("findings: could not read failure rules (%s)", e)
    return Context(
        study=study_name, sweep=spec.sweep.name, description=spec.sweep.description,
        node=spec.node.model_dump(), model=spec.model.model_dump(), backend=spec.backend.kind,
        fingerprint=fp, objective=spec.sweep.objective, baseline_config=dict(spec.sweep.baseline),
        space=_cached_space(spec), rules=rule_list, mapping=mapping,
        confirmation=dict(confirmation) if confirmation else None,
        now=_dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
    )


_SPACES: dict[str, Any] = {}


def _cached_space(spec: Any) -> Any:
    key = json.dumps({"p": spec.sweep.params, "c": spec.sweep.constraints}, sort_keys=True, default=str)
    if key not in _SPACES:
        _SPACES[key] = spec.space
    return _SPACES[key]


def update_findings(spec: Any, study_name: str, records: Sequence[R.TrialRecord], fingerprint: Mapping[str, str] | None,
                    rules: Any, *, confirmation: Mapping[str, Any] | None = None, path: Path | None = None) -> Path:
    """Read the findings document, rewrite its servesweep section, keep everything else.

    Args:
        spec: the :class:`~sweeps.config.SweepSpec` (node, model, space, baseline, paths).
        study_name: the Optuna study (its confirmation, if any, is read from the study's
            user attribute ``confirmation`` unless ``confirmation`` is given).
        records: every trial (:func:`sweeps.records.load_records`).
        fingerprint: the node's environment fingerprint ({} if unknown).
        rules: a :class:`~sweeps.rules.RuleStore` or None.
        path: the document (default ``spec.findings_path``).
    Returns:
        The document's path.
    Raises:
        OSError: the document cannot be read or written.
    """
    path = Path(path or spec.findings_path)
    if confirmation is None:
        try:
            confirmation = study_user_attrs(spec.optuna_storage, study_name).get("confirmation")
        except Exception as e:  # noqa: BLE001
            log.debug("findings: no study attrs (%s)", e)
    ctx = context_from_spec(spec, study_name, fingerprint, rules, confirmation)
    old = path.read_bytes().decode("utf-8", "surrogateescape") if path.exists() else ""  # bytes kept as is
    section, _ = render_section(ctx, records, read_data_block(old))
    section = redact_text(section)  # model paths with credentials, tokens in decisive log lines
    new = splice_section(old, section)
    if new != old:
        atomic_write(path, new)
    return path
