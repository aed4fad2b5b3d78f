"""The sweep loop: Optuna ask -> gates -> executor -> tell, with failure knowledge.

A :class:`Driver` is assembled from parts: the study (:mod:`sweeps.study`), the proposal
gates (:mod:`sweeps.gates`), an executor (:mod:`sweeps.executor`: Ray or in-process) and
a publisher (:mod:`sweeps.publish`: trial files, MLflow, findings, progress). It keeps
``executor.slots`` trials in flight, answers gated proposals without GPU time, retries
per the executor's retry policy, tells Optuna every outcome through
:func:`sweeps.study.verdict_for`, learns failure rules, and stops at the budget or the
circuit breaker. :func:`execute` runs its whole lifecycle with graceful Ctrl-C.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from sweeps import gates, load_objective, probes
from sweeps import records as R
from sweeps import study as S
from sweeps.config import SweepSpec, backend_dict
from sweeps.executor import Executor, RayExecutor, collect, retry_reason
from sweeps.ownership import StudyHold, abandon, guarded, prepare
from sweeps.preflight import check_launcher, emulator_profile, ensure_writable, launch_profile
from sweeps.publish import Publisher, guard
from sweeps.queue_order import pop_priority
from sweeps.record_io import interrupted_result, write_outcome
from sweeps.server_env import with_shell_env
from sweeps.space import SearchSpace
from sweeps.stores import prepare as prepare_stores
from sweeps.untried import EXHAUSTED, redirect
from tasks.backends import get_backend
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep")
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class InFlight:
    """A submitted trial: its Optuna trial, config, rendered spec and attempt (1-based)."""

    trial: optuna.trial.Trial
    params: dict[str, Any]
    spec: TrialSpec
    attempt: int
    t_submit: float = field(default_factory=time.monotonic)


class Driver:
    """One sweep: the study, its gates, an executor and a publisher.

    Subclasses choose parts, never the loop: :meth:`make_executor`, :meth:`make_publisher`
    and :meth:`ask` (the next proposal). ``track``/``findings``/``quiet`` configure the
    publisher; ``gated`` turns the proposal gates off (a recheck re-runs fixed configs).
    """

    track = True
    findings = True
    quiet = False
    gated = True

    def __init__(self, spec: SweepSpec, study_name: str | None = None):
        self.spec = spec
        self.space: SearchSpace = spec.space
        self.study_name = study_name or spec.study
        self.objectives = spec.objective_set
        self.profile = emulator_profile(spec)
        self.backend = with_shell_env(backend_dict(spec))  # NCCL_*, CUDA_*, ... from the shell reach the servers
        self.inflight: dict[Any, InFlight] = {}
        self._pending_flush = False  # finished trials not yet synced to MLflow / findings
        self.stop_reason: str | None = None
        self.interrupted = False
        self.t_start = time.monotonic()
        self.launched = 0
        self.consecutive_skips = 0
        self.asks = 0
        self.recent_bad: list[bool] = []
        self.fingerprint: dict[str, str] = {}
        self.finished_best: R.TrialRecord | None = None
        self.hold: StudyHold | None = None  # file lock + lease (sweeps.ownership)
        self.publisher = self.make_publisher()
        self.progress = self.publisher.progress

    # ---- parts ------------------------------------------------------------------------
    def make_executor(self) -> Executor:
        """Ray tasks on the cluster (starts or joins Ray)."""
        return RayExecutor.start(self.spec)

    def make_publisher(self) -> Publisher:
        """Trial files, MLflow, findings and progress, per ``track``/``findings``/``quiet``."""
        return Publisher(self.spec, self.study_name, track=self.track, findings=self.findings, quiet=self.quiet)

    @property
    def tracker(self) -> Any:
        """The MLflow :class:`~sweeps.tracking.Tracker` (None while MLflow is down)."""
        return self.publisher.tracker

    @property
    def max_inflight(self) -> int:
        """Trials in flight at once: the executor's slots."""
        return self.executor.slots

    # ---- setup ------------------------------------------------------------------------
    def setup(self) -> None:
        """Check the stores, :func:`~sweeps.ownership.prepare` (lock + lease, executor, MLflow's
        permission: nothing is created before), open the study, rules and MLflow parent run,
        read the node fingerprint, recover stale trials and enqueue the seeds.

        Raises:
            SweepError: unwritable store, missing launcher, changed space, no trial slot; the
                rest of :func:`~sweeps.ownership.prepare`'s (LeaseHeld, RayUnavailable, MlflowDenied).
        """
        ensure_writable(self.spec)
        check_launcher(self.spec)
        prepare_stores(self.spec, self.track)  # schemas created once, under <store>/locks/create.lock
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from sweeps.sqlite_tuning import tune_sqlite_engines

        tune_sqlite_engines()  # WAL + synchronous=NORMAL: 16 ms -> 0.02 ms per commit (measured)
        prepare(self)  # lock + lease, Ray (auth, slots), MLflow's permission: before the study and any run
        self.study = S.open_study(self.spec, self.study_name)
        from sweeps.rules import RuleStore, load_implicated_knobs

        self.rules = RuleStore(self.spec.rules_db)
        self.implicated = load_implicated_knobs(REPO_ROOT / "conf" / "failure_knobs.yaml")
        self.publisher.open_tracker(self.study)
        self.fingerprint = self._node_fingerprint()
        S.recover_stale(self.study)
        # the trial budget is the study's: a resumed sweep continues where it stopped;
        # interrupted trials (Ctrl-C, a killed driver) are re-queued: they do not spend the budget
        self.launched = sum(1 for r in R.load_records(self.study)
                            if r.launched and r.state != "RUNNING" and r.status != "interrupted")
        S.enqueue_seeds(self.study, self.spec, self.space)

    def _node_fingerprint(self) -> dict[str, str]:
        try:
            return self.executor.fingerprint(self.spec.backend.kind, self.profile)
        except Exception as e:  # noqa: BLE001
            log.warning("could not collect the node fingerprint (%s); rules will not apply until a trial reports one", e)
            return {}

    def release(self) -> None:
        """Release the study lock and lease (several drivers may run in one process). Idempotent."""
        if self.hold is not None:
            self.hold.release()

    # ---- the loop ---------------------------------------------------------------------
    def budget_left(self) -> bool:
        """False (and ``stop_reason`` set) once a budget, max_asks or the skip cap is spent."""
        b = self.spec.sweep.budget
        if b.trials is not None and self.launched >= b.trials:
            reason = f"trial budget spent ({b.trials} launched)"
        elif b.wall_time_s is not None and time.monotonic() - self.t_start >= b.wall_time_s:
            reason = f"wall-time budget spent ({b.wall_time_s:.0f} s)"
        elif b.gpu_hours is not None and self._gpu_hours() >= b.gpu_hours:
            reason = f"GPU-hour budget spent ({b.gpu_hours} h)"
        elif self.asks >= b.max_asks:
            reason = f"max_asks reached ({b.max_asks})"
        elif self.consecutive_skips >= b.max_consecutive_skips:
            # a safety net: every skip enqueues an untried config, so skips in a row mean the
            # gates keep refusing what the draw offers
            reason = (f"{self.consecutive_skips} consecutive proposals were answered without a launch "
                      f"(max_consecutive_skips)")
        else:
            reason = None
        self.stop_reason = self.stop_reason or reason
        return self.stop_reason is None

    def _gpu_hours(self) -> float:
        return sum(r.timings.get("gpu_s", 0.0) for r in R.load_records(self.study)) / 3600.0

    def _room(self) -> bool:
        cap = self.spec.sweep.budget.trials or 10**9
        return not self.interrupted and len(self.inflight) < self.max_inflight and self.budget_left() \
            and self.launched + len(self.inflight) < cap

    def loop(self) -> None:
        """Propose until the slots are full, flush publishing, collect one finished trial; repeat."""
        while True:
            while self._room():
                if not self._propose():
                    break
            if self._pending_flush:
                self._pending_flush = False
                self.publisher.flush(self.study, self.fingerprint, self.rules)
            if not self.inflight:
                break
            ready = self.executor.wait(list(self.inflight), timeout=1.0)
            if self.hold is not None and (why := self.hold.lost()):  # another driver owns the study: no writes
                abandon(self, why)
            self.publisher.refresh(self.study, len(self.inflight), self.t_start)
            for ref in ready:
                self._collect(ref)
            if self.interrupted:
                break

    def ask(self) -> tuple[optuna.trial.Trial, dict[str, Any]] | None:
        """The next proposal (a waiting baseline or re-queued trial, other enqueued ones, the sampler's)."""
        trial = pop_priority(self.study) or self.study.ask()
        return trial, self.space.sample(trial)

    def _gate(self, trial: optuna.trial.Trial, params: dict[str, Any], key: str) -> gates.Skip | None:
        if not self.gated:
            return None
        running = [(f.trial.number, f.params) for f in self.inflight.values()]
        return (gates.infeasible(self.space, params)
                or gates.duplicate(self.study, trial.number, key, running)
                or gates.degraded(R.load_records(self.study), params)
                or gates.rule(self.rules, self.fingerprint, self.spec.model.name, params, self.study_name))

    def _propose(self) -> bool:
        """Ask one trial; answer it without GPU time or submit it. False when nothing to ask."""
        got = self.ask()
        if got is None:
            return False
        self.asks += 1
        trial, params = got
        key = R.config_key(params)
        trial.set_user_attr(R.A_CONFIG_KEY, key)
        skip = self._gate(trial, params, key)
        if skip is not None:
            self._answer(trial, skip)
            return True
        self.consecutive_skips = 0
        self._launch(trial, params)
        return True

    def _answer(self, trial: optuna.trial.Trial, skip: gates.Skip) -> None:
        """Store a gated proposal's facts and tell Optuna (no GPU time spent)."""
        self.consecutive_skips += 1
        guarded(write_outcome, trial, skip.attrs, f"trial {trial.number}", what=f"record of trial {trial.number}")
        S.tell(self.study, trial, S.verdict_for(skip.status, source=skip.source))
        self._pending_flush = True
        if self.gated and not redirect(self, dict(trial.params), skip.gate):  # a near untried feasible config
            self.stop_reason = self.stop_reason or EXHAUSTED

    def _launch(self, trial: optuna.trial.Trial, params: dict[str, Any]) -> None:
        """Render a config's launch and submit it (an unrenderable config is told infeasible)."""
        try:
            argv, env, expected = get_backend(self.spec.backend.kind).render(
                params, self.spec.node.model_dump(), self.spec.model.model_dump(), self.backend)
        except ValueError as e:
            self._answer(trial, gates.infeasible_skip([str(e)]))
            return
        tspec = TrialSpec(
            sweep=self.study_name, trial_number=trial.number, params=params, argv=argv, env=env,
            backend=self.spec.backend.kind, gpus=self.spec.gpus_per_trial, bench=load_objective.trial_bench(self),
            timeouts=self.spec.timeouts(), container_name=self.spec.backend.container_name, expected_paths=expected,
        )
        self._submit(trial, params, probes.first(self, trial, params, tspec), attempt=1)

    def _submit(self, trial: optuna.trial.Trial, params: dict[str, Any], tspec: TrialSpec, attempt: int) -> None:
        prof = launch_profile(self.profile, f"{self.study_name}/{trial.number}/{attempt}/{int(tspec.probe)}")
        self.inflight[self.executor.submit(tspec, prof)] = InFlight(trial, params, tspec, attempt)

    # ---- collecting results ---------------------------------------------------------------
    def _collect(self, ref: Any) -> None:
        """A task finished: retry it per the policy, or record its result."""
        f = self.inflight.pop(ref)
        res = collect(self.executor, ref)
        if not res.fingerprint or "error" in res.fingerprint:
            res.fingerprint = res.fingerprint or self.fingerprint
        elif not self.fingerprint:
            self.fingerprint = res.fingerprint
        if probes.intercept(self, f, res):  # a probe's outcome: dead end, or the full launch next
            return
        why = None if self.interrupted else retry_reason(res, f.attempt, self.spec.backend.retries_transient)
        if why is not None:
            log.warning("trial %d: %s", f.trial.number, why)
            self.publisher.save_files(f.trial.number, f.params, f.spec, res, suffix=f".attempt{f.attempt}")
            self._submit(f.trial, f.params, f.spec, f.attempt + 1)
            return
        self._record(f, res)

    def _metrics(self, f: InFlight, res: TrialResult) -> dict[str, float]:
        """The trial's metrics plus ``speedup_vs_baseline`` (the objective's ratio to the
        baseline's, > 1 = better); tags a speculative config that is not better."""
        metrics = load_objective.derived(res.metrics, self.spec) if res.status == "ok" else dict(res.metrics)
        if res.status != "ok":
            return metrics
        obj = self.objectives.primary
        base = R.baseline_value(R.load_records(self.study), obj)
        if bool(f.trial.user_attrs.get(R.A_BASELINE)) and base is None:
            base = obj.value(metrics)
        v = obj.value(metrics)
        if base and v:
            metrics["speedup_vs_baseline"] = obj.ratio(v, base)
            if f.params.get("speculative") not in (None, "none") and metrics["speedup_vs_baseline"] < 1.0:
                res.perf_tags = sorted(set(res.perf_tags) | {"spec_decode_no_speedup"})
        return metrics

    def _record(self, f: InFlight, res: TrialResult) -> None:
        """Store a trial's result in its user attrs, tell Optuna, learn, publish."""
        t = f.trial
        self.publisher.save_files(t.number, f.params, f.spec, res)
        if res.status not in ("skipped", "interrupted"):  # interrupted configs are re-queued
            self.launched += 1
        metrics = self._metrics(f, res)
        attrs = {
            R.A_STATUS: res.status, R.A_METRICS: metrics, R.A_FAILURE_CLASS: res.failure_class,
            R.A_FAILURE_KIND: res.failure_kind, R.A_SIGNATURE: res.failure_signature, R.A_PHASE: res.phase,
            R.A_PERF_TAGS: res.perf_tags, R.A_LAUNCH: res.launch_command, R.A_FINGERPRINT: res.fingerprint,
            R.A_NODE: res.node, R.A_ATTEMPTS: f.attempt, R.A_LOG_TAIL: res.log_tail[-4000:],
            R.A_TIMINGS: res.timings(),
        }
        guarded(write_outcome, t, attrs, f"trial {t.number}", what=f"record of trial {t.number}")  # see record_io
        verdict = S.verdict_for(res.status, failure_kind=res.failure_kind, metrics=metrics,
                                objectives=self.objectives,
                                degraded=R.DEGRADED in res.perf_tags and f.params.get("allreduce") not in (None, "nccl"))
        if res.status == "failed" and verdict is S.INFEASIBLE:
            self._learn(t.number, f.params, res, retried=f.attempt > 1)
        S.tell(self.study, t, verdict)
        bad = res.status == "infra_error" or res.failure_class == "unknown"
        self.recent_bad = (self.recent_bad + [bad])[-self.spec.sweep.circuit_breaker.window:]
        self._check_breaker()
        self.publisher.trial_done(t.number, f.params, res, metrics)
        self._pending_flush = True

    def _learn(self, number: int, params: dict[str, Any], res: TrialResult, retried: bool) -> None:
        """Record a failure rule for a deterministic class; a transient class never becomes one
        (a config must not turn into a dead end because of a fault that may not recur)."""
        if res.failure_kind == "transient":
            return
        if not res.failure_class or not (res.fingerprint or self.fingerprint):
            return
        if res.failure_class == "cli_arg_error":
            # argparse rejected the command line: knob values are type-checked before launch, so
            # the cause is the sweep's static config (extra_args, launcher), not these knob values
            return
        with guard(f"record a failure rule for trial {number}"):
            self.rules.learn(res.fingerprint or self.fingerprint, self.spec.model.name, params, res.failure_class,
                             res.failure_signature or "", {"sweep": self.study_name, "trial_number": number},
                             mapping=self.implicated)

    def _check_breaker(self) -> None:
        cb = self.spec.sweep.circuit_breaker
        if len(self.recent_bad) >= cb.window and sum(self.recent_bad) / len(self.recent_bad) >= cb.max_bad_fraction:
            self.stop_reason = (
                f"circuit breaker: {sum(self.recent_bad)} of the last {len(self.recent_bad)} trials failed with "
                f"infrastructure or unknown errors; check the node (server logs under {self.spec.store_dir / 'trials'}) "
                f"and run the same command again to resume"
            )

    # ---- interruption / closing -----------------------------------------------------------
    def interrupt(self) -> None:
        """Ctrl-C: cancel running trials (their tasks tear servers down), record them interrupted
        and re-queue their configs; a trial that finished ok meanwhile keeps its result."""
        self.interrupted = True
        self.stop_reason = "interrupted (Ctrl-C)"
        for ref in list(self.inflight):
            self.executor.cancel(ref)
        deadline = time.monotonic() + self.spec.backend.timeouts.term_grace_s + 15
        while self.inflight and time.monotonic() < deadline:
            for ref in self.executor.wait(list(self.inflight), timeout=1.0):
                f = self.inflight.pop(ref)
                got = collect(self.executor, ref)
                res = got if got.status == "ok" else interrupted_result(got.phase)
                self._record(f, res)
                if res.status == "interrupted":
                    self._requeue(f)
        for ref, f in list(self.inflight.items()):
            self.inflight.pop(ref)
            self._record(f, interrupted_result())
            self._requeue(f)

    def _requeue(self, f: InFlight) -> None:
        """Enqueue an interrupted trial's config so the same command runs it first on resume."""
        with guard(f"re-queue interrupted trial {f.trial.number}"):
            S.requeue(self.study, f.params, f.trial.user_attrs)

    def finish(self) -> R.TrialRecord | None:
        """Confirm the winner, publish the last state, print the summary; returns the best record."""
        conf = self._confirm()
        recs = R.load_records(self.study)
        best = R.best_record(recs, self.objectives)
        if conf.get("winner") is not None:  # the confirmed winner, not the luckiest single run
            best = next((r for r in recs if r.number == conf["winner"]), best)
        base = R.baseline_value(recs, self.objectives)
        # findings and summary first: the parent run's artifacts are their final state
        self.publisher.write_findings(self.study, recs, self.fingerprint, self.rules)
        self.publisher.summary(recs, best, base, self.stop_reason, conf)
        self.publisher.final(self.study, recs, best, base, self.stop_reason, self.interrupted)
        return best

    def _confirm(self) -> dict[str, Any]:
        """Re-measure the top configs with repeats (sweep.confirm); {} when off or interrupted."""
        c = self.spec.sweep.confirm
        if self.interrupted or c.top_k <= 0 or self.spec.sweep.mode != "search":
            return {}
        out: dict[str, Any] = {}
        with guard("confirm the winner"):
            from sweeps.confirm import confirm_top

            out = confirm_top(self, k=c.top_k, repeats=c.repeats, confidence=c.confidence) or {}
        return out
