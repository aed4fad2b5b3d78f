"""One clear line for the command-line mistakes Hydra answers with advice or a traceback.

* An override of a key the config does not declare (``sweep.budgt.trials=3``): Hydra says
  "Could not override ... use +key", which would ADD the typo. We name the closest declared
  key instead (:func:`difflib.get_close_matches` over every dotted key of the composed config).
* A config group option that does not exist (``sweep=smok``): the closest option.
* A YAML file that does not parse: ``<file>:<line>:<column>: <problem>`` (1-based, as editors count).

:func:`precheck` composes the config with the Hydra compose API before ``@hydra.main`` runs
(~0.3 s); every message it returns means exit code 2 (:data:`sweeps.errors.EXIT_CONFIG`), nothing started.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

_OVERRIDE = re.compile(r"Could not override '([^']+)'")
_MISSING_OPTION = re.compile(r"Could not find '([^'/]+)/([^']+)'")
_OPTIONS = re.compile(r"Available options in '[^']+':\n((?:\t[^\n]+\n?)+)")


def yaml_error_line(e: yaml.YAMLError) -> str:
    """``file:line:column: problem (context)`` of a YAML parse error (1-based line and column)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    if mark is None:
        return f"YAML: {problem}"
    line, col = mark.line + 1, mark.column + 1
    return f"{mark.name}:{line}:{col}: {problem}" + (f" ({context})" if context else "") + \
        f" [line {line}, column {col}]"


def dotted_keys(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a plain nested dict (``sweep.budget.trials``), parents included."""
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            yield key
            yield from dotted_keys(v, key + ".")


def closest(word: str, choices: Sequence[str]) -> str | None:
    """The closest of ``choices`` to ``word`` (difflib ratio >= 0.6), or None."""
    got = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return got[0] if got else None


def _compose(conf_dir: Path, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            return OmegaConf.to_container(compose("config", overrides=overrides), resolve=False)
    finally:
        GlobalHydra.instance().clear()


#: mappings whose entries are the user's to add (a knob, a baseline value, a server variable):
#: Hydra adds a new one with "+"; every other section has a fixed set of keys
_OPEN_MAPPINGS = ("sweep.params", "sweep.baseline", "backend.env")
#: the fields a param of the space may set (sweeps.config.space.parse_space): one it leaves out is
#: added with "+" too
_PARAM_FIELDS = ("type", "choices", "low", "high", "log", "step", "when", "ordered")


def unknown_key_message(conf_dir: Path, overrides: list[str], key: str) -> str:
    """The message for an override of an undeclared ``key``: the closest declared key."""
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("~+") != key]
    try:
        keys = list(dotted_keys(_compose(conf_dir, rest)))
    except Exception:  # noqa: BLE001 - another override is broken too: suggest from the defaults
        keys = list(dotted_keys(_compose(conf_dir, [])))
    value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key and "=" in o), "...")
    parent, _, leaf = key.rpartition(".")
    # a typo is most likely of a sibling (sweep.budget.trails -> sweep.budget.trials); a key that is
    # like none of its siblings under an existing mapping is a new entry, which Hydra adds with "+"
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    near = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.75)
    # a typo in the parent (sweep.params.cuda_grph_max_bs.choices): the parent's siblings
    grand, _, pleaf = parent.rpartition(".")
    uncle = (difflib.get_close_matches(pleaf, [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == grand],
                                       n=1, cutoff=0.75) if parent and parent not in keys else [])
    if near:
        hint = f"did you mean {parent + '.' if parent else ''}{near[0]}={value}?"
    elif uncle:
        hint = f"did you mean {grand + '.' if grand else ''}{uncle[0]}.{leaf}={value}?"
    elif grand in _OPEN_MAPPINGS and parent not in keys:
        hint = (f"{grand} has no entry '{pleaf}'; a new one is added whole, e.g. "
                f"+{parent}={{type: categorical, choices: [...]}}" if grand == "sweep.params"
                else f"{grand} has no entry '{pleaf}'; to add one, write +{parent}=...")
    elif parent in _OPEN_MAPPINGS:
        hint = f"{parent} has no entry '{leaf}' yet; to add one, write +{key}={value}"
    elif parent.rpartition(".")[0] == "sweep.params" and leaf in _PARAM_FIELDS:
        hint = f"{parent} does not set its optional field '{leaf}'; to add it, write +{key}={value}"
    elif parent and any(k.startswith(parent + ".") for k in keys):
        hint = f"{parent} has no key '{leaf}'; its keys: {', '.join(sorted(set(siblings)))}"
    elif (best := closest(key, keys)) is not None:
        hint = f"did you mean {best}={value}?"
    else:
        hint = "check the spelling against conf/config.yaml and conf/<group>/*.yaml"
    return f"servesweep: unknown config key '{key}': {hint} (nothing was started)"


def missing_option_message(text: str, group: str, option: str) -> str:
    """The message for ``group=option`` naming no file: the closest option and the list."""
    m = _OPTIONS.search(text)
    options = [x.strip() for x in m.group(1).splitlines() if x.strip()] if m else []
    best = closest(option, options)
    hint = f"did you mean {group}={best}? " if best else ""
    return f"servesweep: no config '{group}/{option}.yaml': {hint}options: {', '.join(options)} (nothing was started)"


def explain(e: BaseException, conf_dir: Path, overrides: list[str]) -> str | None:
    """One line for a composition error ``e`` (see the module doc), or None when it is not one we explain."""
    for c in _chain(e):
        if isinstance(c, yaml.YAMLError):
            return f"servesweep: {yaml_error_line(c)} (the YAML does not parse; nothing was started)"
    for c in _chain(e):
        if type(c).__name__ == "OverrideParseException":  # hydra.errors: the override's own syntax
            return parse_error_message(c)
    text = str(e)
    m = _OVERRIDE.search(text)
    if m:
        return unknown_key_message(conf_dir, overrides, m.group(1))
    m = _MISSING_OPTION.search(text)
    if m:
        return missing_option_message(text, m.group(1), m.group(2))
    return None


def parse_error_message(e: BaseException) -> str:
    """One line for an override Hydra's grammar rejects (``LexerNoViableAltException`` and the
    like): the override, where it stopped reading, and the quoting that fixes the common cases."""
    override = str(getattr(e, "override", "") or "")
    lines = str(e).splitlines()
    col = lines[1].index("^") - (len(lines[0]) - len(override)) if len(lines) > 1 and "^" in lines[1] else -1
    at = f" at {override[col:col + 12]!r}" if 0 <= col < len(override) else ""
    constraint = ("; write a constraint as {name: n, expr: 'x <= 4'}" if "constraints" in override.split("=", 1)[0]
                  else "")
    return (f"servesweep: cannot parse the override {override!r}{at}: quote a value that holds spaces, "
            f"operators or non-ASCII characters (\"key='a <= 4'\"){constraint} (Hydra's override grammar; "
            f"nothing was started)")


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    c: BaseException | None = e
    while c is not None and id(c) not in seen:
        seen.add(id(c))
        yield c
        c = c.__cause__ or c.__context__


#: Hydra flags that change what is printed, not what is composed: the precheck still runs
_VIEW_FLAGS = {"--cfg": 1, "-c": 1, "--resolve": 0, "--package": 1, "-p": 1}


def _config_path(argv: Sequence[str], conf_dir: Path) -> tuple[Path | str, list[str]] | None:
    """``--config-path``/``-cp`` taken out of ``argv`` (relative to the entry script's
    directory, ``conf_dir``'s parent, and with no ``~`` expansion, as Hydra resolves it): the
    config directory (a message string when the flag has no value) and the overrides; None
    when a Hydra flag that changes the composition or the run (``-m``, ``-cn``...) is present."""
    rest: list[str] = []
    path: str | None = None
    it = iter(argv)
    for a in it:
        if a in ("--config-path", "-cp"):
            path = next(it, "")
        elif a.startswith("--config-path="):
            path = a.split("=", 1)[1]
        elif a.split("=", 1)[0] in _VIEW_FLAGS:
            if "=" not in a:
                for _ in range(_VIEW_FLAGS[a]):
                    next(it, None)
        elif a.startswith("-"):
            return None
        else:
            rest.append(a)
    if path is None:
        return conf_dir, rest
    if not path:
        return "servesweep: --config-path needs a directory (nothing was started)", rest
    p = Path(path)
    return (p if p.is_absolute() else conf_dir.parent / p), rest


def precheck(conf_dir: Path, argv: Sequence[str]) -> str | None:
    """Compose the config with ``argv``'s overrides; the one-line message of a typo'd key, a
    missing option or unparsable YAML, else None. ``--config-path`` and the print-only flags
    (``--cfg job``, ``--resolve``) are honoured; a command line with other Hydra flags
    (``-m``, ``-cn``, ``--help``) is left to ``@hydra.main``."""
    split = _config_path(argv, conf_dir)
    if split is None:
        return None
    conf_dir, overrides = split  # hydra.* too: hydra.searchpath decides which files compose
    if isinstance(conf_dir, str):
        return conf_dir
    if not (conf_dir / "config.yaml").is_file():
        return f"servesweep: --config-path {conf_dir}: no config.yaml there (nothing was started)"
    try:
        _compose(conf_dir, overrides)
    except Exception as e:  # noqa: BLE001 - Hydra and OmegaConf raise many types
        return explain(e, conf_dir, overrides)
    return None
