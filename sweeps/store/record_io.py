"""A trial's outcome as ONE user attribute, written with retries on lock/busy errors.

The whole outcome is one :class:`tasks.outcome.Outcome` (``user_attrs["record"]``, its
:meth:`~tasks.outcome.Outcome.stored` form) written in one storage call, then the few
attributes other code filters on (``status``, ``duplicate_of``, ``skipped_by_rule``) are
derived from it in the same retried call path. A storage call failing on a lock is retried
(:func:`sweeps.store.retry.retrying`, >= 120 s); one that still fails raises
:class:`~sweeps.store.retry.StoreWriteError`, which stops the sweep rather than leaving a
half-recorded trial.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from sweeps.store import records
from sweeps.store.retry import retrying
from tasks.outcome import Outcome, interrupted

#: attributes other code filters on without building a record (gates, tests, recheck)
DERIVED = (records.A_STATUS, records.A_DUPLICATE_OF, records.A_SKIPPED_BY_RULE)

#: the stored outcome's model (the name this module has always exported)
OutcomeRecord = Outcome


def write_outcome(trial: Any, outcome: Outcome | Mapping[str, Any], what: str) -> Outcome:
    """Store a trial's outcome: the record in one call, then its :data:`DERIVED` attributes.

    Args:
        trial: a live ``optuna.trial.Trial`` (anything with ``set_user_attr``).
        outcome: the trial's outcome, or the facts a driver gate states, keyed by field name
            (:meth:`Outcome.from_attrs`: unknown keys are ignored, unstated timings unmeasured).
        what: names the trial in log lines and errors (e.g. ``"trial 3 of study s"``).
    Returns:
        the outcome as stored (validated again: the node fills its outcome field by field).
    Raises:
        StoreWriteError: a lock outlasting the retry budget.  pydantic.ValidationError: bad facts.
    """
    rec = Outcome.from_attrs(outcome.stored() if isinstance(outcome, Outcome) else outcome)
    body = rec.stored()  # Optuna JSON-encodes it (NaN kept as NaN, as before)
    retrying(lambda: trial.set_user_attr(records.A_RECORD, body), f"store the record of {what}")
    for k in DERIVED:
        if body.get(k) is not None:
            retrying(functools.partial(trial.set_user_attr, k, body[k]), f"store {k} of {what}")
    return rec


def interrupted_result(phase: str | None = None, signal: str = "SIGINT") -> Outcome:
    """:func:`tasks.outcome.interrupted` (an interrupted trial's outcome, in the phase it reached,
    stopped by ``signal``)."""
    return interrupted(phase, signal)
