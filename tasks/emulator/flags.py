"""The SGLang launch flags the emulated server accepts: the knob table's, for a version.

``build_parser(version)`` turns the rows of SGLang's knob table
(``tasks/backends/sglang_flags.json``, the same table rendering reads) present in
``version`` into an ``argparse`` parser that behaves like SGLang's ``launch_server.py``:

* ``prog="launch_server.py"`` so errors print ``usage: launch_server.py ...``;
* ``allow_abbrev=True`` like SGLang (which relies on argparse prefix matching): that is
  what makes ``--cuda-graph-max-bs`` *ambiguous* on 0.5.20+
  ("ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode,
  --cuda-graph-max-bs-prefill"), as SGLang's own parser says;
* a deprecated alias row (``--cuda-graph-max-bs`` in 0.5.14-0.5.19) is an extra option
  string of the flag it aliases, so it stores into ``cuda_graph_max_bs_decode``;
* unknown flags -> ``error: unrecognized arguments: ...``, exit code 2.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from tasks.backends.flagtable import FlagRow, load_flag_table, parse_version

_TABLE = load_flag_table("sglang")
DEFAULT_SGLANG_VERSION = _TABLE.default_version
_TYPES = {"str": str, "int": int, "float": float}


def _decode_flag_since() -> tuple[int, ...]:
    rows = [r for r in _TABLE.rows if r.flag == "--cuda-graph-max-bs-decode"]
    if len(rows) != 1 or rows[0].since is None:
        raise ValueError("the SGLang knob table needs one --cuda-graph-max-bs-decode row with a 'since' version")
    return rows[0].since


#: First SGLang version with ``--cuda-graph-max-bs-decode`` (from the knob table).
NEW_GRAPH_FLAGS_SINCE = _decode_flag_since()


def uses_new_graph_flags(version: str) -> bool:
    """True if ``version`` has ``--cuda-graph-max-bs-decode`` (then ``cuda_graph_max_bs_decode`` is
    where the decode CUDA-graph max batch size is parsed to; else ``cuda_graph_max_bs``)."""
    return parse_version(version) >= NEW_GRAPH_FLAGS_SINCE


def flags_for(version: str = DEFAULT_SGLANG_VERSION) -> list[FlagRow]:
    """The knob-table rows present in ``version``, deprecated aliases included."""
    return _TABLE.rows_for(version)


def flag_names(version: str = DEFAULT_SGLANG_VERSION) -> set[str]:
    """All option strings (names + aliases) accepted by ``version``."""
    out: set[str] = set()
    for f in flags_for(version):
        out.add(f.flag)
        out.update(f.aliases)
    return out


class LaunchArgError(Exception):
    """argparse rejected the command line.

    Attributes:
        message: argparse's message, e.g. ``unrecognized arguments: --foo``.
        text: the full stderr text SGLang would print (usage line + ``error:`` line).
        exit_code: always 2 (argparse).
    """

    def __init__(self, message: str, text: str):
        super().__init__(message)
        self.message = message
        self.text = text
        self.exit_code = 2


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse hook
        text = f"{self.format_usage()}{self.prog}: error: {message}\n"
        raise LaunchArgError(message, text)


def build_parser(version: str = DEFAULT_SGLANG_VERSION) -> argparse.ArgumentParser:
    """An argparse parser for SGLang ``version``'s flags (raises LaunchArgError instead of exiting).

    Raises:
        ValueError: ``version`` is not a version string.
    """
    parser = _RaisingParser(prog="launch_server.py", allow_abbrev=True, add_help=False)
    rows = flags_for(version)
    extra: dict[str, list[str]] = {}  # flag -> deprecated aliases storing into it
    for r in rows:
        if r.alias_of is not None:
            extra.setdefault(r.alias_of, []).append(r.flag)
    for f in rows:
        if f.alias_of is not None:
            continue
        names = [f.flag, *f.aliases, *extra.get(f.flag, ())]
        if f.type == "bool":
            parser.add_argument(*names, dest=f.dest, action="store_true", default=False)
        else:
            parser.add_argument(*names, dest=f.dest, type=_TYPES[f.type], default=f.default,
                                choices=list(f.choices) if f.choices else None)
    return parser


@functools.cache
def _cached_parser(version: str) -> argparse.ArgumentParser:
    return build_parser(version)


#: dest -> value of every flag of the table when it is not given.
_ABSENT: dict[str, Any] = {r.dest: (False if r.type == "bool" else r.default) for r in _TABLE.rows if r.alias_of is None}


def parse_flags(args: list[str], version: str = DEFAULT_SGLANG_VERSION) -> dict[str, Any]:
    """Parse SGLang flags into a dict keyed by dest (``tp_size``, ...): every flag of the knob
    table, those ``version`` lacks at their default.

    Raises:
        LaunchArgError: unknown/ambiguous flag, bad value, or missing ``--model-path``.
    """
    parser = _cached_parser(version)
    ns, extra = parser.parse_known_args(args)
    if extra:
        parser.error("unrecognized arguments: " + " ".join(extra))
    if not ns.model_path:
        parser.error("the following arguments are required: --model-path")
    # Flags this version lacks read as absent (False / their default), like an unset flag.
    return {**_ABSENT, **vars(ns)}
