"""Publishing a sweep's results: trial files, MLflow sync, the findings document, plots
and the terminal progress. Nothing here ever stops the sweep: every step runs under
:func:`sweeps.run.best_effort.best_effort`, which logs a failure and goes on (Optuna holds the truth; a later sync or
the next run of the same command catches up).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import optuna

from sweeps.config.spec import SweepSpec
from sweeps.publish.deploy import deploy_command_for, is_emulated, node_label
from sweeps.publish.findings.load import break_even_metrics, front_of
from sweeps.publish.outcome import INTERRUPTED, sweep_outcome
from sweeps.run.best_effort import best_effort
from sweeps.run.progress import Progress, metric_text
from sweeps.store import records as trial_records
from sweeps.store.tracking import LOCAL_FAILURES_MAX, MlflowStoreBroken
from tasks.redact import redact_argv, redact_text
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep")
TRACKER_RETRY_S = 10.0  # MLflow down at start: try to open the parent run again at most this often


class Publisher:
    """Everything a sweep publishes about its trials.

    Args:
        spec: the sweep.  study_name: the study (MLflow trial keys, trial dirs, findings).
        track: log to MLflow.  findings: keep the findings document up to date.
        quiet: no per-trial lines or status lines (the summary is still printed).
    """

    def __init__(self, spec: SweepSpec, study_name: str, *, track: bool = True, findings: bool = True,
                 quiet: bool = False):
        self.spec, self.study_name, self.track, self.findings = spec, study_name, track, findings
        self.objectives = spec.objective_set
        self.progress = Progress(study_name, spec.sweep.budget.trials, objective=self.objectives.primary,
                                 deploy=lambda p: deploy_command_for(spec, p), node=node_label(spec),
                                 emulated=is_emulated(spec))
        c = spec.sweep.confirm
        if spec.sweep.mode == "search" and c.top_k > 0:  # the baseline is confirmed too
            self.progress.confirm_launches = (c.top_k + 1) * c.repeats
        from sweeps.search.serving_check import wanted

        if wanted(spec):  # the winner's and the baseline's load checks
            self.progress.serving_checks = 2
        if quiet:
            self.progress.event = lambda line: None  # type: ignore[method-assign]
            self.progress.refresh = lambda *a, **k: None  # type: ignore[method-assign]
        self.tracker: Any = None
        self._tracker_tried_at = 0.0

    # ---- MLflow parent run ------------------------------------------------------------
    @property
    def tracking(self) -> bool:
        """True when the MLflow parent run is open."""
        return self.tracker is not None and bool(self.tracker.parent_run_id)

    def open_tracker(self, study: optuna.Study) -> None:
        """Open the MLflow experiment and the study's parent run (``self.tracker`` stays None when MLflow is down)."""
        self._study = study
        self.tracker = None
        if not self.track:
            return
        try:
            from sweeps.store.tracking import Tracker

            sp = self.spec
            self.tracker = Tracker(sp.mlflow_uri, sp.sweep.name, sp.artifact_location)
            self.tracker.objective = self.objectives.primary
            self.tracker.open_parent(study, sp.sweep.description or sp.sweep.name,
                                     {"sweep": sp.sweep.name, "node": sp.node.name, "model": sp.model.name,
                                      "backend": sp.backend.kind, "objective": ",".join(self.objectives.names),
                                      "direction": ",".join(self.objectives.directions)})
        except Exception as e:  # noqa: BLE001 - MLflow down: the sweep goes on, sync catches up later
            self._open_failures = getattr(self, "_open_failures", 0) + 1
            if self._open_failures >= LOCAL_FAILURES_MAX and not self.spec.mlflow_uri.startswith(("http://", "https://")):
                raise MlflowStoreBroken(f"the MLflow store {self.spec.mlflow_uri} failed to open the sweep's run "
                                        f"{self._open_failures} times in a row ({e}); a local store has no outage to "
                                        f"wait out: repair or move it (e.g. mv mlflow.db mlflow.db.broken) and run "
                                        f"the same command again") from e
            log.warning("MLflow unavailable (%s); trials will be synced when it is back", e)
            self.tracker = None

    def _retry_tracker(self, study: optuna.Study, force: bool = False) -> None:
        if not self.tracking and (force or time.monotonic() - self._tracker_tried_at > TRACKER_RETRY_S):
            self._tracker_tried_at = time.monotonic()
            self.open_tracker(study)

    def _sync(self, recs: list[trial_records.TrialRecord]) -> None:
        self.tracker.sync(self.study_name, recs, self.spec.store_dir,
                          {"backend": self.spec.backend.kind, "node_profile": self.spec.node.name})

    def close_failed(self) -> None:
        """Setup failed: close an open parent run as FAILED."""
        if self.tracking:
            with contextlib.suppress(Exception):
                self.tracker.close_parent("FAILED")

    # ---- per trial --------------------------------------------------------------------
    def save_files(self, number: int, params: dict[str, Any], tspec: TrialSpec, res: TrialResult,
                   suffix: str = "") -> None:
        """Write a trial's server log (``server<suffix>.log``) and, for the final attempt, its
        launch command, bench JSON, result and config (argv redacted) to its trial dir."""
        d = trial_records.trial_dir(self.spec.store_dir, self.study_name, number)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"server{suffix}.log").write_text(res.server_log)
        if suffix:
            return
        (d / "launch_command.txt").write_text(res.launch_command + "\n")
        if res.bench:
            (d / "bench.json").write_text(json.dumps({"metrics": res.metrics, "requests": res.bench}, indent=1))
        (d / "result.json").write_text(json.dumps(
            {k: v for k, v in res.to_dict().items() if k not in ("server_log", "bench")}, indent=1, default=str))
        (d / "config.json").write_text(json.dumps(
            {"params": params, "argv": redact_argv(tspec.argv), "env": sorted(tspec.env),
             "backend": self.spec.backend.kind, "node": self.spec.node.name, "model": self.spec.model.name}, indent=1))

    def trial_done(self, number: int, params: dict[str, Any], res: TrialResult, metrics: dict[str, float],
                   retired: list[str] | None = None, requestion: bool = False) -> None:
        """One line in the terminal for a finished trial. ``requestion``: a re-question probe, one
        probe-only launch of a known dead end, said so (it is not a launch of the budget);
        ``retired``: the rules/entries its passed probe retired (nothing was benchmarked)."""
        from sweeps.store.tracking import run_name
        from tasks.load_search import censored_text

        name = run_name(trial_records.TrialRecord(number=number, state="", params=params, status=res.status,
                                      perf_tags=res.perf_tags))
        censored = censored_text(metrics, self.objectives.primary.name) if res.status == "ok" else None
        if requestion or (retired and res.status == "ok"):  # a re-question trial is its probe only
            passed = res.status == "ok" and trial_records.DEGRADED not in res.perf_tags
            how = " ".join(x for x in (res.status, res.failure_class) if x)
            if passed:
                what = (f"passed: retired {', '.join(retired)} (dead end no longer reproduces)" if retired
                        else "passed: the dead end no longer reproduces")
            elif trial_records.requestion_unanswered(res.status, res.failure_kind):
                what = f"{how}: no answer, the rule stands"
            else:
                what = f"{how}: the dead end still reproduces"
            line = f"{name}: re-question probe {what}"[:200]
        elif censored is not None:  # a load search that stopped at a bound: the bound is the value
            line = f"{name}: {censored} (censored: the rate search stopped at this bound)"
        elif res.status == "ok" and metrics.get(self.objectives.primary.name) is None:  # ended at its probe
            line = f"{name}: not benchmarked: {res.failure_class or ''} {res.failure_signature or ''}"[:200]
        elif res.status == "ok":
            sp = metrics.get("speedup_vs_baseline")
            obj = self.objectives.primary
            line = (f"{name}: {metric_text(obj.name, metrics.get(obj.name))}"
                    + (f" ({sp:.2f}x baseline)" if sp else "")
                    + (f" [{', '.join(res.perf_tags)}]" if res.perf_tags else ""))
        elif res.status == "interrupted":  # no class: the sweep stopped it, the trial did not fail
            line = f"{name}: interrupted in {res.phase}; its config is re-queued, the same command resumes it"
        else:
            # the raw decisive line reads as the log does; the normalized signature (<N> for
            # numbers) is what rules match, and stands in when no line decided
            said = res.failure_line or res.failure_signature or ""
            line = f"{name}: {res.status} {res.failure_class or ''} ({res.phase}) {said}"[:200]
        self.progress.event(line)

    def refresh(self, study: optuna.Study, running: int, t_start: float) -> None:
        """The periodic status line."""
        self.progress.refresh(study, running, t_start)

    def flush(self, study: optuna.Study, fingerprint: dict[str, str], rules: Any) -> None:
        """Sync finished trials to MLflow and refresh the findings document."""
        recs = trial_records.load_records(study)
        self._retry_tracker(study)
        if self.tracking:
            self._sync(recs)
        self.write_findings(study, recs, fingerprint, rules)

    def write_findings(self, study: optuna.Study, recs: list[trial_records.TrialRecord], fingerprint: dict[str, str],
                       rules: Any) -> None:
        """Update the findings document (off with ``findings=False``)."""
        self._study = study
        if not self.findings:
            return
        with best_effort("update the findings document"):
            from sweeps.publish.findings import update_findings

            update_findings(self.spec, study, recs, fingerprint, rules, objective=self.objectives.primary)

    # ---- closing ----------------------------------------------------------------------
    def final(self, study: optuna.Study, recs: list[trial_records.TrialRecord], best: trial_records.TrialRecord | None,
              base: float | None, stop_reason: str | None, interrupted: bool) -> None:
        """Last MLflow update: every trial synced, parent tags (``best_run``, ``best_trial``,
        ``best_launch_command``, ``stop_reason``, ``sweep_outcome`` and its ``sweep_outcome_reason``),
        parent metrics, artifacts; the parent is closed KILLED (interrupted), FAILED (nothing was
        measured) or FINISHED."""
        self._retry_tracker(study, force=True)  # last chance for a sweep that started while MLflow was down
        if not self.tracking:
            self._mlflow_missed(recs)
            return
        done = False
        with best_effort("update MLflow at the end (rerun the command to sync)", logging.WARNING):
            self._sync(recs)
            outcome = sweep_outcome(recs, self.spec, self.study_name, stop_reason)
            tags = {"stop_reason": stop_reason or "", "trials_launched": str(sum(r.budgeted for r in recs)),
                    "sweep_outcome": INTERRUPTED if interrupted else outcome.kind,
                    "sweep_outcome_reason": outcome.line or ""}
            if best is not None:
                tags.update(best_trial=str(best.number), best_launch_command=self.deploy(best.params) or "",
                            measured_on=node_label(self.spec))
                if best.launch_command:  # a config the confirmation's race added was never a sweep launch
                    tags["best_emulated_launch_command"] = best.launch_command
                best_run = self.run_id_of(best.number)
                if best_run:
                    tags["best_run"] = best_run
            s = self.study_summary(recs, study.user_attrs.get("confirmation"),
                                   study.user_attrs.get("serving_check"))
            if s is not None:  # the one set of numbers: the console's, the findings'
                tags.update(s.parent_tags())
                tags["mlflow.note.content"] = s.markdown()
                self.tracker.set_parent_tags(tags)
                self.tracker.log_parent_metrics(s.parent_metrics())
            else:
                self.tracker.set_parent_tags(tags)
                obj = self.objectives.primary
                bv = trial_records.value_of(best, obj) if best is not None else None
                self.tracker.log_parent_metrics({f"best_{obj.name}": bv, f"baseline_{obj.name}": base,
                                                 "best_speedup_vs_baseline": obj.ratio(bv, base) if bv and base else None})
            self.log_parent_truth(study, recs)
            self.tracker.log_parent_metrics(break_even_metrics(recs))  # speculative speedup < 1 by concurrency
            self.log_parent_artifacts(study)
            self.tracker.close_parent("KILLED" if interrupted else "FAILED" if outcome.failed else "FINISHED")
            done = not self.tracker.behind
        if not done:
            self._mlflow_missed(recs)

    def _mlflow_missed(self, recs: list[trial_records.TrialRecord]) -> None:
        """The last line of a sweep whose trials did not all reach MLflow (it was down, or the last
        sync failed): a warning in the log is easy to miss, and MLflow is where the team looks."""
        if not self.track:
            return
        n = sum(r.launched and r.state not in ("RUNNING", "WAITING") for r in recs)
        self.progress.console.print(
            f"MLflow ({redact_text(self.spec.mlflow_uri)}) was not reached at the end: the {n} finished trials of "
            f"this study may be missing from it (and the findings' plots from its parent run). They are kept in "
            f"the study; run the same command once MLflow is back and it syncs every trial.", soft_wrap=True,
            markup=False)

    def deploy(self, params: dict[str, Any]) -> str | None:
        """The deployable command of ``params`` on the target node (:func:`sweeps.publish.deploy.deploy_command_for`)."""
        return deploy_command_for(self.spec, params)

    def log_parent_truth(self, study: optuna.Study, recs: list[trial_records.TrialRecord]) -> None:
        """Skip counts and table, the confirmed winner and its runs (:func:`sweeps.publish.parent_run.log_truth`)."""
        from sweeps.publish.parent_run import log_truth

        log_truth(self.tracker, self.spec, self.study_name, study, recs, self.reports_dir)

    @property
    def reports_dir(self) -> Path:
        """``<store>/reports/<study>``: plots, the skip table, the summary."""
        return self.spec.store_dir / "reports" / self.study_name

    def run_id_of(self, number: int) -> str | None:
        """The MLflow child run id of trial ``number`` (None when not synced)."""
        runs = self.tracker.client.search_runs(
            [self.tracker.experiment_id], filter_string=f"tags.trial_key = '{self.study_name}/{number}'", max_results=1)
        return runs[0].info.run_id if runs else None

    def _findings_for_mlflow(self) -> Path:
        """The findings document without its servesweep markers (MLflow shows HTML comments as
        text), under the same name in ``reports_dir/mlflow/``; the document itself keeps them."""
        from sweeps.publish.findings.document import without_markers

        out = self.reports_dir / "mlflow" / self.spec.findings_path.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(without_markers(self.spec.findings_path.read_text(encoding="utf-8")), encoding="utf-8")
        return out

    def log_parent_artifacts(self, study: optuna.Study) -> None:
        """The findings document, the summary and the plots, as artifacts of the parent run
        (uploaded again at every call: the last upload is the final state)."""
        if self.spec.findings_path.exists():
            with best_effort("attach the findings document"):
                self.tracker.log_parent_artifact(self._findings_for_mlflow())
        if (self.reports_dir / "summary.txt").exists():
            self.tracker.log_parent_artifact(self.reports_dir / "summary.txt")
        with best_effort("write the plots", logging.WARNING):
            from sweeps.publish.plots import write_plots

            out = self.spec.store_dir / "reports" / self.study_name
            for p in write_plots(study, out, objective=self.objectives.primary, records=trial_records.load_records(study)):
                self.tracker.log_parent_artifact(p, "plots")

    def summary(self, recs: list[trial_records.TrialRecord], best: trial_records.TrialRecord | None, base: float | None,
                stop_reason: str | None, confirmation: dict[str, Any]) -> None:
        """The closing summary in the terminal, also written to ``summary.txt`` (a parent artifact),
        with the one-line reason when nothing was measured or the baseline was not
        (:func:`sweeps.publish.outcome.sweep_outcome`)."""
        note = sweep_outcome(recs, self.spec, self.study_name, stop_reason).line
        kw: dict[str, Any] = {"confirmation": confirmation, "note": note}
        s = self.study_summary(recs, confirmation)
        if s is not None:
            kw.update(headline=s.lines(), classes=s.counts.by_class, reference=s.baseline.value, winner=s.winner)
        self.progress.summary(recs, best, base, stop_reason, self.spec.findings_path, **kw)
        front = front_lines(recs, self.objectives)
        for line in front:
            self.progress.console.print(line, markup=False, highlight=False)
        with best_effort("write summary.txt", logging.WARNING):
            self.reports_dir.mkdir(parents=True, exist_ok=True)
            (self.reports_dir / "summary.txt").write_text(self.progress.summary_text(
                recs, best, base, stop_reason, self.spec.findings_path, **kw) + "".join(f"{line}\n" for line in front))

    def study_summary(self, recs: list[trial_records.TrialRecord], confirmation: dict[str, Any] | None = None,
                      serving: dict[str, Any] | None = None) -> Any:
        """The study's one set of numbers (:func:`sweeps.publish.summary.build_summary`), or None
        for a multi-objective study (its answer is a front, not one winner)."""
        if self.objectives.multi:
            return None
        from sweeps.publish.summary import SERVING_ATTR, approach_levels, build_summary

        serving = serving if serving is not None else self._study_attr(SERVING_ATTR)
        return build_summary(self.study_name, self.objectives.primary, recs, confirmation, serving,
                             deploy=self.deploy, emulated=is_emulated(self.spec), node=node_label(self.spec),
                             approaches=approach_levels(self.spec))

    def _study_attr(self, key: str) -> Any:
        study = getattr(self, "_study", None)
        return study.user_attrs.get(key) if study is not None else None


def front_lines(recs: list[trial_records.TrialRecord], objectives: Any) -> list[str]:
    """The console's Pareto front of a multi-objective sweep (empty for one objective):
    ``Pareto front (4 configs: output_tok_s_c64 maximize, tpot_ms_p50_c1 minimize)`` and one
    ``  t3  1234.5  9.87  eagle3 ...`` line per non-dominated config, best first objective first."""
    if not getattr(objectives, "multi", False):
        return []
    front = front_of(recs, objectives.names, objectives.directions)
    what = ", ".join(f"{n} {d}" for n, d in zip(objectives.names, objectives.directions))
    if not front:
        return [f"Pareto front: no trial measured every objective ({what})"]
    lines = [f"Pareto front ({len(front)} config{'s' if len(front) != 1 else ''}: {what}):"]
    for r in front:
        vals = "  ".join(f"{float(r.metrics[n]):.4g}" for n in objectives.names)
        knobs = " ".join(f"{k}={v}" for k, v in r.params.items())
        lines.append(f"  t{r.number}  {vals}  {knobs}")
    return lines
