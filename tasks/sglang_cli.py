"""SGLang launch flags by version, and preflight of a launch argv against SGLang's own parser.

Why: SGLang renames flags between releases and its parser accepts unique prefixes
(``argparse`` ``allow_abbrev=True``), so a stale or abbreviated flag either fails at
startup (after minutes of GPU time) or silently means something else. This module

* maps *logical flag ids* (``cuda_graph_max_bs``, ``disable_custom_all_reduce``, ...) to
  the full flag name of a given SGLang version: read from the installed SGLang's parser
  when it is importable, otherwise from :data:`VERSION_TABLE`;
* checks a launch argv with SGLang's real parser before any GPU is touched
  (:func:`preflight_argv`): in-process when SGLang is importable, else through a checker
  subprocess run by another interpreter (the contract venv's, or the node's);
* is a CLI: ``python -m tasks.sglang_cli flags`` and
  ``python -m tasks.sglang_cli check-argv --json '<argv or list of argvs>'``.

Stdlib only (it runs inside the contract venv, which has SGLang but not servesweep's deps).

Sources for the table (all read by us, 2026-11):
  [P23] SGLang 0.5.23 wheel, its real parser: ``ServerArgs.add_cli_args`` dumped in the
        contract venv (``scripts/contract_env.sh``). 561 option strings.
  [P22] SGLang 0.5.22 wheel, real parser dumped the same way (546 option strings).
  [S]   Static reading of ``sglang/srt/server_args.py`` in the 0.5.3, 0.5.6, 0.5.10,
        0.5.14, 0.5.17 and 0.5.20 wheels (``parser.add_argument("--...")`` literals and, from
        0.5.14 on, the annotated field declarations the parser is generated from).
  Versions between inspected ones (0.5.7-0.5.9, 0.5.11-0.5.13, 0.5.18-0.5.19, 0.5.21)
  were not inspected; the table assigns them to the older side of each boundary [A].
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_SGLANG_VERSION = "0.5.23"

# Exit codes of ``check-argv``: 0 all accepted, 1 some argv rejected, 3 SGLang not importable.
EXIT_OK, EXIT_REJECTED, EXIT_NO_SGLANG = 0, 1, 3

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------
# Version table
# ---------------------------------------------------------------------------------------
Version = tuple[int, ...]


@dataclass(frozen=True)
class FlagRow:
    """One row of :data:`VERSION_TABLE`: a logical flag's full name over a version range.

    Attributes:
        logical: logical flag id (e.g. ``"cuda_graph_max_bs"``).
        flag: full option string (e.g. ``"--cuda-graph-max-bs-decode"``).
        since: first version with this name (inclusive), None = since forever.
        until: first version *without* it (exclusive), None = still present in 0.5.23.
        source: evidence ([P23], [P22], [S], [A]: see the module docstring).
    """

    logical: str
    flag: str
    since: Version | None = None
    until: Version | None = None
    source: str = "[P23][P22][S]"

    def covers(self, v: Version) -> bool:
        """True when version tuple ``v`` is in ``[since, until)``."""
        return (self.since is None or v >= self.since) and (self.until is None or v < self.until)


#: Logical id -> full flag, per version range. Rows for one logical id are ordered by
#: preference (newest name first); :func:`resolve_flags` on a live parser also tries them
#: in this order and takes the first exact option string the parser has.
VERSION_TABLE: tuple[FlagRow, ...] = (
    FlagRow("model_path", "--model-path"),
    FlagRow("tp_size", "--tp-size"),
    FlagRow("trust_remote_code", "--trust-remote-code"),
    FlagRow("host", "--host"),
    FlagRow("port", "--port"),
    FlagRow("nccl_port", "--nccl-port"),
    FlagRow("mem_fraction_static", "--mem-fraction-static"),
    FlagRow("ep_size", "--ep-size"),  # aliases --expert-parallel-size, --ep [P23]
    FlagRow("moe_a2a_backend", "--moe-a2a-backend"),
    # All-reduce paths.
    FlagRow("disable_custom_all_reduce", "--disable-custom-all-reduce"),
    FlagRow("enable_torch_symm_mem", "--enable-torch-symm-mem", source="[P23][P22][S 0.5.3+]"),
    # Deprecated since 0.5.14 in favour of --flashinfer-allreduce-fusion-backend=auto, still
    # accepted by 0.5.23 [P23 help text] (and by the emulator), so it stays the rendering.
    FlagRow("enable_flashinfer_allreduce_fusion", "--enable-flashinfer-allreduce-fusion"),
    # Absent in 0.5.3 and 0.5.6, present from 0.5.10 [S] (PR #21446, 2026-03).
    FlagRow(
        "enforce_disable_flashinfer_allreduce_fusion",
        "--enforce-disable-flashinfer-allreduce-fusion",
        since=(0, 5, 10),
        source="[P23][P22][S 0.5.10, absent 0.5.6][A 0.5.7-0.5.9]",
    ),
    # choices in 0.5.23: auto, trtllm, mnnvl, cutedsl [P23]; declared from 0.5.14 [S].
    FlagRow(
        "flashinfer_allreduce_fusion_backend",
        "--flashinfer-allreduce-fusion-backend",
        since=(0, 5, 14),
        source="[P23][P22][S 0.5.14, absent 0.5.10][A 0.5.11-0.5.13]",
    ),
    # CUDA-graph max batch size: 0.5.14-0.5.17 have -decode plus the old name as a
    # DeprecatedAliasStoreAction [S]; 0.5.20 has no alias [S]; 0.5.22/0.5.23 have only
    # -decode/-prefill, so the old name is *ambiguous* there [P22][P23].
    FlagRow(
        "cuda_graph_max_bs",
        "--cuda-graph-max-bs-decode",
        since=(0, 5, 14),
        source="[P23][P22][S 0.5.14, 0.5.17, 0.5.20][A 0.5.11-0.5.13]",
    ),
    FlagRow("cuda_graph_max_bs", "--cuda-graph-max-bs", until=(0, 5, 14), source="[S 0.5.3-0.5.10]"),
    # Speculative decoding. --speculative-algorithm is a free string in 0.5.23 (no argparse
    # choices); the name is checked later by SpeculativeAlgorithm.from_string [P23].
    FlagRow("speculative_algorithm", "--speculative-algorithm"),
    FlagRow("speculative_draft_model_path", "--speculative-draft-model-path"),  # alias --speculative-draft-model
    FlagRow("speculative_num_steps", "--speculative-num-steps"),
    FlagRow("speculative_eagle_topk", "--speculative-eagle-topk"),
    FlagRow("speculative_num_draft_tokens", "--speculative-num-draft-tokens"),
)

LOGICAL_IDS: tuple[str, ...] = tuple(dict.fromkeys(r.logical for r in VERSION_TABLE))


def parse_version(version: str) -> Version:
    """``"0.5.23"`` / ``"0.5.15.post1"`` / ``"0.5.23rc0"`` -> ``(0, 5, 23)`` (release part only).

    Raises:
        ValueError: no leading ``X.Y`` release number.
    """
    m = re.match(r"^\s*v?(\d+(?:\.\d+)+)", version)
    if not m:
        raise ValueError(f"not an SGLang version: {version!r} (expected e.g. '0.5.23')")
    return tuple(int(x) for x in m.group(1).split("."))


class FlagUnavailable(KeyError):
    """A logical flag has no option string in the targeted SGLang version."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class FlagSet(Mapping[str, str]):
    """Resolved logical flag id -> full flag name for one SGLang version.

    A read-only mapping (``flags["cuda_graph_max_bs"] == "--cuda-graph-max-bs-decode"``);
    looking up an id the version lacks raises :class:`FlagUnavailable` naming the version,
    ``flags.get(id)`` returns None.

    Attributes:
        version: SGLang version the names are for (None if unknown).
        source: ``"parser"`` (read from SGLang's own parser) or ``"table"``.
        flags: the resolved names.
        missing: logical ids with no option string in this version.
        option_strings: every option string of the parser (``source == "parser"`` only).
    """

    version: str | None
    source: str
    flags: Mapping[str, str]
    missing: frozenset[str] = frozenset()
    option_strings: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def __getitem__(self, key: str) -> str:
        try:
            return self.flags[key]
        except KeyError:
            if key in self.missing:
                raise FlagUnavailable(
                    f"SGLang {self.version or '?'} has no flag for {key!r} (source: {self.source}); "
                    f"drop the knob level that needs it or target another SGLang version"
                ) from None
            raise FlagUnavailable(f"unknown logical flag id {key!r}; known: {sorted(LOGICAL_IDS)}") from None

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


def flags_from_table(version: str = DEFAULT_SGLANG_VERSION) -> FlagSet:
    """Logical ids -> names for ``version`` from :data:`VERSION_TABLE` (no SGLang needed).

    Raises:
        ValueError: ``version`` is not a version string.
    """
    v = parse_version(version)
    flags: dict[str, str] = {}
    for row in VERSION_TABLE:
        if row.logical not in flags and row.covers(v):
            flags[row.logical] = row.flag
    return FlagSet(version, "table", flags, frozenset(LOGICAL_IDS) - set(flags))


def flags_from_parser(parser: argparse.ArgumentParser, version: str | None = None) -> FlagSet:
    """Logical ids -> names read from a parser that ``ServerArgs.add_cli_args`` filled.

    For each logical id the candidate names of :data:`VERSION_TABLE` (all versions, newest
    first) are tried and the first *exact* option string the parser has wins; prefixes are
    never used.
    """
    opts = frozenset(parser._option_string_actions)
    flags: dict[str, str] = {}
    for row in VERSION_TABLE:
        if row.logical not in flags and row.flag in opts:
            flags[row.logical] = row.flag
    return FlagSet(version, "parser", flags, frozenset(LOGICAL_IDS) - set(flags), opts)


# ---------------------------------------------------------------------------------------
# SGLang's parser (in this interpreter, when importable)
# ---------------------------------------------------------------------------------------
class SGLangUnavailable(RuntimeError):
    """SGLang cannot be imported here and no other interpreter was given to check with."""


class PreflightError(ValueError):
    """SGLang's parser rejects a launch argv.

    Attributes:
        flag: the offending option (or value) as it appeared in argv, if known.
        argv: the server argv that was checked.
    """

    def __init__(self, message: str, flag: str | None = None, argv: Sequence[str] = ()):
        super().__init__(message)
        self.flag = flag
        self.argv = list(argv)


class _ParserError(Exception):
    """Raised instead of argparse's print-and-exit."""


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse hook
        raise _ParserError(message)

    def exit(self, status: int = 0, message: str | None = None):  # e.g. --help, --version
        raise _ParserError(message or f"parser exited with status {status}")


def sglang_importable() -> bool:
    """True when ``sglang`` is installed in this interpreter (does not import it)."""
    return importlib.util.find_spec("sglang") is not None


@functools.lru_cache(maxsize=1)
def _sglang_parser() -> tuple[argparse.ArgumentParser, str | None]:
    """SGLang's own CLI parser (as ``prepare_server_args`` builds it) and SGLang's version.

    Imports ``sglang.srt.server_args`` (~4 s on our 2-core machines, torch included);
    cached for the process.

    Raises:
        SGLangUnavailable: SGLang (or one of its imports) is missing.
    """
    try:
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    except Exception as e:  # ImportError, or a broken install raising anything
        raise SGLangUnavailable(f"cannot import sglang.srt.server_args: {type(e).__name__}: {e}") from e
    # prepare_server_args uses ArgumentParser(prog="sglang serve") with allow_abbrev left on.
    parser = _RaisingParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    try:
        from importlib.metadata import version as _dist_version

        version: str | None = _dist_version("sglang")
    except Exception:
        version = None
    return parser, version


def resolve_flags(
    version: str | None = None,
    parser: argparse.ArgumentParser | None = None,
    python: str | None = None,
) -> FlagSet:
    """The launch-flag names to render, from the best source available.

    Order: an explicit ``parser``; else SGLang's parser in this interpreter when SGLang is
    importable; else SGLang's parser in interpreter ``python`` (subprocess
    ``python -m tasks.sglang_cli flags --json``); else :data:`VERSION_TABLE` for
    ``version`` (default :data:`DEFAULT_SGLANG_VERSION`).

    Args:
        version: SGLang version for the table fallback (and the label of ``parser``).
        parser: a parser ``ServerArgs.add_cli_args`` has filled.
        python: path of an interpreter with SGLang installed.

    Raises:
        SGLangUnavailable: ``python`` was given but could not resolve the flags.
        ValueError: ``version`` is not a version string.
    """
    if parser is not None:
        return flags_from_parser(parser, version)
    if sglang_importable():
        try:
            p, v = _sglang_parser()
            return flags_from_parser(p, v)
        except SGLangUnavailable:
            pass
    if python:
        proc = _run_checker(python, ["flags", "--json"], timeout_s=180.0)
        if proc.returncode != 0:
            raise SGLangUnavailable(f"{python} could not resolve SGLang flags: {proc.stderr.strip()[-800:]}")
        return FlagSet.from_dict(json.loads(proc.stdout))
    return flags_from_table(version or DEFAULT_SGLANG_VERSION)


# ---------------------------------------------------------------------------------------
# Preflight
# ---------------------------------------------------------------------------------------
def server_args_of(argv: Sequence[str]) -> list[str]:
    """The server-argument part of a launch argv.

    Strips a launcher prefix: everything up to ``-m sglang.launch_server``, a
    ``.../launch_server.py`` script, or ``sglang serve``. An argv that starts with an
    option is returned as is.
    """
    a = [str(x) for x in argv]
    for i, tok in enumerate(a):
        if tok == "sglang.launch_server" and i > 0 and a[i - 1] == "-m":
            return a[i + 1 :]
        if tok.endswith("launch_server.py"):
            return a[i + 1 :]
        if tok == "serve" and i > 0 and os.path.basename(a[i - 1]) == "sglang":
            return a[i + 1 :]
    return a


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _check_exact_options(parser: argparse.ArgumentParser, args: Sequence[str]) -> None:
    """Reject any option token that is not an exact option string of ``parser``.

    argparse would accept a unique prefix (``--cuda-graph-max-bs-dec``) or call a shared
    one ambiguous; servesweep renders full names only, so any prefix is an error here.
    Values are skipped using each action's ``nargs``.

    Raises:
        PreflightError: names the token and the full option(s) it abbreviates or resembles.
    """
    opts = parser._option_string_actions
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            return
        if not tok.startswith("-") or tok == "-" or _NUMBER.match(tok):
            continue
        name = tok.split("=", 1)[0] if tok.startswith("--") else tok
        action = opts.get(name)
        if action is None:
            prefixed = sorted(o for o in opts if o.startswith(name)) if name.startswith("--") else []
            if len(prefixed) > 1:
                raise PreflightError(
                    f"{name!r} is not an SGLang option: SGLang's parser calls it ambiguous "
                    f"(it could match {', '.join(prefixed)}); write the full name of the one "
                    f"you mean (CUDA-graph max batch size on SGLang >= 0.5.14: --cuda-graph-max-bs-decode)",
                    flag=name,
                    argv=args,
                )
            if prefixed:
                raise PreflightError(
                    f"{name!r} is an abbreviation of {prefixed[0]} (SGLang's parser would accept "
                    f"the prefix; servesweep renders full names only): write {prefixed[0]}",
                    flag=name,
                    argv=args,
                )
            close = difflib.get_close_matches(name, list(opts), n=3, cutoff=0.75)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise PreflightError(f"{name!r} is not an SGLang option{hint}", flag=name, argv=args)
        if "=" in tok:
            continue
        nargs = action.nargs
        if nargs == 0:
            continue
        if nargs is None or nargs == "?" or isinstance(nargs, int):
            n = 1 if nargs in (None, "?") else int(nargs)
            for _ in range(n):
                if i < len(args) and (nargs != "?" or not args[i].startswith("-")):
                    i += 1
            continue
        # '+', '*', REMAINDER: values run to the next option-looking token.
        while i < len(args) and (not args[i].startswith("-") or _NUMBER.match(args[i])):
            i += 1


def _explain(message: str, args: Sequence[str], parser: argparse.ArgumentParser) -> PreflightError:
    """Turn an argparse error message into a PreflightError that names the flag and the fix."""
    m = re.search(r"ambiguous option: (\S+) could match (.+)$", message)
    if m:
        flag = m.group(1).split("=", 1)[0]
        return PreflightError(
            f"SGLang rejects {flag!r}: ambiguous option, it could match {m.group(2)}; "
            f"write one of those full names (for the CUDA-graph max batch size on SGLang "
            f">= 0.5.14 that is --cuda-graph-max-bs-decode)",
            flag=flag,
            argv=args,
        )
    m = re.search(r"unrecognized arguments: (.+)$", message)
    if m:
        first = m.group(1).split()[0]
        close = difflib.get_close_matches(first.split("=", 1)[0], list(parser._option_string_actions), n=3, cutoff=0.75)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return PreflightError(f"SGLang rejects unrecognized argument(s) {m.group(1)}{hint}", flag=first, argv=args)
    m = re.search(r"argument ([^:]+): (.+)$", message)
    if m:
        flag = m.group(1).split("/")[0].strip()
        return PreflightError(f"SGLang rejects {flag}: {m.group(2)}", flag=flag, argv=args)
    return PreflightError(f"SGLang rejects the argv: {message}", argv=args)


def check_server_args(
    args: Sequence[str], parser: argparse.ArgumentParser | None = None, strict: bool = True
) -> argparse.Namespace:
    """Parse server args with SGLang's parser in this interpreter; return the namespace.

    Checks, in order: every option token is an exact option string; argparse accepts the
    argv (types, choices, required ``--model-path``); ``--speculative-algorithm`` names an
    algorithm ``SpeculativeAlgorithm.from_string`` knows (SGLang's parser has no choices for
    it and only fails at startup). SGLang's later resolution (``ServerArgs.resolve_once``)
    needs the model's config and ``transformers``, so it is not run here.
    ``strict=False`` skips servesweep's own rules (exact option strings, no ``--config``)
    and so accepts exactly what SGLang accepts before loading a model.

    Raises:
        PreflightError: the argv is rejected (message names the flag and the fix).
        SGLangUnavailable: SGLang is not importable and no parser was given.
    """
    args = [str(x) for x in args]
    if parser is None:
        parser, _ = _sglang_parser()
    if strict and "--config" in args:
        raise PreflightError(
            "--config merges a YAML file into the argv; servesweep renders explicit flags only",
            flag="--config",
            argv=args,
        )
    if strict:
        _check_exact_options(parser, args)
    try:
        ns = parser.parse_args(args)
    except _ParserError as e:
        raise _explain(str(e), args, parser) from None
    algo = getattr(ns, "speculative_algorithm", None)
    if algo is not None:
        try:
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # type: ignore[import-not-found]
        except Exception:
            SpeculativeAlgorithm = None  # noqa: N806 - older layouts: parser check only
        if SpeculativeAlgorithm is not None:
            try:
                SpeculativeAlgorithm.from_string(algo)
            except ValueError as e:
                raise PreflightError(
                    f"SGLang rejects --speculative-algorithm {algo!r}: {e} (builtins include EAGLE, EAGLE3)",
                    flag="--speculative-algorithm",
                    argv=args,
                ) from None
    return ns


def _run_checker(
    python: str, cli_args: list[str], timeout_s: float, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tasks.sglang_cli <cli_args>`` with this repo on PYTHONPATH (argv list)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    try:
        return subprocess.run(
            [python, "-m", "tasks.sglang_cli", *cli_args],
            capture_output=True,
            input=stdin,
            text=True,
            env=env,
            cwd=str(REPO_ROOT),
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SGLangUnavailable(f"checker {python!r} failed to run: {e}") from e


def check_many(
    argvs: Sequence[Sequence[str]], python: str | None = None, strict: bool = True
) -> list[dict[str, Any]]:
    """Check several launch argvs at once; one result dict per argv.

    Each result is ``{"ok": bool, "error": str | None, "flag": str | None}``. In-process
    when SGLang is importable here, else with ``python`` in one subprocess (SGLang's import
    costs ~4 s, so batching matters). ``strict``: see :func:`check_server_args`.

    Raises:
        SGLangUnavailable: neither SGLang here nor a working ``python`` checker.
    """
    if not sglang_importable() or python:
        if not python:
            raise SGLangUnavailable(
                "SGLang is not importable in this interpreter; pass python=<interpreter with "
                "SGLang> (e.g. .contract-venv/bin/python, or the node's)"
            )
        payload = json.dumps([[str(x) for x in a] for a in argvs])
        # The batch goes through stdin: one argv element is capped at 128 KiB on Linux.
        cli = ["check-argv", "--json", "-"] + ([] if strict else ["--lenient"])
        proc = _run_checker(python, cli, timeout_s=300.0, stdin=payload)
        if proc.returncode not in (EXIT_OK, EXIT_REJECTED):
            raise SGLangUnavailable(
                f"checker {python} exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-800:]}"
            )
        results = json.loads(proc.stdout)["results"]
        if len(results) != len(argvs):
            raise SGLangUnavailable(f"checker returned {len(results)} results for {len(argvs)} argvs")
        return results
    out: list[dict[str, Any]] = []
    for a in argvs:
        try:
            check_server_args(server_args_of(a), strict=strict)
            out.append({"ok": True, "error": None, "flag": None})
        except PreflightError as e:
            out.append({"ok": False, "error": str(e), "flag": e.flag})
    return out


def preflight_argv(argv: list[str], python: str | None = None) -> None:
    """Check one launch argv with SGLang's real parser before any GPU time is spent.

    ``argv`` may carry a launcher prefix (``python -m sglang.launch_server ...``); the node's
    ``--host/--port/--nccl-port`` may be present or not. In-process when SGLang is
    importable here (see :func:`check_server_args`); otherwise with interpreter ``python``
    through ``python -m tasks.sglang_cli check-argv`` (argv list, no shell).

    Raises:
        PreflightError: SGLang rejects the argv; the message names the flag/value and the fix.
        SGLangUnavailable: SGLang is not importable here and ``python`` is None or broken.
    """
    (res,) = check_many([argv], python=python)
    if not res["ok"]:
        raise PreflightError(res["error"], flag=res.get("flag"), argv=server_args_of(argv))


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``flags [--version V] [--json]`` | ``check-argv --json '<argv | [argv, ...]>'``.

    ``check-argv`` prints ``{"sglang_version": ..., "flags": <FlagSet.to_dict()>,
    "results": [{"ok", "error", "flag"}]}``
    and exits 0 when every argv is accepted, 1 when any is rejected, 3 when SGLang is not
    importable in this interpreter.
    """
    ap = argparse.ArgumentParser(prog="python -m tasks.sglang_cli", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("flags", help="print the resolved FlagSet")
    f.add_argument("--version", default=None, help="table version when SGLang is not importable")
    f.add_argument("--table", action="store_true", help="use the version table even if SGLang is importable")
    f.add_argument("--json", action="store_true", help="machine-readable output")
    c = sub.add_parser("check-argv", help="check launch argv(s) with SGLang's parser (in this interpreter)")
    c.add_argument("--json", required=True, dest="payload", help="JSON list of strings, or list of such lists; '-' reads it from stdin")
    c.add_argument("--lenient", action="store_true", help="accept what SGLang accepts (prefixes, --config)")
    ns = ap.parse_args(argv)

    if ns.cmd == "flags":
        fs = flags_from_table(ns.version or DEFAULT_SGLANG_VERSION) if ns.table else resolve_flags(ns.version)
        if ns.json:
            print(json.dumps(fs.to_dict(), indent=None))
        else:
            print(f"# SGLang {fs.version or '?'} (source: {fs.source})")
            for k in LOGICAL_IDS:
                print(f"{k:48s} {fs.flags.get(k, '-- not available --')}")
        return 0

    payload = json.loads(sys.stdin.read() if ns.payload == "-" else ns.payload)
    batch = payload if payload and all(isinstance(x, list) for x in payload) else [payload]
    try:
        _, version = _sglang_parser()
    except SGLangUnavailable as e:
        print(json.dumps({"error": str(e)}))
        return EXIT_NO_SGLANG
    results = check_many(batch, strict=not ns.lenient)
    flags = resolve_flags().to_dict()
    print(json.dumps({"sglang_version": version, "flags": flags, "results": results}))
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_REJECTED


if __name__ == "__main__":
    sys.exit(main())
