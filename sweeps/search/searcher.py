"""What to launch next and what an outcome teaches: the sweep's :class:`Searcher`.

A searcher owns the search side of one sweep: the approach quota (a free ask of the sampler
is pinned to an approach still owed launches once the trial budget's launches left no longer
exceed what is owed: :mod:`sweeps.search.coverage`) -> ask (a
waiting baseline or re-queued trial, other enqueued ones, then the sampler's proposal:
:mod:`sweeps.search.queue_order`) ->
the proposal gates (:mod:`sweeps.search.gates`) -> in place of a gated proposal, an
untried feasible config (:mod:`sweeps.search.untried`) -> the probe decision
(:mod:`sweeps.search.probes`) -> tell (the record, Optuna's verdict, a learned failure
rule). It keeps its own state: the node fingerprint rules are keyed by, the seeded
untried draw and the probe planner. It never launches anything: the loop
(:class:`sweeps.search.loop.SweepLoop`) hands its launches to a
:class:`~sweeps.run.runner.Runner`, the way Ray Tune's ``Searcher`` suggests and its trial
runner runs.

Subclasses choose proposals, never the loop: a recheck (:class:`sweeps.app.recheck.RecheckSearcher`)
asks only its enqueued dead ends and turns the gates, the untried draw and probes off
(``gated = False``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from sweeps.config.space import SearchSpace, SpaceError
from sweeps.config.spec import SweepSpec
from sweeps.rules.store import RuleStore
from sweeps.run.best_effort import best_effort
from sweeps.run.ownership import write_unless_finished
from sweeps.run.runner import InFlight
from sweeps.search import gates, load_objective
from sweeps.search.coverage import A_EQUAL_FOOTING, Coverage, changed_knobs, pin, waiting
from sweeps.search.probes import A_REQUESTION, ProbePlanner, ProbeStep, enqueue_requestions
from sweeps.search.queue_order import pop_priority
from sweeps.search.untried import UntriedDraw, allowed_by_knowledge, redirect, taken_keys
from sweeps.store import records
from sweeps.store import study as study_store
from sweeps.store.record_io import write_outcome
from tasks.types import BenchSpec, TrialResult, TrialSpec

log = logging.getLogger("servesweep")

#: ``(trial number, params)`` of each config in flight (what the duplicate gate and the draw avoid)
Running = Sequence[tuple[int, Mapping[str, Any]]]


@dataclass(frozen=True)
class Proposal:
    """An asked trial and its config; ``skip`` is the gate's answer (None: launch it)."""

    trial: optuna.trial.Trial
    params: dict[str, Any]
    skip: gates.Skip | None


class Searcher:
    """Proposals and tells of one sweep over its study (see the module docstring).

    Args:
        spec: the sweep.  study_name: its study (rule scope and evidence).
        study: the open study.  rules: the shared failure-rule table.
        implicated: the knobs each failure class implicates (``conf/failure_knobs.yaml``).
        fingerprint: the node's environment fingerprint ({} until a node or a trial reports one).

    Attributes:
        gated: proposals go through the gates, a gated one is replaced by an untried draw,
            and startup-risky launches are probed first. False for a searcher that re-runs
            fixed configs.
    """

    gated = True

    def __init__(self, spec: SweepSpec, study_name: str, study: optuna.Study, rules: RuleStore,
                 implicated: Mapping[str, list[str]], fingerprint: dict[str, str]):
        self.spec, self.study_name, self.study, self.rules = spec, study_name, study, rules
        self.space: SearchSpace = spec.space
        self.objectives = spec.objective_set
        self.implicated = implicated
        self.fingerprint = fingerprint
        self.untried = UntriedDraw(self.space, spec.sweep.sampler.seed)  # the enumeration is drawn lazily
        self.probes = ProbePlanner(spec, study, rules, study_name)
        ap = spec.sweep.approaches
        self.coverage: Coverage | None = (Coverage(ap, self.space, self.objectives.primary, spec.sweep.budget.trials)
                                          if ap is not None else None)

    def prepare(self) -> None:
        """Called once by the loop's setup after the seeds are enqueued: the re-question probes
        of the node's knowledge (:func:`sweeps.search.probes.enqueue_requestions`)."""
        if self.gated and self.spec.sweep.mode == "search":
            with best_effort("enqueue the re-question probes"):
                n = enqueue_requestions(self.spec, self.rules, self.fingerprint, self.study, self.study_name)
                if n:
                    log.info("re-questioning %d level(s) the node's knowledge excludes: one probe each", n)

    def known_dead_end(self, params: Mapping[str, Any]) -> bool:
        """True when the node's knowledge names ``params`` a dead end: a shipped entry not cleared
        on this fingerprint, or an active learned rule (no hit is counted). Such a seed is not
        launched (:func:`sweeps.store.study.enqueue_seeds`): the re-question probe covers it."""
        if not self.gated or not self.fingerprint:
            return False
        if self.probes.knowledge_hits(self.fingerprint, params):
            return True
        return self.rules.match(self.fingerprint, self.spec.model.name, dict(params), sweep=self.study_name,
                                record_hit=False) is not None

    # ---- ask -> gates ---------------------------------------------------------------
    def ask(self) -> tuple[optuna.trial.Trial, dict[str, Any]] | None:
        """The next proposal (a waiting baseline or re-queued trial, other enqueued ones, the sampler's)."""
        trial = pop_priority(self.study) or self.study.ask()
        return trial, self.space.sample(trial)

    def pin_due(self, running: Running) -> None:
        """Before a free ask of the sampler (nothing enqueued waits), pin the approach that is
        due (:meth:`sweeps.search.coverage.Coverage.due`), else enqueue the first untried,
        feasible equal-footing comparison of the approaches still in the race
        (:meth:`~sweeps.search.coverage.Coverage.crosses`) that the node's knowledge allows;
        nothing without ``sweep.approaches``."""
        if self.coverage is None or not self.gated or waiting(self.study):
            return
        recs = records.load_records(self.study)
        inflight = [p for _, p in running]
        level = self.coverage.due(recs, inflight)
        if level is not None:
            pin(self.study, self.coverage.knob, level)
            return
        crosses = self.coverage.crosses(recs)
        if not crosses:
            return
        taken = taken_keys(self.study, inflight)
        allowed = self._allowed()
        for cfg, t, o in crosses:
            try:
                cfg = self.space.normalize(cfg)
            except SpaceError:  # the first approach's own knobs do not fit the shared ones
                continue
            if self.space.violated(cfg) or records.config_key(cfg) in taken or not allowed(cfg):
                continue
            base = next(r.params for r in recs if r.number == t)
            log.info("equal footing: trial %d's config with %s from trial %d", t, changed_knobs(cfg, base), o)
            attrs = {A_EQUAL_FOOTING: [t, o]}
            self.study.enqueue_trial(cfg, user_attrs={**attrs, "enqueue_attrs": attrs})
            return

    def _allowed(self) -> Any:
        """:func:`allowed_by_knowledge` of this sweep's node, model and study (a config filter)."""
        return allowed_by_knowledge(self.rules, self.fingerprint, self.study, self.spec.model.name, self.study_name)

    def exhausted(self, running: Running) -> bool:
        """True when no trial is queued and no untried config the node's knowledge allows is
        left (the untried draw finds none): asking the sampler then only re-proposes a config
        the study has answered. False for an ungated searcher (it never draws)."""
        if not self.gated or waiting(self.study):
            return False
        inflight = [p for _, p in running]
        allowed = self._allowed()
        return self.untried.draw(taken_keys(self.study, inflight), allowed) is None

    def _due_within(self, running: Running) -> dict[str, Any] | None:
        """The approach a redirect must stay in: the one due for its quota, if any."""
        if self.coverage is None:
            return None
        level = self.coverage.due(records.load_records(self.study), [p for _, p in running])
        return None if level is None else {self.coverage.knob: level}

    def propose(self, running: Running) -> Proposal | None:
        """Ask one trial, key its config and gate it; None when there is nothing to ask."""
        self.pin_due(running)
        got = self.ask()
        if got is None:
            return None
        trial, params = got
        key = records.config_key(params)
        trial.set_user_attr(records.A_CONFIG_KEY, key)
        return Proposal(trial, params, self.gate(trial, params, key, running))

    def gate(self, trial: optuna.trial.Trial, params: dict[str, Any], key: str, running: Running) -> gates.Skip | None:
        """The first gate that answers ``params`` without GPU time, or None (launch it). A
        re-question trial passes the rule gate: it is there to question the rule."""
        if not self.gated:
            return None
        requestion = bool(trial.user_attrs.get(A_REQUESTION))
        return (gates.infeasible(self.space, params)
                or gates.duplicate(self.study, trial.number, key, running)
                or gates.degraded(records.load_records(self.study), params)
                or (None if requestion else
                    gates.rule(self.rules, self.fingerprint, self.spec.model.name, params, self.study_name)))

    def answer(self, trial: optuna.trial.Trial, skip: gates.Skip, running: Running) -> bool:
        """Store a gated proposal's facts, tell Optuna (no GPU time spent) and enqueue an
        untried feasible config near it. False when the space is exhausted."""
        write_unless_finished(write_outcome, trial, skip.attrs, f"trial {trial.number}", what=f"record of trial {trial.number}")
        study_store.tell(self.study, trial, study_store.verdict_for(skip.status, source=skip.source))
        if not self.gated:
            return True
        allowed = self._allowed()
        inflight = [p for _, p in running]
        within = self._due_within(running)
        if within and redirect(self.study, self.untried, inflight, allowed, self.objectives,
                               dict(trial.params), skip.gate, within=within):
            return True
        # no untried config is left in the due approach: any approach rather than stopping the sweep
        return redirect(self.study, self.untried, inflight, allowed, self.objectives, dict(trial.params), skip.gate)

    # ---- the launch -----------------------------------------------------------------
    def bench(self) -> BenchSpec:
        """The bench of the next launch (:func:`sweeps.search.load_objective.trial_bench`)."""
        return load_objective.trial_bench(self.spec, self.study, self.objectives)

    def first_launch(self, number: int, params: dict[str, Any], tspec: TrialSpec,
                     requestion: Mapping[str, Any] | None = None) -> TrialSpec:
        """What trial ``number`` launches first: a probe of ``tspec`` or ``tspec`` itself
        (``requestion``: the trial's re-question attr; its probe is the whole trial)."""
        if not self.gated:
            return tspec
        return self.probes.first(self.fingerprint, number, params, tspec, requestion)

    def note_fingerprint(self, res: TrialResult) -> None:
        """A result without a usable fingerprint gets the node's; the first one reported becomes the node's."""
        if not res.fingerprint or "error" in res.fingerprint:
            res.fingerprint = res.fingerprint or self.fingerprint
        elif not self.fingerprint:
            self.fingerprint = res.fingerprint

    def probe_outcome(self, f: InFlight, res: TrialResult, retry: bool) -> ProbeStep:
        """A finished probe: :meth:`sweeps.search.probes.ProbePlanner.outcome`, and its
        failure rule learned when it revealed a dead end."""
        step = self.probes.outcome(f, res, self.fingerprint, retry)
        if step.learn:  # the same refusals as a full launch's (a cli_arg_error is the sweep's config)
            self._learn(f.trial.number, f.params, res, step.evidence)
        return step

    def launch_done(self, number: int, res: TrialResult) -> None:
        """A full launch reported (before its retry or record): the probe's cost is added to it."""
        self.probes.add_cost(number, res)

    # ---- tell -----------------------------------------------------------------------
    def metrics(self, f: InFlight, res: TrialResult) -> dict[str, float]:
        """The trial's metrics plus ``speedup_vs_baseline`` (the objective's ratio to the
        baseline's, > 1 = better); tags a speculative config that is not better."""
        metrics = load_objective.derived(res.metrics, self.spec) if res.status == "ok" else dict(res.metrics)
        if res.status != "ok":
            return metrics
        obj = self.objectives.primary
        base = records.baseline_value(records.load_records(self.study), obj)
        if bool(f.trial.user_attrs.get(records.A_BASELINE)) and base is None:
            base = obj.value(metrics)
        v = obj.value(metrics)
        if base and v:
            metrics["speedup_vs_baseline"] = obj.ratio(v, base)
            if f.params.get("speculative") not in (None, "none") and metrics["speedup_vs_baseline"] < 1.0:
                res.perf_tags = sorted(set(res.perf_tags) | {"spec_decode_no_speedup"})
        return metrics

    def tell(self, f: InFlight, res: TrialResult, metrics: Mapping[str, float]) -> None:
        """Store a trial's result in its user attrs, learn from a dead end, tell Optuna."""
        t = f.trial
        stored = res.model_copy(update={"metrics": dict(metrics), "attempts": f.attempt, "log_tail": res.log_tail[-4000:]})
        write_unless_finished(write_outcome, t, stored, f"trial {t.number}", what=f"record of trial {t.number}")  # see record_io
        verdict = study_store.verdict_for(res.status, failure_kind=res.failure_kind, metrics=metrics,
                                objectives=self.objectives,
                                degraded=records.DEGRADED in res.perf_tags and f.params.get("allreduce") not in (None, "nccl"))
        if res.status == "failed" and verdict is study_store.INFEASIBLE:
            self.learn(t.number, f.params, res)
        study_store.tell(self.study, t, verdict)

    def learn(self, number: int, params: dict[str, Any], res: TrialResult) -> None:
        """Record a failure rule for a deterministic class; a transient class never becomes one
        (a config must not turn into a dead end because of a fault that may not recur)."""
        self._learn(number, params, res, {})

    def _learn(self, number: int, params: dict[str, Any], res: TrialResult, evidence: Mapping[str, Any]) -> None:
        """The one place a failed launch (full or probe) becomes a failure rule, ``evidence``
        added to the trial's; what is refused here is refused for both."""
        if res.failure_kind == "transient":
            return
        if not res.failure_class or not (res.fingerprint or self.fingerprint):
            return
        if res.failure_class == "cli_arg_error":
            # argparse rejected the command line: knob values are type-checked before launch, so
            # the cause is the sweep's static config (extra_args, launcher), not these knob values
            return
        what = "the probe's failure rule" if evidence.get("probe") else "a failure rule"
        with best_effort(f"record {what} for trial {number}", store_write=True):
            self.rules.learn(res.fingerprint or self.fingerprint, self.spec.model.name, params, res.failure_class,
                             res.failure_signature or "",
                             {"sweep": self.study_name, "trial_number": number, **evidence}, mapping=self.implicated)

    def requeue(self, f: InFlight) -> None:
        """Enqueue an interrupted trial's config so the same command runs it first on resume."""
        with best_effort(f"re-queue interrupted trial {f.trial.number}"):
            study_store.requeue(self.study, f.params, f.trial.user_attrs)
