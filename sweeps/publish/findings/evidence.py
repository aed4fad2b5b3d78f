"""The log evidence a findings line quotes: decisive lines verbatim (redacted, never
normalized), and the server's own lines about the path a knob level took.

A trial's stored ``failure_signature`` is normalized for matching (``KeyError: <N>``), which
hides what a reader needs (``KeyError: 12``: compute capability 12.x, SM120). The raw
line comes back from the record's ``log_tail`` through the classifier
(:func:`tasks.failures.classify` returns it as ``Classification.line``), redacted with
:func:`tasks.redact.redact_text`.
"""

from __future__ import annotations

import re
from typing import Any

from sweeps.store import records
from tasks.redact import redact_text

MAX_LINE = 300  # characters of a quoted log line
# The leading timestamp / rank prefix of SGLang's log lines ("[2026-11-29 15:00:10 TP0] ").
_PREFIX = re.compile(r"^\[[0-9-]+ [0-9:.]+(?: [A-Z]+[0-9]+)*\]\s*")


# A placeholder a normalizer or a redactor puts where a host, path, number or secret was.
_PLACEHOLDER = re.compile(r"<[A-Z][A-Z_]*>")


def decisive_evidence(r: records.TrialRecord) -> tuple[str, str]:
    """(the decisive line of a failed trial, how it is quoted): ``verbatim`` (the log's own
    line), ``redacted`` (the log's line with secrets or hosts replaced, or holding a
    ``<HOST>``-style placeholder) or ``normalized signature`` (no log line: the stored
    signature). ``("", "")`` when there is none. The classifier's line is used when it finds
    the trial's own class in the log tail."""
    if r.log_tail:
        try:
            from tasks.failures import classify

            c = classify(r.log_tail, None, r.phase)
            if c.line and (c.failure_class == r.failure_class or not r.failure_class):
                raw = c.line.strip()[:MAX_LINE]
                return quoted(raw)
        except ImportError:
            pass
    sig = redact_text(r.failure_signature or "")[:MAX_LINE]
    return (sig, "normalized signature") if sig else ("", "")


def quoted(raw: str) -> tuple[str, str]:
    """(``raw`` redacted, ``verbatim`` when that changed nothing and it holds no placeholder, else ``redacted``)."""
    shown = redact_text(raw)[:MAX_LINE]
    return shown, "verbatim" if shown == raw and not _PLACEHOLDER.search(shown) else "redacted"


def decisive_line(r: records.TrialRecord) -> str:
    """The decisive line of a failed trial, redacted ('' when neither its log tail nor its
    signature has one); see :func:`decisive_evidence` for how it is quoted."""
    return decisive_evidence(r)[0]


def degraded_line(r: records.TrialRecord) -> str | None:
    """The log line saying the server took another allreduce path than configured."""
    try:
        from tasks.failures import detect_perf_findings

        for f in detect_perf_findings(r.log_tail or ""):
            if f.tag == records.DEGRADED:
                return redact_text(f.line.strip())[:MAX_LINE]
    except ImportError:
        pass
    return None


def _words(knob: str) -> list[str]:
    return [w for w in knob.lower().split("_") if len(w) > 2]


def path_line(r: records.TrialRecord, knob: str, level: Any) -> str | None:
    """The server's own log line naming ``knob=level`` (e.g. ``env: NCCL_PROTO=Simple``, the
    allreduce path it took), without its timestamp prefix; None when the log says nothing."""
    if r.status == "ok" and not records.counts_for_level(r) and knob == "allreduce":
        return degraded_line(r)
    lv = str(level).lower()
    words = _words(knob)
    if not words or lv in ("none", "default", "true", "false") or len(lv) < 2:
        return None
    for line in (r.log_tail or "").splitlines():
        low = line.lower()
        if "serverargs(" in low or len(line) > 2 * MAX_LINE:
            continue  # the echo of every flag says nothing about the path taken
        if re.search(rf"(?<![a-z0-9]){re.escape(lv)}(?![a-z0-9])", low) and all(w in low for w in words):
            return redact_text(_PREFIX.sub("", line.strip()))[:MAX_LINE]
    return None
