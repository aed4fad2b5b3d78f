"""The failure classifier's tables, loaded from ``failure_signatures.yaml`` and validated.

The YAML beside this module holds the pure data (canonical classes and kinds, the signature
rows in precedence order, the startup milestones, the signature normalizers, the
degraded-allreduce lines and the components a traceback's frames name); :func:`load_tables`
compiles every regex and checks every entry, so a bad entry fails at import with
:class:`SignatureTableError` naming it. The classifier itself is ``tasks.failures``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

TABLE_PATH = Path(__file__).with_name("failure_signatures.yaml")
KINDS = ("deterministic", "transient", "infra", "perf")
#: Named whole-log checks a signature row may use instead of patterns (``tasks.failures``).
CHECK_NAMES = ("spec_decode_no_speedup", "allreduce_path_degraded")
_ROW_KEYS = {"class", "patterns", "source", "requires", "unless", "unless_before", "near", "not_near", "line_unless",
             "first_error", "waited_past", "exit_codes", "stages", "check"}

#: Lines above the decisive one searched by ``Signature.near`` (a Python traceback frame
#: and its source line sit 1-3 lines above the exception line; 8 leaves room for chained
#: frames and rank-interleaved output).
NEAR_LINES = 8
#: Longest line the regexes look at, chars (guards against pathological single-line logs).
MAX_LINE_CHARS = 4000
#: Longest signature returned, chars (MLflow tag values are capped at 5000; keep them readable).
MAX_SIGNATURE_CHARS = 300


class SignatureTableError(ValueError):
    """A malformed entry in the signature tables (the message names the entry)."""


@dataclass(frozen=True)
class Signature:
    """One row of the signature table.

    Attributes:
        failure_class: canonical class id.
        patterns: regexes searched line by line; the earliest matching line is the
            decisive one. Empty for classes only the harness sets by name.
        source: where the fragment comes from (source file, public issue).
        requires: regex that must occur somewhere in the log (multiline).
        unless: regex that vetoes the row when it occurs anywhere in the log.
        unless_before: regex that vetoes a decisive line when it occurs on an earlier line (a
            consequence of what that line reports: a surviving rank's failed network completion
            after its peer crashed), but not on a later one (what the failure caused).
        near: regex that must occur within :data:`NEAR_LINES` lines above (or on) the
            decisive line, or in the traceback that ends on it, e.g. the frame that raised it.
        not_near: regex that vetoes the decisive line when it occurs where ``near`` looks.
        line_unless: regex that vetoes a decisive line it matches (e.g. a side component's
            own line: NCCL's RAS socket is not the server's port).
        exit_codes: the row applies only for these exit codes (``None`` = still running
            or killed by the harness); ``None`` here means any exit code.
        stages: the row applies only when the decisive line falls in one of these startup
            stages (see ``Tables.milestones``); None among them is a line before any milestone.
        check: name of a whole-log check (one of :data:`CHECK_NAMES`) used instead of
            patterns (the perf rows, e.g. throughput below the baseline).
        first_error: the row speaks only for the log's first error: its decisive line must not
            be a warning, nor follow an ERROR or fatal line outside its own traceback, nor be followed by the
            server becoming ready (a launcher's verdict on a server that failed for a reason of
            its own, or came up after all, is not the cause).
        waited_past: the row's line reports a wait (a hang detector's notice), so it is no
            verdict when the startup went on after its last such line (a hang repeats the
            notice): a later line, outside any traceback and below WARN, that marks a startup
            milestone later than the stage the notice fell in (``Tables.milestones``; a request,
            a health probe or a throughput line is no such progress).
    """

    failure_class: str
    patterns: tuple[re.Pattern[str], ...] = ()
    source: str = ""
    requires: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None
    unless_before: re.Pattern[str] | None = None
    near: re.Pattern[str] | None = None
    not_near: re.Pattern[str] | None = None
    line_unless: re.Pattern[str] | None = None
    exit_codes: frozenset[int | None] | None = None
    stages: frozenset[str] | None = None
    check: str | None = None
    first_error: bool = False
    waited_past: bool = False


@dataclass(frozen=True)
class Tables:
    """Everything :func:`load_tables` reads.

    Attributes:
        kinds: class id -> kind, in the file's order.
        signatures: rows in precedence order.
        milestones: (stage, regex) in startup order.
        normalizers: (regex, replacement) applied in order by ``normalize_line``.
        degraded_paths: (allreduce path, regex) of lines saying the path was turned off.
        added: the classes added to ``../shared/data/failure_classes.md``'s canonical set
            (``added_classes``): class -> {what, sources, knobs, probe, probe_reason}.
        raised_in: the :class:`RaisedIn` entries of ``raised_in``: the component a traceback's
            innermost frames name, tried in order when no signature row matched.
    """

    kinds: dict[str, str]
    signatures: tuple[Signature, ...]
    milestones: tuple[tuple[str, re.Pattern[str]], ...]
    normalizers: tuple[tuple[re.Pattern[str], str], ...]
    degraded_paths: tuple[tuple[str, re.Pattern[str]], ...]
    added: dict[str, dict[str, Any]]
    raised_in: tuple[RaisedIn, ...] = ()


def _compile(where: str, pattern: Any, flags: int = 0) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise SignatureTableError(f"{where}: expected a non-empty regex string, got {pattern!r}")
    try:
        return re.compile(pattern, flags)
    except re.error as e:
        raise SignatureTableError(f"{where}: bad regex {pattern!r}: {e}") from None


def _opt(where: str, row: dict, key: str, flags: int = 0) -> re.Pattern[str] | None:
    return None if row.get(key) is None else _compile(f"{where}.{key}", row[key], flags)


def _row(i: int, row: Any, kinds: dict[str, str], stages: set[str]) -> Signature:
    if not isinstance(row, dict):
        raise SignatureTableError(f"signatures[{i}]: expected a mapping, got {row!r}")
    cls = row.get("class")
    where = f"signatures[{i}] ({cls})"
    if cls not in kinds:
        raise SignatureTableError(f"{where}: class is not in kinds")
    unknown = set(row) - _ROW_KEYS
    if unknown:
        raise SignatureTableError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(_ROW_KEYS)})")
    pats = row.get("patterns") or []
    if not isinstance(pats, list):
        raise SignatureTableError(f"{where}.patterns: expected a list of regexes")
    codes = row.get("exit_codes")
    if codes is not None and (not isinstance(codes, list)
                              or not all(c is None or (isinstance(c, int) and not isinstance(c, bool)) for c in codes)):
        raise SignatureTableError(f"{where}.exit_codes: expected a list of ints / null, got {codes!r}")
    st = _stages(where, row.get("stages"), stages)
    check = row.get("check")
    if check is not None and check not in CHECK_NAMES:
        raise SignatureTableError(f"{where}.check: {check!r} is not one of {CHECK_NAMES}")
    if pats and check is not None:
        raise SignatureTableError(f"{where}: a row has patterns or a check, not both")
    first = row.get("first_error", False)
    if not isinstance(first, bool):
        raise SignatureTableError(f"{where}.first_error: expected true or false, got {first!r}")
    waited = row.get("waited_past", False)
    if not isinstance(waited, bool):
        raise SignatureTableError(f"{where}.waited_past: expected true or false, got {waited!r}")
    return Signature(
        failure_class=cls, patterns=tuple(_compile(f"{where}.patterns[{j}]", p) for j, p in enumerate(pats)),
        source=str(row.get("source") or ""), requires=_opt(where, row, "requires", re.MULTILINE),
        unless=_opt(where, row, "unless", re.MULTILINE), unless_before=_opt(where, row, "unless_before"),
        near=_opt(where, row, "near"),
        not_near=_opt(where, row, "not_near"), line_unless=_opt(where, row, "line_unless"),
        exit_codes=None if codes is None else frozenset(codes), stages=st, check=check, first_error=first,
        waited_past=waited)


def _stages(where: str, st: Any, stages: set[str]) -> frozenset[str] | None:
    """The ``stages`` guard of a row or a ``raised_in`` entry: milestone names (null: a line
    before any milestone), or None."""
    if st is not None and (not isinstance(st, list) or not set(st) <= stages | {None}):
        raise SignatureTableError(f"{where}.stages: expected milestone names from {sorted(stages)} or null, got {st!r}")
    return None if st is None else frozenset(st)


def _kinds(data: dict) -> dict[str, str]:
    kinds = data.get("kinds")
    if not isinstance(kinds, dict) or not kinds:
        raise SignatureTableError("kinds: expected a mapping class -> kind")
    for cls, kind in kinds.items():
        if kind not in KINDS:
            raise SignatureTableError(f"kinds.{cls}: {kind!r} is not one of {KINDS}")
    return {str(k): str(v) for k, v in kinds.items()}


def _pairs(data: dict, section: str, name_key: str) -> list[tuple[str, re.Pattern[str]]]:
    out = []
    for i, e in enumerate(data.get(section) or []):
        where = f"{section}[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get(name_key), str) or set(e) - {name_key, "pattern", "ignore_case"}:
            raise SignatureTableError(f"{where}: expected {{{name_key}, pattern[, ignore_case]}}, got {e!r}")
        out.append((e[name_key], _compile(f"{where} ({e[name_key]})", e.get("pattern"),
                                          re.IGNORECASE if e.get("ignore_case") else 0)))
    return out


def _normalizers(data: dict) -> tuple[tuple[re.Pattern[str], str], ...]:
    out = []
    for i, e in enumerate(data.get("normalizers") or []):
        if not (isinstance(e, list) and len(e) == 2 and isinstance(e[1], str)):
            raise SignatureTableError(f"normalizers[{i}]: expected [regex, replacement], got {e!r}")
        out.append((_compile(f"normalizers[{i}]", e[0]), e[1]))
    return tuple(out)


_ADDED_KEYS = {"what", "sources", "knobs", "probe", "probe_reason"}


def _added(data: dict, kinds: dict[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for cls, e in (data.get("added_classes") or {}).items():
        where = f"added_classes.{cls}"
        if cls not in kinds:
            raise SignatureTableError(f"{where}: class is not in kinds")
        if not isinstance(e, dict) or set(e) != _ADDED_KEYS:
            raise SignatureTableError(f"{where}: expected exactly the keys {sorted(_ADDED_KEYS)}")
        if not isinstance(e["knobs"], list) or not all(isinstance(k, str) and k for k in e["knobs"]):
            raise SignatureTableError(f"{where}.knobs: expected a list of knob names")
        if e["probe"] not in ("revealable", "not_revealable"):
            raise SignatureTableError(f"{where}.probe: {e['probe']!r} is not revealable / not_revealable")
        if e["probe"] == "revealable" and kinds[cls] != "deterministic":
            raise SignatureTableError(f"{where}.probe: only a deterministic class can be revealable")
        for k in ("what", "sources", "probe_reason"):
            if not isinstance(e[k], str) or not e[k].strip():
                raise SignatureTableError(f"{where}.{k}: expected text")
        out[str(cls)] = dict(e)
    return out


class RaisedIn(NamedTuple):
    """One ``raised_in`` entry: the class of a crash whose innermost frames ``frames`` names,
    where the table says it comes from, and the startup stages it applies in (None: any)."""

    failure_class: str
    frames: re.Pattern[str]
    source: str
    stages: frozenset[str] | None = None


def _raised_in(data: dict, kinds: dict[str, str], stages: set[str]) -> tuple[RaisedIn, ...]:
    out = []
    for i, e in enumerate(data.get("raised_in") or []):
        where = f"raised_in[{i}]"
        if not isinstance(e, dict) or not {"class", "frames", "source"} <= set(e) <= {"class", "frames", "source", "stages"}:
            raise SignatureTableError(f"{where}: expected the keys class, frames, source[, stages], got {e!r}")
        if e["class"] not in kinds:
            raise SignatureTableError(f"{where} ({e['class']}): class is not in kinds")
        if not isinstance(e["source"], str) or not e["source"].strip():
            raise SignatureTableError(f"{where} ({e['class']}).source: expected text naming where the path comes from")
        out.append(RaisedIn(str(e["class"]), _compile(f"{where} ({e['class']}).frames", e["frames"]), e["source"],
                            _stages(f"{where} ({e['class']})", e.get("stages"), stages)))
    return tuple(out)


def load_tables(path: str | Path = TABLE_PATH) -> Tables:
    """Read and validate the signature tables.

    Raises:
        SignatureTableError: a missing section, an unknown key, a bad regex, a class not in
            ``kinds``, a kind not in :data:`KINDS`, an unknown stage or check, rows of one
            class that are not contiguous, or a class in ``kinds`` without a row.
    """
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise SignatureTableError(f"{path}: expected a mapping at the top level")
    kinds = _kinds(data)
    milestones = tuple(_pairs(data, "milestones", "stage"))
    stage_names = {name for name, _ in milestones}
    rows = tuple(_row(i, r, kinds, stage_names) for i, r in enumerate(data.get("signatures") or []))
    order: list[str] = []
    for r in rows:
        if order and order[-1] == r.failure_class:
            continue
        if r.failure_class in order:
            raise SignatureTableError(f"signatures: rows of {r.failure_class} are not contiguous")
        order.append(r.failure_class)
    missing = set(kinds) - set(order)
    if missing:
        raise SignatureTableError(f"signatures: no row for {sorted(missing)} (every class in kinds needs one)")
    return Tables(kinds, rows, milestones, _normalizers(data), tuple(_pairs(data, "degraded_paths", "path")),
                  _added(data, kinds), _raised_in(data, kinds, stage_names))


TABLES = load_tables()


def normalize_line(line: str) -> str:
    """Mask the run-specific parts of a log line so equal failures give equal signatures.

    Masks timestamps (``<TS>``), URLs, IPv4/IPv6 (``<IP>``), ``host:port``, NCCL
    ``host:pid:tid`` prefixes (``<HOST>``), absolute paths (``<PATH>``), hex ids
    (``<HEX>``), TP/DP/EP/PP ranks (``TP<R>``, ``rank<R>``), pids, ports, versions
    (``<V>``) and numbers (``<N>``); collapses whitespace.

    Args:
        line: one raw log line (any length; only the first :data:`MAX_LINE_CHARS` used).
    Returns:
        The normalized line, stripped, at most :data:`MAX_SIGNATURE_CHARS` chars.
    """
    s = line[:MAX_LINE_CHARS]
    for pat, repl in TABLES.normalizers:
        s = pat.sub(repl, s)
    return s.strip()[:MAX_SIGNATURE_CHARS]
