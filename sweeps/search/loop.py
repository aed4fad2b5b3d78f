"""The sweep loop: a :class:`~sweeps.search.searcher.Searcher` and a :class:`~sweeps.run.runner.Runner`.

A :class:`SweepLoop` is assembled from parts: the searcher (ask -> gates -> untried draw ->
probe decision -> tell, over the study of :mod:`sweeps.store.study`), the runner (an
executor of :mod:`sweeps.run.executor`: Ray or in-process, the trials in flight, the retry
policy) and a publisher (:class:`SweepPublisher`: trial files, MLflow, findings, progress).
It keeps the runner's slots busy, answers gated proposals without GPU time, retries per the
runner's policy, and stops at the budget or the circuit breaker. :func:`sweeps.app.lifecycle.execute`
runs its whole lifecycle with graceful Ctrl-C.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import optuna

from sweeps.config.server_env import with_shell_env
from sweeps.config.space import SearchSpace
from sweeps.config.spec import SweepSpec, backend_dict, knob_env_vars
from sweeps.rules.store import RuleStore
from sweeps.run.executor import Executor, RayExecutor
from sweeps.run.ownership import StudyHold, abandon, hold_study, prepare
from sweeps.run.preflight import check_launcher, emulator_profile, ensure_writable
from sweeps.run.runner import InFlight, Runner
from sweeps.run.stores import prepare as prepare_stores
from sweeps.search import gates
from sweeps.search.coverage import STOP_ATTR, TRIAL_BUDGET_ATTR
from sweeps.search.interfaces import SweepPublisher
from sweeps.search.probes import A_PROBE, A_REQUESTION
from sweeps.search.searcher import Proposal, Searcher
from sweeps.search.untried import EXHAUSTED
from sweeps.store import records
from sweeps.store import study as study_store
from sweeps.store.record_io import interrupted_result
from tasks.backends import get_backend
from tasks.types import TrialResult, TrialSpec

__all__ = ["InFlight", "SweepLoop", "SweepPublisher"]

log = logging.getLogger("servesweep")
REPO_ROOT = Path(__file__).resolve().parents[2]
#: on a store failure, how long (s) launches finishing on their own get before the rest are
#: cancelled (:meth:`sweeps.run.runner.Runner.cancel_all`): a trial whose work directory is on
#: the same full disk fails at its next write, well inside this
STOP_GRACE_S = 5.0


def kept_on_interrupt(f: InFlight, got: TrialResult) -> bool:
    """Whether a task that reported while a stopping sweep drained keeps its result: one that
    finished ok, unless it was a probe, which is only the first step of its trial (a re-question's
    probe excepted: it is the whole trial); the rest are recorded interrupted and re-queued."""
    return got.status == "ok" and (not f.spec.probe or bool(f.trial.user_attrs.get(A_REQUESTION)))


class SweepLoop:
    """One sweep: a searcher and a runner over its study, and a publisher.

    The publisher is the app's part (:class:`sweeps.app.sweep.Driver` supplies
    :class:`sweeps.publish.outputs.Publisher`): this floor decides what to launch and never
    imports what publishes it.

    Subclasses choose parts, never the loop: :meth:`make_executor`, :meth:`make_publisher`
    and :meth:`make_searcher`. ``track``/``findings``/``quiet`` configure the publisher.

    Attributes:
        searcher / runner: set by :meth:`setup` (None before).
        launched: trials of the budget launched (the study's, over resumes; re-question probes are not).
        asks / consecutive_skips: proposals asked, and answered without a launch in a row.
        stop_reason: why the loop stops (None while it runs).  interrupted: Ctrl-C seen.
    """

    track = True
    findings = True
    quiet = False

    def __init__(self, spec: SweepSpec, study_name: str | None = None):
        self.spec = spec
        self.space: SearchSpace = spec.space
        self.study_name = study_name or spec.study
        self.objectives = spec.objective_set
        self.profile = emulator_profile(spec)
        # NCCL_*, CUDA_*, ... from the shell reach the servers, but not a variable a searched knob sets
        self.backend = with_shell_env(backend_dict(spec), knob_vars=knob_env_vars(spec))
        self.searcher: Searcher | None = None
        self.runner: Runner[InFlight] | None = None
        self._fingerprint: dict[str, str] = {}  # until the searcher holds it
        self._pending_flush = False  # finished trials not yet synced to MLflow / findings
        self.stop_reason: str | None = None
        #: False while running; the signal's name (SIGINT, SIGTERM) once a stop was asked for
        self.interrupted: bool | str = False
        self.t_start = time.monotonic()
        self.launched = 0
        #: the study's launches when this run started (a resumed study's earlier runs)
        self.launched_before = 0
        self.consecutive_skips = 0
        self.asks = 0
        self.recent_bad: list[bool] = []
        self.finished_best: records.TrialRecord | None = None
        self.hold: StudyHold | None = None  # file lock + lease (sweeps.run.ownership)
        #: the run's command-line overrides (secrets masked; set by the entry point): stored on the
        #: study for the findings' next-step commands
        self.run_overrides: list[str] = []
        self.publisher: SweepPublisher = self.make_publisher()
        self.progress = self.publisher.progress

    # ---- parts ------------------------------------------------------------------------
    def make_executor(self) -> Executor:
        """Ray tasks on the cluster (starts or joins Ray)."""
        return RayExecutor.start(self.spec)

    def make_publisher(self) -> SweepPublisher:
        """Trial files, MLflow, findings and progress (a :class:`sweeps.publish.outputs.Publisher`).

        Raises:
            NotImplementedError: always; the app's :class:`sweeps.app.sweep.Driver` supplies it.
        """
        raise NotImplementedError("a SweepLoop needs a publisher: use sweeps.app.sweep.Driver")

    def make_searcher(self, study: optuna.Study, rules: RuleStore, implicated: dict[str, list[str]],
                      fingerprint: dict[str, str]) -> Searcher:
        """The sweep's :class:`~sweeps.search.searcher.Searcher` (a recheck chooses its own)."""
        return Searcher(self.spec, self.study_name, study, rules, implicated, fingerprint)

    def _searcher(self) -> Searcher:
        # AttributeError: before setup the sweep has no study, rules or executor (hasattr is False)
        if self.searcher is None:
            raise AttributeError("the sweep has no searcher yet: call setup() first")
        return self.searcher

    def _runner(self) -> Runner[InFlight]:
        if self.runner is None:
            raise AttributeError("the sweep has no runner yet: call setup() first")
        return self.runner

    @property
    def study(self) -> optuna.Study:
        """The sweep's Optuna study (after :meth:`setup`)."""
        return self._searcher().study

    @property
    def rules(self) -> RuleStore:
        """The failure-rule table (after :meth:`setup`)."""
        return self._searcher().rules

    @property
    def fingerprint(self) -> dict[str, str]:
        """The node's environment fingerprint ({} until a node or a trial reports one)."""
        return self.searcher.fingerprint if self.searcher is not None else self._fingerprint

    @property
    def executor(self) -> Executor:
        """The runner's executor (after :meth:`setup`)."""
        return self._runner().executor

    @executor.setter
    def executor(self, executor: Executor) -> None:
        self._runner().executor = executor

    @property
    def inflight(self) -> dict[Hashable, InFlight]:
        """Executor handle -> the trial it runs, for every launch in flight."""
        return self.runner.inflight if self.runner is not None else {}

    @property
    def tracker(self) -> Any:
        """The MLflow :class:`~sweeps.store.tracking.Tracker` (None while MLflow is down)."""
        return self.publisher.tracker

    @property
    def max_inflight(self) -> int:
        """Trials in flight at once: the executor's slots."""
        return self._runner().slots

    @property
    def store_dir(self) -> Path:
        """The sweep's store directory."""
        return self.spec.store_dir

    def close_failed(self) -> None:
        """Setup or the store failed: close an open MLflow parent run as FAILED."""
        self.publisher.close_failed()

    def open_study(self) -> optuna.Study | None:
        """The sweep's study, or None before :meth:`setup` opened it."""
        return self.searcher.study if self.searcher is not None else None

    def cancel_inflight(self) -> None:
        """Cancel every in-flight trial's task (its server is torn down) and forget the trials."""
        if self.runner is not None:
            self.runner.cancel_all(grace_s=STOP_GRACE_S)
            self.runner.drop_all()

    def close_parent(self, status: str, tags: Mapping[str, str]) -> None:
        """Tag the MLflow parent run with ``tags`` and close it with ``status`` (nothing while
        MLflow is off or down)."""
        tracker = self.publisher.tracker
        if tracker is not None:
            tracker.set_parent_tags(dict(tags))
            tracker.close_parent(status)

    # ---- setup ------------------------------------------------------------------------
    def setup(self) -> None:
        """Check the stores, hold the study (lock + lease), :func:`~sweeps.run.ownership.prepare`
        (MLflow's permission, the executor: nothing is created before), open the study, rules
        and MLflow parent run, read the node fingerprint, recover stale trials and enqueue the seeds.

        Raises:
            StoreError: unwritable store (exit 2). SweepError: missing launcher, changed space, no trial slot; LeaseHeld
                (:func:`~sweeps.run.ownership.hold_study`); the rest of
                :func:`~sweeps.run.ownership.prepare`'s (RayUnavailable, MlflowDenied).
        """
        ensure_writable(self.spec)
        check_launcher(self.spec)
        prepare_stores(self.spec, self.track)  # schemas created once, under <store>/locks/create.lock
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from sweeps.store.sqlite import tune_sqlite_engines

        tune_sqlite_engines()  # WAL + synchronous=NORMAL: 16 ms -> 0.02 ms per commit (measured)
        # lock + lease, then MLflow's permission and Ray (auth, slots): before the study and any run
        self.hold = hold_study(self.spec, self.study_name)
        executor = prepare(self.spec, self.track, self.make_executor)
        self.runner = Runner(executor, self.profile, self.spec.backend.retries_transient)
        self.progress.slots = executor.slots
        study = study_store.open_study(self.spec, self.study_name)
        study.set_user_attr(STOP_ATTR, None)  # running: a resumed study's last stop no longer holds
        # the trial budget it runs under, so a report rebuilt from storage owes the quota by the same end
        study.set_user_attr(TRIAL_BUDGET_ATTR, self.spec.sweep.budget.trials)
        study.set_user_attr(study_store.OVERRIDES_ATTR, list(self.run_overrides))
        from sweeps.rules.store import load_implicated_knobs

        rules = RuleStore(self.spec.rules_db)
        implicated = load_implicated_knobs(REPO_ROOT / "conf" / "failure_knobs.yaml")
        self.publisher.open_tracker(study)
        self.searcher = self.make_searcher(study, rules, implicated, self._node_fingerprint(executor))
        study_store.recover_stale(study)
        # the trial budget is the study's: a resumed sweep continues where it stopped;
        # interrupted trials (Ctrl-C, a killed driver) are re-queued: they do not spend the budget;
        # nor do re-question probes (README: probes count in the GPU-hours, not in the trial budget)
        self.launched = sum(1 for r in records.load_records(study)
                            if r.budgeted and r.state != "RUNNING" and r.status != "interrupted")
        self.launched_before = self.launched
        study_store.enqueue_seeds(study, self.spec, self.space, self.searcher.known_dead_end)
        self.searcher.prepare()

    def _node_fingerprint(self, executor: Executor) -> dict[str, str]:
        try:
            return executor.fingerprint(self.spec.backend.kind, self.profile)
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
        return sum(r.timings.get("gpu_s", 0.0) for r in records.load_records(self.study)) / 3600.0

    def _room(self) -> bool:
        cap = self.spec.sweep.budget.trials or 10**9
        budgeted = sum(1 for f in self.inflight.values() if not f.trial.user_attrs.get(A_REQUESTION))
        return not self.interrupted and self._runner().has_room() and self.budget_left() \
            and self.launched + budgeted < cap

    def _running(self) -> list[tuple[int, dict[str, Any]]]:
        return [(f.trial.number, f.params) for f in self.inflight.values()]

    def loop(self) -> None:
        """Propose until the slots are full, flush publishing, collect one finished trial; repeat."""
        runner = self._runner()
        # a resumed study whose space was used up: a sampler's ask would only add one more
        # proposal answered without GPU time, on every rerun of the same command
        # (a spent budget is the stop's reason first: budget_left() records it)
        if self.launched_before and not runner.inflight and self.budget_left() \
                and self._searcher().exhausted(self._running()):
            self.stop_reason = self.stop_reason or EXHAUSTED
        while True:
            while self._room():
                if not self._propose():
                    break
            if self._pending_flush:
                self._pending_flush = False
                self.publisher.flush(self.study, self.fingerprint, self.rules)
            if not runner.inflight:
                break
            ready = runner.wait(timeout=1.0)
            if self.hold is not None and (why := self.hold.lost()):  # another driver owns the study: no writes
                abandon(runner, why)
            self.publisher.refresh(self.study, len(runner.inflight), self.t_start)
            for ref in ready:
                self._collect(ref)
            if self.interrupted:
                break

    def _propose(self) -> bool:
        """Ask one trial; answer it without GPU time or submit it. False when nothing to ask."""
        got: Proposal | None = self._searcher().propose(self._running())
        if got is None:
            return False
        self.asks += 1
        if got.skip is not None:
            self._answer(got.trial, got.skip)
            return True
        self.consecutive_skips = 0
        self._launch(got.trial, got.params)
        return True

    def _answer(self, trial: optuna.trial.Trial, skip: gates.Skip) -> None:
        """A gated proposal: the searcher stores and tells it (no GPU time spent)."""
        self.consecutive_skips += 1
        left = self._searcher().answer(trial, skip, self._running())
        self._pending_flush = True
        if not left:  # no untried feasible config is left to launch in its place
            self.stop_reason = self.stop_reason or EXHAUSTED

    def _launch(self, trial: optuna.trial.Trial, params: dict[str, Any]) -> None:
        """Render a config's launch and submit it (an unrenderable config is told infeasible)."""
        searcher = self._searcher()
        try:
            argv, env, expected = get_backend(self.spec.backend.kind).render(
                params, self.spec.node.model_dump(), self.spec.model.model_dump(), self.backend)
        except ValueError as e:
            self._answer(trial, gates.infeasible_skip([str(e)]))
            return
        tspec = TrialSpec(
            sweep=self.study_name, trial_number=trial.number, params=params, argv=argv, env=env,
            backend=self.spec.backend.kind, gpus=self.spec.gpus_per_trial, bench=searcher.bench(),
            timeouts=self.spec.timeouts(), container_name=self.spec.backend.container_name, expected_paths=expected,
        )
        self._submit(trial, params, searcher.first_launch(trial.number, params, tspec,
                                                          trial.user_attrs.get(A_REQUESTION)), attempt=1)

    def _submit(self, trial: optuna.trial.Trial, params: dict[str, Any], tspec: TrialSpec, attempt: int) -> None:
        key = f"{self.study_name}/{trial.number}/{attempt}/{int(tspec.probe)}"
        self._runner().submit(tspec, key, InFlight(trial, params, tspec, attempt))

    # ---- collecting results ---------------------------------------------------------------
    def _collect(self, ref: Hashable) -> None:
        """A task finished: a probe's next step, a retry per the runner's policy, or its record."""
        searcher, runner = self._searcher(), self._runner()
        f, res = runner.take(ref)
        searcher.note_fingerprint(res)
        why = None if self.interrupted else runner.retry_reason(res, f.attempt)
        if f.spec.probe:  # a probe's outcome: dead end, or the full launch next
            self._probe_done(f, res, why)
            return
        searcher.launch_done(f.trial.number, res)
        if why is not None:
            log.warning("trial %d: %s", f.trial.number, why)
            self.publisher.save_files(f.trial.number, f.params, f.spec, res, suffix=f".attempt{f.attempt}")
            self._submit(f.trial, f.params, f.spec, f.attempt + 1)
            return
        self._record(f, res)

    def _probe_done(self, f: InFlight, res: TrialResult, why: str | None) -> None:
        """A probe finished: retry it, end the trial at its cost, or submit the full launch."""
        from sweeps.run.best_effort import best_effort

        step = self._searcher().probe_outcome(f, res, retry=why is not None)
        if step.action == "retry":  # the executor's retry policy applies to a probe as to any launch
            log.warning("trial %d (probe): %s", f.trial.number, why)
            with best_effort(f"save probe files of trial {f.trial.number}"):
                self.publisher.save_files(f.trial.number, f.params, f.spec, res, suffix=f".probe.attempt{f.attempt}")
            self._submit(f.trial, f.params, f.spec, f.attempt + 1)
            return
        with best_effort(f"save probe files of trial {f.trial.number}"):
            self.publisher.save_files(f.trial.number, f.params, f.spec, res, suffix=".probe")
        if step.action == "record" or step.full is None:
            self._record(f, res)  # the trial ends here: one trial of the budget, a probe's GPU-seconds
            return
        self._submit(f.trial, f.params, step.full, attempt=1)

    def _record(self, f: InFlight, res: TrialResult) -> None:
        """Store a trial's result, tell Optuna and learn (the searcher), publish."""
        t = f.trial
        searcher = self._searcher()
        self.publisher.save_files(t.number, f.params, f.spec, res)
        # interrupted configs are re-queued; a re-question probe is not a launch of the budget
        if res.status not in ("skipped", "interrupted") and not t.user_attrs.get(A_REQUESTION):
            self.launched += 1
        metrics = searcher.metrics(f, res)
        searcher.tell(f, res, metrics)
        bad = res.status == "infra_error" or res.failure_class == "unknown"
        self.recent_bad = (self.recent_bad + [bad])[-self.spec.sweep.circuit_breaker.window:]
        self._check_breaker()
        retired = (t.user_attrs.get(A_PROBE) or {}).get("retired") if res.status == "ok" and f.spec.probe else None
        self.publisher.trial_done(t.number, f.params, res, metrics, retired,
                                  requestion=bool(t.user_attrs.get(A_REQUESTION)))
        self._pending_flush = True

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
        how = self.interrupted if isinstance(self.interrupted, str) else "SIGINT"
        self.interrupted = how
        self.stop_reason = f"interrupted ({'Ctrl-C' if how == 'SIGINT' else how})"
        if self.runner is None:
            return
        searcher = self._searcher()
        self.runner.cancel_all()
        deadline = time.monotonic() + self.spec.backend.timeouts.term_grace_s + 15
        for f, got in self.runner.drain(deadline):
            res = got if got is not None and kept_on_interrupt(f, got) else \
                interrupted_result(got.phase if got is not None else None, how)
            self._record(f, res)
            if res.status == "interrupted":
                searcher.requeue(f)

    def finish(self) -> records.TrialRecord | None:
        """Confirm the winner, publish the last state, print the summary; returns the best record."""
        conf = self._confirm()
        self._serving_check(conf)
        recs = records.load_records(self.study)
        best = records.best_record(recs, self.objectives)
        if conf.get("winner") is not None:  # the confirmed winner, not the luckiest single run
            from sweeps.search.confirm import config_record

            best = config_record(recs, conf, conf["winner"]) or best
        base = records.baseline_value(recs, self.objectives)
        from sweeps.run.best_effort import best_effort

        with best_effort("store the stop reason"):  # the findings say why an owed quota was not paid
            self.study.set_user_attr(STOP_ATTR, self.stop_reason)
        # findings and summary first: the parent run's artifacts are their final state
        self.publisher.write_findings(self.study, recs, self.fingerprint, self.rules)
        self.publisher.summary(recs, best, base, self.stop_reason, conf)
        self.publisher.final(self.study, recs, best, base, self.stop_reason, bool(self.interrupted))
        return best

    def _serving_check(self, conf: dict[str, Any]) -> dict[str, Any]:
        """Load-check the winner at the baseline's sustainable rate (``sweep.serving_check``,
        :mod:`sweeps.search.serving_check`); {} when off, interrupted or nothing to check."""
        out: dict[str, Any] = {}
        from sweeps.run.best_effort import best_effort

        with best_effort("run the serving check of the winner"):
            from sweeps.search.serving_check import check_tie_group

            out, picked = check_tie_group(self, conf)
            if picked is not conf:  # the tie-break moved the pick: the confirmation says so too
                conf.clear()
                conf.update(picked)
        return out

    def _confirm(self) -> dict[str, Any]:
        """Re-measure the top configs with repeats (sweep.confirm); {} when off or interrupted."""
        c = self.spec.sweep.confirm
        if self.interrupted or c.top_k <= 0 or self.spec.sweep.mode != "search":
            return {}
        out: dict[str, Any] = {}
        from sweeps.run.best_effort import best_effort

        with best_effort("confirm the winner"):
            from sweeps.search.confirm import confirm_top

            out = confirm_top(self, k=c.top_k, repeats=c.repeats, confidence=c.confidence, margin=c.margin,
                              max_repeats=c.repeat_budget, descend=c.descend if c.race else 0,
                              futility=c.futility) or {}
        return out
