"""A server log read as events: prefixes stripped, severity ranked, tracebacks grouped.

A line of a real log carries prefixes that say nothing about the failure and hide it from
anchored patterns: a container's ``vllm-1  | ``, vLLM's process tag ``(EngineCore_0 pid=12)``
/ ``(VllmWorker TP0 pid=9)`` and its level-time-file header ``ERROR 06-05 06:18:13
[core.py:470]``, SGLang's ``[2026-01-01 10:00:01 TP3]``, torchrun's ``[rank0]:``, glog's
``[W1015 22:50:12.358 ProcessGroupNCCL.cpp:1234]``, NCCL's ``host:pid:tid [dev]``, journald's
``Aug 17 18:42:18 host vllm[8052]:``, Kubernetes' CRI ``<timestamp> stdout F``, DJL Serving's
``WARN  PyProcess W-1-model-stderr:`` and a reply's quote marker ``> ``.
:func:`parse_log` strips them (in any nesting) into :attr:`Event.body`, keeps the level and
the process they name, and ranks each line:

- ``FATAL`` (3): an exception line (``RuntimeError: ...``) and pydantic's ``Value error, ...``
  line under a ``ValidationError`` (the validator's message), a CUDA error, an assert in a kernel,
  ``terminate called``, a fatal glog/NCCL/compiler line, argparse's ``error:``, our harness's
  lines and the kernel's OOM-killer lines;
- ``ERROR`` (2): an ERROR-level line with text, an ``NCCL WARN`` line;
- ``WARN`` (1): a WARNING-level line, a Python ``...Warning:``;
- ``INFO`` (0): everything else, and every traceback frame / source line.

A traceback is the run of lines from ``Traceback (most recent call last):`` to its exception
line; :attr:`Event.tb_start` points every line of it at its first line, so a guard can look at
the frames that raised an exception however deep the stack is.

Sources of the prefix formats: vLLM ``vllm/logger.py`` (``%(levelname)s %(asctime)s
[%(filename)s:%(lineno)d]``, date format ``%m-%d %H:%M:%S``) and its process prefix
(``vllm/utils`` ``_add_prefix``); SGLang ``srt/utils`` ``configure_logger`` (``[%(asctime)s%(
prefix)s]``); torchrun ``--tee``/``--log-line-prefix-template`` (``[rank0]:``); NCCL
``debug.cc`` (``%s:%d:%d [%d]``); Ray's C++ log ``src/ray/util/logging.cc`` (``[%Y-%m-%d
%H:%M:%S,%e %L %P %t]``); the corpus (tasks/failure_corpus/dev).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

INFO, WARN, ERROR, FATAL = 0, 1, 2, 3
#: How far up a traceback group is searched for its start, lines (a deep stack of a compiled
#: model is ~150 frames x 2 lines; longer is a log, not a traceback).
MAX_TRACEBACK_LINES = 400

# Each prefix regex consumes one prefix at the start of the (remaining) line; they are tried in
# a loop, so nested prefixes (a container tag, then vLLM's process tag, then its header) go.
_PIPE = re.compile(r"^\s*(?:[\w.-]+\s*)?\|\s?")
#: (a Ray actor's name may nest its own parentheses, three deep: Ray Data's
#: ``(MapWorker(MapBatches(vLLMEngineActor)) pid=1202, ip=10.0.0.1)``; the name and the tail
#: after ``pid=`` are bounded, so a long line that opens a parenthesis and never closes it costs
#: no more than a short one)
_PROC = re.compile(r"^\s*\((?P<proc>(?:[^()]|\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)){0,200}?\bpid=\d+[^()]{0,120})\)\s?")
_VLLM_HDR = re.compile(r"^\s*(?P<lvl>INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?"
                       r"\s+\[?[\w./<>-]+:\d+\]\s?")
_VLLM_SHORT = re.compile(r"^\s*(?P<lvl>INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+(?:\d+\s+)?\[[\w./-]+:\d+\]\s?")
_DASHLOG = re.compile(r"^\s*-?\s*[\w.<>]+\s+-\s+(?P<lvl>INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+-\s")
_SGLANG = re.compile(r"^\s*\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?P<proc>(?:\s+[A-Z]{2}\d+)*)\s*\]\s?")
#: Ray's C++ log lines (src/ray/util/logging.cc, spdlog pattern ``[%Y-%m-%d %H:%M:%S,%e %L %P %t]``:
#: level letter, pid, thread id), printed by the raylet, the GCS and the core workers of every
#: Ray actor (vLLM's Ray executor): ``C`` is RAY_LOG(FATAL) / a failed RAY_CHECK, which aborts
_RAYCPP = re.compile(r"^\s*\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+(?P<lvl>[TDIWEC])\s+(?P<proc>\d+)\s+\d+\]\s?")
_RANK = re.compile(r"^\s*\[(?P<proc>rank\d+|default\d+|RANK\s*\d+)\]:\s?")
_GLOG = re.compile(r"^\s*\[?(?P<lvl>[IWEF])\d{4}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+(?:\d+\s+)?[\w./<>-]+:\d+\]\s?")
_NCCL = re.compile(r"^\s*(?P<proc>[\w.-]+:\d+:\d+)\s+\[\d+\]\s?")
_ISO = re.compile(r"^\s*\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+")
#: a GitHub / e-mail quote marker (``> `` before each line of a log quoted in a reply)
_QUOTE = re.compile(r"^\s*>+(?:\s|$)")
#: journald / syslog: ``Aug 17 18:42:18 host vllm[8052]: `` (a server run as a systemd unit)
_SYSLOG = re.compile(r"^\s*[A-Z][a-z]{2}\s+\d{1,2}\s+\d{2}:\d{2}:\d{2}\s+[\w.-]+\s+[\w./@-]+(?:\[\d+\])?:\s?")
#: Kubernetes' CRI log format after its timestamp: ``stdout F `` / ``stderr P `` (kubectl logs of a node's files)
_CRI = re.compile(r"^\s*(?:stdout|stderr)\s+[FP]\s")
#: DJL Serving's (the LMI / SageMaker large-model containers') relay of its Python engine's streams:
#: ``WARN  PyProcess W-252-model-stderr: `` (its level is the stream's, stderr -> WARN, not the line's)
_DJL = re.compile(r"^\s*(?:INFO|WARN|ERROR|DEBUG)\s+PyProcess\s+W-[\w.-]+-std(?:out|err):\s?")
#: (a logger's name may follow the level, never an exception's: "ERROR: KeyError: 'x'" keeps its KeyError)
_PYLOG = re.compile(r"^\s*(?P<lvl>INFO|WARNING|ERROR|DEBUG|CRITICAL):\s+"
                    r"(?:(?![A-Za-z_][\w.]*(?:Error|Exception|Warning|Interrupt|Exit)\b)[\w.]+:)?\s*")
_PREFIXES = (_QUOTE, _PIPE, _PROC, _DJL, _VLLM_HDR, _VLLM_SHORT, _DASHLOG, _RAYCPP, _SGLANG, _RANK, _GLOG, _NCCL, _ISO, _SYSLOG,
             _CRI, _PYLOG)
_LEVEL = {"T": INFO, "D": INFO, "I": INFO, "W": WARN, "E": ERROR, "C": FATAL, "F": FATAL, "INFO": INFO, "DEBUG": INFO,
          "WARNING": WARN, "WARN": WARN, "ERROR": ERROR, "CRITICAL": FATAL}

_EXC = re.compile(r"^(?:[A-Za-z_][\w]*\.)*(?:(?=[A-Z])\w*(?:Error|Exception|Exit|Interrupt|Failure)|KeyError|AssertionError"
                  r"|OutOfMemoryError|SafetensorError|DistBackendError|DistStoreError|EngineDeadError"
                  r"|EngineGenerateError|CalledProcessError|ValidationError)\b(?:\([\w.]+\))?(?::|\s*$|\s+\d+ validation error)")
_FATAL = re.compile(
    r"CUDA error:|\bCUDA (?:driver )?error\b|\bHIP error:|cudaError\w+|device-side assert|Assertion [`'\"].*[`'\"] failed|"
    r"Assertion .* failed|Assertion failed\b|\bGGML_ASSERT\(.*\) failed|^terminate called|what\(\):|"
    r"Segmentation fault|Fatal Python error|core dumped|"
    r"\bNCCL error\b|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|"
    r"\bnvcc fatal|ptxas fatal|^ptxas \S+, line \d+; error\s+: |Ninja build failed|^FAILED: |^\S+: error: |^error: |"
    r"^\[(?:harness|dmesg)\]|Out of memory: Kill|oom-kill:|^Killed\s*$|NVRM: Xid|"
    r"No available shared memory broadcast block found|has been marked dead|died unexpectedly|"
    r"\bfatal error\b|^Exception in thread|^Error: |^\s*Value error, |^\s*Check failed: ", re.I)
_WARN_BODY = re.compile(r"\b\w*Warning\b:|^\s*warnings\.warn\(")
_NCCL_LVL = re.compile(r"\bNCCL (?P<lvl>INFO|WARN|ERROR|TRACE)\b")
_FRAME = re.compile(r"^\s*File \"[^\"]*\", line \d+|^\s*File \"|^\s+\^+\s*$|^\s*\.\.\.\s*$|^\s*\[Previous line repeated")
_TB = re.compile(r"Traceback \(most recent call last\)")
#: A word that says something failed; never a count of failures that is zero (a benchmark's
#: "Failed requests:   0", "errors=0", '"failed": 0', "| failed | 0 |", "failed: 0/200") nor
#: vegeta's empty "Error Set:" header: a report that nothing failed is no failure.
ERRORISH = re.compile(r"\b(?:error|fail(?:ed|ure)?|fatal|exception|abort(?:ed)?|timed? ?out|refused|denied)"
                      r"\b(?![\w ]{0,30}\"?\s*[:=|]\s*0+(?:\.0+)?(?:/\d+)?\s*(?:$|[,;|)}]))(?! [Ss]et:\s*$)", re.I | re.M)


#: Words one of which every :data:`ERRORISH` match holds, any case ("time" for its time-out
#: wordings): a gate before the quotable check and the regex on a long log with no error in it.
def _maybe_errorish(line: str) -> bool:
    low = line.lower()  # an explicit chain: ~3x cheaper than any() over a tuple, ~8x than a re.I regex
    return ("error" in low or "fail" in low or "fatal" in low or "exception" in low or "abort" in low
            or "time" in low or "refused" in low or "denied" in low)


@dataclass(frozen=True)
class Event:
    """One log line read as an event.

    Attributes:
        index: line number in the log, 0-based.
        raw: the line as written.
        body: the line with its prefixes stripped (leading indentation kept).
        severity: the rank used to pick the decisive line (INFO..FATAL; frames are INFO).
        proc: the process the prefix names (``EngineCore_0 pid=12``, ``TP3``, ``rank0``,
            ``host:pid:tid``), "" when none.
        component: ``nccl`` for NCCL's own lines, else "".
        frame: the line is a traceback frame or its source line.
    """

    index: int
    raw: str
    body: str
    severity: int
    proc: str
    component: str
    frame: bool


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|</?(?:font|b|i|span|strong|code|em)\b[^>]{0,80}>")
#: a colour code whose ESC byte a paste dropped (vLLM's "[0;36m(EngineCore_DP0 pid=224)[0;0m ERROR ..."
#: as posted in vllm-project/vllm-ascend#7015; "[31mERROR[0m [90m..." from vLLM's coloured
#: levels; "^[[0;36m" as cat -v shows the byte): reset, bold, a foreground colour (30-37, 90-97), or
#: attributes joined by ";"; never another lone number ("[5m"), which can be text
_BARE_SGR = re.compile(r"(?:\^\[)?\[(?:0|1|3[0-7]|9[0-7]|\d{1,2}(?:;\d{1,3})+)m")


#: NCCL before 2.4 wrote its level without its name after the ``host:pid:tid [dev]`` prefix
#: ("[0] INFO NET/Socket : 1 interfaces found", "[0] include/socket.h:360 WARN Call to connect
#: failed"); the body is given the later releases' "NCCL WARN" so one family reads both
_OLD_NCCL_LVL = re.compile(r"(?P<at>(?:[\w./-]+\.(?:cc|cu|h|c):\d+ )?)(?P<lvl>INFO|WARN|TRACE)\b(?! NCCL\b)")


def strip_prefixes(line: str) -> tuple[str, int | None, str]:
    """(body, level named by a prefix or None, process named by a prefix) of one raw line
    (terminal colour codes and the HTML colour tags of a pasted log dropped first). A line of
    NCCL before 2.4 (its level without "NCCL") reads as a later release's (:data:`_OLD_NCCL_LVL`)."""
    if "\x1b" in line or "</" in line:
        line = _ANSI.sub("", line)
    if "m" in line and ("[0" in line or "[1" in line or "[3" in line or "[9" in line):
        line = _BARE_SGR.sub("", line)
    body, level, proc = line, None, ""
    nccl = False
    for _ in range(8):
        for pat in _PREFIXES:
            m = pat.match(body)
            if not m or m.end() == 0:
                continue
            nccl = nccl or pat is _NCCL
            g = m.groupdict()
            if g.get("lvl"):
                level = max(level or 0, _LEVEL[g["lvl"]])
            if g.get("proc") and g["proc"].strip():
                proc = proc or g["proc"].strip()
            body = body[m.end():]
            break
        else:
            break
    if nccl and (old := _OLD_NCCL_LVL.match(body)):
        body = f"{old['at']}NCCL {body[old.start('lvl'):]}"
    return body, level, proc


def _severity(body: str, level: int | None, component: str) -> int:
    """Severity of a stripped line out of context (a frame is demoted later, in context)."""
    text = body.strip()
    lvl = INFO if level is None else level
    if not text or _FRAME.match(body):
        return INFO
    warning = bool(_WARN_BODY.search(text))
    # a fatal wording the program itself logged at WARN is one it went on past (Inductor's
    # autotuning logs a candidate's "ptxas fatal" and drops the candidate): a warning
    if (_EXC.match(text) or _FATAL.search(text)) and not warning and lvl != WARN:
        return FATAL
    if component == "nccl":
        m = _NCCL_LVL.search(text)
        if m and m.group("lvl") in ("WARN", "ERROR"):
            return ERROR
    if warning:
        return WARN
    if lvl >= ERROR and _TB.search(text):
        return INFO
    return min(lvl, ERROR) if lvl < FATAL else FATAL


class _Line(NamedTuple):
    """What one distinct line (up to its digits) says out of context (a tuple: a big log makes
    tens of thousands of them, and a frozen dataclass costs ~5x more to build)."""

    body: str
    severity: int
    proc: str
    component: str
    file_frame: bool
    indented: bool
    exception: bool
    traceback: bool

    @property
    def quotable(self) -> bool:
        """Worth quoting (:func:`is_quotable`), out of context."""
        return _quotable_text(self.body.strip())


def _read_line(raw: str) -> _Line:
    body, level, proc = strip_prefixes(raw)
    component = "nccl" if _NCCL_LVL.search(body) else ""
    text = body.strip()
    return _Line(body, _severity(body, level, component), proc, component, bool(_FRAME.match(body)),
                 body[:1].isspace(), bool(_EXC.match(text)), bool(_TB.search(text)))


#: Distinct lines (up to digits) up to which every line is read in full and every signature
#: row is tried on every line. Above it (a server logging each request's prompt) the log is read
#: as an engineer reads a huge log: every line holding a word of :data:`_TRIGGERS` (found by one
#: bytes-level scan) is read in full, its head (startup) and tail (how it ended) are searched for
#: progress lines too, and every other line is chatter (INFO, its prefix kept, no milestone), so
#: a 10 MB log of distinct lines is still classified in well under a second
#: (benchmarks/failure_corpus.py).
MAX_FORMS_ALL = 5000
#: Lines at the start and at the end of a big log searched for startup progress whatever they
#: say (a big log's startup lines are at its head; the last milestone before the exit at its tail).
HEAD_LINES = 1000
TAIL_LINES = 1000
#: Lower-case words one of which every line that can rank above INFO, or be decisive, contains.
_TRIGGERS = ("error", "exception", "fatal", "fail", "warn", "assert", "abort", "terminate", "what()", "segmentation",
             "core dumped", "kill", "oom", "out of memory", "xid", "died", "dead", "traceback", 'file "', "timeout",
             "timed out", "[harness]", "[dmesg]", "exit", "interrupt", "refused", "denied", "unsupported",
             "not supported", "not compatible", "usage:", "broadcast block", "ninja", "nvcc", "ptxas", "errno",
             "already in use", "invalid", "kernel image", "not enough", "sigquit", "critical", "illegal")
_TRIGGER_BYTES = tuple(w.encode() for w in _TRIGGERS)
#: Trigger hits that are chatter: SGLang's every decode-batch line says ``token usage: 0.42``
#: (argparse's ``usage:``, what the trigger is for, starts a line's body). Without this a serving
#: log of distinct decode lines read every line in full: 6.4 s CPU for 10 MB instead of < 1 s.
_NOT_TRIGGER: dict[bytes, tuple[bytes, ...]] = {b"usage:": (b"token ",)}


def trigger_lines(lines: list[bytes]) -> set[int]:
    """Indices of the ``lines`` (bytes, any case) that hold a word of :data:`_TRIGGERS`.

    One ``bytes.find`` pass per word over the lines joined and lower-cased (C speed, ~1 ms per
    MB per word); a hit jumps to the next line, so the cost is the scan plus one bisect per
    matching line, never a Python call per line.
    """
    from bisect import bisect_right

    blob = b"\n".join(lines).lower()
    starts, pos = [], 0
    for ln in lines:
        starts.append(pos)
        pos += len(ln) + 1
    out: set[int] = set()
    for w in _TRIGGER_BYTES:
        hay = blob
        for p in _NOT_TRIGGER.get(w, ()):
            # the chatter wording masked in one C pass, at the same length (offsets stay): a
            # serving log says "token usage:" on every line, and a per-hit check cost ~0.2 s on 10 MB
            hay = hay.replace(p + w, p + w[:-1] + b"\0")
        at = hay.find(w)
        while at != -1:
            i = bisect_right(starts, at) - 1
            out.add(i)
            if i + 1 >= len(starts):
                break
            at = hay.find(w, starts[i + 1])
    return out


def _chatter(raw: str) -> _Line:
    """A line with no trigger word, read cheaply: INFO, body = the raw line."""
    return _Line(raw, INFO, "", "", False, raw[:1].isspace(), False, False)


_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")


class LogView:
    """A log split into lines and read as events, cheaply enough for a 10 MB log.

    Lines that differ only in their digits (a decode-batch line, a progress bar, an NCCL INFO
    line of another rank) are read once: :attr:`keys` maps each line to its distinct form and
    :attr:`forms` holds the first line of each form read out of context. The context (which
    lines are traceback frames, hence their severity) is one pass over the lines.

    A log of more than :data:`MAX_FORMS_ALL` distinct forms is :attr:`big`: only its trigger
    lines (:func:`trigger_lines`) are read in full, and only they, its head and its tail are
    searched for startup progress (:attr:`scan`).

    Attributes:
        lines: the raw lines (each at most ``max_line`` chars).
        keys: per line, the index of its form in :attr:`forms`.
        forms: per distinct form, its first raw line and what it says.
        severity: per line, INFO..FATAL in context (traceback frames are INFO).
        frame: per line, it is a traceback frame or its source line.
        tb_start: per line, the first line of the traceback / frame run it ends or is in
            (its own index when none).
    """

    def __init__(self, text: str, max_line: int) -> None:
        raw_lines = text.split("\n")
        # bytes.translate is ~50x faster than str.translate; UTF-8 never has 0x0A inside a
        # character, so the split lines stay aligned
        masked = text.encode("utf-8", "surrogatepass").translate(_DIGITS).split(b"\n")
        self.lines = [x if len(x) <= max_line else x[:max_line] for x in raw_lines]
        index: dict[bytes, int] = {}
        reps: list[int] = []
        keys: list[int] = []
        for i, m in enumerate(masked):
            if len(m) > max_line:
                m = m[:max_line]
            k = index.get(m)
            if k is None:
                k = index[m] = len(reps)
                reps.append(i)
            keys.append(k)
        self.keys = keys
        self.form_lines = [self.lines[i] for i in reps]
        #: a log of more distinct lines than MAX_FORMS_ALL (one that logs every request's prompt)
        self.big = len(reps) > MAX_FORMS_ALL
        if self.big:
            read: set[int] | range = trigger_lines([masked[i][:max_line] for i in reps])
            scan: set[int] | range = set(read) | set(keys[:HEAD_LINES]) | set(keys[-TAIL_LINES:])
        else:
            read = scan = range(len(reps))
        #: the forms read in full (all of them unless :attr:`big`: then the trigger lines')
        self.read = read
        #: the forms searched for startup milestones and by the whole-log guards (all of them
        #: unless :attr:`big`: then the trigger lines' and the head's and tail's)
        self.scan = scan
        self.forms = [_read_line(x) if k in read else _chatter(x) for k, x in enumerate(self.form_lines)]
        self._quotable: dict[int, bool] = {}
        self._context()

    def _context(self) -> None:
        forms, n = self.forms, len(self.keys)
        sev, frame, start = [0] * n, [False] * n, list(range(n))
        in_tb, run_start, prev_frame = False, -1, False
        for i, k in enumerate(self.keys):
            f = forms[k]
            if f.traceback:
                in_tb, run_start = True, i
            is_frame = f.file_frame or (f.indented and not f.exception and (prev_frame or in_tb))
            if is_frame and run_start < 0:
                run_start = i
            frame[i] = is_frame
            sev[i] = INFO if is_frame else f.severity
            if run_start >= 0 and i - run_start <= MAX_TRACEBACK_LINES:
                start[i] = run_start
            if f.exception or (not is_frame and not f.traceback and f.body.strip()):
                if f.exception or not in_tb:
                    in_tb, run_start = False, -1
            prev_frame = is_frame
        self.severity, self.frame, self.tb_start = sev, frame, start

    def body(self, i: int) -> str:
        """The stripped body of line ``i`` (of its form's first line when digits differ)."""
        return self.forms[self.keys[i]].body

    def event(self, i: int) -> Event:
        """Line ``i`` as an :class:`Event`."""
        f = self.forms[self.keys[i]]
        body, _, _ = strip_prefixes(self.lines[i])
        return Event(i, self.lines[i], body, self.severity[i], f.proc, f.component, self.frame[i])

    def quotable(self, i: int) -> bool:
        """Line ``i`` is worth quoting (:func:`is_quotable`)."""
        if self.frame[i]:
            return False
        k = self.keys[i]
        q = self._quotable.get(k)
        if q is None:
            q = self._quotable[k] = self.forms[k].quotable
        return q

    def decisive(self) -> int | None:
        """Index of the first quotable line of the highest severity present (the first fatal
        event of the first failing process); with nothing ranked above INFO, the last quotable
        line that says something failed, else the last quotable line; None for an empty log."""
        best, best_sev = None, -1
        for i, s in enumerate(self.severity):
            if s > best_sev and self.quotable(i):
                best, best_sev = i, s
                if s == FATAL:
                    return i
        if best is None or best_sev > INFO:
            return best
        last = None
        for i in range(len(self.keys) - 1, -1, -1):
            if last is not None and not _maybe_errorish(self.lines[i]):
                continue  # a substring gate, ~100x cheaper than the quotable check and the regex
            if self.quotable(i):
                if ERRORISH.search(self.body(i)):
                    return i
                last = i if last is None else last
        return last


def parse_log(lines: list[str], max_line: int = 4000) -> list[Event]:
    """One :class:`Event` per line of ``lines`` (frames and source lines of a traceback rank
    INFO, so the exception line that ends it is what a traceback contributes)."""
    view = LogView("\n".join(lines), max_line)
    return [view.event(i) for i in range(len(view.lines))]


_ADVICE = re.compile(
    r"^\s*(?:HINT|Hint|Note|NOTE|Tip|TIP|Please|please|To (?:silence|enable|disable|debug|fix)|For debugging|"
    r"If you|You (?:can|may|might|should)|Try |See |Consider |Possible solutions|Compile with|"
    r"CUDA kernel errors might be asynchronously|Set TORCH_|Exception raised from|frame #\d+|"
    r"The above exception was|During handling of the above|\(?run with NCCL_DEBUG)", re.I)


def _quotable_text(text: str) -> bool:
    return bool(text) and not _TB.search(text) and not _ADVICE.match(text) and len(re.sub(r"[\W_]+", "", text)) >= 4


def is_quotable(e: Event) -> bool:
    """A line worth quoting as the decisive one: text beyond its prefix, not advice, not a
    traceback banner or frame (an empty ``ERROR ... multiproc_worker_utils.py`` line is not)."""
    return not e.frame and _quotable_text(e.body.strip())
