"""Failure classifier: (server log, exit code, lifecycle phase) -> canonical failure class.

The classifier is a *table* (:data:`SIGNATURES`, loaded from ``failure_signatures.yaml`` by
``tasks.failure_signatures``), not a chain of ifs. Each row names a canonical class, the
regexes that identify it and optional guards (exit codes, a context regex that must or must
not occur, a regex that must occur in the few lines just above the decisive one, the startup
stage of that line, a named numeric check). The first row that matches wins, because SGLang
wraps many root causes in the same generic banners (``Capture cuda graph failed:``,
``Received sigquit from a child process``) and the specific text must be tried first.

When no row matches, a second small table (:data:`FALLBACKS`) applies the exit-code and
phase semantics of a launch (harness-observed classes: ``startup_timeout``,
``server_crash``, ``bench_stall``, ``early_exit``, ...). Anything else is ``unknown``
with a normalized signature so that unknown failures still group.

Signatures are the decisive log line with timestamps, paths, hosts, IPs, ports, hex,
TP/DP/EP ranks and numbers masked (:func:`normalize_line`), so two logs that differ only in
those details give the same signature. Perf findings on a healthy server are in
``tasks.perf_findings`` (re-exported here).

Without a phase (and without an exit code, or exit 0) the phase is read from the log: a log
that never reached the server's ready line (SGLang "The server is fired up and ready to
roll!", vLLM's API server "Application startup complete" / "Uvicorn running") failed at
startup (last progress in distributed init: a collective hang); a log that reached it with no
failure signature is :data:`HEALTHY` (not a failure class: ``failure_class == "healthy"``,
``kind == "healthy"``); :func:`with_speedup` turns a healthy speculative trial at or below
the baseline into ``spec_decode_no_speedup``.

CLI: ``python -m tasks.failures [--exit-code N] [--phase P] [--speedup X | --bench B.json] LOG...``
prints ``PATH<TAB>CLASS<TAB>KIND<TAB>SIGNATURE`` per log (CLASS ``healthy`` for a healthy log).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tasks.failure_signatures import (
    CHECK_NAMES,
    MAX_LINE_CHARS,
    MAX_SIGNATURE_CHARS,
    NEAR_LINES,
    TABLES,
    Signature,
    SignatureTableError,
    normalize_line,
)
from tasks.perf_findings import (
    PerfFinding,
    detect_perf_findings,
    detect_perf_tags,
    first_perf_line,
    spec_bench_finding,
    spec_no_speedup,
)

__all__ = [
    "KIND",
    "PRECEDENCE",
    "SIGNATURES",
    "FALLBACKS",
    "MAX_LINE_CHARS",
    "MAX_SIGNATURE_CHARS",
    "NEAR_LINES",
    "Classification",
    "PerfFinding",
    "Signature",
    "SignatureTableError",
    "classify",
    "harness_classification",
    "detect_perf_findings",
    "detect_perf_tags",
    "normalize_line",
    "spec_no_speedup",
]

#: Canonical class -> kind (``deterministic`` | ``transient`` | ``infra`` | ``perf``), the
#: ``kinds`` section of failure_signatures.yaml (it ships with the code: the node reads no
#: other document).
KIND: dict[str, str] = TABLES.kinds
#: The signature rows in precedence order (first match wins).
SIGNATURES: tuple[Signature, ...] = TABLES.signatures
#: Startup milestones: the stage of a line, and the progress a startup timeout reached.
MILESTONES: tuple[tuple[str, re.Pattern[str]], ...] = TABLES.milestones
#: Class precedence (first match wins), derived from :data:`SIGNATURES`.
PRECEDENCE: tuple[str, ...] = tuple(dict.fromkeys(s.failure_class for s in SIGNATURES))

_SIGKILL = frozenset({-9, 137})
#: The verdict for a log that reached ready with no failure signature (not a key of KIND).
HEALTHY = "healthy"


@dataclass(frozen=True)
class Classification:
    """The classifier's verdict for one trial.

    Attributes:
        failure_class: canonical class id (a key of :data:`KIND`).
        kind: ``deterministic`` | ``transient`` | ``infra`` | ``perf``.
        signature: the decisive line normalized by :func:`normalize_line` (or a
            ``<...>`` description when no log line decided), at most
            :data:`MAX_SIGNATURE_CHARS` chars.
        line: the decisive raw log line ("" when none).
    """

    failure_class: str
    kind: str
    signature: str
    line: str

    @property
    def healthy(self) -> bool:
        """The log shows a healthy server (:data:`HEALTHY`): no failure."""
        return self.failure_class == HEALTHY


def _speedup_check(text: str) -> str | None:
    """Decisive line when the log's bench lines show no speedup over the baseline."""
    f = spec_bench_finding(text)
    return f[0] if f else None


#: The named whole-log checks a row may use (``check:`` in the YAML).
_CHECKS: dict[str, Callable[[str], str | None]] = {
    "spec_decode_no_speedup": _speedup_check,
    "allreduce_path_degraded": lambda text: first_perf_line(text, "allreduce_path_degraded"),
}
if set(_CHECKS) != set(CHECK_NAMES):  # the table validates names against CHECK_NAMES
    raise SignatureTableError(f"checks implemented {sorted(_CHECKS)} != declared {sorted(CHECK_NAMES)}")


@dataclass(frozen=True)
class _Facts:
    exit_code: int | None
    phase: str | None
    sigquit: bool
    traceback: bool
    ready: bool
    last_milestone: str | None


#: Exit-code / phase semantics applied when no signature row matched (what the exit code and
#: the lifecycle phase say, and the harness classes), in order: (why, predicate, class).
FALLBACKS: tuple[tuple[str, Callable[[_Facts], bool], str], ...] = (
    ("still starting at the deadline, last progress in NCCL init: a collective hang",
     lambda f: f.exit_code is None and f.phase == "startup" and f.last_milestone == "dist_init",
     "collective_hang_or_timeout"),
    ("still starting at the deadline", lambda f: f.exit_code is None and f.phase == "startup", "startup_timeout"),
    ("SIGKILL from outside during startup, no sigquit, no traceback, no OOM evidence",
     lambda f: f.exit_code in _SIGKILL and not f.sigquit and not f.traceback and f.phase == "startup",
     "startup_timeout"),
    ("server up but the stream stopped", lambda f: f.exit_code is None and f.phase in ("warmup", "bench"), "bench_stall"),
    ("process group survived teardown", lambda f: f.exit_code is None and f.phase == "teardown", "teardown_timeout"),
    ("exit 0 before the benchmark finished",
     lambda f: f.exit_code == 0 and f.phase in ("startup", "warmup", "bench"), "early_exit"),
    ("exited after it was healthy",
     lambda f: f.exit_code not in (None, 0) and (f.phase in ("warmup", "bench") or f.ready), "server_crash"),
)


# --------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_SIGQUIT = re.compile(r"Received sigquit from a child process")
#: vLLM's API server lines ("(APIServer pid=N) ...", tests/data/vllm_logs) and its ready lines:
#: uvicorn's, unprefixed. SGLang prints the same uvicorn lines *before* its warmup, so they
#: mean ready only in a vLLM log; SGLang's ready line is the ``ready`` milestone of the table.
_VLLM_LOG = re.compile(r"^\(APIServer pid=\d+\)", re.M)
_UVICORN_READY = re.compile(r"Application startup complete|Uvicorn running on")
_ERRORISH = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\b:?|\b(?:ERROR|FATAL|fatal|Fatal)\b|\bNCCL WARN\b")


def _stages(lines: list[str]) -> list[str | None]:
    """Startup stage of each line: the last milestone at or before it."""
    out: list[str | None] = []
    cur: str | None = None
    for line in lines:
        for name, pat in MILESTONES:
            if pat.search(line):
                cur = name
        out.append(cur)
    return out


def _match_row(row: Signature, text: str, lines: list[str], stages: list[str | None],
               exit_code: int | None) -> str | None:
    if row.exit_codes is not None and exit_code not in row.exit_codes:
        return None
    if row.requires is not None and not row.requires.search(text):
        return None
    if row.unless is not None and row.unless.search(text):
        return None
    if row.check is not None:
        return _CHECKS[row.check](text)
    for pat in row.patterns:
        for i, line in enumerate(lines):
            if not pat.search(line):
                continue
            if row.stages is not None and stages[i] not in row.stages:
                continue
            if row.near is not None and not any(row.near.search(x) for x in lines[max(0, i - NEAR_LINES):i + 1]):
                continue
            return line
    return None


def _make(failure_class: str, line: str, fallback_sig: str) -> Classification:
    sig = normalize_line(line) if line.strip() else fallback_sig
    return Classification(failure_class, KIND[failure_class], sig or fallback_sig, line)


def _last_line(lines: list[str], pat: re.Pattern[str] | None = None) -> str:
    for line in reversed(lines):
        if line.strip() and (pat is None or pat.search(line)):
            return line
    return ""


def _classify(log_text: str, exit_code: int | None, phase: str | None) -> Classification:
    text = log_text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    lines = [x[:MAX_LINE_CHARS] for x in text.split("\n")]
    stages = _stages(lines)
    for row in SIGNATURES:
        if not row.patterns and row.check is None:
            continue
        line = _match_row(row, text, lines, stages, exit_code)
        if line is not None:
            return _make(row.failure_class, line, f"<{row.failure_class}>")

    vllm_ready = bool(_VLLM_LOG.search(text)) and bool(_UVICORN_READY.search(text))
    ready = "ready" in stages or vllm_ready
    if phase is None and ready and exit_code in (None, 0):  # reached ready, nothing failed
        line = next((ln for ln, st in zip(lines, stages) if st == "ready"), "") or _last_line(lines, _UVICORN_READY)
        return Classification(HEALTHY, HEALTHY, "<healthy: reached ready, no failure signature>", line)
    if phase is None and exit_code is None:
        phase = "startup"  # still running and never ready: it failed at startup
    facts = _Facts(exit_code, phase, bool(_SIGQUIT.search(text)), bool(_TRACEBACK.search(text)),
                   ready, next((s for s in reversed(stages) if s), None))
    code = "still running" if exit_code is None else f"exit {exit_code}"
    for _why, pred, cls in FALLBACKS:
        if pred(facts):
            if cls in ("startup_timeout", "collective_hang_or_timeout") and exit_code is None:
                progress = [ln for ln, st in zip(lines, stages) if st and st == facts.last_milestone]
                line = _last_line(progress) or _last_line(lines)
            else:
                line = _last_line(lines, _ERRORISH) or _last_line(lines)
            return _make(cls, line, f"<{cls}: no log output, {code}>")
    line = _last_line(lines, _ERRORISH) or _last_line(lines)
    return _make("unknown", line, f"<no log output, {code}>")


def classify(log_text: str, exit_code: int | None = None, phase: str | None = None) -> Classification:
    """Classify one trial's failure (or healthy-server perf finding).

    Args:
        log_text: the server log (any size; harness lines such as
            ``[harness] startup deadline exceeded ...`` or dmesg OOM lines may be appended).
        exit_code: what the parent saw: Popen return code (negative = signal, e.g. -9),
            137-style shell codes, 0 for a clean exit, None while still running / killed by
            the harness.
        phase: lifecycle phase where it failed: ``preflight`` | ``startup`` | ``warmup`` |
            ``bench`` | ``teardown``, or None (inferred from the log when still running).
    Returns:
        A :class:`Classification`; ``unknown`` with a normalized signature when no row and
        no exit-code rule applies.
    Raises:
        Nothing: a classifier bug returns ``unknown`` with a ``<classifier error: ...>``
        signature rather than losing the trial's result.
    """
    try:
        return _classify(str(log_text or ""), exit_code, phase)
    except Exception as e:  # noqa: BLE001 - the result must survive a classifier bug
        return Classification("unknown", KIND["unknown"], f"<classifier error: {type(e).__name__}>", "")


def with_speedup(c: Classification, speedup: float | None) -> Classification:
    """A healthy verdict becomes ``spec_decode_no_speedup`` when the trial's speculative
    decoding ``speedup`` (decode tok/s over the baseline's) is <= 1.0; else ``c`` unchanged."""
    if not c.healthy or speedup is None or speedup > 1.0:
        return c
    return Classification("spec_decode_no_speedup", KIND["spec_decode_no_speedup"],
                          f"<speculative decoding at {speedup:.3f}x the baseline (<= 1.0)>", c.line)


def _bench_speedup(path: str) -> float:
    """Speedup from a bench JSON: ``speedup_vs_baseline``, or ``decode_tok_s`` over
    ``baseline_decode_tok_s`` (top level or under ``metrics``). Raises ValueError when absent."""
    import json

    data = json.loads(Path(path).read_text())
    m = data.get("metrics", data) if isinstance(data, dict) else {}
    if "speedup_vs_baseline" in m:
        return float(m["speedup_vs_baseline"])
    base = m.get("baseline_decode_tok_s", data.get("baseline_decode_tok_s"))
    if "decode_tok_s" in m and base:
        return float(m["decode_tok_s"]) / float(base)
    raise ValueError(f"{path}: no speedup_vs_baseline, nor decode_tok_s + baseline_decode_tok_s")


def harness_classification(failure_class: str, detail: str = "") -> Classification:
    """A classification for a class the harness decides by name (``bench_stall``, ``gpu_busy``...).

    Args:
        failure_class: a key of :data:`KIND`.
        detail: the harness message (normalized into the signature).
    Raises:
        KeyError: ``failure_class`` is not canonical.
    """
    kind = KIND[failure_class]
    sig = normalize_line(detail) if detail.strip() else f"<{failure_class}>"
    return Classification(failure_class, kind, sig, detail)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------
def _exit_code_arg(s: str) -> int | None:
    return None if s.lower() in ("none", "null", "") else int(s)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m tasks.failures [--exit-code N] [--phase P] LOG...``; returns 0, or 2 on unreadable files."""
    p = argparse.ArgumentParser(prog="python -m tasks.failures", description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", metavar="LOG", help="server log file(s)")
    p.add_argument("--exit-code", type=_exit_code_arg, default=None,
                   help="exit code the parent saw (int, or 'none' = still running)")
    p.add_argument("--phase", choices=["preflight", "startup", "warmup", "bench", "teardown"], default=None)
    sp = p.add_mutually_exclusive_group()
    sp.add_argument("--speedup", type=float, default=None,
                    help="speculative trial's decode speedup over the baseline (a healthy log <= 1.0 is spec_decode_no_speedup)")
    sp.add_argument("--bench", default=None, help="bench JSON with speedup_vs_baseline (or decode_tok_s + baseline_decode_tok_s)")
    a = p.parse_args(list(argv) if argv is not None else None)
    speedup = _bench_speedup(a.bench) if a.bench else a.speedup
    rc = 0
    for path in a.logs:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError as e:
            print(f"{path}: {e.strerror}", file=sys.stderr)
            rc = 2
            continue
        c = with_speedup(classify(text, a.exit_code, a.phase), speedup)
        print(f"{path}\t{c.failure_class}\t{c.kind}\t{c.signature}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
