"""Probe launches in the sweep loop: a dead end found for a fraction of a full launch.

Rule (:func:`probe_reason`): a config is launched as a probe first (``tasks.probe.probe_argv``:
the same argv with dummy weights and the model cut to the fewest layers that still run every
path) when

1. shipped public knowledge (``sweeps.rules.knowledge.match``: ``conf/knowledge/*.yaml``) names it
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

**Re-questioning** (:func:`requestion_configs`): knowledge can go stale under an unchanged
fingerprint (an uncaptured driver or firmware change, a patched wheel, an env var). Once per
study, each learned rule on this node that excludes a whole level of a searched knob gets one
probe-only trial (the baseline with that level, user attr ``requestion``: the rule ids) when
the level is worth a probe (:data:`PROBE_COST_SHARE`). The probe is the whole trial: it fails
again -> the rule is strengthened (the probe's evidence appended, ``last_confirmed`` now); it
passes -> the rule is retired on this fingerprint (:meth:`RuleStore.retire`, evidence: the
probe) and the level is open to the sampler again. Its trial has no metrics and teaches
Optuna nothing (it measured no objective).

The trial's user attr ``probe`` keeps the probe's result (``result``, ``failure_class``,
``signature``, ``gpu_s``, ``startup_s``, ``reason``) for findings and MLflow.

:class:`ProbePlanner` is the searcher's part that decides and reads probes, and keeps their
state (the full launch waiting behind each probe, the probe's cost until the full launch
reports, the levels a probe passed); the loop acts on its :class:`ProbeStep`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from sqlalchemy import Column, Integer, MetaData, String, Table, Text, inspect, select

from sweeps.config.spec import SweepSpec
from sweeps.rules.store import RuleStore
from sweeps.run.best_effort import best_effort
from sweeps.run.runner import InFlight
from sweeps.store import records as trial_records
from sweeps.store.retry import retrying
from tasks.backends import get_backend
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep")
A_PROBE = trial_records.A_PROBE

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
    from sweeps.rules.match import fingerprint_hash

    try:
        return fingerprint_hash(fingerprint)
    except ValueError:
        return None


def cleared_entries(rules: RuleStore, fingerprint: Mapping[str, Any]) -> set[str]:
    """Knowledge entry ids a passed probe cleared on this fingerprint (``rules``: a RuleStore).

    A read: a plain deferred transaction that never waits for another process's write lock
    (no ``probe_cleared`` table yet -> nothing cleared, and nothing is created here)."""
    h = _fp_hash(fingerprint)
    if h is None:
        return set()
    with rules._read() as conn:
        if not inspect(conn).has_table(_cleared.name):
            return set()
        rows = conn.execute(select(_cleared.c.entry_id).where(_cleared.c.fingerprint_hash == h)).all()
    return {r[0] for r in rows}


def mark_cleared(rules: RuleStore, fingerprint: Mapping[str, Any], entry_ids: list[str], evidence: Mapping[str, Any]) -> None:
    """Store that a probe passed for these knowledge entries on this fingerprint.

    One write transaction (creating ``probe_cleared`` if missing) retried on a lock like every
    rules-store write.

    Raises:
        sweeps.store.retry.StoreWriteError: the rules DB stayed locked for the retry budget.
    """
    h = _fp_hash(fingerprint)
    if h is None or not entry_ids:
        return

    def run() -> None:
        with rules._tx() as conn:
            _meta.create_all(conn, checkfirst=True)
            have = {r[0] for r in conn.execute(select(_cleared.c.entry_id)
                                               .where(_cleared.c.fingerprint_hash == h)).all()}
            for eid in entry_ids:
                if eid not in have:
                    conn.execute(_cleared.insert().values(fingerprint_hash=h, entry_id=eid,
                                                          evidence=json.dumps(dict(evidence), sort_keys=True)))
                    have.add(eid)

    retrying(run, "record the probe's cleared knowledge entries")


# ---------------------------------------------------------------------------------------
# re-questioning learned rules
# ---------------------------------------------------------------------------------------
#: A level is re-questioned when the share of the knob it holds (1 / its levels) is at least
#: the probe's cost relative to a full launch: then a probe per level costs no more, in
#: expectation, than the full launches a sampler spends finding one level's configs. 0.15 is the
#: dead-end cost goal of issue 15, which the campaign's probes meet (0.136 of the full launches
#: they replace: benchmarks/results/sweep_efficiency_landscapes.md).
PROBE_COST_SHARE = 0.15
#: the user attr of a re-question trial (and its probe record's key): what its probe questions
A_REQUESTION = trial_records.A_REQUESTION
#: what the findings and the log say of a rule whose re-question probe passed
NO_LONGER = "dead end no longer reproduces"


def _level_share(spec: SweepSpec, knob: str, value: Any) -> Any:
    """The level of ``knob`` equal to ``value`` when re-questioning it is worth a probe (a level
    of a searched categorical/int knob, not the baseline's, holding >= :data:`PROBE_COST_SHARE`
    of the knob); None otherwise."""
    from sweeps.rules.match import canon_value

    p = next((q for q in spec.space.params if q.name == knob), None)
    if p is None or (p.type == "float" and not p.step):
        return None
    levels = p.levels()
    level = next((lv for lv in levels if canon_value(lv) == canon_value(value)), None)
    if level is None or level == spec.sweep.baseline.get(knob) or 1 / len(levels) < PROBE_COST_SHARE:
        return None
    return level


def requestion_configs(spec: SweepSpec, rules: RuleStore, fingerprint: Mapping[str, Any],
                       study: optuna.Study, study_name: str | None = None) -> list[tuple[dict[str, Any], dict[str, list[Any]]]]:
    """The re-question trials a study launches once: ``(config, {"rules": ids, "entries": ids})``
    per whole level a piece of knowledge excludes.

    Knowledge that qualifies names exactly one knob of the space at a level worth a probe
    (:func:`_level_share`):

    - a learned rule active on ``fingerprint`` (not retired) for this model and sweep;
    - a shipped entry (``conf/knowledge``) matching this node's stack, not cleared by a passed
      probe on this fingerprint (each of its levels).

    The config is the baseline with that level (conditional knobs switched on take their first
    level, as the level seeds); knowledge of the same level shares it. Nothing already asked in
    ``study`` is asked again, nor a rule with evidence from this study (``study_name``, default
    ``spec.study``): a resumed sweep re-questions nothing twice.

    Returns:
        In rule-id, then entry order; [] without a fingerprint.
    """
    from sweeps.config.space import seed_configs
    from sweeps.rules.knowledge import for_stack

    if not fingerprint:
        return []
    base = spec.sweep.baseline
    asked_rules: set[int] = set()
    asked_entries: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        q = t.user_attrs.get(A_REQUESTION) or {}
        asked_rules.update(q.get("rules") or [])
        asked_entries.update(q.get("entries") or [])
    by_level: dict[tuple[str, str], tuple[dict[str, Any], dict[str, list[Any]]]] = {}

    def add(knob: str, value: Any, kind: str, ident: Any) -> None:
        level = _level_share(spec, knob, value)
        if level is None:
            return
        key = (knob, repr(level))
        if key not in by_level:  # the baseline with this level, as the level seeds are built
            cfg = next(c for c in seed_configs(spec.space, base, (), (knob,)) if c.get(knob) == level)
            by_level[key] = (cfg, {"rules": [], "entries": []})
        by_level[key][1][kind].append(ident)

    name = study_name or spec.study
    for r in rules.rules_for_fingerprint(fingerprint):  # [] for a fingerprint without its keys
        if r.id in asked_rules or len(r.knobs) != 1 or (r.model is not None and r.model != spec.model.name) \
                or (r.scope_sweep is not None and r.scope_sweep != name) \
                or any(e.get("sweep") == name for e in r.evidence):
            continue
        (knob, value), = r.knobs.items()
        add(knob, value, "rules", r.id)
    cleared = cleared_entries(rules, fingerprint)
    for e in for_stack(fingerprint, spec.node.model_dump()):
        if e.id in asked_entries or e.id in cleared or len(e.knobs) != 1:
            continue
        (knob, values), = e.knobs.items()
        for v in values:
            add(knob, v, "entries", e.id)
    return list(by_level.values())


def enqueue_requestions(spec: SweepSpec, rules: RuleStore, fingerprint: Mapping[str, Any], study: optuna.Study,
                        study_name: str | None = None) -> int:
    """Enqueue :func:`requestion_configs`' trials (user attr ``requestion``); how many."""
    todo = requestion_configs(spec, rules, fingerprint, study, study_name)
    for cfg, what in todo:
        attrs = {A_REQUESTION: what}
        study.enqueue_trial(cfg, user_attrs={**attrs, "enqueue_attrs": attrs})
    return len(todo)


# ---------------------------------------------------------------------------------------
# the rule and the outcome
# ---------------------------------------------------------------------------------------
def _level_started(records: list[trial_records.TrialRecord], knob: str, value: Any) -> bool:
    return any(r.status == "ok" and r.params.get(knob) == value for r in records)


def _reveals(res: TrialResult) -> bool:
    from tasks.probe import probe_classes

    if res.status != "failed" or not res.failure_class:
        return False
    try:
        return probe_classes().reveals(res.failure_class)
    except KeyError:
        return False


@dataclass(frozen=True)
class ProbeStep:
    """What the loop does with a finished probe (:meth:`ProbePlanner.outcome`).

    Attributes:
        action: ``retry`` (the executor's retry policy: the same probe again), ``record`` (the
            trial ends at the probe: a dead end, a degraded level, or no full launch to follow)
            or ``full`` (submit ``full``, the trial's full launch, as attempt 1).
        full: the full launch's spec (``full`` only).
        learn: the probe failed with a class it reveals: learn a failure rule (``record`` only).
        evidence: what the learned rule's evidence adds to the trial's (``probe``, the shipped
            entries that sent it, ``requestion``).
    """

    action: Literal["retry", "record", "full"]
    full: TrialSpec | None = None
    learn: bool = False
    evidence: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"probe": True})


class ProbePlanner:
    """Decides which launches are probed first and reads their outcomes, keeping its own state.

    Args:
        spec: the sweep (backend kind, model, node, baseline, ``seed_each_level_of``).
        study: the sweep's study (which levels already started).
        rules: the rule store (its ``probe_cleared`` table).
        study_name: evidence of cleared markers.
    """

    def __init__(self, spec: SweepSpec, study: optuna.Study, rules: RuleStore, study_name: str):
        self.spec, self.study, self.rules, self.study_name = spec, study, rules, study_name
        self._full: dict[int, tuple[TrialSpec | None, str]] = {}  # trial -> (full launch or None, probe reason)
        self._requestion: dict[int, dict[str, list[Any]]] = {}  # re-question trial -> what it questions
        self._done: dict[int, dict[str, Any]] = {}  # trial -> its passed probe's info (until the full launch reports)
        self._passed_levels: set[tuple[str, str]] = set()  # (knob, repr(level)) a probe started this sweep
        self._off_said = False

    def knowledge_hits(self, fingerprint: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
        """Ids of the shipped entries matching ``params`` on the node of ``fingerprint``, not yet cleared."""
        from sweeps.rules.knowledge import match

        if not fingerprint:
            return []
        ids = [e.id for e in match(fingerprint, self.spec.node.model_dump(), params)]
        return [i for i in ids if i not in cleared_entries(self.rules, fingerprint)] if ids else []

    def reason(self, fingerprint: Mapping[str, Any], params: Mapping[str, Any]) -> str | None:
        """Why ``params`` is probed first (see the module docstring), or None for a full launch."""
        if get_backend(self.spec.backend.kind).probe is None:
            return None
        hits = self.knowledge_hits(fingerprint, params)
        if hits:
            return "shipped knowledge: " + ", ".join(hits)
        base = self.spec.sweep.baseline
        records = None
        for knob in self.spec.sweep.seed_each_level_of:
            v = params.get(knob)
            if v is None or v == base.get(knob):
                continue
            records = trial_records.load_records(self.study) if records is None else records
            if (knob, repr(v)) not in self._passed_levels and not _level_started(records, knob, v):
                return f"first launch of {knob}={v}"
        return None

    def first(self, fingerprint: Mapping[str, Any], number: int, params: dict[str, Any], tspec: TrialSpec,
              requestion: Mapping[str, list[Any]] | None = None) -> TrialSpec:
        """The spec to submit first for trial ``number``: a probe of ``tspec`` when :meth:`reason`
        says so, or when the trial re-questions knowledge (``requestion``: the ``rules`` and
        shipped ``entries`` its probe questions; the probe is then the whole trial)."""
        from tasks.probe import probe_argv

        reason = None
        if requestion:
            what = [f"rule {i}" for i in requestion.get("rules") or []] + list(requestion.get("entries") or [])
            reason = "re-question: " + ", ".join(what)
        else:
            with best_effort(f"decide a probe for trial {number}"):
                reason = self.reason(fingerprint, params)
        if reason is None or get_backend(self.spec.backend.kind).probe is None:
            return tspec
        support = get_backend(self.spec.backend.kind).probe
        assert support is not None  # reason() said so
        try:
            argv = probe_argv(tspec.argv, support, self.spec.model.model_dump(), params)
        except ValueError as e:  # a model the probe cannot cut (no layer count): launch in full
            if not self._off_said:  # said once: it holds for every trial of the sweep
                self._off_said = True
                log.info("no probe launches for model %s (%s): every trial launches in full",
                         self.spec.model.name, e)
            return tspec
        if requestion:
            self._requestion[number] = {k: list(v) for k, v in requestion.items()}
        self._full[number] = (None if requestion else tspec, reason)
        return dataclasses.replace(tspec, argv=argv, probe=True)

    def add_cost(self, number: int, res: TrialResult) -> None:
        """A full launch that followed a probe reported: add the probe's GPU-seconds (the trial's
        ``timings.gpu_s`` is what the GPU-hour budget sums)."""
        probe = self._done.pop(number, None)
        if probe is not None:
            res.gpu_s += float(probe.get("gpu_s") or 0.0)

    def _no_longer(self, f: InFlight, res: TrialResult, fingerprint: Mapping[str, Any],
                   asked: Mapping[str, list[Any]]) -> str:
        """A re-question probe passed: retire its rules and clear its shipped entries on this
        fingerprint (evidence: the probe); the finding's sentence."""
        fp = res.fingerprint or fingerprint
        ev = {"sweep": self.study_name, "trial_number": f.trial.number, "probe": True, "result": res.status,
              "gpu_s": round(float(res.gpu_s), 3), "startup_s": res.startup_s,
              "config": {k: v for k, v in f.params.items() if k not in self.spec.sweep.baseline
                         or self.spec.sweep.baseline[k] != v}}
        with best_effort(f"retire the rules re-questioned by trial {f.trial.number}", store_write=True):
            for rid in asked.get("rules") or []:
                rule = self.rules.retire(int(rid), ev)
                if rule is not None and rule.origin == "shipped":  # its entries pass too
                    ids = [i for e in rule.evidence for i in (e.get("shipped") or [])]
                    mark_cleared(self.rules, fp, sorted(set(ids)), ev)
            mark_cleared(self.rules, fp, list(asked.get("entries") or []), ev)
        what = [f"rule {i}" for i in asked.get("rules") or []] + list(asked.get("entries") or [])
        msg = (f"{NO_LONGER}: {', '.join(what)} (trial {f.trial.number}'s probe of "
               f"{', '.join(f'{k}={v}' for k, v in ev['config'].items())} reached ready in "
               f"{float(res.startup_s or 0.0):.0f} s, {float(res.gpu_s):.0f} GPU-s)")
        log.info("%s", msg)
        return msg

    def outcome(self, f: InFlight, res: TrialResult, fingerprint: Mapping[str, Any], retry: bool) -> ProbeStep:
        """A probe (``f.spec.probe``) finished with ``res``: what the loop does next (see the
        module docstring). ``retry``: the executor's retry policy runs it again.

        Sets the trial's ``probe`` user attr, the degraded outcome on ``res``, the passed
        levels and the cleared markers; files, rules and records are the loop's.
        """
        if retry:
            return ProbeStep("retry")
        full, reason = self._full.pop(f.trial.number, (None, ""))
        info = {"result": res.status, "failure_class": res.failure_class, "signature": res.failure_signature,
                "gpu_s": res.gpu_s, "startup_s": res.startup_s, "reason": reason, "dead_end": _reveals(res),
                "attempts": f.attempt}
        # the level this config names silently fell back (the probe's startup log shows it): the
        # full launch would measure another path, so the probe's outcome is the trial's (degraded)
        degraded = (res.status == "ok" and trial_records.DEGRADED in res.perf_tags
                    and f.params.get("allreduce") not in (None, "nccl"))
        info["dead_end"] = info["dead_end"] or degraded
        if degraded:  # no benchmark ran: the run says why it has no tok/s
            res.failure_class, res.failure_kind = trial_records.DEGRADED, "perf"
            res.failure_signature = res.failure_signature or (
                f"allreduce={f.params.get('allreduce')} silently fell back (seen in the probe's startup log)")
        asked = self._requestion.pop(f.trial.number, None)
        evidence: dict[str, Any] = {"probe": True}
        if reason.startswith("shipped knowledge: "):
            evidence["shipped"] = reason.removeprefix("shipped knowledge: ").split(", ")
        if asked is not None:
            info[A_REQUESTION] = asked
            evidence.update(requestion=True, **({"shipped": asked["entries"]} if asked.get("entries") else {}))
            if res.status == "ok" and not degraded:
                info["finding"] = self._no_longer(f, res, fingerprint, asked)
                info["retired"] = [f"rule {i}" for i in asked.get("rules") or []] + list(asked.get("entries") or [])
        f.trial.set_user_attr(A_PROBE, info)
        if info["dead_end"] or full is None:
            return ProbeStep("record", learn=_reveals(res) and bool(res.fingerprint or fingerprint), evidence=evidence)
        if res.status == "ok":
            for knob in self.spec.sweep.seed_each_level_of:
                if knob in f.params:
                    self._passed_levels.add((knob, repr(f.params[knob])))
            ids = reason.removeprefix("shipped knowledge: ").split(", ") if reason.startswith("shipped") else []
            with best_effort(f"store the probe's cleared marker for trial {f.trial.number}", store_write=True):
                mark_cleared(self.rules, res.fingerprint or fingerprint, ids,
                             {"sweep": self.study_name, "trial_number": f.trial.number})
        self._done[f.trial.number] = info
        return ProbeStep("full", full=full)
