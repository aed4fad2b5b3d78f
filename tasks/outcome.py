"""A trial's outcome: the one model the node returns, the study stores and every reader reads.

The node fills an :class:`Outcome` (``tasks.backends.lifecycle``); the driver adds what only
it knows (attempts, the derived metrics, a duplicate's or a rule's reference) and stores it
whole as one Optuna user attribute (``sweeps.store.record_io.write_outcome``); records,
the MLflow sync and the findings read it back (``sweeps.store.records.TrialRecord`` is an
``Outcome`` with the trial's identity). Adding a fact about a trial is one field here.

Two fields stay out of the study (``exclude=True``): the whole server log and the raw
benchmark records are large and are written to the trial's files instead
(``sweeps.publish.outputs.Publisher.save_files``).

Attribute shapes written before this model (a stored ``record`` without ``exit_code`` or
``gpu_ids``, and older studies with one attribute per fact and no ``record``) are read by
:meth:`Outcome.from_attrs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field


class Status(StrEnum):
    """What became of a trial. A ``str`` enum: it compares, JSON-encodes and formats as its value.

    The first seven are outcomes a trial is stored with; the last five are what a record shows
    for a trial with no stored outcome, read from its Optuna state (still queued or running,
    or told outside the driver).
    """

    #: benchmarked (its metrics are the measurement)
    OK = "ok"
    #: the config failed (``failure_class`` says how)
    FAILED = "failed"
    #: the node failed, not the config (never a rule)
    INFRA_ERROR = "infra_error"
    #: matched a failure rule or duplicated a finished config: no GPU time
    SKIPPED = "skipped"
    #: the sweep was stopped while it ran (its config is queued again)
    INTERRUPTED = "interrupted"
    #: violated a search-space constraint: never launched (``violated_constraints`` says which)
    INFEASIBLE = "infeasible"
    #: enqueued, but the sweep stopped before launching it (its config is queued again next run)
    NOT_LAUNCHED = "not_launched"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETE = "complete"
    PRUNED = "pruned"
    FAIL = "fail"


#: the statuses of a trial that held GPUs (a duplicate aside: ``TrialRecord.launched``)
LAUNCHED = frozenset({Status.OK, Status.FAILED, Status.INFRA_ERROR, Status.INTERRUPTED})


class Timings(BaseModel):
    """Where a trial's time went, s. None: not measured (a skip has only ``gpu_s``; an
    infeasible config none). Readable like the plain dict it is stored as: ``t["gpu_s"]``,
    ``t.get("gpu_s", 0.0)``, ``t.items()`` see the measured ones only.

    Attributes:
        startup_s: launch -> healthy.  warmup_s: healthy -> first generation served
            (``tasks.readiness``).  bench_s: benchmark warm-up requests + measurement.
        gpu_s: GPU-seconds held = wall time holding the GPUs × the trial's GPUs.
        wall_s: the whole task's wall time.
    """

    model_config = ConfigDict(extra="ignore")

    startup_s: float | None = None
    warmup_s: float | None = None
    bench_s: float | None = None
    gpu_s: float | None = None
    wall_s: float | None = None

    @classmethod
    def zero(cls) -> Timings:
        """All five at 0.0: a node's result before it measures anything."""
        return cls(startup_s=0.0, warmup_s=0.0, bench_s=0.0, gpu_s=0.0, wall_s=0.0)

    def as_dict(self) -> dict[str, float]:
        """The measured timings, ``{name: seconds}`` (the stored shape)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def __call__(self) -> dict[str, float]:
        """:meth:`as_dict` (``res.timings()`` reads the same dict as ``record.timings``)."""
        return self.as_dict()

    def get(self, name: str, default: float | None = None) -> float | None:
        """The measured ``name`` (e.g. ``"gpu_s"``), s, or ``default``."""
        v = self.as_dict().get(name)
        return default if v is None else v

    def __getitem__(self, name: str) -> float:
        """The measured ``name``, s. Raises KeyError when it was not measured."""
        return self.as_dict()[name]

    def items(self) -> list[tuple[str, float]]:
        """``(name, seconds)`` of the measured timings."""
        return list(self.as_dict().items())

    def __eq__(self, other: object) -> bool:
        """Equal to another ``Timings`` with the same values, or to the dict of its measured ones."""
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dict it stands for


class Outcome(BaseModel):
    """What one trial came to. Expected failures are data here, never exceptions.

    Attributes:
        status: see :class:`Status`.
        metrics: ``decode_tok_s`` (tok/s), ``output_tok_s`` (tok/s), ``ttft_ms_p50``,
            ``itl_ms_p50``, ``itl_ms_p99`` (ms), ``accept_length`` (tokens per verify; 1.0
            without speculation), ``e2e_s_p50`` (s), and what the driver derives
            (``speedup_vs_baseline``, a ratio); the backend's full set is its own.
        failure_class: canonical class id (a key of ``tasks.failures.KIND``) or None; also a
            perf class on an ok trial (``allreduce_path_degraded``).
        failure_kind: ``deterministic`` | ``transient`` | ``infra`` | ``perf`` or None.
        failure_signature: the decisive log line with numbers/paths masked (what rules match).
        failure_line: the decisive log line itself, redacted, at most 300 chars
            (``tasks.failures.Classification.decisive_line``; "" when no line decided or the class
            came from elsewhere): what the console shows.
        phase: lifecycle phase where the failure happened (``preflight``, ``startup``,
            ``warmup``, ``bench``, ``teardown``).
        exit_code: the server's exit code when it had exited, else None.
        perf_tags: performance findings on a healthy server (e.g. ``allreduce_path_degraded``).
        log_tail: last lines of the (redacted) server log (the study keeps its last 4000 chars).
        server_log: the whole redacted server log, capped at 1 MiB (trial files only).
        launch_command: the redacted, shell-quoted launch command with its env.
        bench: raw per-request benchmark records, JSON-able (trial files only).
        timings: see :class:`Timings`.
        fingerprint: environment fingerprint (GPU arch, driver, CUDA, NCCL, torch, SGLang, FlashInfer).
        node: hostname / Ray node id the trial ran on.
        gpu_ids: the GPU indices Ray assigned to the trial on that node (e.g. ``[4, 5, 6, 7]``).
        attempts: launches it took (a transient failure is retried), set by the driver.
        duplicate_of: the finished trial whose config this one repeated, or None.
        skipped_by_rule: id of the failure rule it matched (or a degraded-level reason), or None.
        violated_constraints: the search-space constraints an infeasible config broke.
    """

    model_config = ConfigDict(extra="ignore")

    status: Status
    metrics: dict[str, float] = Field(default_factory=dict)
    failure_class: str | None = None
    failure_kind: str | None = None
    failure_signature: str | None = None
    failure_line: str = ""
    phase: str | None = None
    exit_code: int | None = None
    perf_tags: list[str] = Field(default_factory=list)
    log_tail: str = ""
    server_log: str = Field(default="", exclude=True)
    launch_command: str = ""
    bench: list[dict[str, Any]] = Field(default_factory=list, exclude=True)
    timings: Timings = Field(default_factory=Timings.zero)
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    node: str = ""
    gpu_ids: list[int] = Field(default_factory=list)
    attempts: int = 0
    duplicate_of: int | None = None
    skipped_by_rule: str | None = None
    violated_constraints: list[str] = Field(default_factory=list)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Self:
        """An outcome from stored facts keyed by field name (:meth:`facts`).

        Raises:
            pydantic.ValidationError: a fact of the wrong type, or no ``status``.
        """
        return cls.model_validate(Outcome.facts(attrs))

    @staticmethod
    def facts(attrs: Mapping[str, Any]) -> dict[str, Any]:
        """The outcome fields of stored facts keyed by field name: a stored ``record``, the
        older one-attribute-per-fact shape, or the facts a driver gate states (a skip, an
        infeasible config). Unknown keys are dropped; ``None`` for a list/dict fact means
        empty; timings not stated are not measured (none at all: ``{}``), unlike a node's.
        """
        data = {k: v for k, v in attrs.items() if k in FIELD_NAMES}
        for k in ("metrics", "perf_tags", "fingerprint", "gpu_ids", "violated_constraints", "timings"):
            if k in data and data[k] is None:
                del data[k]
        data.setdefault("timings", {})
        return data

    def stored(self) -> dict[str, Any]:
        """The study's copy: every field but the trial-files-only ones (``server_log``,
        ``bench``), unmeasured timings left out; NaN stays NaN (Optuna JSON-encodes it)."""
        body = self.model_dump(warnings=False)  # a status the node set by hand is a plain str: fine
        body.update(status=Status(self.status).value, timings=self.timings.as_dict())  # plain str (set by hand: unchecked)
        return body

    def to_dict(self) -> dict[str, Any]:
        """Every field, the trial-files-only ones included (JSON-able but for NaN/inf)."""
        body = self.stored()
        body.update(timings=self.timings.model_dump(), server_log=self.server_log, bench=self.bench)
        return body

    # The flat timing spellings (``res.startup_s``, ``res.gpu_s += x``): views of ``timings``.
    @property
    def startup_s(self) -> float:
        """``timings.startup_s`` (0.0 when not measured), s; setting it sets that."""
        return self.timings.startup_s or 0.0

    @startup_s.setter
    def startup_s(self, value: float) -> None:
        self.timings.startup_s = value

    @property
    def warmup_s(self) -> float:
        """``timings.warmup_s`` (0.0 when not measured), s; setting it sets that."""
        return self.timings.warmup_s or 0.0

    @warmup_s.setter
    def warmup_s(self, value: float) -> None:
        self.timings.warmup_s = value

    @property
    def bench_s(self) -> float:
        """``timings.bench_s`` (0.0 when not measured), s; setting it sets that."""
        return self.timings.bench_s or 0.0

    @bench_s.setter
    def bench_s(self, value: float) -> None:
        self.timings.bench_s = value

    @property
    def gpu_s(self) -> float:
        """``timings.gpu_s`` (0.0 when not measured), s; setting it sets that."""
        return self.timings.gpu_s or 0.0

    @gpu_s.setter
    def gpu_s(self, value: float) -> None:
        self.timings.gpu_s = value

    @property
    def wall_s(self) -> float:
        """``timings.wall_s`` (0.0 when not measured), s; setting it sets that."""
        return self.timings.wall_s or 0.0

    @wall_s.setter
    def wall_s(self, value: float) -> None:
        self.timings.wall_s = value


#: ``Outcome``'s field names (pydantic's ``model_fields`` is slow to ask once per stored fact)
FIELD_NAMES = frozenset(Outcome.model_fields)


def interrupted(phase: str | None = None, signal: str = "SIGINT") -> Outcome:
    """An interrupted trial's outcome, in the phase its task reached, stopped by ``signal``
    (``SIGINT``, ``SIGTERM``); a phase not known (None, ``unknown``) means ``startup`` (the driver
    cannot show that a trial it never heard back from passed readiness)."""
    return Outcome(status=Status.INTERRUPTED, phase=phase if phase not in (None, "unknown") else "startup",
                   failure_signature=f"sweep interrupted ({signal})")
