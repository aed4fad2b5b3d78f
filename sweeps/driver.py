"""The sweep driver: Optuna ask -> Ray task -> tell, with failure knowledge and MLflow sync.

``run(cfg)`` is the whole job (``run_sweep.py`` only composes the config):

1. validate the config into a :class:`~sweeps.config.SweepSpec` (every error before Ray);
2. open the Optuna study (RDB storage, resumable by name; a changed search space is
   refused), the MLflow parent run, the failure-rules table and the node fingerprint;
3. fail the study's stale RUNNING trials (a killed driver) and re-enqueue their configs;
4. enqueue the baseline, the seed trials and one trial per level of the seeded knobs;
5. keep ``cluster GPUs // GPUs per trial`` trials in flight (``ray.wait(num_returns=1)``),
   skipping configs that violate a constraint, match a failure rule or duplicate a
   finished config (told to Optuna without GPU time), retrying transient failures once
   and infrastructure failures on a fresh task, until the budget is spent;
6. after every finished trial: tell Optuna (Optuna is the source of truth), learn rules,
   sync MLflow, refresh the progress display and the findings document;
7. print the closing summary with the best config's exact launch command.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

from sweeps import records as R
from sweeps.config import ConfigError, SweepSpec, backend_dict, load_spec
from sweeps.progress import Progress
from sweeps.space import SearchSpace, seed_configs
from tasks.knobs import render_launch
from tasks.redact import redact_argv
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep")
SPACE_ATTR = "space_signature"
EXIT_INTERRUPTED = 130


class SweepError(RuntimeError):
    """A sweep-level problem (unreachable Ray, unwritable store, changed space, ...)."""


def _sweep_errors() -> tuple[type[BaseException], ...]:
    from sweeps.cluster import RayUnavailable

    return (SweepError, ConfigError, RayUnavailable)


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def space_signature(spec: SweepSpec) -> str:
    """Hash of the search space (params + constraints) that a resumed study must match."""
    body = json.dumps({"params": spec.sweep.params, "constraints": spec.sweep.constraints}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def emulator_profile(spec: SweepSpec) -> dict[str, Any] | None:
    """The ``{"node", "model", "emulator"}`` profile the emulated server / instant model read."""
    if spec.backend.kind not in ("emulated", "instant"):
        return None
    from tasks.emulator.profile import build_profile

    emu = dict(spec.backend.emulator)
    emu.setdefault("sglang_version", spec.backend.sglang_version)
    return build_profile(spec.node.model_dump(), spec.model.model_dump(), emu)


def _ensure_writable(spec: SweepSpec) -> None:
    for d in (spec.store_dir, spec.findings_path.parent):
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / ".servesweep-write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise SweepError(f"cannot write to {d} ({e.strerror}); fix its permissions or set tracking.store_dir / "
                             f"tracking.findings_dir to a writable directory") from None


def _check_launcher(spec: SweepSpec) -> None:
    """A launcher that does not exist is a config error, not a failure of every config (it
    would teach a ``cli_arg_error`` rule per config). Checked here for a local Ray only: on a
    cluster the launcher lives on the GPU nodes.

    Raises:
        SweepError: ``backend.launcher[0]`` is not an executable on PATH.
    """
    if spec.backend.kind == "instant" or spec.ray.address or not spec.backend.launcher:
        return
    import shutil

    exe = sys.executable if spec.backend.launcher[0] == "{python}" else spec.backend.launcher[0]
    if shutil.which(exe) is None:
        raise SweepError(f"backend.launcher: {exe!r} is not an executable on PATH (nothing was launched); "
                         f"install it or point backend.launcher at it")


def make_sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, grouped for conditional params, constant liar for trials in
    flight) or random, seeded from the sweep config."""
    s = spec.sweep.sampler
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    return optuna.samplers.TPESampler(
        seed=s.seed, n_startup_trials=s.n_startup_trials, multivariate=True, group=True, constant_liar=True,
    )


def open_study(spec: SweepSpec, name: str | None = None) -> optuna.Study:
    """Create or resume the study ``name`` (default ``spec.study``) in the RDB storage.

    Raises:
        SweepError: the existing study was created with a different search space.
    """
    name = name or spec.study
    storage = optuna.storages.RDBStorage(
        spec.optuna_storage, engine_kwargs={"connect_args": {"timeout": 30}} if spec.optuna_storage.startswith("sqlite") else {},
    )
    study = optuna.create_study(study_name=name, storage=storage, sampler=make_sampler(spec), direction="maximize",
                                load_if_exists=True)
    sig = space_signature(spec)
    old = study.user_attrs.get(SPACE_ATTR)
    if old is None:
        study.set_user_attr(SPACE_ATTR, sig)
        study.set_user_attr("sweep", spec.sweep.name)
        study.set_user_attr("node", spec.node.name)
        study.set_user_attr("model", spec.model.name)
        study.set_user_attr("backend", spec.backend.kind)
    elif old != sig:
        raise SweepError(
            f"study {name!r} exists with a different search space (signature {old} != {sig}). "
            f"Resume it with its original sweep config, or start a new study: new_study=true "
            f"(or study_name=<new name>)."
        )
    return study


# ---------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------
@dataclass
class InFlight:
    trial: optuna.trial.Trial
    params: dict[str, Any]
    spec: TrialSpec
    attempt: int
    t_submit: float = field(default_factory=time.monotonic)


class Driver:
    """Owns the study, Ray submissions, rules, MLflow and the findings for one sweep."""

    def __init__(self, spec: SweepSpec, study_name: str | None = None):
        self.spec = spec
        self.space: SearchSpace = spec.space
        self.study_name = study_name or spec.study
        self.profile = emulator_profile(spec)
        self.backend = backend_dict(spec)
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
        self.progress = Progress(self.study_name, spec.sweep.budget.trials)
        self.finished_best: R.TrialRecord | None = None

    # ---- setup ----------------------------------------------------------------------
    def setup(self) -> None:
        _ensure_writable(self.spec)
        _check_launcher(self.spec)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from sweeps.sqlite_tuning import tune_sqlite_engines

        tune_sqlite_engines()  # WAL + synchronous=NORMAL: 16 ms -> 0.02 ms per commit (measured)
        self._lock_study()
        self.study = open_study(self.spec, self.study_name)
        from sweeps.rules import RuleStore, load_implicated_knobs

        self.rules = RuleStore(self.spec.rules_db)
        self.implicated = load_implicated_knobs(Path(__file__).resolve().parent.parent / "conf" / "failure_knobs.yaml")
        self._open_tracker()
        self._start_ray()
        self.fingerprint = self._node_fingerprint()
        self._recover_stale()
        # the trial budget is the study's: a resumed sweep continues where it stopped
        # interrupted trials (Ctrl-C, a killed driver) are re-queued: they do not spend the budget
        self.launched = sum(1 for r in R.load_records(self.study)
                            if r.launched and r.state != "RUNNING" and r.status != "interrupted")
        self._enqueue_seeds()

    def _open_tracker(self) -> None:
        """Open the MLflow experiment and the study's parent run (``self.tracker``; None when MLflow is down)."""
        self.tracker = None
        try:
            from sweeps.tracking import Tracker

            self.tracker = Tracker(self.spec.mlflow_uri, self.spec.sweep.name, self.spec.artifact_location)
            self.tracker.open_parent(self.study, self.spec.sweep.description or self.spec.sweep.name,
                                     {"sweep": self.spec.sweep.name, "node": self.spec.node.name,
                                      "model": self.spec.model.name, "backend": self.spec.backend.kind,
                                      "objective": self.spec.sweep.objective})
        except Exception as e:  # noqa: BLE001 - MLflow down: the sweep goes on, sync catches up later
            log.warning("MLflow unavailable (%s); trials will be synced when it is back", e)
            self.tracker = None

    def _lock_study(self) -> None:
        """One driver per study on this store: a second one would fail the first's running
        trials as stale. The lock (flock on ``<store>/locks/<study>.lock``) dies with the process.

        Raises:
            SweepError: another live driver holds the study.
        """
        import fcntl

        d = self.spec.store_dir / "locks"
        d.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(d / f"{self.study_name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._lock_fd, 32, 0).decode(errors="replace").strip() or "?"
            raise SweepError(f"study {self.study_name!r} is being run by another driver (pid {holder}); wait for it, "
                             f"or run a separate study with study_name=<name>") from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, str(os.getpid()).encode(), 0)

    def _start_ray(self) -> None:
        import ray

        from sweeps.cluster import start_ray

        self.ray = ray
        start_ray(self.spec)
        from sweeps.cluster import explain_no_slots, trial_slots

        slots, per_node = trial_slots(self.spec)  # packed node by node, pinning respected
        if slots < 1:
            raise SweepError(explain_no_slots(self.spec))
        log.info("Ray: %d trial slot(s) over %d node(s) %s", slots, sum(1 for v in per_node.values() if v), per_node)
        self.max_inflight = self.spec.ray.max_in_flight or slots
        from tasks.remote import fingerprint_task, trial_task

        self._trial_task = trial_task(self.spec)
        self._fp_task = fingerprint_task(self.spec)

    def _node_fingerprint(self) -> dict[str, str]:
        try:
            return self.ray.get(self._fp_task.remote(self.spec.backend.kind, self.profile), timeout=120)
        except Exception as e:  # noqa: BLE001
            log.warning("could not collect the node fingerprint (%s); rules will not apply until a trial reports one", e)
            return {}

    def _recover_stale(self) -> None:
        """Fail RUNNING trials left by a killed driver (infra: node_lost) and re-enqueue them."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            tid = t._trial_id
            st = self.study._storage
            st.set_trial_user_attr(tid, R.A_STATUS, "interrupted")
            st.set_trial_user_attr(tid, R.A_FAILURE_CLASS, "node_lost")
            st.set_trial_user_attr(tid, R.A_FAILURE_KIND, "infra")
            st.set_trial_user_attr(tid, R.A_SIGNATURE, "driver stopped while the trial was running")
            self._tell(t.number, state=TrialState.FAIL)
            if t.params:
                self.study.enqueue_trial(dict(t.params), user_attrs=dict(t.user_attrs.get("enqueue_attrs") or {}))
            log.warning("trial %d was running when the driver stopped: marked failed (node_lost) and re-queued", t.number)

    def _enqueue_seeds(self) -> None:
        """Enqueue the baseline (tagged ``is_baseline``), the seed trials and one trial per
        level of the seeded knobs; ``skip_if_exists`` makes a resumed sweep enqueue nothing twice."""
        sw = self.spec.sweep
        if sw.mode != "search":
            return
        for i, cfg in enumerate(seed_configs(self.space, sw.baseline, sw.seed_trials, sw.seed_each_level_of)):
            attrs = {R.A_BASELINE: True} if i == 0 else {}
            self.study.enqueue_trial(cfg, user_attrs={**attrs, "enqueue_attrs": attrs}, skip_if_exists=True)

    # ---- the loop ---------------------------------------------------------------------
    def budget_left(self) -> bool:
        b = self.spec.sweep.budget
        if b.trials is not None and self.launched >= b.trials:
            self.stop_reason = self.stop_reason or f"trial budget spent ({b.trials} launched)"
        elif b.wall_time_s is not None and time.monotonic() - self.t_start >= b.wall_time_s:
            self.stop_reason = self.stop_reason or f"wall-time budget spent ({b.wall_time_s:.0f} s)"
        elif b.gpu_hours is not None and self._gpu_hours() >= b.gpu_hours:
            self.stop_reason = self.stop_reason or f"GPU-hour budget spent ({b.gpu_hours} h)"
        elif self.asks >= b.max_asks:
            self.stop_reason = self.stop_reason or f"max_asks reached ({b.max_asks})"
        elif self.consecutive_skips >= b.max_consecutive_skips:
            self.stop_reason = self.stop_reason or (
                f"{self.consecutive_skips} consecutive proposals were skips or duplicates: the space looks exhausted")
        return self.stop_reason is None

    def _gpu_hours(self) -> float:
        return sum(r.timings.get("gpu_s", 0.0) for r in R.load_records(self.study)) / 3600.0

    def loop(self) -> None:
        while True:
            while not self.interrupted and len(self.inflight) < self.max_inflight and self.budget_left() \
                    and self.launched + len(self.inflight) < (self.spec.sweep.budget.trials or 10**9):
                if not self._propose():
                    break
            if self._pending_flush:
                self._flush_finished()
            if not self.inflight:
                break
            ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=1.0)
            self.progress.refresh(self.study, len(self.inflight), self.t_start)
            for ref in ready:
                self._collect(ref)
            if self.interrupted:
                break

    def _propose(self) -> bool:
        """Ask one trial; skip it without GPU time or submit it. False when nothing to ask."""
        self.asks += 1
        trial = self.study.ask()
        params = self.space.sample(trial)
        key = R.config_key(params)
        trial.set_user_attr(R.A_CONFIG_KEY, key)
        violated = self.space.violated(params)
        if violated:
            self._tell_skip(trial, "infeasible", violated=violated)
            return True
        dup = self._duplicate_of(trial.number, key)
        if dup is not None:
            self._tell_duplicate(trial, dup)
            return True
        degraded = self._degraded_level(params)
        if degraded is not None:
            self._tell_degraded_skip(trial, degraded)
            return True
        rule = self.rules.match(self.fingerprint, self.spec.model.name, params, sweep=self.study_name) if self.fingerprint else None
        if rule is not None:
            self._tell_rule_skip(trial, rule)
            return True
        self.consecutive_skips = 0
        self._launch(trial, params)
        return True

    def _launch(self, trial: optuna.trial.Trial, params: dict[str, Any]) -> None:
        """Render a config's launch and submit it as a Ray task (an unrenderable config is told infeasible)."""
        try:
            argv, env, expected = render_launch(params, self.spec.node.model_dump(), self.spec.model.model_dump(),
                                                self.backend)
        except ValueError as e:
            self._tell_skip(trial, "infeasible", violated=[str(e)])
            return
        tspec = TrialSpec(
            sweep=self.study_name, trial_number=trial.number, params=params, argv=argv, env=env,
            backend=self.spec.backend.kind, gpus=self.spec.gpus_per_trial, bench=self.spec.bench_spec(),
            timeouts=self.spec.timeouts(), container_name=self.spec.backend.container_name, expected_paths=expected,
        )
        self._submit(trial, params, tspec, attempt=1)

    def _submit(self, trial: optuna.trial.Trial, params: dict[str, Any], tspec: TrialSpec, attempt: int) -> None:
        ref = self._trial_task.remote(tspec, self.profile, str(self.spec.store_dir / "work"))
        self.inflight[ref] = InFlight(trial, params, tspec, attempt)

    def _duplicate_of(self, number: int, key: str) -> int | None:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if t.number != number and t.user_attrs.get(R.A_CONFIG_KEY) == key and t.user_attrs.get(R.A_DUPLICATE_OF) is None \
                    and t.user_attrs.get(R.A_STATUS) in ("ok", "failed", "skipped"):
                return t.number
        for f in self.inflight.values():
            if R.config_key(f.params) == key:
                return f.trial.number
        return None

    # ---- telling Optuna ----------------------------------------------------------------
    def _tell_infeasible(self, trial: optuna.trial.Trial | int, reason: str) -> None:
        """Record a config the sampler must learn to avoid: PRUNED + a violated constraint.

        TPE reads COMPLETE and PRUNED trials; with a positive constraint value it ranks the
        trial among the infeasible (worst) ones, so it stops proposing that region.
        """
        t = trial if isinstance(trial, optuna.trial.Trial) else None
        if t is not None:
            t.set_constraint("feasible", 1.0)
        self._tell(trial, state=TrialState.PRUNED)

    def _tell(self, trial: Any, **kw: Any) -> None:
        try:
            self.study.tell(trial, **kw)
        except Exception as e:  # noqa: BLE001 - a tell problem is logged, never crashes the sweep
            log.error("study.tell failed for trial %s: %s", getattr(trial, "number", trial), e)

    def _tell_skip(self, trial: optuna.trial.Trial, status: str, violated: list[str]) -> None:
        self.consecutive_skips += 1
        trial.set_user_attr(R.A_STATUS, status)
        trial.set_user_attr(R.A_VIOLATED, violated)
        self._tell_infeasible(trial, "constraint")
        self._after_finish()

    def _tell_duplicate(self, trial: optuna.trial.Trial, dup: int) -> None:
        self.consecutive_skips += 1
        # by number without deep-copying every trial (study.trials deep-copies: O(n) per duplicate)
        src = next((t for t in self.study.get_trials(deepcopy=False) if t.number == dup), None)
        trial.set_user_attr(R.A_STATUS, "skipped")
        trial.set_user_attr(R.A_DUPLICATE_OF, dup)
        if src is not None and src.state == TrialState.COMPLETE and src.value is not None:
            for k in (R.A_METRICS,):
                if k in src.user_attrs:
                    trial.set_user_attr(k, src.user_attrs[k])
            self._tell(trial, values=src.value)
        elif src is not None and src.state == TrialState.PRUNED:
            for k in (R.A_FAILURE_CLASS, R.A_FAILURE_KIND, R.A_SIGNATURE):
                if k in src.user_attrs:
                    trial.set_user_attr(k, src.user_attrs[k])
            self._tell_infeasible(trial, "duplicate of a failed config")
        else:  # the original is still running: tell nothing useful, let the sampler move on
            trial.set_constraint("feasible", 0.0)
            self._tell(trial, state=TrialState.PRUNED)
        self._after_finish()

    def _degraded_level(self, params: dict[str, Any]) -> int | None:
        """A trial of this study that ran the same allreduce level and saw it silently
        replaced (``allreduce_path_degraded``): the level does not run on this node, so the
        config is not launched again. Returns that trial's number or None."""
        level = params.get("allreduce")
        if level in (None, "nccl"):
            return None
        for r in R.load_records(self.study):
            if r.status == "ok" and r.params.get("allreduce") == level and not R.counts_for_level(r) \
                    and r.duplicate_of is None and r.skipped_by_rule is None:
                return r.number
        return None

    def _tell_degraded_skip(self, trial: optuna.trial.Trial, evidence: int) -> None:
        self.consecutive_skips += 1
        trial.set_user_attr(R.A_STATUS, "skipped")
        trial.set_user_attr(R.A_SKIPPED_BY_RULE, f"degraded:allreduce={trial.params.get('allreduce')}@t{evidence}")
        trial.set_user_attr(R.A_FAILURE_CLASS, R.DEGRADED)
        trial.set_user_attr(R.A_FAILURE_KIND, "perf")
        trial.set_user_attr(R.A_SIGNATURE, f"allreduce={trial.params.get('allreduce')} silently fell back to NCCL "
                                           f"in trial {evidence}")
        trial.set_user_attr(R.A_TIMINGS, {"gpu_s": 0.0})
        self._tell_infeasible(trial, "degraded allreduce level")
        self._after_finish()

    def _tell_rule_skip(self, trial: optuna.trial.Trial, rule: Any) -> None:
        self.consecutive_skips += 1
        trial.set_user_attr(R.A_STATUS, "skipped")
        trial.set_user_attr(R.A_SKIPPED_BY_RULE, str(rule.id))
        trial.set_user_attr(R.A_FAILURE_CLASS, rule.failure_class)
        trial.set_user_attr(R.A_FAILURE_KIND, rule.kind)
        trial.set_user_attr(R.A_SIGNATURE, rule.signature)
        trial.set_user_attr(R.A_TIMINGS, {"gpu_s": 0.0})
        self._tell_infeasible(trial, "failure rule")
        self._after_finish()

    # ---- collecting results ------------------------------------------------------------
    def _collect(self, ref: Any) -> None:
        f = self.inflight.pop(ref)
        try:
            res: TrialResult = self.ray.get(ref)
        except Exception as e:  # noqa: BLE001 - Ray infra failure (node died, worker crashed)
            res = TrialResult(status="infra_error", failure_class="node_lost", failure_kind="infra",
                              failure_signature=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                              phase="unknown")
        if not res.fingerprint or "error" in res.fingerprint:
            res.fingerprint = res.fingerprint or self.fingerprint
        elif not self.fingerprint:
            self.fingerprint = res.fingerprint
        retries = self.spec.backend.retries_transient
        if res.status == "infra_error" and f.attempt <= retries + 1 and not self.interrupted:
            log.warning("trial %d: infrastructure failure (%s); retrying on a fresh task", f.trial.number, res.failure_class)
            self._save_files(f, res, suffix=f".attempt{f.attempt}")
            self._submit(f.trial, f.params, f.spec, f.attempt + 1)
            return
        if res.status == "failed" and res.failure_kind == "transient" and f.attempt <= retries and not self.interrupted:
            log.warning("trial %d: transient failure (%s); retrying once", f.trial.number, res.failure_class)
            self._save_files(f, res, suffix=f".attempt{f.attempt}")
            self._submit(f.trial, f.params, f.spec, f.attempt + 1)
            return
        self._record(f, res)

    def _save_files(self, f: InFlight, res: TrialResult, suffix: str = "") -> None:
        d = R.trial_dir(self.spec.store_dir, self.study_name, f.trial.number)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"server{suffix}.log").write_text(res.server_log)
        if not suffix:
            (d / "launch_command.txt").write_text(res.launch_command + "\n")
            if res.bench:
                (d / "bench.json").write_text(json.dumps({"metrics": res.metrics, "requests": res.bench}, indent=1))
            (d / "result.json").write_text(json.dumps(
                {k: v for k, v in res.to_dict().items() if k not in ("server_log", "bench")}, indent=1, default=str))
            (d / "config.json").write_text(json.dumps(
                {"params": f.params, "argv": redact_argv(f.spec.argv), "env": sorted(f.spec.env), "backend": self.spec.backend.kind,
                 "node": self.spec.node.name, "model": self.spec.model.name}, indent=1))

    def _record(self, f: InFlight, res: TrialResult) -> None:
        t = f.trial
        self._save_files(f, res)
        launched = res.status not in ("skipped", "interrupted")  # interrupted configs are re-queued
        if launched:
            self.launched += 1
        base = R.baseline_value(R.load_records(self.study))
        metrics = dict(res.metrics)
        is_baseline = bool(t.user_attrs.get(R.A_BASELINE))
        if res.status == "ok":
            if is_baseline and base is None:
                base = metrics.get("decode_tok_s")
            if base:
                metrics["speedup_vs_baseline"] = metrics["decode_tok_s"] / base
                if f.params.get("speculative") not in (None, "none") and metrics["speedup_vs_baseline"] < 1.0:
                    res.perf_tags = sorted(set(res.perf_tags) | {"spec_decode_no_speedup"})
        attrs = {
            R.A_STATUS: res.status, R.A_METRICS: metrics, R.A_FAILURE_CLASS: res.failure_class,
            R.A_FAILURE_KIND: res.failure_kind, R.A_SIGNATURE: res.failure_signature, R.A_PHASE: res.phase,
            R.A_PERF_TAGS: res.perf_tags, R.A_LAUNCH: res.launch_command, R.A_FINGERPRINT: res.fingerprint,
            R.A_NODE: res.node, R.A_ATTEMPTS: f.attempt, R.A_LOG_TAIL: res.log_tail[-4000:],
            R.A_TIMINGS: {"startup_s": res.startup_s, "bench_s": res.bench_s, "gpu_s": res.gpu_s, "wall_s": res.wall_s},
        }
        for k, v in attrs.items():
            try:
                t.set_user_attr(k, v)
            except Exception as e:  # noqa: BLE001
                log.error("could not store %s for trial %d: %s", k, t.number, e)
        obj = metrics.get(self.spec.sweep.objective)
        if res.status == "ok" and obj is not None and math.isfinite(obj) and R.DEGRADED in res.perf_tags \
                and f.params.get("allreduce") not in (None, "nccl"):
            self._tell_infeasible(t, "allreduce level silently replaced")  # measured, but not the level named
        elif res.status == "ok" and obj is not None and math.isfinite(obj):
            t.set_constraint("feasible", 0.0)
            self._tell(t, values=obj)
        elif res.status == "failed" and res.failure_kind in ("deterministic", "transient"):
            self._learn(t.number, f.params, res, retried=f.attempt > 1)
            self._tell_infeasible(t, res.failure_class or "failed")
        else:  # infra errors, interruptions: not the config's fault, teach the sampler nothing
            self._tell(t, state=TrialState.FAIL)
        bad = res.status == "infra_error" or res.failure_class == "unknown"
        self.recent_bad = (self.recent_bad + [bad])[-self.spec.sweep.circuit_breaker.window:]
        self._check_breaker()
        line = self._trial_line(t.number, f.params, res, metrics)
        self.progress.event(line)
        self._after_finish()

    def _learn(self, number: int, params: dict[str, Any], res: TrialResult, retried: bool) -> None:
        """Record a failure rule: deterministic classes at once; a transient class only after
        its retry failed too (then it applies to this sweep only)."""
        if res.failure_kind == "transient" and not retried:
            return
        if not res.failure_class or not (res.fingerprint or self.fingerprint):
            return
        if res.failure_class == "cli_arg_error":
            # argparse rejected the command line: knob values are type-checked before launch, so
            # the cause is the sweep's static config (extra_args, launcher), not these knob values
            return
        try:
            self.rules.learn(res.fingerprint or self.fingerprint, self.spec.model.name, params, res.failure_class,
                             res.failure_signature or "", {"sweep": self.study_name, "trial_number": number},
                             mapping=self.implicated, force=res.failure_kind == "transient")
        except Exception as e:  # noqa: BLE001
            log.error("could not record a failure rule for trial %d: %s", number, e)

    def _check_breaker(self) -> None:
        cb = self.spec.sweep.circuit_breaker
        if len(self.recent_bad) >= cb.window and sum(self.recent_bad) / len(self.recent_bad) >= cb.max_bad_fraction:
            self.stop_reason = (
                f"circuit breaker: {sum(self.recent_bad)} of the last {len(self.recent_bad)} trials failed with "
                f"infrastructure or unknown errors; check the node (server logs under {self.spec.store_dir / 'trials'}) "
                f"and run the same command again to resume"
            )

    def _trial_line(self, number: int, params: dict[str, Any], res: TrialResult, metrics: dict[str, float]) -> str:
        from sweeps.tracking import run_name

        name = run_name(R.TrialRecord(number=number, state="", params=params, status=res.status, perf_tags=res.perf_tags))
        if res.status == "ok":
            sp = metrics.get("speedup_vs_baseline")
            return (f"{name}: {metrics.get('decode_tok_s', float('nan')):.1f} tok/s"
                    + (f" ({sp:.2f}x baseline)" if sp else "") + (f" [{', '.join(res.perf_tags)}]" if res.perf_tags else ""))
        return f"{name}: {res.status} {res.failure_class} ({res.phase}) {res.failure_signature or ''}"[:200]

    def _after_finish(self) -> None:
        """A trial was told to Optuna: MLflow sync + findings are due. They run in the loop
        once the freed GPUs have their next trial (``_flush_finished``), so the GPUs never
        wait for bookkeeping, and one sync covers every trial finished meanwhile."""
        self._pending_flush = True

    def _flush_finished(self) -> None:
        self._pending_flush = False
        recs = R.load_records(self.study)
        if (self.tracker is None or not self.tracker.parent_run_id) and \
                time.monotonic() - getattr(self, "_tracker_tried_at", 0.0) > 10.0:
            self._tracker_tried_at = time.monotonic()  # MLflow was down at start: try again, at most every 10 s
            self._open_tracker()
        if self.tracker is not None and self.tracker.parent_run_id:
            self.tracker.sync(self.study_name, recs, self.spec.store_dir, {"backend": self.spec.backend.kind,
                                                                          "node": self.spec.node.name})
        self._write_findings(recs)

    def _write_findings(self, recs: list[R.TrialRecord]) -> None:
        try:
            from sweeps.findings import update_findings

            update_findings(self.spec, self.study_name, recs, self.fingerprint, self.rules)
        except ImportError:
            pass
        except Exception as e:  # noqa: BLE001 - a findings problem never stops the sweep
            log.error("could not update the findings document: %s", e)

    # ---- interruption / shutdown ---------------------------------------------------------
    def interrupt(self) -> None:
        """Ctrl-C: cancel running trials (their tasks tear servers down), record them interrupted."""
        self.interrupted = True
        self.stop_reason = "interrupted (Ctrl-C)"
        for ref, f in list(self.inflight.items()):
            try:
                self.ray.cancel(ref, force=False)
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + self.spec.backend.timeouts.term_grace_s + 15
        while self.inflight and time.monotonic() < deadline:
            ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                f = self.inflight.pop(ref)
                res = TrialResult(status="interrupted", failure_class=None, phase="bench",
                                  failure_signature="sweep interrupted (SIGINT)")
                try:
                    got = self.ray.get(ref)
                    if got.status == "ok":
                        res = got
                except Exception:  # noqa: BLE001 - cancelled
                    pass
                self._record(f, res)
                if res.status == "interrupted":
                    self._requeue(f)
        for ref, f in list(self.inflight.items()):
            self.inflight.pop(ref)
            self._record(f, TrialResult(status="interrupted", phase="bench", failure_signature="sweep interrupted (SIGINT)"))
            self._requeue(f)

    def _requeue(self, f: InFlight) -> None:
        """Enqueue an interrupted trial's config so the same command runs it first on resume."""
        try:
            attrs = dict(f.trial.user_attrs.get("enqueue_attrs") or {})
            self.study.enqueue_trial(dict(f.params), user_attrs={**attrs, "enqueue_attrs": attrs})
        except Exception as e:  # noqa: BLE001
            log.error("could not re-queue interrupted trial %d: %s", f.trial.number, e)

    def finish(self) -> R.TrialRecord | None:
        conf = self._confirm()
        recs = R.load_records(self.study)
        best = R.best_record(recs)
        if conf.get("winner") is not None:  # the confirmed winner, not the luckiest single run
            best = next((r for r in recs if r.number == conf["winner"]), best)
        base = R.baseline_value(recs)
        if self.tracker is None or not self.tracker.parent_run_id:
            self._open_tracker()  # last chance for a sweep that started while MLflow was down
        if self.tracker is not None and self.tracker.parent_run_id:
            try:
                self.tracker.sync(self.study_name, recs, self.spec.store_dir, {"backend": self.spec.backend.kind,
                                                                              "node": self.spec.node.name})
                tags = {"stop_reason": self.stop_reason or "", "trials_launched": str(sum(r.launched for r in recs))}
                if best is not None:
                    tags.update(best_trial=str(best.number), best_launch_command=best.launch_command)
                    best_run = self._run_id_of(best.number)
                    if best_run:
                        tags["best_run"] = best_run
                self.tracker.set_parent_tags(tags)
                self.tracker.log_parent_metrics({"best_decode_tok_s": best.value if best else None,
                                                 "baseline_decode_tok_s": base,
                                                 "best_speedup_vs_baseline": (best.value / base) if best and base else None})
                self._log_parent_artifacts()
                self.tracker.close_parent("KILLED" if self.interrupted else "FINISHED")
            except Exception as e:  # noqa: BLE001
                log.warning("final MLflow update failed (%s); rerun the command to sync", e)
        self._write_findings(recs)
        self.progress.summary(recs, best, base, self.stop_reason, self.spec.findings_path, confirmation=conf)
        return best

    def _confirm(self) -> dict[str, Any]:
        """Re-measure the top configs with repeats (sweep.confirm); {} when off or interrupted."""
        c = self.spec.sweep.confirm
        if self.interrupted or c.top_k <= 0 or self.spec.sweep.mode != "search":
            return {}
        try:
            from sweeps.confirm import confirm_top

            return confirm_top(self, k=c.top_k, repeats=c.repeats, confidence=c.confidence) or {}
        except ImportError:
            return {}
        except Exception as e:  # noqa: BLE001 - a confirmation problem never loses the sweep
            log.error("winner confirmation failed: %s", e)
            return {}

    def _run_id_of(self, number: int) -> str | None:
        assert self.tracker is not None
        runs = self.tracker.client.search_runs(
            [self.tracker.experiment_id], filter_string=f"tags.trial_key = '{self.study_name}/{number}'", max_results=1)
        return runs[0].info.run_id if runs else None

    def _log_parent_artifacts(self) -> None:
        assert self.tracker is not None
        if self.spec.findings_path.exists():
            self.tracker.log_parent_artifact(self.spec.findings_path)
        try:
            from sweeps.report import write_plots

            out = self.spec.store_dir / "reports" / self.study_name
            for p in write_plots(self.study, out):
                self.tracker.log_parent_artifact(p, "plots")
        except ImportError:
            pass
        except Exception as e:  # noqa: BLE001
            log.warning("plots failed: %s", e)


# ---------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------
def dry_run(spec: SweepSpec) -> int:
    """Render and validate launch commands without launching anything; prints them.

    Renders the baseline, the seed trials and ``dry_run_sample`` sampled feasible configs
    (default: the sweep's trial budget), and validates every argv in one batch with SGLang's
    own parser (``tasks.sglang_cli.check_many``): in-process when SGLang is importable,
    else with ``backend.python`` or the contract venv's interpreter.

    Returns:
        0 when every command is valid, 2 when SGLang's parser rejected any.
    """
    from tasks.sglang_cli import SGLangUnavailable, check_many
    from tasks.trial import launch_command

    t0 = time.monotonic()
    space = spec.space
    sw = spec.sweep
    configs = seed_configs(space, sw.baseline, sw.seed_trials, sw.seed_each_level_of) if sw.mode == "search" else []
    n = spec.dry_run_sample or spec.sweep.budget.trials or 50
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=spec.sweep.sampler.seed), direction="maximize")
    target = len(configs) + n
    for _ in range(n * 20):
        if len(configs) >= target:
            break
        t = study.ask()
        cfg = space.sample(t)
        study.tell(t, state=TrialState.PRUNED)
        if not space.violated(cfg) and cfg not in configs:
            configs.append(cfg)
    rendered = []
    for cfg in configs:
        argv, env, _ = render_launch(cfg, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
        rendered.append(([sys.executable if a == "{python}" else a for a in argv], env))
    python = spec.backend.python
    contract_py = Path(__file__).resolve().parent.parent / ".contract-venv" / "bin" / "python"
    if python is None and contract_py.exists():
        python = str(contract_py)
    checked: list[dict[str, Any]] | None = None
    if spec.backend.kind in ("sglang", "emulated"):
        try:
            checked = check_many([a for a, _ in rendered], python=python)
        except SGLangUnavailable:
            print("warning: commands NOT validated: SGLang is not importable here. Install it (pip install -e "
                  "'.[sglang]'), set backend.python=<interpreter that has it>, or run `make contract-env`.",
                  file=sys.stderr)
    bad = 0
    for i, (argv, env) in enumerate(rendered):
        status = "rendered"
        if checked is not None:
            ok = checked[i].get("ok")
            status = "valid" if ok else f"REJECTED by SGLang's parser: {checked[i].get('error')}"
            bad += not ok
        print(f"[{status}] {launch_command(argv, env)}")
    what = "validated with SGLang's parser" if checked is not None else "not validated"
    print(f"{len(rendered)} launch commands rendered ({what}), {bad} rejected, in {time.monotonic() - t0:.1f} s; "
          f"nothing was launched (dry_run=true).")
    return 2 if bad else 0


def execute(drv: Driver) -> Driver:
    """Run a driver's whole lifecycle: setup, the loop, graceful Ctrl-C (first SIGINT stops
    proposing and tears running trials down; a second one aborts), finish. Returns ``drv``
    with ``drv.finished_best`` set. Raises what setup raises (SweepError, RayUnavailable...)."""
    prev = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        if drv.interrupted:
            raise KeyboardInterrupt
        print("\nservesweep: stopping (Ctrl-C again to abort); tearing down running trials...", file=sys.stderr)
        drv.interrupted = True

    prev_term = signal.getsignal(signal.SIGTERM)
    try:
        try:
            drv.setup()
        except BaseException:
            tracker = getattr(drv, "tracker", None)
            if tracker is not None and tracker.parent_run_id:
                with contextlib.suppress(Exception):
                    tracker.close_parent("FAILED")
            raise
        # SIGTERM (timeout, SLURM, docker stop) stops as gracefully as Ctrl-C
        signal.signal(signal.SIGINT, on_sigint)
        signal.signal(signal.SIGTERM, on_sigint)
        drv.loop()
        if drv.interrupted:
            drv.interrupt()
        drv.finished_best = drv.finish()
    finally:
        signal.signal(signal.SIGINT, prev)
        signal.signal(signal.SIGTERM, prev_term)
    return drv


def run(cfg: Any) -> float | None:
    """Run the sweep described by the composed Hydra config; returns the best objective.

    Exits the process with code 2 on a config error (nothing started), 1 on a sweep-level
    error, 130 after Ctrl-C (state saved; the same command resumes).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = load_spec(cfg)
    except ConfigError as e:
        print(f"servesweep: invalid configuration, nothing was started:\n{e}", file=sys.stderr)
        sys.exit(2)
    if spec.dry_run:
        sys.exit(dry_run(spec))
    study_name = spec.study
    if spec.new_study and not spec.study_name:
        study_name = f"{spec.sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    from sweeps.estimate import estimate_gpu_hours

    print(estimate_gpu_hours(spec)[1], flush=True)
    if spec.sweep.mode == "recheck":
        from sweeps.recheck import run_recheck

        return run_recheck(spec)
    drv = Driver(spec, study_name)
    try:
        best = execute(drv).finished_best
    except KeyboardInterrupt:
        print("servesweep: aborted; trials still running are recovered (failed, re-queued) by the next run of the "
              "same command", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except _sweep_errors() as e:
        print(f"servesweep: {e}", file=sys.stderr)
        sys.exit(1)
    except optuna.exceptions.StorageInternalError as e:
        print(f"servesweep: the Optuna storage {spec.optuna_storage} failed ({e.__cause__ or e}); finished trials "
              f"are kept there. Fix the store and run the same command again to resume.", file=sys.stderr)
        sys.exit(1)
    if drv.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    return best.value if best else None
