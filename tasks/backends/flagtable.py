"""The knob table of an engine: logical flag id -> full flag name per version range, as data.

One table per engine (``tasks/backends/<engine>_flags.json``), read by everything that
names a flag: rendering (:mod:`tasks.backends.sglang.knobs`), the version/parser layer
(:mod:`tasks.backends.sglang.cli`), the emulated server's parser (:mod:`tasks.emulator.flags`) and
the dry run. Loaded and validated once per process; a malformed table is a
:class:`FlagTableError` naming the file and the row.

JSON, not YAML, and stdlib only: :mod:`tasks.backends.sglang.cli` imports this inside the contract
venv, which holds SGLang's parser and nothing of servesweep's dependencies.

A row (``flags[i]``)::

    {"id": "cuda_graph_max_bs",          # logical flag id (what rendering asks for)
     "flag": "--cuda-graph-max-bs-decode",  # full option string
     "type": "int",                       # str | int | float | bool (store_true); default str
     "since": "0.5.14", "until": null,    # [since, until) versions; null = unbounded
     "aliases": [], "choices": null, "default": null,   # as the engine's parser has them
     "alias_of": null,                    # a deprecated alias: stored into that flag, never rendered
     "source": "[P23][S 0.5.14]"}         # evidence, keys of the table's "sources"

Rows of one id are in preference order: the first non-alias row covering a version is the
name rendered for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

Version = tuple[int, ...]
TYPES = ("str", "int", "float", "bool")
_HERE = Path(__file__).resolve().parent
_ROW_KEYS = frozenset({"id", "flag", "type", "since", "until", "aliases", "choices", "default", "alias_of",
                       "source", "note"})


class FlagTableError(ValueError):
    """The knob table file is malformed (the message names the file, row and field)."""


def parse_version(version: str) -> Version:
    """``"0.5.23"`` / ``"0.5.15.post1"`` / ``"0.5.23rc0"`` -> ``(0, 5, 23)`` (release part only).

    Raises:
        ValueError: no leading ``X.Y`` release number.
    """
    m = re.match(r"^\s*v?(\d+(?:\.\d+)+)", str(version))
    if not m:
        raise ValueError(f"not a version: {version!r} (expected e.g. '0.5.23')")
    return tuple(int(x) for x in m.group(1).split("."))


@dataclass(frozen=True)
class FlagRow:
    """One row of a knob table: a logical flag's full name over a version range.

    Attributes:
        logical: logical flag id (e.g. ``"cuda_graph_max_bs"``).
        flag: full option string (e.g. ``"--cuda-graph-max-bs-decode"``).
        since: first version with this name (inclusive), None = since forever.
        until: first version *without* it (exclusive), None = still present.
        source: evidence (keys of the table's ``sources``).
        type: ``str`` | ``int`` | ``float`` | ``bool`` (a store_true switch).
        aliases: further option strings of the same argument.
        choices: allowed values, or None.
        default: value when absent.
        alias_of: set on a deprecated alias row: the flag it stores into (never rendered).
    """

    logical: str
    flag: str
    since: Version | None = None
    until: Version | None = None
    source: str = ""
    type: str = "str"
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    default: Any = None
    alias_of: str | None = None

    def covers(self, v: Version) -> bool:
        """True when version tuple ``v`` is in ``[since, until)``."""
        return (self.since is None or v >= self.since) and (self.until is None or v < self.until)

    @property
    def dest(self) -> str:
        """argparse destination of the flag (``--tp-size`` -> ``tp_size``)."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class FlagTable:
    """An engine's knob table.

    Attributes:
        engine: ``"sglang"``, ``"vllm"``, ...
        default_version: the version targeted when the config names none.
        inspected_versions: versions whose parsers were read (what tests check, with the boundaries).
        sources: evidence key -> description.
        rows: every row, in file order.
    """

    engine: str
    default_version: str
    inspected_versions: tuple[str, ...]
    sources: dict[str, str]
    rows: tuple[FlagRow, ...]

    @property
    def logical_ids(self) -> tuple[str, ...]:
        """Every logical id, in first-seen order."""
        return tuple(dict.fromkeys(r.logical for r in self.rows))

    def rows_for(self, version: str) -> list[FlagRow]:
        """The rows present in ``version`` (aliases included), in file order."""
        v = parse_version(version)
        return [r for r in self.rows if r.covers(v)]

    def names_for(self, version: str) -> dict[str, str]:
        """Logical id -> the full flag name rendered for ``version`` (ids it lacks are absent)."""
        out: dict[str, str] = {}
        for r in self.rows_for(version):
            if r.alias_of is None:
                out.setdefault(r.logical, r.flag)
        return out

    def versions_to_check(self) -> list[str]:
        """The inspected versions plus every range boundary and the version just before it."""
        vs = {parse_version(v) for v in self.inspected_versions}
        for r in self.rows:
            for b in (r.since, r.until):
                if b is not None:
                    vs.add(b)
                    if b[-1] > 0:
                        vs.add((*b[:-1], b[-1] - 1))
        return [".".join(map(str, v)) for v in sorted(vs)]


class FlagUnavailable(KeyError):
    """A logical flag has no option string in the targeted engine version."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class FlagSet(Mapping[str, str]):
    """Resolved logical flag id -> full flag name for one engine version.

    A read-only mapping (``flags["cuda_graph_max_bs"] == "--cuda-graph-max-bs-decode"``);
    looking up an id the version lacks raises :class:`FlagUnavailable` naming the version,
    ``flags.get(id)`` returns None.

    Attributes:
        version: engine version the names are for (None if unknown).
        source: ``"parser"`` (read from the engine's own parser) or ``"table"``.
        flags: the resolved names.
        missing: logical ids with no option string in this version.
        option_strings: every option string of the parser (``source == "parser"`` only).
        engine: the engine's name in messages.
    """

    version: str | None
    source: str
    flags: Mapping[str, str]
    missing: frozenset[str] = frozenset()
    option_strings: frozenset[str] | None = field(default=None, repr=False, compare=False)
    engine: str = field(default="SGLang", compare=False)

    def __getitem__(self, key: str) -> str:
        try:
            return self.flags[key]
        except KeyError:
            if key in self.missing:
                raise FlagUnavailable(
                    f"{self.engine} {self.version or '?'} has no flag for {key!r} (source: {self.source}); "
                    f"drop the knob level that needs it or target another {self.engine} version"
                ) from None
            raise FlagUnavailable(f"unknown logical flag id {key!r}; known: {sorted({*self.flags, *self.missing})}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.flags)

    def __len__(self) -> int:
        return len(self.flags)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"version", "source", "flags", "missing"}``."""
        return {
            "version": self.version,
            "source": self.source,
            "flags": dict(self.flags),
            "missing": sorted(self.missing),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FlagSet:
        """Inverse of :meth:`to_dict`."""
        return cls(
            version=d.get("version"),
            source=str(d["source"]),
            flags=dict(d["flags"]),
            missing=frozenset(d.get("missing", ())),
        )


def _row(i: int, d: Any, where: str) -> FlagRow:
    at = f"{where}: flags[{i}]"
    if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not str(d.get("flag", "")).startswith("--"):
        raise FlagTableError(f"{at}: needs a string 'id' and a 'flag' starting with '--' (got {d!r})")
    unknown = set(d) - _ROW_KEYS
    if unknown:
        raise FlagTableError(f"{at} ({d['flag']}): unknown field(s) {sorted(unknown)}; known: {sorted(_ROW_KEYS)}")
    typ = d.get("type", "str")
    if typ not in TYPES:
        raise FlagTableError(f"{at} ({d['flag']}): type {typ!r} is not one of {TYPES}")
    try:
        since = parse_version(d["since"]) if d.get("since") else None
        until = parse_version(d["until"]) if d.get("until") else None
    except ValueError as e:
        raise FlagTableError(f"{at} ({d['flag']}): {e}") from None
    if since and until and since >= until:
        raise FlagTableError(f"{at} ({d['flag']}): since {d['since']} is not before until {d['until']}")
    choices = d.get("choices")
    return FlagRow(d["id"], d["flag"], since, until, str(d.get("source", "")), typ, tuple(d.get("aliases") or ()),
                   tuple(choices) if choices else None, d.get("default"), d.get("alias_of"))


def _check_consistent(rows: tuple[FlagRow, ...], where: str) -> None:
    """Each alias row names a flag row of the same id that covers the alias's whole range; one
    option string never belongs to two arguments at one version."""
    bounds = sorted({b for r in rows for b in (r.since, r.until) if b is not None} | {(0,)})
    for r in rows:
        if r.alias_of is None:
            continue
        targets = [t for t in rows if t.flag == r.alias_of and t.logical == r.logical and t.alias_of is None]
        if not targets or not all(any(t.covers(b) for t in targets) for b in bounds if r.covers(b)):
            raise FlagTableError(f"{where}: {r.flag} is an alias of {r.alias_of}, which no row of "
                                 f"{r.logical!r} defines over the alias's versions")
    for v in bounds:
        seen: dict[str, str] = {}
        for r in rows:
            if not r.covers(v):
                continue
            for name in (r.flag, *r.aliases):
                owner = r.alias_of or r.flag
                if seen.setdefault(name, owner) != owner:
                    raise FlagTableError(f"{where}: option {name} belongs to both {seen[name]} and {owner} "
                                         f"at version {'.'.join(map(str, v))}")


@cache
def load_flag_table(engine: str) -> FlagTable:
    """The validated knob table of ``engine`` (``tasks/backends/<engine>_flags.json``), cached.

    Raises:
        FlagTableError: the file is missing or malformed (names the file, row and field).
    """
    return read_flag_table(_HERE / f"{engine}_flags.json", engine)


def read_flag_table(path: Path, engine: str = "") -> FlagTable:
    """Read and validate one knob table file (see the module docstring for its rows).

    Raises:
        FlagTableError: the file is missing or malformed (names the file, row and field).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FlagTableError(f"{path}: cannot read this knob table: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("flags"), list) or not data["flags"]:
        raise FlagTableError(f"{path}: needs a non-empty 'flags' list")
    rows = tuple(_row(i, d, str(path)) for i, d in enumerate(data["flags"]))
    _check_consistent(rows, str(path))
    try:
        default = str(data["default_version"])
        parse_version(default)
        inspected = tuple(str(v) for v in data.get("inspected_versions") or ())
        for v in inspected:
            parse_version(v)
    except (KeyError, ValueError) as e:
        raise FlagTableError(f"{path}: default_version / inspected_versions: {e}") from None
    return FlagTable(str(data.get("engine", engine)), default, inspected, dict(data.get("sources") or {}), rows)
