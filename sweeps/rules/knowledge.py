"""Shipped public knowledge: known dead ends from public reports (``conf/knowledge/*.yaml``).

Each entry names a canonical failure class, the knob levels it implicates, the stack it
applies to (GPU arch / compute capability, NVLink, component version ranges) and the public
issue or PR it comes from. :func:`match` answers "is this config a known dead end on this
node?"; a match means *probe first* (a cheap probe launch, see ``tasks/probe.py``), never
*skip*: the probe's outcome becomes a local rule either way, and an upgrade that fixed the
problem shows up as a passing probe.

Matching rules (all must hold):

* every knob of the entry is in ``params`` with one of the listed levels (compared as text);
* ``applies_to`` fields the node/fingerprint reports must fit: ``gpu_arch`` (fingerprint),
  ``compute_capability`` (node, a PEP 440 specifier such as ``">=12.0,<13.0"``), ``nvlink``
  (node), ``engine`` (fingerprint ``engine``), ``versions`` (fingerprint component -> PEP 440
  specifier, pre-releases included). A field that is not reported, or a version that does not
  parse, counts as matching: a probe is cheap, a missed dead end costs a full launch.

The files are loaded and validated on first use (:func:`load_knowledge`); a bad entry raises
:class:`KnowledgeError` naming the file and the field (``conf/knowledge/nccl.yaml:
entries[0].failure_class: ...``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.backends import engine_fingerprint_keys, engines

REPO_ROOT = Path(__file__).resolve().parents[2]
KNOWLEDGE_DIR = REPO_ROOT / "conf" / "knowledge"
SWEEP_DIR = REPO_ROOT / "conf" / "sweep"
#: Fingerprint components of the node's stack an entry may constrain (keys of conf/node/*.yaml
#: ``fingerprint``); each backend adds its engine's version field (:func:`version_components`).
STACK_COMPONENTS = ("flashinfer", "torch", "nccl", "cuda", "driver")


def version_components() -> tuple[str, ...]:
    """The fingerprint components an entry's ``applies_to.versions`` may name:
    :data:`STACK_COMPONENTS` plus every backend's ``Backend.fingerprint_key`` (``sglang``, ``vllm``, ...)."""
    return (*STACK_COMPONENTS, *engine_fingerprint_keys())


class KnowledgeError(ValueError):
    """A knowledge file is unreadable or an entry is invalid; the message names file and field."""


def _specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier as e:
        raise ValueError(f"not a PEP 440 version specifier ({e})") from None
    return value


class Source(BaseModel):
    """A public report: ``url`` (GitHub issue or PR), ``kind``, and what it shows."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$")
    kind: Literal["issue", "pr"]
    says: str = Field(min_length=10)


class Fix(BaseModel):
    """A public fix: its PR, the first release containing it, and what it changes."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$")
    version: str
    says: str


class AppliesTo(BaseModel):
    """The stack an entry applies to; an omitted field constrains nothing."""

    model_config = ConfigDict(extra="forbid")
    engine: list[str] | None = None
    gpu_arch: list[str] | None = None
    compute_capability: str | None = None
    nvlink: bool | None = None
    versions: dict[str, str] = Field(default_factory=dict)

    @field_validator("engine")
    @classmethod
    def _engines(cls, v: list[str] | None) -> list[str] | None:
        for e in v or []:
            if e not in engines():
                raise ValueError(f"unknown engine {e!r}; use one of {list(engines())}")
        return v

    @field_validator("compute_capability")
    @classmethod
    def _cc(cls, v: str | None) -> str | None:
        return None if v is None else _specifier(v)

    @field_validator("versions")
    @classmethod
    def _versions(cls, v: dict[str, str]) -> dict[str, str]:
        known = version_components()
        for comp, spec in v.items():
            if comp not in known:
                raise ValueError(f"unknown component {comp!r}; use one of {list(known)}")
            try:
                _specifier(spec)
            except ValueError as e:
                raise ValueError(f"{comp}: {e}") from None
        return v


class KnowledgeEntry(BaseModel):
    """One known dead end (see the module docstring and conf/knowledge/README.md).

    Attributes:
        id: unique id over all knowledge files.
        failure_class: canonical class (a key of ``tasks.failures.KIND``).
        knobs: knob -> implicated levels (conf/sweep params names and levels).
        applies_to: the stack it applies to.
        sources: public reports (at least one).
        fixed_by: public fixes, with the first release containing them.
        corpus: ids of the public-corpus entries (``tasks/failure_corpus``) whose logs show
            this dead end; each must exist and carry this entry's failure class.
        file: the YAML file it came from (set by the loader).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z0-9_]+$")
    failure_class: str
    summary: str = Field(min_length=10)
    knobs: dict[str, list[Any]] = Field(min_length=1)
    applies_to: AppliesTo = Field(default_factory=AppliesTo)
    sources: list[Source] = Field(min_length=1)
    fixed_by: list[Fix] = Field(default_factory=list)
    corpus: list[str] = Field(default_factory=list)
    notes: str | None = None
    file: str = ""

    @field_validator("failure_class")
    @classmethod
    def _canonical(cls, v: str) -> str:
        from tasks.failures import KIND

        if v not in KIND:
            raise ValueError(f"{v!r} is not a canonical failure class (../shared/data/failure_classes.md)")
        return v

    def matches_params(self, params: Mapping[str, Any]) -> bool:
        """True when every implicated knob is in ``params`` at one of the listed levels."""
        return all(k in params and str(params[k]) in {str(x) for x in levels} for k, levels in self.knobs.items())

    def matches_stack(self, fingerprint: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
        """True when the node/fingerprint fits ``applies_to`` (unreported fields match)."""
        a = self.applies_to
        fp = {k: v for k, v in fingerprint.items() if v is not None}
        if a.engine is not None and "engine" in fp and str(fp["engine"]) not in a.engine:
            return False
        if a.gpu_arch is not None and "gpu_arch" in fp and str(fp["gpu_arch"]) not in a.gpu_arch:
            return False
        cc = node.get("compute_capability") or _cc_from_arch(fp.get("gpu_arch"))
        if a.compute_capability is not None and cc is not None and not _in_spec(str(cc), a.compute_capability):
            return False
        if a.nvlink is not None and node.get("nvlink") is not None and bool(node["nvlink"]) != a.nvlink:
            return False
        return all(comp not in fp or _in_spec(str(fp[comp]), spec) for comp, spec in a.versions.items())

    def rule_row(self) -> dict[str, Any]:
        """A row for ``python -m sweeps.rules list`` (origin ``shipped``)."""
        return {
            "origin": "shipped",
            "id": self.id,
            "failure_class": self.failure_class,
            "knobs": {k: list(v) for k, v in self.knobs.items()},
            "applies_to": self.applies_to.model_dump(exclude_none=True, exclude_defaults=True),
            "source": self.sources[0].url,
            "fixed_by": [f"{f.version} ({f.url})" for f in self.fixed_by],
            "file": self.file,
        }


def _cc_from_arch(arch: Any) -> str | None:
    """``"sm_120"`` / ``"sm_90a"`` -> ``"12.0"`` / ``"9.0"``; None when it is not of that form."""
    text = str(arch or "")
    digits = "".join(ch for ch in text.removeprefix("sm_") if ch.isdigit())
    if not text.startswith("sm_") or len(digits) < 2:
        return None
    return f"{int(digits[:-1])}.{digits[-1]}"


def _in_spec(version: str, spec: str) -> bool:
    """``version`` satisfies PEP 440 ``spec`` (pre-releases allowed); unparsable -> True."""
    try:
        v = Version(version)
    except InvalidVersion:
        return True
    return SpecifierSet(spec).contains(v, prereleases=True)


def _sweep_params(sweep_dir: Path) -> dict[str, set[str] | None]:
    """Knob name -> its categorical levels (as text) over every conf/sweep file; None = any value."""
    out: dict[str, set[str] | None] = {}
    for path in sorted(sweep_dir.glob("*.yaml")):
        params = (yaml.safe_load(path.read_text()) or {}).get("params") or {}
        for name, dist in params.items():
            choices = dist.get("choices") if isinstance(dist, dict) else None
            if choices is None:
                out[name] = None
            elif out.get(name, set()) is not None:
                out[name] = (out.get(name) or set()) | {str(c) for c in choices}
    return out


def _check_knobs(entry: KnowledgeEntry, known: Mapping[str, set[str] | None], where: str) -> None:
    for knob, levels in entry.knobs.items():
        if knob not in known:
            raise KnowledgeError(f"{where}.knobs.{knob}: not a knob of any conf/sweep/*.yaml params "
                                 f"(known: {sorted(known)})")
        allowed = known[knob]
        bad = [lv for lv in levels if allowed is not None and str(lv) not in allowed]
        if bad or not levels:
            raise KnowledgeError(f"{where}.knobs.{knob}: levels {bad or levels} are not choices of the sweep "
                                 f"param (choices: {sorted(allowed or [])})")


def _check_corpus(entry: KnowledgeEntry, where: str) -> None:
    """Every cited corpus entry exists and shows this entry's failure class."""
    from tasks.failure_corpus import CORPUS_DIR, PARTS, CorpusError, load_entry

    for i, cid in enumerate(entry.corpus):
        found = [(part, CORPUS_DIR / part / f"{cid}.yaml") for part in PARTS if (CORPUS_DIR / part / f"{cid}.yaml").is_file()]
        if not found:
            raise KnowledgeError(f"{where}.corpus[{i}]: no corpus entry {cid!r} (tasks/failure_corpus/*/{cid}.yaml)")
        part, path = found[0]
        try:
            got = load_entry(path, part).expected_class
        except CorpusError as e:
            raise KnowledgeError(f"{where}.corpus[{i}]: {e}") from None
        if got != entry.failure_class:
            raise KnowledgeError(f"{where}.corpus[{i}]: {cid} shows {got}, not {entry.failure_class}")


def _load_file(path: Path, known: Mapping[str, set[str] | None]) -> list[KnowledgeEntry]:
    rel = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise KnowledgeError(f"{rel}: cannot read ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise KnowledgeError(f"{rel}: expected a mapping with an `entries:` list")
    out = []
    for i, raw in enumerate(data["entries"]):
        where = f"{rel}: entries[{i}]"
        if not isinstance(raw, dict):
            raise KnowledgeError(f"{where}: expected a mapping")
        try:
            entry = KnowledgeEntry.model_validate({**raw, "file": str(rel)})
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise KnowledgeError(f"{where}.{loc}: {err['msg']}") from None
        _check_knobs(entry, known, f"{where}")
        _check_corpus(entry, where)
        out.append(entry)
    return out


def load_knowledge(directory: str | Path | None = None, sweep_dir: str | Path | None = None) -> tuple[KnowledgeEntry, ...]:
    """Load and validate every ``*.yaml`` under ``directory`` (default conf/knowledge).

    Knob names and levels are checked against the params of ``sweep_dir`` (default
    conf/sweep). The shipped set (both defaults) is read once per process; an explicit
    directory is read on every call.

    Raises:
        KnowledgeError: naming the file and field of the first bad entry, or a duplicate id.
    """
    if directory is None and sweep_dir is None:
        return _load_shipped()
    return _load(Path(directory or KNOWLEDGE_DIR), Path(sweep_dir or SWEEP_DIR))


@functools.lru_cache(maxsize=1)
def _load_shipped() -> tuple[KnowledgeEntry, ...]:
    return _load(KNOWLEDGE_DIR, SWEEP_DIR)


def _load(directory: Path, sweep_dir: Path) -> tuple[KnowledgeEntry, ...]:
    known = _sweep_params(sweep_dir)
    entries: list[KnowledgeEntry] = []
    seen: dict[str, str] = {}
    for path in sorted(directory.glob("*.yaml")):
        for e in _load_file(path, known):
            if e.id in seen:
                raise KnowledgeError(f"{e.file}: id {e.id!r} already defined in {seen[e.id]}")
            seen[e.id] = e.file
            entries.append(e)
    return tuple(entries)


def match(fingerprint: Mapping[str, Any], node: Mapping[str, Any], params: Mapping[str, Any],
          entries: tuple[KnowledgeEntry, ...] | None = None) -> list[KnowledgeEntry]:
    """The shipped entries that make ``params`` a known dead end on this node: probe first.

    Args:
        fingerprint: environment fingerprint (``gpu_arch``, ``sglang``, ``flashinfer``, ``torch``,
            ``nccl``, ``cuda``, ``driver``, optional ``engine``), as in conf/node ``fingerprint``.
        node: the node conf (``compute_capability`` like ``"12.0"``, ``nvlink``).
        params: the trial's knob values (conf/sweep params names).
        entries: the entries to test (default: :func:`load_knowledge`).

    Returns:
        Matching entries in file order (empty = no known dead end).
    """
    pool = load_knowledge() if entries is None else entries
    return [e for e in pool if e.matches_params(params) and e.matches_stack(fingerprint, node)]


def for_stack(fingerprint: Mapping[str, Any], node: Mapping[str, Any],
              entries: tuple[KnowledgeEntry, ...] | None = None) -> list[KnowledgeEntry]:
    """The entries that apply to this node whatever the knobs (for ``rules list``)."""
    pool = load_knowledge() if entries is None else entries
    return [e for e in pool if e.matches_stack(fingerprint, node)]
