"""The public failure corpus: real server-log excerpts from public issue threads, each labelled
with the class and kind the thread's diagnosis gives (``dev/``, ``test/``, ``test2/``, ...,
one YAML per log; :data:`PARTS` lists the parts on disk).

The entry format and the labelling rules are in ``tasks/failure_corpus/README.md``. The
``dev`` part is what the classifier's signatures are written against; each ``test<N>`` part is
a held-out part, labelled and committed before any classifier ran on it, and scored blind once
(``benchmarks/failure_corpus.py``); the README says which parts a later round has read.
The parts are data for the driver and the benchmarks: a trial's node gets the package without
them (``sweeps.run.ray_auth.CODE_EXCLUDES``), so :data:`PARTS` is empty there.

:func:`load_corpus` reads and validates every entry (:class:`CorpusEntry`): the class must be a
class of ``tasks/failure_signatures.yaml`` (or ``healthy``) and the kind must be that class's
kind, so a mislabelled entry fails with :class:`CorpusError` naming the file and the field.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CORPUS_DIR = Path(__file__).resolve().parent
#: The parts, ``dev`` then ``test``, ``test2``, ... in their order: every ``dev`` / ``test<N>``
#: directory of the corpus, so a new held-out part is picked up by the loader, the benchmark's
#: ``--parts`` and the tool's ``--corpus-parts`` without another list to edit.
PARTS: tuple[str, ...] = tuple(sorted(
    (d.name for d in CORPUS_DIR.iterdir() if d.is_dir() and re.fullmatch(r"dev|test\d*", d.name)),
    key=lambda n: -1 if n == "dev" else int(n[4:] or 1)))
#: The verdict for a log of a server that came up and served (``tasks.failures.HEALTHY``).
HEALTHY = "healthy"
Engine = Literal["sglang", "vllm", "other"]
Component = Literal["sglang", "vllm", "nccl", "flashinfer", "deepep", "deepgemm", "pytorch", "triton", "cuda",
                    "transformers", "other"]
Phase = Literal["startup", "warmup", "bench", "teardown"]


class CorpusError(ValueError):
    """A corpus entry that does not parse or validate (the message names the file and field)."""


class CorpusEntry(BaseModel):
    """One labelled public log (``tasks/failure_corpus/<part>/<id>.yaml``).

    Attributes:
        id: ``<engine-or-component>-<issue number>[-suffix]``, the file stem.
        source: ``owner/repo#number`` of the public thread.
        url: the thread's URL.
        engine: the serving engine whose log it is.
        component: where the error was raised.
        version: the engine version the thread states, else None.
        gpu: the GPU the thread states, else None.
        phase: where the thread shows it failed (``startup`` = before ready).
        exit_code: only when the thread states or clearly implies it, else None.
        expected_class: the class decided from the thread (a class of the signature table, or
            ``healthy``).
        expected_kind: that class's kind (``healthy`` for a healthy log).
        why: what the thread says the cause was.
        log: the excerpt as posted.
        part: one of :data:`PARTS` (set by the loader from the directory).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    source: str = Field(pattern=r"^[\w.-]+/[\w.-]+#\d+$")
    url: str = Field(pattern=r"^https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull|discussions)/\d+")
    engine: Engine
    component: Component
    version: str | None = None
    gpu: str | None = None
    phase: Phase
    exit_code: int | None = None
    expected_class: str
    expected_kind: str
    why: str = Field(min_length=3)
    log: str = Field(min_length=1)
    # a str checked against the parts on disk when an entry is validated, never a Literal of them:
    # the module is imported where the parts are absent (a trial node's package), PARTS empty there
    part: str

    @field_validator("part")
    @classmethod
    def _known_part(cls, v: str) -> str:
        if v not in PARTS:
            raise ValueError(f"{v!r} is not a corpus part; the parts are {', '.join(PARTS) or 'none on disk'}")
        return v

    @field_validator("version", "gpu", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        # an unquoted YAML version (0.11) is a float; keep what was written
        return None if v is None else str(v)

    @field_validator("expected_class")
    @classmethod
    def _known_class(cls, v: str) -> str:
        from tasks.failure_signatures import TABLES

        if v != HEALTHY and v not in TABLES.kinds:
            raise ValueError(f"{v!r} is not a class of tasks/failure_signatures.yaml (kinds) nor {HEALTHY!r}")
        return v

    @model_validator(mode="after")
    def _kind_of_class(self) -> CorpusEntry:
        from tasks.failure_signatures import TABLES

        want = HEALTHY if self.expected_class == HEALTHY else TABLES.kinds[self.expected_class]
        if self.expected_kind != want:
            raise ValueError(f"expected_kind {self.expected_kind!r} is not the kind of {self.expected_class} ({want!r})")
        return self


def load_entry(path: str | Path, part: str) -> CorpusEntry:
    """Read and validate one entry file.

    Raises:
        CorpusError: unreadable YAML, a missing/bad field (named), or an id that is not the
            file stem.
    """
    p = Path(path)
    try:
        # libyaml's safe loader when the wheel has it: the same documents, ~10x faster on 757 files
        raw = yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as e:
        raise CorpusError(f"{p.name}: cannot read ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise CorpusError(f"{p.name}: expected a mapping")
    try:
        entry = CorpusEntry.model_validate({**raw, "part": part})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "entry"
        raise CorpusError(f"{part}/{p.name}: {loc}: {err['msg']}") from None
    if entry.id != p.stem:
        raise CorpusError(f"{part}/{p.name}: id {entry.id!r} is not the file stem {p.stem!r}")
    return entry


def load_corpus(parts: Iterable[str] = PARTS, root: str | Path = CORPUS_DIR,
                errors: list[str] | None = None) -> list[CorpusEntry]:
    """Every entry of the given parts, sorted by part then id.

    Args:
        parts: any of :data:`PARTS` (``dev``, ``test``, ``test2``, ...).
        root: the corpus directory.
        errors: when given, a bad entry is skipped and its message appended here instead of
            raising (the benchmark scores what validates and says what did not).
    Raises:
        CorpusError: the first bad entry (file and field named), an unknown part, or an id in
            two files (unless ``errors`` is given).
    """
    out: list[CorpusEntry] = []
    seen: dict[str, str] = {}
    for part in parts:
        if part not in PARTS:
            raise CorpusError(f"unknown corpus part {part!r}; use one of {PARTS}")
        for path in sorted((Path(root) / part).glob("*.yaml")):
            try:
                e = load_entry(path, part)
                if e.id in seen:
                    raise CorpusError(f"{part}/{path.name}: id {e.id!r} is also in {seen[e.id]}")
            except CorpusError as err:
                if errors is None:
                    raise
                errors.append(str(err))
                continue
            seen[e.id] = part
            out.append(e)
    return out


def entry_url(entry_id: str, root: str | Path = CORPUS_DIR) -> str | None:
    """The thread URL of a corpus entry by id (any part), None when no such entry."""
    for part in PARTS:
        p = Path(root) / part / f"{entry_id}.yaml"
        if p.is_file():
            return load_entry(p, part).url
    return None


_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
#: Tokens that say nothing about which failure it is (prefix words, masks, log levels).
_STOP = frozenset({"error", "info", "warning", "warn", "the", "and", "for", "with", "from", "this", "that", "pid",
                   "rank", "file", "line", "not", "was", "are", "has", "have", "none", "true", "false", "ts", "hex",
                   "path", "host", "port", "url", "ip"})


def tokens(line: str) -> frozenset[str]:
    """The words of a normalized decisive line that can tell failures apart (lower case,
    3+ characters, masks and log words dropped)."""
    from tasks.failure_signatures import normalize_line

    return frozenset(t.lower() for t in _TOKEN.findall(normalize_line(line)) if t.lower() not in _STOP)


@dataclass(frozen=True)
class Neighbour:
    """A corpus entry near a log: its id, class, thread URL, part and similarity (0..1)."""

    id: str
    expected_class: str
    url: str
    part: str
    score: float


@functools.lru_cache(maxsize=4)
def _index(parts: tuple[str, ...], root: str, decisive: Callable[[CorpusEntry], str]
           ) -> tuple[tuple[CorpusEntry, frozenset[str]], ...]:
    return tuple((e, tokens(decisive(e))) for e in load_corpus(parts, root))


#: the least Jaccard overlap of two decisive lines' tokens for an entry to be called near at all
MIN_OVERLAP = 0.1


def nearest(line: str, failure_class: str | None, k: int, parts: Iterable[str], *,
            decisive: Callable[[CorpusEntry], str], root: str | Path = CORPUS_DIR,
            same_class: bool = False) -> list[Neighbour]:
    """The ``k`` corpus entries whose decisive line is most like ``line``.

    Similarity: the Jaccard index of the two lines' :func:`tokens`, plus 0.25 when the entry's
    expected class is ``failure_class`` and that class names a cause (not ``unknown``: two unknowns
    share no cause), capped at 1. An entry whose line shares under :data:`MIN_OVERLAP` of its
    tokens with ``line`` is left out whatever its class: a class alone is no likeness, and an empty
    list ("none alike") is the honest answer. Entries scoring under 0.15 are left out too, and so
    are healthy entries for a failure (a report line that failed requests share with a healthy
    run's report is no likeness).

    Args:
        decisive: an entry's decisive line (``tasks.failures`` passes its classifier's), found
            once per process and function.
        same_class: keep only entries of ``failure_class``. For a performance finding on a
            healthy server (kind ``perf``: a silently degraded allreduce path, speculative decoding
            slower than the baseline) the decisive line is a report or a path line that failure
            logs share words with; only the same finding is like it.
    Raises:
        CorpusError: a bad corpus entry.
    """
    want = tokens(line)
    out = []
    for e, toks in _index(tuple(parts), str(root), decisive):
        union = want | toks
        score = len(want & toks) / len(union) if union else 0.0
        if score < MIN_OVERLAP:
            continue
        if same_class and e.expected_class != failure_class:
            continue
        if e.expected_class == "healthy" and failure_class not in (None, "healthy"):
            continue  # a healthy log's line (a milestone, a report) is no likeness to a failure's
        if failure_class not in (None, "unknown") and e.expected_class == failure_class:
            score += 0.25
        if score >= 0.15:
            out.append(Neighbour(e.id, e.expected_class, e.url, e.part, round(min(score, 1.0), 3)))
    out.sort(key=lambda n: (-n.score, n.id))
    return out[:k]
