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
* is a CLI: ``python -m tasks.backends.sglang.cli flags`` and
  ``python -m tasks.backends.sglang.cli check-argv --json '<argv or list of argvs>'``.

Stdlib only (it runs inside the contract venv, which has SGLang but not servesweep's deps).

The flag names, their version ranges and the evidence for each live in the knob table
(``tasks/backends/sglang_flags.json``, loaded by :mod:`tasks.backends.flagtable`).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.backends.argcheck import PreflightError, check_exact_options, explain
from tasks.backends.flagtable import FlagRow, FlagSet, FlagUnavailable, Version, load_flag_table, parse_version

__all__ = ["FlagRow", "FlagSet", "FlagUnavailable", "PreflightError", "Version", "parse_version"]  # re-exported for callers

#: SGLang's knob table (logical flag id -> full flag name per version range, with sources).
TABLE = load_flag_table("sglang")
DEFAULT_SGLANG_VERSION = TABLE.default_version
VERSION_TABLE: tuple[FlagRow, ...] = TABLE.rows
LOGICAL_IDS: tuple[str, ...] = TABLE.logical_ids

# Exit codes of ``check-argv``: 0 all accepted, 1 some argv rejected, 3 SGLang not importable.
EXIT_OK, EXIT_REJECTED, EXIT_NO_SGLANG = 0, 1, 3

REPO_ROOT = Path(__file__).resolve().parents[3]
#: Appended to "ambiguous option" errors: the rename users hit most.
_HINT = " (CUDA-graph max batch size on SGLang >= 0.5.14: --cuda-graph-max-bs-decode)"


def flags_from_table(version: str = DEFAULT_SGLANG_VERSION) -> FlagSet:
    """Logical ids -> names for ``version`` from the knob table (no SGLang needed).

    Raises:
        ValueError: ``version`` is not a version string.
    """
    flags = TABLE.names_for(version)
    return FlagSet(version, "table", flags, frozenset(LOGICAL_IDS) - set(flags))


def flags_from_parser(parser: argparse.ArgumentParser, version: str | None = None) -> FlagSet:
    """Logical ids -> names read from a parser that ``ServerArgs.add_cli_args`` filled.

    For each logical id the candidate names of the knob table (all versions, newest first;
    deprecated aliases skipped) are tried and the first *exact* option string the parser has
    wins; prefixes are never used.
    """
    opts = frozenset(parser._option_string_actions)
    flags: dict[str, str] = {}
    for row in VERSION_TABLE:
        if row.alias_of is None and row.logical not in flags and row.flag in opts:
            flags[row.logical] = row.flag
    return FlagSet(version, "parser", flags, frozenset(LOGICAL_IDS) - set(flags), opts)


# ---------------------------------------------------------------------------------------
# SGLang's parser (in this interpreter, when importable)
# ---------------------------------------------------------------------------------------
class SGLangUnavailable(RuntimeError):
    """SGLang cannot be imported here and no other interpreter was given to check with."""


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
    ``python -m tasks.backends.sglang.cli flags --json``); else :data:`VERSION_TABLE` for
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
        check_exact_options(parser, args, hint=_HINT)
    try:
        ns = parser.parse_args(args)
    except _ParserError as e:
        raise explain(str(e), args, parser, hint=_HINT) from None
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
    """Run ``python -m tasks.backends.sglang.cli <cli_args>`` with this repo on PYTHONPATH (argv list)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    try:
        return subprocess.run(
            [python, "-m", "tasks.backends.sglang.cli", *cli_args],
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
    through ``python -m tasks.backends.sglang.cli check-argv`` (argv list, no shell).

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
    ap = argparse.ArgumentParser(prog="python -m tasks.backends.sglang.cli", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("flags", help="print the resolved FlagSet")
    f.add_argument("--version", default=None, help="table version when SGLang is not importable")
    f.add_argument("--table", action="store_true", help="use the version table even if SGLang is importable")
    f.add_argument("--json", action="store_true", help="machine-readable output")
    c = sub.add_parser("check-argv", help="check launch argv(s) with SGLang's parser (in this interpreter)")
    c.add_argument("--json", required=True, dest="payload", help="JSON list of strings, or list of such lists; '-' reads stdin")
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
