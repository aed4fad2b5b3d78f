"""Proposal gates: configs answered without GPU time.

Each gate looks at a proposed config and either lets it through (None) or returns a
:class:`Skip`: the user attributes to store and the outcome to tell Optuna (see
:func:`sweeps.store.study.verdict_for`). The gates, in order: a violated space constraint
(``infeasible``), a duplicate of a finished or running config, an allreduce level this
study saw silently replaced (``degraded``), a learned failure rule (``rule``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeps.config.space import SearchSpace
from sweeps.store import records as trial_records
from sweeps.store.records import (
    A_CONFIG_KEY,
    A_DUPLICATE_OF,
    A_FAILURE_CLASS,
    A_FAILURE_KIND,
    A_METRICS,
    A_SIGNATURE,
    A_SKIPPED_BY_RULE,
    A_STATUS,
    A_TIMINGS,
    A_VIOLATED,
)
from tasks.outcome import Status


@dataclass
class Skip:
    """A proposal answered without launching it.

    Attributes:
        gate: ``infeasible``, ``duplicate``, ``degraded`` or ``rule``.
        attrs: user attributes to set on the trial.
        status: the outcome for :func:`sweeps.store.study.verdict_for` (``skipped`` or ``duplicate``).
        source: the finished trial a duplicate copies (None while the original runs).
    """

    gate: str
    attrs: dict[str, Any] = field(default_factory=dict)
    status: str = "skipped"
    source: FrozenTrial | None = None


def probe_only(status: str, probe: Mapping[str, Any] | None) -> bool:
    """A re-question trial whose probe passed (:mod:`sweeps.search.probes`; not one that saw its
    allreduce level silently fall back): it started the config but measured nothing, so the
    config is neither a duplicate source, nor taken, nor a silently degraded level."""
    return trial_records.requestion_passed(status, probe)


def infeasible(space: SearchSpace, params: Mapping[str, Any]) -> Skip | None:
    """A config that violates a constraint of the space (status ``infeasible``)."""
    violated = space.violated(dict(params))
    return infeasible_skip(violated) if violated else None


def infeasible_skip(violated: list[str]) -> Skip:
    """The skip of a config that cannot be launched (violated constraints, unrenderable)."""
    return Skip("infeasible", {A_STATUS: Status.INFEASIBLE, A_VIOLATED: violated})


def duplicate(study: optuna.Study, number: int, key: str, running: Iterable[tuple[int, Mapping[str, Any]]]) -> Skip | None:
    """A config equal to a finished trial (ok, failed or skipped; not itself a duplicate), to
    one in flight (``running``: ``(trial number, params)``) or to one only the confirmation race
    measured (:func:`race_measured`); the finished one's facts are copied."""
    dup: int | None = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if t.number != number and t.user_attrs.get(A_CONFIG_KEY) == key and t.user_attrs.get(A_DUPLICATE_OF) is None \
                and t.user_attrs.get(A_STATUS) in (Status.OK, Status.FAILED, Status.SKIPPED) \
                and not probe_only(t.user_attrs.get(A_STATUS), t.user_attrs.get(trial_records.A_PROBE)):
            dup = t.number
            break
    if dup is None:
        dup = next((n for n, p in running if trial_records.config_key(dict(p)) == key), None)
    if dup is None:
        return race_measured(study, key)
    # by number without deep-copying every trial (study.trials deep-copies: O(n) per duplicate)
    src = next((t for t in study.get_trials(deepcopy=False) if t.number == dup), None)
    attrs: dict[str, Any] = {A_STATUS: Status.SKIPPED, A_DUPLICATE_OF: dup}
    copy: tuple[str, ...] = ()
    if src is not None and src.state == TrialState.COMPLETE and src.values is not None:  # .value: single-objective only
        copy = (A_METRICS,)
    elif src is not None and src.state == TrialState.PRUNED:
        copy = (A_FAILURE_CLASS, A_FAILURE_KIND, A_SIGNATURE)
    else:
        src = None
    facts = trial_records.outcome_attrs(src) if src is not None else {}
    attrs.update({k: facts[k] for k in copy if k in facts})
    return Skip("duplicate", attrs, status="duplicate", source=src)


def race_measured(study: optuna.Study, key: str) -> Skip | None:
    """A config no study trial measured but the confirmation race did (a race-added config,
    numbered from :data:`sweeps.search.confirm.DERIVED_BASE`, ``derived`` with ``in_study``
    False) with a finite confirmed mean: a duplicate of that race entry, its mean copied as the
    metrics. Optuna is told the mean (COMPLETE) when the study has one objective; with more it
    is told nothing (the race measures the primary objective only). None otherwise."""
    from sweeps.search.confirm import ATTR, config_record

    conf = study.user_attrs.get(ATTR) or {}
    derived = {int(d["trial"]) for d in conf.get("derived") or [] if not d.get("in_study")}
    entry = next((e for e in conf.get("entries") or [] if int(e.get("trial", -1)) in derived
                  and isinstance(e.get("config"), dict) and trial_records.config_key(e["config"]) == key), None)
    rec = config_record([], conf, entry["trial"]) if entry is not None else None
    if rec is None or not rec.metrics:  # launched but never measured: not a measurement to copy
        return None
    src = None
    if len(study.directions) == 1:
        src = optuna.trial.create_trial(state=TrialState.COMPLETE, values=list(rec.metrics.values()),
                                        user_attrs={A_METRICS: dict(rec.metrics)})
    return Skip("duplicate", {A_STATUS: Status.SKIPPED, A_DUPLICATE_OF: rec.number, A_METRICS: dict(rec.metrics)},
                status="duplicate", source=src)


def degraded_levels(records: Iterable[trial_records.TrialRecord]) -> dict[Any, int]:
    """allreduce level -> the first trial of this study that ran it and saw it silently
    replaced (``allreduce_path_degraded``): levels that do not run on this node."""
    out: dict[Any, int] = {}
    for r in records:
        level = r.params.get("allreduce")
        if (level not in (None, "nccl") and level not in out and r.status == Status.OK and not trial_records.counts_for_level(r)
                and r.duplicate_of is None and r.skipped_by_rule is None and not probe_only(r.status, r.probe)):
            out[level] = r.number
    return out


def degraded(records: Iterable[trial_records.TrialRecord], params: Mapping[str, Any]) -> Skip | None:
    """A trial of this study that ran the same allreduce level and saw it silently
    replaced (``allreduce_path_degraded``): the level does not run on this node."""
    level = params.get("allreduce")
    if level in (None, "nccl"):
        return None
    ev = degraded_levels(records).get(level)
    if ev is None:
        return None
    return Skip("degraded", {
        A_STATUS: Status.SKIPPED, A_SKIPPED_BY_RULE: f"degraded:allreduce={level}@t{ev}",
        A_FAILURE_CLASS: trial_records.DEGRADED, A_FAILURE_KIND: "perf",
        A_SIGNATURE: f"allreduce={level} silently fell back to NCCL in trial {ev}", A_TIMINGS: {"gpu_s": 0.0}})


def rule(rules: Any, fingerprint: Mapping[str, str], model: str, params: Mapping[str, Any], sweep: str) -> Skip | None:
    """A learned failure rule (:class:`sweeps.rules.store.RuleStore`) matching this node and config."""
    if not fingerprint:
        return None
    hit = rules.match(fingerprint, model, dict(params), sweep=sweep)
    if hit is None:
        return None
    return Skip("rule", {A_STATUS: Status.SKIPPED, A_SKIPPED_BY_RULE: str(hit.id),
                         A_FAILURE_CLASS: hit.failure_class,
                         A_FAILURE_KIND: hit.kind, A_SIGNATURE: hit.signature, A_TIMINGS: {"gpu_s": 0.0}})
