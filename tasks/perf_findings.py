"""Performance findings on a healthy server: an allreduce path silently turned off, and
speculative decoding that is not faster than the no-spec baseline.

The degraded-path lines are data (``degraded_paths`` in ``failure_signatures.yaml``); the
bench-line formats are the harness's own (``Output token throughput (tok/s): ...``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from tasks.failure_signatures import MAX_LINE_CHARS, TABLES, normalize_line


@dataclass(frozen=True)
class PerfFinding:
    """A performance finding on a healthy server.

    Attributes:
        tag: perf class id (``allreduce_path_degraded`` | ``spec_decode_no_speedup``).
        path: the allreduce path the line says is off (``custom_allreduce``,
            ``torch_symm_mem``, ``flashinfer_fusion``), or "" for non-allreduce tags.
        line: the raw log line.
        signature: ``normalize_line(line)``.
    """

    tag: str
    path: str
    line: str
    signature: str


#: allreduce knob level -> the path it must run (tasks.backends.sglang.knobs ALLREDUCE_LEVELS; nccl has no path to lose).
_LEVEL_PATH = {"custom": "custom_allreduce", "torch_symm_mem": "torch_symm_mem", "flashinfer_fusion": "flashinfer_fusion"}

_NUM = r"(\d+(?:\.\d+)?)"
_TRIAL_VS_BASELINE = re.compile(r"Output token throughput \(tok/s\):\s*" + _NUM + r"\s*\(baseline[^)]*?" + _NUM + r"\s*\)")
_BASELINE_TPUT = re.compile(r"\bbaseline\b.*?Output token throughput \(tok/s\):\s*" + _NUM)
_TRIAL_TPUT = re.compile(r"\bthis trial\b.*?Output token throughput \(tok/s\):\s*" + _NUM)
#: Words one of which every ``degraded_paths`` line contains ("fall back" / "falls back" /
#: "falling back" all contain "back"): a substring gate, ~50x cheaper than the regexes.
_DEGRADED_WORDS = ("isabl", "ISABL", "not supported", "not available", "unavailable", "back")


def _lines_holding(text: str, words: tuple[str, ...]) -> Iterator[str]:
    """Each line of ``text`` holding one of ``words`` (case-sensitive), once, in order: one
    ``str.find`` pass per word over the whole text (C speed: a 10 MB log of 100k lines in a few
    ms per word, against ~0.1 s for a per-line test in Python and ~70 ms for one regex of the
    words), then the lines found, in order."""
    starts: set[int] = set()
    for w in words:
        at = text.find(w)
        while at != -1:
            start = text.rfind("\n", 0, at) + 1
            starts.add(start)
            end = text.find("\n", at + len(w))
            if end < 0:
                break
            at = text.find(w, end + 1)
    for start in sorted(starts):
        end = text.find("\n", start)
        yield text[start:len(text) if end < 0 else end]


def _gated_lines(text: str) -> Iterator[str]:
    """Each line of ``text`` holding one of :data:`_DEGRADED_WORDS`, once, in order."""
    return _lines_holding(text, _DEGRADED_WORDS)


_SPEEDUP = re.compile(r"\bspeedup(?: vs\.? baseline)?\s*[:=]\s*" + _NUM)


def spec_no_speedup(decode_tok_s: float, baseline_tok_s: float, *, min_speedup: float = 1.0) -> bool:
    """True when speculative decoding did not beat the no-spec baseline.

    Args:
        decode_tok_s: the trial's decode throughput, tok/s.
        baseline_tok_s: the baseline config's decode throughput on the same node, tok/s.
        min_speedup: speedup (ratio) a trial must strictly exceed to count as a speedup;
            default 1.0 ("slower than baseline", e.g. 59 vs 61 tok/s).
    Returns:
        ``decode_tok_s / baseline_tok_s <= min_speedup``.
    Raises:
        ValueError: a throughput that is not a finite number >= 0, or a baseline of 0.
    """
    for name, v in (("decode_tok_s", decode_tok_s), ("baseline_tok_s", baseline_tok_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0 (got {v!r})")
    if baseline_tok_s == 0:
        raise ValueError("baseline_tok_s must be > 0")
    return decode_tok_s / baseline_tok_s <= min_speedup


def spec_bench_finding(text: str) -> tuple[str, float, float] | None:
    """(decisive line, trial tok/s, baseline tok/s) when bench lines show no speedup, else None."""
    baseline: float | None = None
    trial: tuple[str, float] | None = None
    # every bench regex needs one of the words; a found line split as str.splitlines splits it
    # (a progress bar's carriage returns)
    for raw in (r for hit in _lines_holding(text, ("tok/s", "speedup")) for r in hit.splitlines()
                if "tok/s" in r or "speedup" in r):
        line = raw[:MAX_LINE_CHARS]
        m = _TRIAL_VS_BASELINE.search(line)
        if m:
            t, b = float(m.group(1)), float(m.group(2))
            if b > 0 and spec_no_speedup(t, b):
                return raw, t, b
            continue
        m = _SPEEDUP.search(line)
        if m and float(m.group(1)) <= 1.0:
            return raw, float(m.group(1)), 1.0
        m = _BASELINE_TPUT.search(line)
        if m:
            baseline = float(m.group(1))
            continue
        m = _TRIAL_TPUT.search(line)
        if m:
            trial = (raw, float(m.group(1)))
    if trial and baseline and spec_no_speedup(trial[1], baseline):
        return trial[0], trial[1], baseline
    return None


def detect_perf_findings(log_text: str) -> list[PerfFinding]:
    """All performance findings in a healthy server's log, in log order (one per path/tag).

    Args:
        log_text: the server log (plus any bench lines the harness appended).
    Returns:
        ``allreduce_path_degraded`` findings (one per allreduce path that a log line says
        was turned off) and a ``spec_decode_no_speedup`` finding when bench lines compare
        the trial's throughput to a baseline and it is not faster.
    """
    out: list[PerfFinding] = []
    seen: set[str] = set()
    for raw in _gated_lines(log_text):  # a cheap gate: every degraded_paths regex needs one of these words
        raw = raw.rstrip("\r")
        line = raw[:MAX_LINE_CHARS]
        for path, pat in TABLES.degraded_paths:
            if path not in seen and pat.search(line):
                seen.add(path)
                out.append(PerfFinding("allreduce_path_degraded", path, raw, normalize_line(raw)))
    spec = spec_bench_finding(log_text)
    if spec:
        out.append(PerfFinding("spec_decode_no_speedup", "", spec[0], normalize_line(spec[0])))
    return out


def detect_perf_tags(log_text: str, expected_paths: Mapping[str, object] | None = None) -> list[str]:
    """Perf class ids for a healthy server's log (e.g. ``["allreduce_path_degraded"]``).

    Args:
        log_text: the server log.
        expected_paths: optional ``TrialSpec.expected_paths``: path booleans
            (``{"custom_allreduce": True}``) and/or the allreduce level
            (``{"allreduce": "custom"}``, as ``tasks.backends.sglang.knobs.render_launch`` returns); when
            given, an allreduce path that was turned off counts only if the trial expected
            that path to run.
    Returns:
        Unique tags in first-seen order; [] when nothing was found.
    """
    expected: dict[str, object] | None = None
    if expected_paths is not None:
        expected = dict(expected_paths)
        level = _LEVEL_PATH.get(str(expected_paths.get("allreduce")))
        if level:
            expected[level] = True
    tags: list[str] = []
    for f in detect_perf_findings(log_text):
        if f.path and expected is not None and not expected.get(f.path):
            continue
        if f.tag not in tags:
            tags.append(f.tag)
    return tags


#: an engine's own record of the all-reduce paths it was asked to use: SGLang's ``server_args=ServerArgs(...)``
#: and vLLM's engine config line both print these arguments
_REQUESTED = {
    "custom_allreduce": "disable_custom_all_reduce=False",
    "torch_symm_mem": "enable_torch_symm_mem=True",
    "flashinfer_fusion": "enable_flashinfer_allreduce_fusion=True",
}
_REQUESTED_RE = {path: re.compile(rf"\b{re.escape(arg)}\b") for path, arg in _REQUESTED.items()}


def requested_paths(text: str) -> set[str]:
    """The all-reduce paths a log's own argument dump shows were asked for (``custom_allreduce``,
    ``torch_symm_mem``, ``flashinfer_fusion``); empty when the log prints no arguments."""
    # the literal first: Python's re scans a 10 MB text for a pattern opening with \b ~50x slower
    return {path for path, arg in _REQUESTED.items() if arg in text and _REQUESTED_RE[path].search(text)}


def first_perf_line(text: str, tag: str, paths: Collection[str] | None = None) -> str | None:
    """The raw line of the first finding with ``tag`` in ``text``, or None. ``paths``: only an
    all-reduce path among these counts (as ``detect_perf_tags``' expected paths)."""
    for f in detect_perf_findings(text):
        if f.tag == tag and (paths is None or not f.path or f.path in paths):
            return f.line
    return None
