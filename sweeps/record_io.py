"""A trial's outcome as ONE user attribute, written with retries on lock/busy errors.

The whole outcome is one :class:`OutcomeRecord` (``user_attrs["record"]``) written in one
storage call, then the few attributes other code filters on (``status``, ``duplicate_of``,
``skipped_by_rule``) are derived from it in the same retried call path. A storage call
failing on a lock is retried (:func:`sweeps.store_retry.retrying`, >= 120 s); one that
still fails raises :class:`~sweeps.store_retry.StoreWriteError`, which stops the sweep
rather than leaving a half-recorded trial.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sweeps import records as R
from sweeps.store_retry import retrying
from tasks.types import TrialResult

#: attributes other code filters on without building a record (gates, tests, recheck)
DERIVED = (R.A_STATUS, R.A_DUPLICATE_OF, R.A_SKIPPED_BY_RULE)

class OutcomeRecord(BaseModel):
    """Everything the driver knows about a finished trial (keys = the ``records.A_*`` names).

    Attributes:
        status: ``ok`` | ``failed`` | ``infra_error`` | ``skipped`` | ``interrupted`` | ``infeasible``.
        metrics: tok/s, ms, ratios (see :class:`sweeps.records.TrialRecord`).
        timings: ``startup_s``, ``warmup_s``, ``bench_s``, ``gpu_s``, ``wall_s`` (s).
    """

    model_config = ConfigDict(extra="ignore")

    status: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    failure_class: str | None = None
    failure_kind: str | None = None
    failure_signature: str | None = None
    phase: str | None = None
    perf_tags: list[str] = Field(default_factory=list)
    launch_command: str = ""
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    node: str = ""
    attempts: int = 0
    log_tail: str = ""
    timings: dict[str, Any] = Field(default_factory=dict)
    duplicate_of: int | None = None
    skipped_by_rule: str | None = None
    violated_constraints: list[str] = Field(default_factory=list)


def write_outcome(trial: Any, attrs: Mapping[str, Any], what: str) -> OutcomeRecord:
    """Store a trial's outcome: the record in one call, then its :data:`DERIVED` attributes.

    Args:
        trial: a live ``optuna.trial.Trial`` (anything with ``set_user_attr``).
        attrs: outcome facts keyed by ``records.A_*`` names (unknown keys are ignored).
        what: names the trial in log lines and errors (e.g. ``"trial 3 of study s"``).
    Raises:
        StoreWriteError: a lock outlasting the retry budget.  pydantic.ValidationError: bad facts.
    """
    rec = OutcomeRecord.model_validate(dict(attrs))
    body = rec.model_dump()  # Optuna JSON-encodes it (NaN kept as NaN, as before)
    retrying(lambda: trial.set_user_attr(R.A_RECORD, body), f"store the record of {what}")
    for k in DERIVED:
        if body.get(k) is not None:
            retrying(lambda k=k: trial.set_user_attr(k, body[k]), f"store {k} of {what}")
    return rec


def interrupted_result(phase: str | None = None) -> TrialResult:
    """An interrupted trial's result, in the phase its task reached; unknown means ``startup``
    (the driver cannot show that a trial it never heard back from passed readiness)."""
    return TrialResult(status="interrupted", failure_class=None, phase=phase or "startup",
                       failure_signature="sweep interrupted (SIGINT)")
