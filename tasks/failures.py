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
prints per log its class, kind, stage, decisive line and the nearest entries of the public
corpus (``tasks/failure_corpus``) with their threads; ``--tsv`` prints
``PATH<TAB>CLASS<TAB>KIND<TAB>SIGNATURE`` per log instead (CLASS ``healthy`` for a healthy log).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from tasks.failure_corpus import PARTS
from tasks.failure_events import ERROR, ERRORISH, FATAL, WARN, LogView, strip_prefixes
from tasks.failure_signatures import (
    CHECK_NAMES,
    MAX_LINE_CHARS,
    MAX_SIGNATURE_CHARS,
    NEAR_LINES,
    TABLES,
    RaisedIn,
    Signature,
    SignatureTableError,
    normalize_line,
)
from tasks.perf_findings import (
    PerfFinding,
    detect_perf_findings,
    detect_perf_tags,
    first_perf_line,
    requested_paths,
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
#: the rows whose line reports a wait (``waited_past``: :meth:`_Log._waited_out`)
_WAIT_ROWS: tuple[Signature, ...] = tuple(r for r in SIGNATURES if r.waited_past)
#: Where a crash was raised: (class, frame regex, source, stages), the ``raised_in`` section of
#: failure_signatures.yaml, tried on a traceback's innermost frames when no row matched.
RAISED_IN: tuple[RaisedIn, ...] = TABLES.raised_in
#: Innermost ``File "..."`` frames of a traceback that :data:`RAISED_IN` reads: the raising
#: function, its caller and one more (deeper frames are the engine's generic call path).
INNERMOST_FRAMES = 3
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
        phase: the startup milestone the decisive line falls in (:data:`PHASE_NAMES`: ``weights``,
            ``graph capture``, ``ready``, ``first request``...), "" when the log shows none.
    """

    failure_class: str
    kind: str
    signature: str
    line: str
    phase: str = ""

    @property
    def decisive_line(self) -> str:
        """:attr:`line` as a person reads it: control characters dropped, stripped, at most
        :data:`MAX_SIGNATURE_CHARS` chars ("" when no line decided)."""
        return strip_control(self.line).strip()[:MAX_SIGNATURE_CHARS]

    @property
    def healthy(self) -> bool:
        """The log shows a healthy server (:data:`HEALTHY`): no failure."""
        return self.failure_class == HEALTHY


def _speedup_check(text: str) -> str | None:
    """Decisive line when the log's bench lines show no speedup over the baseline."""
    f = spec_bench_finding(text)
    return f[0] if f else None


#: The named whole-log checks a row may use (``check:`` in the YAML), given the log and the exit
#: code. With no exit code (a log alone) no trial says which all-reduce path it expected, and both
#: engines warn that custom all-reduce is off on every PCIe node, asked for or not: only a path the
#: log's own argument dump asked for counts there.
_CHECKS: dict[str, Callable[[str, int | None], str | None]] = {
    "spec_decode_no_speedup": lambda text, code: _speedup_check(text),
    "allreduce_path_degraded": lambda text, code: first_perf_line(
        text, "allreduce_path_degraded", None if code is not None else requested_paths(text)),
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
#: Which engine wrote a log: vLLM's process tags and names, SGLang's names and progress lines.
#: SGLang prints uvicorn's "Application startup complete" *before* its warmup, so uvicorn's
#: lines (the ``api_up`` milestone) mean ready only in a vLLM log.
_VLLM_LOG = re.compile(r"\((?:APIServer|EngineCore\w*|VllmWorker\w*|Worker_TP\w*|Worker)\s+pid=\d+|\bvllm\b|\bvLLM\b"
                       r"|^(?:INFO|WARNING|ERROR|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./]+\.py:\d+\]", re.M)
_SGLANG_LOG = re.compile(r"\bsglang\b|Load weight begin|Capture cuda graph|fired up and ready|Scheduler hit an exception")
#: Lines our harness (or the kernel's OOM killer) appended: evidence about the node and the
#: lifecycle, never a ready line of the engine even when they quote one.
_HARNESS = re.compile(r"^\s*\[(?:harness|dmesg)\]")
_NOT_READY = re.compile(r"never (?:became|got|reached) ready|not ready|startup deadline exceeded|did not become ready", re.I)
#: A launcher or client polling the server that is still not up ("Attempt 23: Please wait for
#: sglang server to become ready...", "Waiting for the vLLM server to start", "server not ready
#: yet, retrying"): said again and again, evidence of waiting on a server that never came up.
_POLLING = re.compile(r"\b(?:wait(?:ing)?|poll(?:ing)?|retry(?:ing)?)\b.{0,40}\b(?:server|engine|endpoint|api)\b.{0,40}"
                      r"\b(?:ready|up|start(?:ed|s)?|respond\w*|available|online)\b"
                      r"|\b(?:server|engine|endpoint|api)\b.{0,30}\b(?:is )?not (?:yet )?(?:ready|up|available|responding)\b",
                      re.I)
#: How many polling lines make the evidence (one "waiting for ..." line is a step of a startup).
POLLING_LINES = 2
#: Stages whose line shows the server up or its work done, whatever the engine: its ready line, a
#: request served, a measured result (a test's or a benchmark's, with no server line). vLLM's
#: ``api_up`` counts too, in a vLLM log only (SGLang logs uvicorn's lines before its warmup).
_UP_STAGES = ("ready", "first_request", "result")
#: The startup's milestones in the order a server passes them: the table's ``milestones``, in its
#: order, up to ``ready`` (the serving stages after it are not the startup's).
_MILESTONE_NAMES = [name for name, _ in MILESTONES]
_STARTUP_ORDER = {name: n for n, name in enumerate(_MILESTONE_NAMES[:_MILESTONE_NAMES.index("ready") + 1])}
#: Human names of the startup milestones (``milestones`` of failure_signatures.yaml).
PHASE_NAMES = {None: "start", "dist_init": "distributed init", "dist_ready": "distributed init done",
               "load": "weights", "loaded": "weights loaded", "compile": "torch.compile",
               "kv_cache": "KV cache", "capture": "graph capture", "captured": "graph capture done",
               "api_up": "API server up", "ready": "ready", "serving": "serving a batch",
               "first_request": "requests served", "result": "results printed"}


class _Log:
    """One log, read once: its events (:class:`tasks.failure_events.LogView`), the startup
    stage of each line, and the text the whole-log guards search."""

    def __init__(self, text: str) -> None:
        self.view = v = LogView(text, MAX_LINE_CHARS)
        form_stage: list[str | None] = [None] * len(v.forms)
        for k in v.scan:  # a big log's chatter (no trigger word, not head or tail) is no milestone
            body = v.forms[k].body
            if not _HARNESS.match(body):
                # the latest milestone a line matches wins, so the first from the end decides:
                # a serving log's lines match late ones (a request, a result) in one or two searches
                form_stage[k] = next((name for name, pat in reversed(MILESTONES) if pat.search(body)), None)
        stages: list[str | None] = []
        cur: str | None = None
        for k in v.keys:
            if form_stage[k] is not None:
                cur = form_stage[k]
            stages.append(cur)
        self.stages = stages
        self.form_stage = form_stage
        self.reached = {s for s in form_stage if s}
        #: the lines that are a report's count of failed requests above zero (:data:`_FAILED_COUNT`),
        #: read line by line: lines that differ only in their digits share one form, whose body is
        #: its first line's ("Failed requests: 0" would hide a later run's "Failed requests: 3")
        self.failed_requests = {i for i, ln in enumerate(v.lines) if "ailed request" in ln and _FAILED_COUNT.search(ln)}
        self.candidates = self._candidates()
        self._first: dict[re.Pattern[str], int] = {}  # _first_line's answers, per pattern
        self.waited_out = self._waited_out()
        #: every distinct line scanned once, in order of first appearance (what requires/unless search)
        read = sorted(v.scan)
        self.text = "\n".join(v.forms[k].body for k in read) + "\n" + "\n".join(v.form_lines[k] for k in read)

    def _candidates(self) -> range | set[int]:
        """The forms the rows are tried on: all of them, or in a log of more than
        :data:`tasks.failure_events.MAX_FORMS_ALL` distinct lines (a server that logs every
        request's prompt) the ones that rank WARN or above and the two lines after each (a
        warning's text often continues on the next line)."""
        v = self.view
        if not v.big:
            return range(len(v.forms))
        out: set[int] = set()
        keys, sev = v.keys, v.severity
        for i, s in enumerate(sev):
            if s >= WARN:
                out.update(keys[i:i + 3])
        return out

    def row_line(self, row: Signature, exit_code: int | None) -> int | None:
        """Index of the decisive line of ``row``: among the lines its patterns match that pass
        its guards, the first of the highest severity; None when the row does not apply."""
        if row.exit_codes is not None and exit_code not in row.exit_codes:
            return None
        v = self.view
        forms = v.forms
        hit_forms = {k for k in self.candidates for pat in row.patterns
                     if pat.search(forms[k].body) and not (row.line_unless is not None and row.line_unless.search(forms[k].body))}
        if not hit_forms:
            return None
        # the whole-log guards after the lines: each is a scan of every distinct line (~10-40 ms
        # on a 10 MB log of distinct lines), and most rows match no line at all
        if row.requires is not None and not row.requires.search(self.text):
            return None
        if row.unless is not None and row.unless.search(self.text):
            return None
        best, best_sev = None, -1
        for i, k in enumerate(v.keys):
            if k not in hit_forms or _tier(v.severity[i]) <= best_sev:
                continue
            if row.stages is not None and self.stages[i] not in row.stages:
                continue
            if row.near is not None and not self._near(row.near, i):
                continue
            if row.not_near is not None and self._near(row.not_near, i):
                continue
            if row.unless_before is not None and self._first_line(row.unless_before) < i:
                continue
            best, best_sev = i, _tier(v.severity[i])
        if best is not None and row.first_error and not self._first_error(best):
            return None
        if best is not None and row.waited_past and best in self.waited_out:
            return None
        return best

    def _first_error(self, i: int) -> bool:
        """Line ``i`` is not a warning, is the log's first error (no ERROR or fatal line before
        its own traceback) and no ready or serving line follows it (in a vLLM log, its API server
        up too: vLLM starts it only once its engine is up)."""
        v = self.view
        if v.severity[i] == WARN:
            return False
        lo = min(i, v.tb_start[i])
        if any(v.severity[j] >= ERROR and v.quotable(j) for j in range(lo)):
            return False
        up = ("ready", "first_request", "serving") + (("api_up",) if self.vllm else ())
        return not any(self.stages[j] in up for j in range(i + 1, len(v.keys)))

    @functools.cached_property
    def vllm(self) -> bool:
        """A vLLM log: its process tags or names, and none of SGLang's lines."""
        return bool(_VLLM_LOG.search(self.text)) and not _SGLANG_LOG.search(self.text)

    def _waited_out(self) -> set[int]:
        """The lines of a wait the startup went on past: a ``waited_past`` row's notices, when a
        line after the last one is a startup milestone later than the stage that notice fell in
        (outside any traceback, below WARN). They rank as warnings from here on: the wait was
        survived, so it is neither a row's verdict nor the fatal event an unknown quotes.

        Only the startup's own advance counts. A request arriving, a health probe answered or a
        throughput line is no sign that a hung engine went on (vLLM's API server answers while
        its engine core hangs, and another data-parallel engine keeps serving), and a milestone
        of a stage the log had already reached is a late line of another process (Ray forwards a
        remote worker's lines minutes late)."""
        v = self.view
        out: set[int] = set()
        for row in _WAIT_ROWS:
            hits = self._lines_matching(*row.patterns)
            if not hits:
                continue
            at = _STARTUP_ORDER.get(self.stages[hits[-1]], -1)
            if any(_STARTUP_ORDER.get(self.form_stage[v.keys[j]], -1) > at and v.severity[j] < WARN
                   and not v.frame[j] and v.tb_start[j] == j for j in range(hits[-1] + 1, len(v.keys))):
                out.update(hits)
        for i in out:
            v.severity[i] = min(v.severity[i], WARN)
        return out

    def _lines_matching(self, *pats: re.Pattern[str]) -> list[int]:
        """Indices, in order, of the scanned lines whose body one of ``pats`` matches (each
        distinct line searched once)."""
        v = self.view
        forms = {k for k in v.scan if any(p.search(v.forms[k].body) for p in pats)}
        return [i for i, k in enumerate(v.keys) if k in forms] if forms else []

    def _first_line(self, pat: re.Pattern[str]) -> int:
        """Index of the first scanned line ``pat`` matches (its body), or the log's length."""
        if pat not in self._first:
            hits = self._lines_matching(pat)
            self._first[pat] = hits[0] if hits else len(self.view.keys)
        return self._first[pat]

    def _near(self, pat: re.Pattern[str], i: int) -> bool:
        lo = min(max(0, i - NEAR_LINES), self.view.tb_start[i])
        return any(pat.search(self.view.body(j)) for j in range(lo, i + 1))


def _tier(severity: int) -> int:
    """Rank of a matched line for the choice between rows: error evidence (an exception, a CUDA
    error, an ERROR line, an ``NCCL WARN`` line: NCCL reports its errors as WARN) or not. An
    exception often wraps the specific line above it (``NCCL error: invalid usage`` under NCCL's
    ``no algorithm/protocol available``), so FATAL does not outrank ERROR here."""
    return min(severity, ERROR)


_FILE_FRAME = re.compile(r'^\s*File "')


def _crash_traceback(v: LogView, d: int | None) -> tuple[range, int | None] | None:
    """The traceback a crash is read from, as (its lines, its exception line or None): the one
    that ends on the decisive exception line ``d``, else the one the log ends inside (an excerpt
    cut before its exception line); None when the log shows neither."""
    if d is not None and v.severity[d] == FATAL and v.tb_start[d] < d:
        return range(v.tb_start[d], d), d
    last = next((i for i in range(len(v.lines) - 1, -1, -1) if v.lines[i].strip()), None)
    if last is not None and (v.frame[last] or _TRACEBACK.search(v.body(last))):
        return range(v.tb_start[last], last + 1), None
    return None


#: Non-empty lines at the end of a log where an error line without a level (``nvshmem
#: initialization failed, exiting``) still reads as how the process ended.
TAIL_ERROR_LINES = 10


def _tail_start(v: LogView) -> int:
    """Index of the first of the last :data:`TAIL_ERROR_LINES` non-empty lines of the log."""
    seen, i = 0, len(v.lines)
    while i > 0 and seen < TAIL_ERROR_LINES:
        i -= 1
        seen += bool(v.lines[i].strip())
    return i


#: An HTTP access-log line (uvicorn's / aiohttp's ``"POST /generate HTTP/1.1" 200``): a request to a path
#: starting with ``path`` (a regex) answered with a status whose first digit matches ``status``.
_ACCESS_LINE = r'"(?:GET|POST|PUT|PATCH|DELETE) /{path}\S* HTTP/\d(?:\.\d)?" {status}\d\d\b'
#: An access-log line of a request the server answered (not with a 5xx): served, even when refused.
_ANSWERED = re.compile(_ACCESS_LINE.format(path="", status="[1-4]"))
#: An access-log line of a request (not a health probe) the server answered 5xx: a request that
#: failed, which the requests answered after it do not undo (the harness's server_http_error).
_FAILED_REQUEST = re.compile(_ACCESS_LINE.format(path="(?!health|ready|ping)", status="5"))


def _ended_in_error(log: _Log) -> int | None:
    """The line a log alone ended on an error with: the last of its last :data:`TAIL_ERROR_LINES`
    non-empty lines that says something failed (an error word, not a warning, not NCCL's own
    lines: NCCL warns beside a hang) with no request served after it; None when there is none.

    An engineer reading a posted log that stops on a request's or a transfer's failure (``Decode
    transfer failed for request ... KVTransferError``) reads how it ended, however healthy the
    server was before: the reporter posted it for that line."""
    v = log.view
    for i in range(len(v.lines) - 1, _tail_start(v) - 1, -1):
        if v.severity[i] == WARN or not v.quotable(i) or v.forms[v.keys[i]].component == "nccl":
            continue
        # the line's own text, not its form's (a report's "Failed requests: 0" shares the form
        # of an earlier run's "Failed requests: 3"): the last few lines only, so it costs little
        if ERRORISH.search(strip_prefixes(v.lines[i])[0]):
            answered = any(_ANSWERED.search(v.body(j)) for j in range(i + 1, len(v.lines)))
            return None if answered or _served_after(log, i, past_all=False) else i
    return None


#: A call on a frame's source line (``cuda_graph_memory_bytes = self.model_runner.capture_model()``).
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
#: Frames of pass-through wrappers (torch's ``@torch.inference_mode()`` / ``no_grad`` decorator,
#: ``nn.Module.__call__``, vLLM's tracing wrapper): an excerpt cut in one is inside the call on the
#: source line above it (``self.model_runner.capture_model(...)`` then ``_contextlib.py ... in
#: decorate_context``: it stopped in ``capture_model``).
_WRAPPER_FRAME = re.compile(r'torch/utils/_contextlib\.py", line \d+, in decorate_context\b'
                            r'|torch/nn/modules/module\.py", line \d+, in _(?:wrapped_)?call_impl\b'
                            r'|vllm/tracing/\w+\.py", line \d+, in \w*wrapper\b')
#: vLLM's worker wrapper naming the method a worker failed in, just above its traceback
#: (worker_base.py execute_method: "Error executing method initialize_cache. This might cause
#: deadlock in distributed execution.", later "Error executing method 'load_model'. ...").
_EXECUTING = re.compile(r"Error executing method '?(\w+)'?")
#: Lines above a traceback searched for :data:`_EXECUTING`.
EXECUTING_LINES = 3
#: The class of a crash in a startup stage when nothing names its cause: whatever fails while
#: the graphs are captured fails the capture (SGLang wraps every such exception in its own
#: "Capture cuda graph failed:" banner, cuda_graph_capture_failed_other's row).
STAGE_CLASS = {"capture": "cuda_graph_capture_failed_other"}
#: vLLM v0's KV-cache check (worker/worker.py raise_if_cache_size_invalid: "The model's max seq
#: len (M) is larger than the maximum number of tokens that can be stored in KV cache (B x S)")
#: read from the numbers the log prints before it: "# GPU blocks: B", the engine config's
#: max_seq_len / max_model_len, its block_size (16 when the log does not say).
_GPU_BLOCKS = re.compile(r"# GPU blocks: (\d+)")
_MAX_LEN = re.compile(r"\bmax_(?:seq|model)_len=(\d+)")
_BLOCK_SIZE = re.compile(r"\bblock_size=(\d+)")
DEFAULT_BLOCK_SIZE = 16


def _kv_cache_short(text: str) -> bool:
    """The log's own numbers show a KV cache that cannot hold one sequence of the model's max
    length (vLLM v0's check, :data:`_GPU_BLOCKS`)."""
    blocks, max_len = _GPU_BLOCKS.findall(text), _MAX_LEN.findall(text)
    if not blocks or not max_len:
        return False
    size = _BLOCK_SIZE.findall(text)
    return int(blocks[-1]) * int(size[-1] if size else DEFAULT_BLOCK_SIZE) < int(max_len[-1])


def _call_stage(calls: list[str]) -> str | None:
    """The startup stage a call names as a frame would (``capture_model`` -> ``capture``), else None."""
    found = None
    for c in calls:
        for name, pat in MILESTONES:
            if pat.search(f"in {c}"):
                found = name
    return found


def _read_crash(log: _Log, frames: range, exc: int | None) -> tuple[str | None, int, str | None]:
    """(class, decisive line, stage) of a crash no family named, read from where it happened,
    as an engineer reads a stack; the class is None when nothing names it (the stage still says
    where it happened).

    The frames looked at, innermost first: the call an excerpt cut before its exception line
    stops in (the calls on the source line under its last ``File`` line, as a frame
    ``in <call>``), the last :data:`INNERMOST_FRAMES` ``File`` lines, the method vLLM's worker
    wrapper says failed (:data:`_EXECUTING`). The first one a :data:`RAISED_IN` entry names (in
    its stages) gives the class; else the stage of the crash may (:data:`STAGE_CLASS`), or, in
    the KV-cache stage, the log's own KV numbers (:func:`_kv_cache_short`). The stage is the
    innermost call's when it names one, else the crash line's.
    """
    v = log.view
    files = [i for i in frames if _FILE_FRAME.match(v.body(i))]
    end = exc if exc is not None else frames[-1]
    calls: list[str] = []
    if exc is None and files:
        # the innermost frame that is not a pass-through wrapper: its source line is the call running
        k = len(files) - 1
        while k > 0 and _WRAPPER_FRAME.search(v.body(files[k])):
            k -= 1
        stop = files[k + 1] if k + 1 < len(files) else frames.stop
        src = next((v.body(j) for j in range(files[k] + 1, stop) if v.body(j).strip().strip("^~ ")), "")
        calls = _CALL.findall(src)
    stage = _call_stage(calls) or log.stages[end]
    line = files[-1] if exc is None and files else end  # a cut excerpt: its innermost File line
    above = range(max(0, frames.start - EXECUTING_LINES), frames.start + 1)
    methods = [(f"in {m.group(1)}", j) for j in above if (m := _EXECUTING.search(v.body(j)))]
    looked = [(f"in {c}", line) for c in calls] + [(v.body(i), i) for i in reversed(files[-INNERMOST_FRAMES:])] + methods
    for text, i in looked:
        for e in RAISED_IN:
            if e.frames.search(text) and (e.stages is None or stage in e.stages):
                return e.failure_class, i, stage
    if stage in STAGE_CLASS:
        return STAGE_CLASS[stage], line, stage
    if stage == "kv_cache" and _kv_cache_short(log.text):
        return "kv_cache_pool_too_small", line, stage
    return None, line, stage


def _make(failure_class: str, line: str, fallback_sig: str, phase: str = "") -> Classification:
    sig = normalize_line(line) if line.strip() else fallback_sig
    return Classification(failure_class, KIND[failure_class], sig or fallback_sig, line, phase)


def _last_line(lines: list[str], pat: re.Pattern[str] | None = None) -> str:
    for line in reversed(lines):
        if line.strip() and (pat is None or pat.search(line)):
            return line
    return ""


def _last_unserved(log: _Log, pat: re.Pattern[str]) -> str:
    """The last line matching ``pat`` that no serving line (a request answered, a batch's
    metrics) follows, else "": a line the server served past (vLLM's fd-limit advice at start,
    "failed to automatically increase" its ulimit) is not why it later failed."""
    v = log.view
    served = [j for j, k in enumerate(v.keys) if log.form_stage[k] in ("first_request", "serving")]
    return _last_line(v.lines[served[-1] + 1:] if served else v.lines, pat)


#: A dump of a process's threads: py-spy's (``Pyspy dump for PID``, ``Thread 499 (idle): "MainThread"``)
#: and Python faulthandler's (``Thread 0x00007f... (most recent call first):``, ``Current thread 0x...``).
_THREAD_DUMP = re.compile(r'Pyspy dump for PID|^\s*Thread (?:\d+|0x[0-9a-f]+) \((?:idle|active|gil|most recent call first)'
                          r'|^\s*Current thread 0x[0-9a-f]+', re.I)


def _dumped_after_serving(log: _Log) -> int | None:
    """The first line of a dump of a process's threads after the log's last sign of serving, else
    None: someone (a watchdog, the reporter) dumped a process that was stuck or dying, which a
    healthy server is not."""
    v, dump = log.view, None
    for j in range(len(v.lines) - 1, -1, -1):
        if log.form_stage[v.keys[j]] == "first_request":
            break
        if _THREAD_DUMP.search(v.body(j)):
            dump = j
    return dump


#: vLLM's periodic engine metrics (v0 metrics.py and v1 loggers.py: "Avg prompt throughput: X
#: tokens/s, Avg generation throughput: Y tokens/s, Running: N reqs, ...").
_METRICS = re.compile(r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                      r"Running: (\d+) reqs")
#: Metric lines (10 s apart) ending a log with requests running and no token made: a stall.
STALL_LINES = 3


#: A monitor polling the server (Prometheus scraping /metrics, a probe on /health or /ping, a
#: client listing models): answered while the engine makes no token, so no sign of progress.
_SCRAPE = re.compile(r'"GET /(?:metrics|health\w*|ping|v1/models)\S* HTTP/1\.[01]" \d{3}')


def _stalled(v: LogView) -> int | None:
    """The first of the metric lines a log ends on when each of its last :data:`STALL_LINES`
    non-empty lines (a monitor's scrapes between them aside, :data:`_SCRAPE`) says requests are
    running and no token was made (the stream stopped while the server stayed up: bench_stall),
    else None."""
    seen, first = 0, None
    for j in range(len(v.lines) - 1, -1, -1):
        if not v.lines[j].strip() or _SCRAPE.search(v.lines[j]):
            continue  # a monitor's scrape between the metric lines makes no token
        m = _METRICS.search(v.lines[j])
        if not m or float(m.group(1)) or float(m.group(2)) or not int(m.group(3)):
            break
        seen, first = seen + 1, j
    return first if seen >= STALL_LINES else None


def _readable_last(v: LogView) -> str:
    """The line an unknown with no progress and no error quotes: the last quotable line that says
    something failed, else the last quotable line, never binary noise (undecodable bytes); ""
    when no line is text."""
    text = [i for i in range(len(v.lines)) if v.quotable(i) and "\ufffd" not in v.lines[i] and v.lines[i].isprintable()]
    i = next((i for i in reversed(text) if ERRORISH.search(v.body(i))), text[-1] if text else None)
    return v.lines[i] if i is not None else ""


#: a benchmark report's count of requests that failed, above zero (vLLM's and SGLang's "Failed
#: requests: 3", LMDeploy's profile_restful_api "number of failed requests: 987")
_FAILED_COUNT = re.compile(r"(?i)(?<!retried )\b(?:number of )?failed requests\s*[:=|]\s*0*[1-9]")


#: what a benchmark run was asked to send, in the order a log shows it: the command line's
#: ``--num-prompts N`` (SGLang's bench_serving, vLLM's ``vllm bench serve`` / benchmark_serving.py)
#: or its echoed ``Namespace(... num_prompts=N ...)``; a dataset's own count ("Total prompts: N",
#: bench_serving's generated-shared-prefix statistics: that dataset sends groups x prompts per
#: group, whatever ``--num-prompts`` says, sglang bench_serving.py
#: sample_generated_shared_prefix_requests). Not a progress bar's total: another tool of the same
#: log (a gsm8k run's ``1319/1319``) draws one too
_ASKED = re.compile(r"--num[-_]prompts[= ]+(\d+)\b|\bnum_prompts=(\d+)\b|\bTotal prompts:\s*(\d+)\s*$")
_SUCCESSFUL = re.compile(r"\bSuccessful requests:\s*(\d+)\s*$")


def _failed_report(log: _Log) -> int | None:
    """The first benchmark report line that says some requests failed: its own failed count
    above zero (``Failed requests: 50``), or ``Successful requests: M`` below what that run was
    asked to send (the latest of :data:`_ASKED` before the report: ``--num-prompts 3000`` ...
    ``Successful requests: 1648``, where neither bench_serving nor the server printed why).
    None when no report in the log shows a shortfall."""
    if log.failed_requests:
        return min(log.failed_requests)
    asked: int | None = None
    ignored = False  # this run's dataset ignores --num-prompts (its flags may span several lines)
    for i, line in enumerate(log.view.lines):
        # each raw line's own text (the patterns are unanchored, so prefixes do not matter):
        # report lines differ only in their digits (one form for all runs)
        if "uccessful requests" in line:
            m = _SUCCESSFUL.search(line)
            if m and asked is not None and int(m.group(1)) < asked:
                return i
            asked, ignored = None, False  # the next run states its own
            continue
        if "generated-shared-prefix" in line:
            asked, ignored = None, True
        if "prompts" in line:
            found = _ASKED.findall(line)
            if found:  # argparse keeps the last of a repeated flag
                flag, ns, total = found[-1]
                if total or not ignored:
                    asked = int(total or flag or ns)
    return None


#: A readiness or metadata probe answered (Kubernetes' /health, a client's /v1/models): the API
#: server is up, but it answers these while its engine hangs (vLLM V1's API server, vllm#36451),
#: so they are no request served past an error.
_PROBE = re.compile(r'"GET /(?:health|health_generate|v1/models|get_model_info|model_info|get_server_info|server_info'
                    r'|metrics|ping)\b[^"]*" 200\b')


def _served_after(log: _Log, i: int, *, past_all: bool) -> bool:
    """The server served requests (SGLang's / vLLM's per-batch lines, a request answered) after
    line ``i`` and before the next fatal event (``past_all``: after every fatal event of the log):
    what line ``i`` reported (vLLM's shm-broadcast wait while a big model compiles, a kernel
    falling back, one request's error) was survived, as a slow but healthy server does.

    A measured result of the work (the ``result`` stage: a test's bandwidth, a benchmark's
    throughput) counts after a warning or an error line, never after a fatal one: a test's stdout
    can be flushed after its crash's traceback, where no server went on serving. Nor after a
    report's own count of failed requests (LMDeploy's "number of failed requests: 987" above its
    throughput): the throughput is of the few that passed."""
    v, keys = log.view, log.view.keys
    start = i
    if past_all:
        start = max([i] + [j for j, s in enumerate(v.severity) if s == FATAL and not _HARNESS.match(v.body(j))])
    failed = log.failed_requests
    served = ("first_request",) if v.severity[start] == FATAL or start in failed else ("first_request", "result")
    for j in range(start + 1, len(keys)):
        if log.form_stage[keys[j]] in served and not _PROBE.search(v.body(j)):
            return True
        if j in failed:
            served = ("first_request",)
        if v.severity[j] == FATAL and not _HARNESS.match(v.body(j)):
            return False
    return False


#: Terminal escape sequences (OSC ``ESC ] ... BEL|ST`` such as a window title, CSI ``ESC [ ... X``
#: such as colours and clear-screen, two-byte ``ESC X``) and the other control characters (C0 but
#: tab and newline, DEL, C1): a log captured from a terminal wraps its lines in them, and echoed
#: raw they would retitle or clear the reader's terminal (ECMA-48 defines the sequence forms).
_CONTROL = re.compile(r"\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]?"
                      r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_CHAR = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_control(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (tab and newline kept;
    a carriage return must already be a newline): what a terminal would show, safe to print."""
    # the char-class scan is ~3x cheaper than the substitution on a clean 10 MB log
    return _CONTROL.sub("", text) if _CONTROL_CHAR.search(text) else text


#: Typographic quotes back to ASCII (``File “x.py”`` is a frame, ``KeyError: ‘model.x’`` a key).
_CURLY = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


#: A traceback pasted with its newlines lost (a web form or a chat turned them into spaces): the
#: banner and its first frame on one line.
_FOLDED_TB = re.compile(r"^.*Traceback \(most recent call last\):[ \t]+File \".*$", re.M)
#: Where the lost newlines were: before a frame or a chained-exception banner (2+ spaces), before
#: a frame's source line (its 4-space indent: 3+ spaces), before an exception line.
_FOLD_POINT = re.compile(r"[ \t]+(?=Traceback \(most recent call last\)|File \"|During handling of the above exception"
                         r"|The above exception was the direct cause)|[ \t]{3,}"
                         r"|[ \t]+(?=(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt): )")


#: A frame of IPython's / Jupyter's traceback: ``File ~/env/lib/.../llm.py:123, in LLM.__init__(self, ...)``.
_IPY_FRAME = re.compile(r"^([ \t]*)File ((?:~|/|[A-Za-z]:\\)[^\n]*?\.py):(\d+), in (?:[\w<>]+\.)*([\w<>]+)\b.*$", re.M)


def _ipython_frames(text: str) -> str:
    """``text`` with IPython's / Jupyter's frames written as Python's (``File "path", line N, in
    f``), so where a notebook's exception was raised reads as in any traceback."""
    return _IPY_FRAME.sub(lambda m: f'{m.group(1)}  File "{m.group(2)}", line {m.group(3)}, in {m.group(4)}', text)


def _unfold(text: str) -> str:
    """``text`` with each traceback that was pasted on one line (its newlines turned into spaces)
    split back into its lines, so its frames and exception line read as a traceback."""
    def point(m: re.Match[str]) -> str:  # a frame indented 2, its source line 4, the rest at 0
        after = m.string[m.end():m.end() + 6]
        return "\n  " if after.startswith('File "') else "\n    " if len(m.group(0)) >= 3 else "\n"

    out, pos, banner = [], 0, "Traceback (most recent call last):"
    while (hit := text.find(banner, pos)) >= 0:  # only the lines holding a banner are looked at
        start = text.rfind("\n", 0, hit) + 1
        end = text.find("\n", hit)
        end = len(text) if end < 0 else end
        line = text[start:end]
        if _FOLDED_TB.match(line):
            out += [text[pos:start], _FOLD_POINT.sub(point, line)]
            pos = end
        else:
            out.append(text[pos:end])
            pos = end
        if pos >= len(text):
            break
    return "".join(out) + text[pos:]


#: A line that starts with its timestamp (a console's or a collector's own column).
_LEAD_TS = re.compile(r"^[ \t]*(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?", re.M)
#: Timestamped lines looked at to tell a newest-first log (enough to see its order).
ORDER_SAMPLE = 50
#: Characters at the head of a log searched for those timestamps (a big log is not scanned whole).
ORDER_HEAD_CHARS = 200_000


def _oldest_first(text: str) -> str:
    """``text`` in the order it was written: a log copied from a console that shows the newest
    line first (its leading timestamps only decrease) is put back oldest first, block by block (a
    timestamped line and the lines under it up to the next one stay together)."""
    stamps = []
    for m in _LEAD_TS.finditer(text, 0, ORDER_HEAD_CHARS):
        stamps.append((m.group(1), m.group(2), float("0." + (m.group(3) or "0"))))
        if len(stamps) >= ORDER_SAMPLE:
            break
    pairs = list(zip(stamps, stamps[1:]))
    if len(stamps) < 3 or any(b > a for a, b in pairs) or sum(b < a for a, b in pairs) < 2:
        return text
    starts = [m.start() for m in _LEAD_TS.finditer(text)]
    blocks = [text[a:b].rstrip("\n") for a, b in zip(starts, starts[1:] + [len(text)])]
    return text[:starts[0]] + "\n".join(reversed(blocks)) + "\n"


def _polled(log: _Log) -> bool:
    """A client or launcher kept polling a server that never came up: at least
    :data:`POLLING_LINES` lines (not our harness's) say it is waiting for the server."""
    v = log.view
    hit = {k for k in v.scan if not _HARNESS.match(v.forms[k].body) and _POLLING.search(v.forms[k].body)}
    return bool(hit) and sum(1 for k in v.keys if k in hit) >= POLLING_LINES


def _classify(log_text: str, exit_code: int | None, phase: str | None) -> Classification:
    text = strip_control(log_text.replace("\r\n", "\n").replace("\r", "\n"))
    if "\u201c" in text or "\u2018" in text:  # a log pasted through a rich-text editor: its quotes curled
        text = text.translate(_CURLY)
    if "(most recent call last):" in text:
        text = _unfold(text)
    if "(most recent call last)" in text and ".py:" in text:
        text = _ipython_frames(text)
    text = _oldest_first(text)
    log = _Log(text)
    v, lines, stages = log.view, log.view.lines, log.stages
    # the decisive event: a row matching an error line (ERROR or FATAL) outranks any row
    # matching only a warning or an info line; among those, the table's precedence decides
    best: tuple[int, int, int, str] | None = None  # (severity, -row index, line, class)
    alone = phase is None and exit_code in (None, 0)
    for n, row in enumerate(SIGNATURES):
        if row.check is not None:
            # a perf finding is of a server that came up: with no exit code (still running, or a log
            # alone) the log must show it up; a server killed while starting is no perf finding
            up = exit_code is not None or any(s in log.reached for s in _UP_STAGES) or "api_up" in log.reached
            if best is None and up and (row.exit_codes is None or exit_code in row.exit_codes):
                line = _CHECKS[row.check](text, exit_code)
                if line is not None:
                    return _make(row.failure_class, line, f"<{row.failure_class}>", PHASE_NAMES.get(stages[-1], ""))
            continue
        if not row.patterns:
            continue
        i = log.row_line(row, exit_code)
        if i is not None and alone and not _FAILED_REQUEST.search(v.body(i)) and _served_after(log, i, past_all=False):
            continue  # the server served past it (a log alone: no exit code says otherwise)
        if i is not None and (best is None or _tier(v.severity[i]) > best[0]):
            best = (_tier(v.severity[i]), -n, i, row.failure_class)
    if best is not None:
        _, _, i, cls = best
        return _make(cls, lines[i], f"<{cls}>", PHASE_NAMES.get(stages[i], ""))

    d = v.decisive()
    crash_tb = _crash_traceback(v, d)
    cut_tb = crash_tb is not None and crash_tb[1] is None  # the log ends inside a traceback
    crash_stage, crash_line = None, None
    if crash_tb is not None:  # no family names the message: where it was raised may
        cls, crash_line, crash_stage = _read_crash(log, *crash_tb)
        i = crash_line
        if cls is not None:
            j = crash_tb[1] if crash_tb[1] is not None else i
            return _make(cls, lines[j], f"<{cls}>", PHASE_NAMES.get(crash_stage, ""))

    vllm_log = log.vllm
    # ready: the engine's ready line, requests served, a measured result of the work (a test's or a
    # benchmark's, with no server line), or (vLLM only) its API server up; never when our harness
    # says the server did not become ready
    ready = any(s in log.reached for s in _UP_STAGES) or ("api_up" in log.reached and vllm_log)
    # for a log alone, vLLM's graphs captured read as up too: the capture is the last step of its
    # engine's startup and its API server follows at once (SGLang still runs a warmup request
    # after it, which can hang)
    captured = vllm_log and "captured" in log.reached
    # an unknown always quotes a line (its signature groups repeats): the first fatal event, else
    # where a cut traceback stopped (its innermost frame), else the last error-ish line the server
    # did not serve past, else the last line (for a trial: the harness's own verdict). A warning or
    # an error the server served past (vLLM's fd-limit advice at start, one request's failed
    # preprocessing) is no later failure's line: it would name every one of them alike
    passed = d is not None and v.severity[d] < FATAL and _served_after(log, d, past_all=False)
    decisive = lines[d] if d is not None and not passed else lines[crash_line] if crash_line is not None \
        else _last_unserved(log, ERRORISH)
    fatal = d is not None and v.severity[d] == FATAL and not _HARNESS.match(v.body(d))
    waited = any(_HARNESS.match(f.body) and _NOT_READY.search(f.body) for f in v.forms)
    # what a crash leaves: a fatal event, an excerpt ending inside a traceback, or an engine's
    # ERROR line (an NCCL WARN alone is not: NCCL warns beside a hang, and its RAS listener warns
    # while the collective simply waits)
    crashed = fatal or cut_tb or (d is not None and v.forms[v.keys[d]].component != "nccl" and (
        v.severity[d] >= ERROR or (ERRORISH.search(v.body(d)) is not None and d >= _tail_start(v))))
    last = next((s for s in reversed(stages) if s), None)
    where = PHASE_NAMES.get(crash_stage or last, "")
    ready = ready and not waited
    survived = not fatal or _served_after(log, d or 0, past_all=True)
    ended = _ended_in_error(log) if phase is None and exit_code in (None, 0) and not fatal else None
    if ended is not None and (d is None or v.severity[d] < ERROR):
        # a log that ends on an error line says how it ended: quote it, however quiet its level
        d, decisive, crashed = ended, lines[ended], True
    if phase is None and (ready or captured and not waited) and exit_code in (None, 0) and not cut_tb and survived \
            and ended is None:
        dump = _dumped_after_serving(log)
        if dump is not None:  # served, then a process was dumped: not healthy, and nothing names why
            return _make("unknown", lines[dump], "<no log output, exit unknown>", where)
        short = _failed_report(log)
        if short is not None:  # a report says requests failed, and nothing names why
            return _make("unknown", lines[short], "<no log output, exit unknown>", where)
        stall = _stalled(v)
        if stall is not None:  # requests running, no token made for the last metric lines
            return _make("bench_stall", lines[stall], "<bench_stall>", where)
        # reached ready, and nothing failed or the server served past what did
        line = next((ln for ln, st in zip(lines, stages) if st in _UP_STAGES), "") or \
            next((ln for ln, st in zip(lines, stages) if st == "api_up"), "") or \
            next((ln for ln, st in zip(lines, stages) if st == "captured"), "")
        return Classification(HEALTHY, HEALTHY, "<healthy: reached ready, no failure signature>", line, where)
    if phase is None and exit_code is None:
        # a log alone, ended by an error nothing names: a crash with that error, not a timeout
        # (a timeout needs evidence of waiting: our harness's deadline line, or a log that just
        # stops in a startup stage with no error)
        if fatal or (crashed and not waited):
            return _make("unknown", decisive, "<no log output, exit unknown>", where)
        if last is None and not waited and not _polled(log):
            # no startup progress, no error, no harness deadline line (an empty log, binary
            # noise): no evidence of waiting, so not a startup timeout; the caller's exit code
            # or phase (--exit-code / --phase) decides
            return _make("unknown", _readable_last(v),
                         "<no startup progress and no error in the log, exit code and phase not given: "
                         "cannot tell a timeout from a crash>", where)
        phase = "startup"  # still running and never ready: it failed at startup
    facts = _Facts(exit_code, phase, bool(_SIGQUIT.search(log.text)), bool(_TRACEBACK.search(log.text)),
                   ready, None if last in ("api_up", "first_request") and not ready else last)
    code = "still running" if exit_code is None else f"exit {exit_code}"
    for _why, pred, cls in FALLBACKS:
        if pred(facts):
            if cls in ("startup_timeout", "collective_hang_or_timeout") and exit_code is None:
                progress = [ln for ln, st in zip(lines, stages) if st and st == last]
                line = _last_line(progress) or decisive or _last_line(lines)
            else:
                line = decisive or _last_line(lines)
            return _make(cls, line, f"<{cls}: no log output, {code}>", where)
    return _make("unknown", decisive or _last_line(lines), f"<no log output, {code}>", where)


#: an exception line with no message: a bare ``assert`` failing, ``raise TimeoutError``
_BARE_EXC = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)\s*$")
#: a traceback's source line (not its ``File ...`` frame, a caret line or an elision)
_SOURCE = re.compile(r"^\s{2,}(?!File \")(?![\^~\s]*$)\S")


def _raised_by(c: Classification, text: str) -> Classification:
    """``c`` quoting the source line that raised its decisive exception when that exception
    carries no message (``AssertionError`` alone under ``assert TopKOutputChecker.format_is_bypassed(
    topk_output)``): the statement is what an engineer reads, and a bare name would give every
    bare assertion one signature, grouping unrelated failures. The class is unchanged; the line
    quoted is still a line of the log, and the signature is that line's."""
    if not c.line or not _BARE_EXC.match(strip_prefixes(c.line)[0].strip()):
        return c
    lines = text.splitlines()
    try:
        i = lines.index(c.line)
    except ValueError:
        return c
    if i == 0:
        return c
    above = lines[i - 1]
    body = strip_prefixes(above)[0]
    if not _SOURCE.match(body) or not body.strip():
        return c
    sig = normalize_line(above)
    return Classification(c.failure_class, c.kind, sig if c.signature == normalize_line(c.line) else c.signature,
                          above, c.phase)


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
        return _raised_by(_classify(str(log_text or ""), exit_code, phase), str(log_text or ""))
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
    if s.lower() in ("none", "null", ""):
        return None
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give the exit code as an integer (e.g. 1, 137, -9), "
                                         "or 'none' for a server still running") from None


#: the files whose bytes version the cache of corpus decisive lines (:func:`_cache_path`)
_CODE = ("failures.py", "failure_events.py", "failure_signatures.py", "failure_signatures.yaml", "perf_findings.py")
_line_cache: dict[str, str] | None = None
_line_cache_dirty = False


def _cache_path() -> Path:
    """Where the tool keeps the corpus entries' decisive lines between runs: one file per version
    of the classifier's code and tables (a changed rule reads every entry again), under
    ``$SERVESWEEP_CACHE_DIR``, else ``$XDG_CACHE_HOME/servesweep`` or ``~/.cache/servesweep``."""
    h = hashlib.sha256()
    for name in _CODE:
        h.update((Path(__file__).parent / name).read_bytes())
    root = os.environ.get("SERVESWEEP_CACHE_DIR") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "servesweep"
    return Path(root) / f"corpus_lines-{h.hexdigest()[:16]}.json"


def _corpus_line(entry) -> str:
    """A corpus entry's decisive line, as the tool reads it (its log and exit code, no phase),
    from the cache of earlier runs of this classifier when it has it (classifying the 757
    entries takes ~1.5 s of each call of the tool otherwise)."""
    global _line_cache, _line_cache_dirty
    if _line_cache is None:
        try:
            _line_cache = json.loads(_cache_path().read_text())
        except (OSError, ValueError):
            _line_cache = {}
    key = hashlib.sha256(f"{entry.exit_code}\n{entry.log}".encode()).hexdigest()[:24]
    line = _line_cache.get(key) if isinstance(_line_cache, dict) else None
    if not isinstance(line, str):
        line = classify(entry.log, entry.exit_code, None).line
        _line_cache[key] = line
        _line_cache_dirty = True
    return line


def _save_line_cache() -> None:
    """Write the decisive lines read this run (atomically; a cache that cannot be written is
    only slower next time)."""
    if not _line_cache_dirty or _line_cache is None:
        return
    try:
        path = _cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_line_cache))
        os.replace(tmp, path)
    except OSError:
        pass


def _parts_arg(s: str) -> tuple[str, ...]:
    parts = tuple(x.strip() for x in s.split(",") if x.strip())
    if not parts or set(parts) - set(PARTS):
        raise argparse.ArgumentTypeError(f"{s!r}: expected corpus parts among {', '.join(PARTS)} (e.g. dev,test)")
    return parts


def _report(path: str, c: Classification, near: list) -> str:
    """The human report of one log: class, kind, stage (the startup stage its decisive line falls
    in, :data:`PHASE_NAMES`; not ``--phase``'s lifecycle vocabulary), decisive line, nearest
    corpus entries."""
    path = strip_control(path.replace("\r", " "))
    out = [f"{path}", f"  class:    {c.failure_class}", f"  kind:     {c.kind}", f"  stage:    {c.phase or '-'}",
           f"  decisive: {c.line.strip()[:MAX_SIGNATURE_CHARS] or '-'}", f"  signature: {c.signature}"]
    if near:
        out.append("  nearest corpus entries (tasks/failure_corpus):")
        out += [f"    {n.id:<28} {n.expected_class:<40} {n.score:.2f}  {n.url}" for n in near]
    else:
        out.append("  nearest corpus entries: none alike")
    return "\n".join(out)


def _read_log(path: str) -> tuple[str, int | None, str | None]:
    """``(log text, exit code it states, label)`` of one CLI argument.

    A failure-corpus entry (a ``.yaml``/``.yml`` mapping with a ``log`` text, the format of
    ``tasks/failure_corpus/<part>/<id>.yaml``) gives its ``log`` field, its ``exit_code`` and, as
    the label, its expected class and kind: the rest of the file is a person's words about the
    log, not log lines. Any other file is the log itself (exit code and label None).

    Raises:
        OSError: the file cannot be read.
    """
    text = Path(path).read_text(errors="replace")
    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        return text, None, None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError:
        return text, None, None
    if not isinstance(raw, dict) or not isinstance(raw.get("log"), str):
        return text, None, None
    code = raw.get("exit_code")
    label = (f"corpus entry {raw.get('id', Path(path).stem)}: its log field; expected "
             f"{raw.get('expected_class', '?')} ({raw.get('expected_kind', '?')})")
    return raw["log"], code if isinstance(code, int) and not isinstance(code, bool) else None, label


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m tasks.failures [--exit-code N] [--phase P] [--tsv] LOG...``; returns 0 when every
    log is healthy (a perf finding included: the server ran), 1 when a log shows a failure, 2 when a
    file could not be read (as ``grep``: a script can test the status).

    A failure-corpus entry file (``tasks/failure_corpus/<part>/<id>.yaml``) is read as its
    ``log`` field with its ``exit_code`` (:func:`_read_log`), and its expected class is shown.

    Prints, per log, the class, kind, stage, decisive line and the nearest entries of the
    public corpus with their threads; ``--tsv`` prints ``PATH<TAB>CLASS<TAB>KIND<TAB>SIGNATURE``
    instead (one line per log, for scripts).
    """
    p = argparse.ArgumentParser(prog="python -m tasks.failures", description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", metavar="LOG", help="server log file(s)")
    p.add_argument("--exit-code", type=_exit_code_arg, default=None,
                   help="exit code the parent saw (int, or 'none' = still running)")
    p.add_argument("--phase", choices=["preflight", "startup", "warmup", "bench", "teardown"], default=None,
                   help="the lifecycle phase the trial failed in, as the harness names it (default: read from the "
                        "log); the report's 'stage' is the startup stage the decisive line falls in")
    sp = p.add_mutually_exclusive_group()
    sp.add_argument("--speedup", type=float, default=None,
                    help="speculative trial's decode speedup over the baseline (a healthy log <= 1.0 is spec_decode_no_speedup)")
    sp.add_argument("--bench", default=None, help="bench JSON with speedup_vs_baseline (or decode_tok_s + baseline_decode_tok_s)")
    p.add_argument("--tsv", action="store_true", help="one PATH<TAB>CLASS<TAB>KIND<TAB>SIGNATURE line per log")
    p.add_argument("--nearest", type=int, default=3, metavar="K", help="corpus entries to show (default 3; 0 = none)")
    p.add_argument("--corpus-parts", type=_parts_arg, default=PARTS, metavar="PARTS",
                   help=f"comma-separated corpus parts the nearest entries come from, among {','.join(PARTS)} "
                        "(default: all of them)")
    a = p.parse_args(list(argv) if argv is not None else None)
    speedup = _bench_speedup(a.bench) if a.bench else a.speedup
    rc = 0
    for path in a.logs:
        try:
            text, entry_code, label = _read_log(path)
        except OSError as e:
            print(f"{path}: {e.strerror}", file=sys.stderr)
            rc = 2
            continue
        code = a.exit_code if a.exit_code is not None else entry_code
        c = with_speedup(classify(text, code, a.phase), speedup)
        if c.kind not in (HEALTHY, "perf"):
            rc = max(rc, 1)
        if a.tsv:
            print(f"{strip_control(path)}\t{c.failure_class}\t{c.kind}\t{strip_control(c.signature)}")
            continue
        near = []
        if a.nearest > 0 and c.line.strip():
            from tasks.failure_corpus import nearest

            near = nearest(c.line, c.failure_class, a.nearest, a.corpus_parts, decisive=_corpus_line,
                           same_class=c.kind == "perf")
        print(_report(path, c, near) + (f"\n  ({strip_control(label)})" if label else ""))
    _save_line_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
