"""A flat, typed view of a study's trials: what findings, reports and MLflow sync read.

Optuna is the source of truth. Every fact about a finished trial lives in its user
attributes (written by the driver before ``study.tell``), so the findings document, the
report and the MLflow sync can all be rebuilt from storage alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import Field

from sweeps.config.objective import Objective, ObjectiveSet
from tasks.outcome import LAUNCHED, Outcome, Status, Timings

#: what an objective-less call ranks by (the default sweep objective)
DEFAULT_OBJECTIVE = Objective("decode_tok_s", "maximize")

# user_attrs keys written by the driver (each the name of its tasks.outcome.Outcome field)
A_STATUS = "status"  # tasks.outcome.Status
#: the status of an enqueued trial the sweep stopped before launching (sweeps.search.unlaunched)
NOT_LAUNCHED = Status.NOT_LAUNCHED
A_METRICS = "metrics"
A_FAILURE_CLASS = "failure_class"
A_FAILURE_KIND = "failure_kind"
A_SIGNATURE = "failure_signature"
A_PHASE = "phase"
A_PERF_TAGS = "perf_tags"
A_SKIPPED_BY_RULE = "skipped_by_rule"
A_DUPLICATE_OF = "duplicate_of"
A_BASELINE = "is_baseline"
A_LAUNCH = "launch_command"
A_FINGERPRINT = "fingerprint"
A_NODE = "node"
A_TIMINGS = "timings"  # tasks.outcome.Timings: {startup_s, warmup_s, bench_s, gpu_s, wall_s}
A_ATTEMPTS = "attempts"
A_CONFIG_KEY = "config_key"
A_LOG_TAIL = "log_tail"
A_VIOLATED = "violated_constraints"
#: the whole outcome in one attribute (tasks.outcome.Outcome.stored); older studies lack it
A_RECORD = "record"
#: set on a trial enqueued again because its first run was interrupted (runs first: sweeps.search.queue_order)
A_REQUEUED = "requeued"
#: the trial's probe launch, when it had one (sweeps.search.probes): result, failure_class, signature,
#: gpu_s, startup_s (s), reason, dead_end, attempts
A_PROBE = "probe"
#: user attr of an equal-footing comparison (sweeps.search.coverage.Coverage.crosses): ``[the
#: approach's best trial, the trial whose shared knob it takes]``
A_EQUAL_FOOTING = "equal_footing"


#: decimals a float keeps in :func:`config_key` (the rounding of ``ParamSpec.levels``)
KEY_DECIMALS = 10


def config_key(params: Mapping[str, Any]) -> str:
    """Canonical JSON of a config's active params (sorted keys): equal configs, equal keys.

    Floats are rounded to :data:`KEY_DECIMALS` decimals first: Optuna suggests a stepped float as
    ``low + k * step`` (0.7999999999999999) where the space's own levels round it (0.8), and
    the two must be one config."""
    return json.dumps({k: round(v, KEY_DECIMALS) if isinstance(v, float) else v for k, v in params.items()},
                      sort_keys=True, default=str)


#: the key of a re-question trial's probe record (and trial attribute) naming what it questions
A_REQUESTION = "requestion"


def is_requestion(probe: Mapping[str, Any] | None) -> bool:
    """True when a trial's probe record (``A_PROBE``) is a re-question probe's."""
    return bool((probe or {}).get(A_REQUESTION))


def requestion_passed(status: str, probe: Mapping[str, Any] | None) -> bool:
    """True for a re-question probe that reached ready (``status`` ok) without seeing its dead
    end (not its allreduce level silently falling back): the dead end no longer reproduces."""
    return status == "ok" and is_requestion(probe) and not (probe or {}).get("dead_end")


def requestion_unanswered(status: str, failure_kind: str | None) -> bool:
    """True for a re-question probe that said nothing about its dead end: stopped with the sweep
    (``interrupted``), or failed for the node's or a passing reason (an infra error, a class of
    kind ``transient`` or ``infra``: a hung server's health check). Its rule stands, unconfirmed."""
    return status in ("interrupted", "infra_error") or failure_kind in ("transient", "infra")


class TrialRecord(Outcome):
    """One trial as the findings/report/MLflow code sees it: its stored :class:`Outcome`
    (every outcome field, under the same name) with the trial's identity.

    Attributes:
        number: Optuna trial number.  state: Optuna state name (COMPLETE, PRUNED, FAIL, RUNNING).
        params: knob values.  status: see :class:`tasks.outcome.Status`.
        metrics: ``decode_tok_s`` (tok/s), ``output_tok_s``, ``ttft_ms_p50``, ``itl_ms_p50``,
            ``itl_ms_p99`` (ms), ``accept_length``, ``speedup_vs_baseline`` (ratio).
        timings: ``startup_s``, ``warmup_s``, ``bench_s``, ``gpu_s``, ``wall_s`` (s), the measured ones.
        is_baseline: the trial measured the sweep's baseline config.
        datetime_start, datetime_complete: Optuna's timestamps (``datetime``), or None.
        probe: the trial's probe launch (``A_PROBE``), or None when it was launched in full only.
        equal_footing: ``[the approach's best trial, the trial whose shared knob it took]`` of
            an equal-footing comparison (``A_EQUAL_FOOTING``: sweeps.search.coverage), else None.

    ``TrialRecord(number, state, params, status, metrics, **fields)`` takes its first five
    positionally; the other fields by name. Unstated timings are not measured.
    """

    number: int
    state: str
    params: dict[str, Any]
    timings: Timings = Field(default_factory=Timings)
    is_baseline: bool = False
    datetime_start: Any = None
    datetime_complete: Any = None
    probe: dict[str, Any] | None = None
    equal_footing: list[int] | None = None

    def __init__(self, number: int, state: str, params: dict[str, Any], status: Status | str,
                 metrics: dict[str, float] | None = None, **fields: Any) -> None:
        fields.update(number=number, state=state, params=params, status=status, metrics=metrics or {})
        super().__init__(**fields)

    @property
    def launched(self) -> bool:
        """True if the trial spent GPU time (not a skip, duplicate or infeasible config)."""
        return self.status in LAUNCHED and self.duplicate_of is None

    @property
    def requestion(self) -> bool:
        """True for a re-question trial (:func:`sweeps.search.probes.requestion_configs`): one
        probe-only launch of a known dead end, a probe in the GPU-hours but not a launch of the
        trial budget (``sweep.budget.trials``) nor of the approaches quota."""
        return is_requestion(self.probe)

    @property
    def budgeted(self) -> bool:
        """True for a launch of the trial budget: :attr:`launched` and not a :attr:`requestion` probe."""
        return self.launched and not self.requestion

    @property
    def violated(self) -> list[str]:
        """``violated_constraints`` (the name the findings use)."""
        return self.violated_constraints

    @property
    def value(self) -> float | None:
        """``decode_tok_s`` of an ok trial; use :func:`value_of` for the sweep's objective."""
        return value_of(self)


def _obj(objective: Objective | ObjectiveSet | None) -> Objective:
    if objective is None:
        return DEFAULT_OBJECTIVE
    return objective.primary if isinstance(objective, ObjectiveSet) else objective


def value_of(r: TrialRecord, objective: Objective | ObjectiveSet | None = None) -> float | None:
    """The objective's value of an ok trial (None when not ok or the metric is missing/non-finite).

    ``objective`` defaults to ``decode_tok_s`` (maximize); an ObjectiveSet means its primary.
    """
    return _obj(objective).value(r.metrics) if r.status == Status.OK else None


def feasible(r: TrialRecord, objective: Objective | ObjectiveSet | None = None) -> bool:
    """True when the trial meets every objective constraint (e.g. ``ttft_ms_p99 <= 2000``)."""
    if isinstance(objective, ObjectiveSet):
        return objective.feasible(r.metrics)
    return _obj(objective).feasible(r.metrics)


def record_from_trial(t: FrozenTrial) -> TrialRecord:
    """Build a :class:`TrialRecord` from an Optuna trial's params and user attributes
    (the one ``record`` attribute first, then the per-fact attributes of older studies).

    A trial with no stored status (queued, running, or told outside the driver) shows its
    Optuna state as its status (``running``, ``waiting``, ``complete``, ...).
    """
    u = outcome_attrs(t)
    u.setdefault(A_STATUS, "running" if t.state == TrialState.RUNNING else t.state.name.lower())
    return TrialRecord.model_validate({
        **Outcome.facts(u), "number": t.number, "state": t.state.name, "params": dict(t.params),
        "is_baseline": bool(u.get(A_BASELINE, False)), "datetime_start": t.datetime_start,
        "datetime_complete": t.datetime_complete, "probe": t.user_attrs.get(A_PROBE),
        "equal_footing": t.user_attrs.get(A_EQUAL_FOOTING)})


def outcome_attrs(t: FrozenTrial) -> dict[str, Any]:
    """A trial's outcome facts keyed by the ``A_*`` names: its ``record`` attribute over the
    per-fact attributes (studies written before the record existed have only those)."""
    return {**t.user_attrs, **(t.user_attrs.get(A_RECORD) or {})}


def load_records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial of ``study`` as :class:`TrialRecord`, by trial number."""
    return [record_from_trial(t) for t in study.get_trials(deepcopy=False)]


def trial_dir(store_dir: Path, study_name: str, number: int) -> Path:
    """Where the driver keeps a trial's files (server log, bench JSON, launch command)."""
    return store_dir / "trials" / study_name / f"{number:05d}"


def baseline_value(records: list[TrialRecord], objective: Objective | ObjectiveSet | None = None) -> float | None:
    """The baseline's objective measured in this study (median of its ok runs), or None."""
    vals = sorted(v for r in records if r.is_baseline and (v := value_of(r, objective)) is not None)
    if not vals:
        return None
    return vals[len(vals) // 2]


DEGRADED = "allreduce_path_degraded"


def counts_for_level(r: TrialRecord) -> bool:
    """False when the server silently took another path than the config names
    (``allreduce_path_degraded``): such a trial is never reported as the level it replaced."""
    return DEGRADED not in r.perf_tags


def rankable(r: TrialRecord, objective: Objective | ObjectiveSet | None = None) -> bool:
    """An ok, launched trial with an objective value, on the path it names, meeting the
    constraints, whose measurement is trustworthy (not tagged ``unstable``: tasks.quality)."""
    return (value_of(r, objective) is not None and r.duplicate_of is None and counts_for_level(r)
            and feasible(r, objective) and "unstable" not in r.perf_tags)


def ranked_records(records: list[TrialRecord], objective: Objective | ObjectiveSet | None = None) -> list[TrialRecord]:
    """The :func:`rankable` trials, best objective first (ties: lower trial number first)."""
    obj = _obj(objective)
    return obj.ranked([r for r in records if rankable(r, objective)], lambda r: value_of(r, obj))


def ranked_by_level(records: Iterable[TrialRecord], knob: str, levels: Iterable[Any],
                    objective: Objective | ObjectiveSet | None = None) -> dict[Any, list[TrialRecord]]:
    """Per level of ``knob`` (every one of ``levels``, in their order), the trials that ran it,
    :func:`ranked_records` (best first; ``[]`` for a level no rankable trial ran)."""
    records = list(records)
    return {v: ranked_records([r for r in records if r.params.get(knob) == v], objective) for v in levels}


def best_record(records: list[TrialRecord], objective: Objective | ObjectiveSet | None = None) -> TrialRecord | None:
    """The :func:`rankable` trial with the best objective (default ``decode_tok_s``, maximize), or None."""
    ranked = ranked_records(records, objective)
    return ranked[0] if ranked else None
