"""Checking a launch argv against an engine's own ``argparse`` parser, with errors that name the
flag and the fix. Engine-neutral (SGLang's and vLLM's CLIs are both argparse parsers that
accept unique prefixes); stdlib only, since it runs inside contract venvs.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence

_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class PreflightError(ValueError):
    """The engine's parser rejects a launch argv.

    Attributes:
        flag: the offending option (or value) as it appeared in argv, if known.
        argv: the server argv that was checked.
    """

    def __init__(self, message: str, flag: str | None = None, argv: Sequence[str] = ()):
        super().__init__(message)
        self.flag = flag
        self.argv = list(argv)


def _skip_values(action: argparse.Action, args: Sequence[str], i: int) -> int:
    """Index of the first token after ``action``'s values starting at ``args[i]`` (by ``nargs``)."""
    nargs = action.nargs
    if nargs == 0:
        return i
    if nargs is None or nargs == "?" or isinstance(nargs, int):
        n = 1 if nargs in (None, "?") else int(nargs)
        for _ in range(n):
            if i < len(args) and (nargs != "?" or not args[i].startswith("-")):
                i += 1
        return i
    # '+', '*', REMAINDER: values run to the next option-looking token.
    while i < len(args) and (not args[i].startswith("-") or _NUMBER.match(args[i])):
        i += 1
    return i


def _not_an_option(name: str, opts: Sequence[str], args: Sequence[str], engine: str, hint: str) -> PreflightError:
    prefixed = sorted(o for o in opts if o.startswith(name)) if name.startswith("--") else []
    if len(prefixed) > 1:
        return PreflightError(
            f"{name!r} is not an {engine} option: {engine}'s parser calls it ambiguous "
            f"(it could match {', '.join(prefixed)}); write the full name of the one you mean{hint}",
            flag=name, argv=args)
    if prefixed:
        return PreflightError(
            f"{name!r} is an abbreviation of {prefixed[0]} ({engine}'s parser would accept "
            f"the prefix; servesweep renders full names only): write {prefixed[0]}",
            flag=name, argv=args)
    close = difflib.get_close_matches(name, list(opts), n=3, cutoff=0.75)
    did = f"; did you mean {', '.join(close)}?" if close else ""
    return PreflightError(f"{name!r} is not an {engine} option{did}", flag=name, argv=args)


def check_exact_options(parser: argparse.ArgumentParser, args: Sequence[str], engine: str = "SGLang",
                        hint: str = "") -> None:
    """Reject any option token that is not an exact option string of ``parser``.

    argparse would accept a unique prefix (``--cuda-graph-max-bs-dec``) or call a shared
    one ambiguous; servesweep renders full names only, so any prefix is an error here.
    Values are skipped using each action's ``nargs``.

    Args:
        engine: the engine's name in messages.
        hint: appended to the "ambiguous" message (e.g. ``" (...: --cuda-graph-max-bs-decode)"``).
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
            raise _not_an_option(name, list(opts), args, engine, hint)
        if "=" not in tok:
            i = _skip_values(action, args, i)


def explain(message: str, args: Sequence[str], parser: argparse.ArgumentParser, engine: str = "SGLang",
            hint: str = "") -> PreflightError:
    """Turn an argparse error message into a PreflightError that names the flag and the fix
    (``hint`` is appended to the "ambiguous option" message)."""
    m = re.search(r"ambiguous option: (\S+) could match (.+)$", message)
    if m:
        flag = m.group(1).split("=", 1)[0]
        return PreflightError(
            f"{engine} rejects {flag!r}: ambiguous option, it could match {m.group(2)}; "
            f"write one of those full names{hint}",
            flag=flag, argv=args)
    m = re.search(r"unrecognized arguments: (.+)$", message)
    if m:
        first = m.group(1).split()[0]
        close = difflib.get_close_matches(first.split("=", 1)[0], list(parser._option_string_actions), n=3, cutoff=0.75)
        did = f"; did you mean {', '.join(close)}?" if close else ""
        return PreflightError(f"{engine} rejects unrecognized argument(s) {m.group(1)}{did}", flag=first, argv=args)
    m = re.search(r"argument ([^:]+): (.+)$", message)
    if m:
        flag = m.group(1).split("/")[0].strip()
        return PreflightError(f"{engine} rejects {flag}: {m.group(2)}", flag=flag, argv=args)
    return PreflightError(f"{engine} rejects the argv: {message}", argv=args)
