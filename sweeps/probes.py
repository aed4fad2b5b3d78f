"""Probe launches in the sweep loop: a dead end found for a fraction of a full launch.

Rule (:func:`probe_reason`): a config is launched as a probe first (``tasks.probe.probe_argv``:
the same argv with dummy weights and the model cut to the fewest layers that still run every
path) when

1. shipped public knowledge (``sweeps.knowledge.match``: ``conf/knowledge/*.yaml``) names it
   a dead end on this node's stack and no earlier probe on this fingerprint cleared that entry;
2. or it sets a level of a knob the sweep seeds level by level (``seed_each_level_of``: the
   knobs the sweep declares startup-risky: allreduce path, NCCL algorithm, MoE all-to-all) to
   a value other than the baseline's that has not yet started in this study (no ok trial and
   no passed probe with it): in practice the seeds' first launch of each level.

A probe runs through the normal executor as a ``TrialSpec`` with ``probe=True`` (the node
starts it, waits for ready and tears it down: no benchmark). Its GPU-seconds go into the
trial's ``timings.gpu_s`` (so the GPU-hour budget counts them) but it does not spend the
trial budget: the trial counts once, whether it ends at its probe or at the full launch
that follows. The executor's retry policy applies to probes as to any launch. Outcome (:func:`intercept`):

* failed with a class a probe reveals (``conf/probe_classes.yaml``) -> a local failure rule
  (evidence: the probe) and the trial is recorded failed at the probe's cost: a dead end;
* passed, but the allreduce level it names silently fell back (``allreduce_path_degraded``,
  read from the probe's startup log) -> the trial is recorded ok-but-degraded at the probe's
  cost (no metrics), so the ``degraded`` gate skips the level from then on;
* passed (or failed with a class it cannot reveal, or an infra error) -> the full launch is
  submitted for the same trial; a pass also stores a ``cleared`` marker per matched
  knowledge entry (table ``probe_cleared`` in the rules database), so the entry does not
  trigger a probe again on this fingerprint.

The trial's user attr ``probe`` keeps the probe's result (``result``, ``failure_class``,
``signature``, ``gpu_s``, ``startup_s``, ``reason``) for findings and MLflow.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, Text, select

from sweeps import records as R
from sweeps.publish import guard
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep")
A_PROBE = R.A_PROBE
#: Engines whose launches a probe can render (tasks.probe.ENGINES), by backend kind.
ENGINE_OF_BACKEND = {"sglang": "sglang", "emulated": "sglang", "instant": "sglang", "vllm": "vllm"}

_meta = MetaData()
_cleared = Table(
    "probe_cleared", _meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("fingerprint_hash", String(64), nullable=False, index=True),
    Column("entry_id", String(256), nullable=False),
    Column("evidence", Text, nullable=False),
)


# ---------------------------------------------------------------------------------------
# cleared markers (a passed probe of a knowledge entry on a fingerprint)
# ---------------------------------------------------------------------------------------
def _fp_hash(fingerprint: Mapping[str, Any]) -> str | None:
    from sweeps.rules_match import fingerprint_hash

    try:
        return fingerprint_hash(fingerprint)
    except ValueError:
        return None


def cleared_entries(rules: Any, fingerprint: Mapping[str, Any]) -> set[str]:
    """Knowledge entry ids a passed probe cleared on this fingerprint (``rules``: a RuleStore)."""
    h = _fp_hash(fingerprint)
    if h is None:
        return set()
    _meta.create_all(rules.engine, checkfirst=True)
    with rules.engine.connect() as conn:
        rows = conn.execute(select(_cleared.c.entry_id).where(_cleared.c.fingerprint_hash == h)).all()
    return {r[0] for r in rows}


def mark_cleared(rules: Any, fingerprint: Mapping[str, Any], entry_ids: list[str], evidence: Mapping[str, Any]) -> None:
    """Store that a probe passed for these knowledge entries on this fingerprint."""
    h = _fp_hash(fingerprint)
    if h is None or not entry_ids:
        return
    _meta.create_all(rules.engine, checkfirst=True)
    have = cleared_entries(rules, fingerprint)
    with rules.engine.begin() as conn:
        for eid in entry_ids:
            if eid not in have:
                conn.execute(_cleared.insert().values(fingerprint_hash=h, entry_id=eid,
                                                      evidence=json.dumps(dict(evidence), sort_keys=True)))


# ---------------------------------------------------------------------------------------
# the rule
# ---------------------------------------------------------------------------------------
def knowledge_hits(drv: Any, params: Mapping[str, Any]) -> list[str]:
    """Ids of the shipped entries matching ``params`` on the driver's node, not yet cleared."""
    from sweeps.knowledge import match

    if not drv.fingerprint:
        return []
    ids = [e.id for e in match(drv.fingerprint, drv.spec.node.model_dump(), params)]
    return [i for i in ids if i not in cleared_entries(drv.rules, drv.fingerprint)] if ids else []


def _level_started(records: list[R.TrialRecord], knob: str, value: Any) -> bool:
    return any(r.status == "ok" and r.params.get(knob) == value for r in records)


def probe_reason(drv: Any, params: Mapping[str, Any]) -> str | None:
    """Why ``params`` is probed first (see the module docstring), or None for a full launch."""
    if not getattr(drv, "gated", True) or drv.spec.backend.kind not in ENGINE_OF_BACKEND:
        return None
    hits = knowledge_hits(drv, params)
    if hits:
        return "shipped knowledge: " + ", ".join(hits)
    base = drv.spec.sweep.baseline
    records = None
    for knob in drv.spec.sweep.seed_each_level_of:
        v = params.get(knob)
        if v is None or v == base.get(knob):
            continue
        records = R.load_records(drv.study) if records is None else records
        probed = _probed_levels(drv)
        if (knob, repr(v)) not in probed and not _level_started(records, knob, v):
            return f"first launch of {knob}={v}"
    return None


def _probed_levels(drv: Any) -> set[tuple[str, str]]:
    return drv.__dict__.setdefault("_probe_passed_levels", set())


def first(drv: Any, trial: Any, params: dict[str, Any], tspec: TrialSpec) -> TrialSpec:
    """The spec to submit first: a probe of ``tspec`` when :func:`probe_reason` says so."""
    from tasks.probe import probe_argv

    reason = None
    with guard(f"decide a probe for trial {trial.number}"):
        reason = probe_reason(drv, params)
    if reason is None:
        return tspec
    engine = ENGINE_OF_BACKEND[drv.spec.backend.kind]
    try:
        argv = probe_argv(tspec.argv, engine, drv.spec.model.model_dump(), params)
    except ValueError as e:  # a model the probe cannot cut (no layer count): launch in full
        if not drv.__dict__.get("_probe_off_said"):  # said once: it holds for every trial of the sweep
            drv._probe_off_said = True
            log.info("no probe launches for model %s (%s): every trial launches in full",
                     drv.spec.model.name, e)
        return tspec
    drv.__dict__.setdefault("_probe_full", {})[trial.number] = (tspec, reason)
    return dataclasses.replace(tspec, argv=argv, probe=True)


# ---------------------------------------------------------------------------------------
# the outcome
# ---------------------------------------------------------------------------------------
def _reveals(res: TrialResult) -> bool:
    from tasks.probe import probe_classes

    if res.status != "failed" or not res.failure_class:
        return False
    try:
        return probe_classes().reveals(res.failure_class)
    except KeyError:
        return False


def intercept(drv: Any, f: Any, res: TrialResult) -> bool:
    """Handle a finished task of the loop before its retry/record; True = handled here.

    A full launch that followed a probe gets the probe's GPU-seconds added (the trial's
    ``timings.gpu_s`` is what the GPU-hour budget sums); a probe is handled as the module
    docstring says.
    """
    if not f.spec.probe:
        probe = drv.__dict__.get("_probe_done", {}).pop(f.trial.number, None)
        if probe is not None:
            res.gpu_s += float(probe.get("gpu_s") or 0.0)
        return False
    from sweeps.executor import retry_reason

    why = None if drv.interrupted else retry_reason(res, f.attempt, drv.spec.backend.retries_transient)
    if why is not None:  # the executor's retry policy applies to a probe as to any launch
        log.warning("trial %d (probe): %s", f.trial.number, why)
        with guard(f"save probe files of trial {f.trial.number}"):
            drv.publisher.save_files(f.trial.number, f.params, f.spec, res, suffix=f".probe.attempt{f.attempt}")
        drv._submit(f.trial, f.params, f.spec, f.attempt + 1)
        return True
    full, reason = drv.__dict__.setdefault("_probe_full", {}).pop(f.trial.number, (None, ""))
    info = {"result": res.status, "failure_class": res.failure_class, "signature": res.failure_signature,
            "gpu_s": res.gpu_s, "startup_s": res.startup_s, "reason": reason, "dead_end": _reveals(res),
            "attempts": f.attempt}
    # the level this config names silently fell back (the probe's startup log shows it): the
    # full launch would measure another path, so the probe's outcome is the trial's (degraded)
    degraded = res.status == "ok" and R.DEGRADED in res.perf_tags and f.params.get("allreduce") not in (None, "nccl")
    info["dead_end"] = info["dead_end"] or degraded
    if degraded:  # no benchmark ran: the run says why it has no tok/s
        res.failure_class, res.failure_kind = R.DEGRADED, "perf"
        res.failure_signature = res.failure_signature or (
            f"allreduce={f.params.get('allreduce')} silently fell back (seen in the probe's startup log)")
    f.trial.set_user_attr(A_PROBE, info)
    with guard(f"save probe files of trial {f.trial.number}"):
        drv.publisher.save_files(f.trial.number, f.params, f.spec, res, suffix=".probe")
    if info["dead_end"] or full is None:
        if _reveals(res) and (res.fingerprint or drv.fingerprint):
            with guard(f"record the probe's failure rule for trial {f.trial.number}"):
                drv.rules.learn(res.fingerprint or drv.fingerprint, drv.spec.model.name, f.params, res.failure_class,
                                res.failure_signature or "", {"sweep": drv.study_name, "trial_number": f.trial.number,
                                                              "probe": True}, mapping=drv.implicated)
        drv._record(f, res)  # the trial ends here: one trial of the budget, a probe's GPU-seconds
        return True
    if res.status == "ok":
        for knob in drv.spec.sweep.seed_each_level_of:
            if knob in f.params:
                _probed_levels(drv).add((knob, repr(f.params[knob])))
        ids = reason.removeprefix("shipped knowledge: ").split(", ") if reason.startswith("shipped") else []
        with guard(f"store the probe's cleared marker for trial {f.trial.number}"):
            mark_cleared(drv.rules, res.fingerprint or drv.fingerprint, ids,
                         {"sweep": drv.study_name, "trial_number": f.trial.number})
    drv.__dict__.setdefault("_probe_done", {})[f.trial.number] = info
    drv._submit(f.trial, f.params, full, attempt=1)
    return True
