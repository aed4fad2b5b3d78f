"""What the MLflow parent run says about a study: skips counted, the confirmed winner, and
the confirmation launches as runs nested under the trial they confirm.

Child runs are launched trials only (:meth:`sweeps.tracking.Tracker.sync`); a proposal
answered without GPU time (a learned rule, a duplicate, a degraded allreduce level, an
infeasible config) is counted here by reason and failure class and listed in one table
artifact (``skipped.csv``).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag

from sweeps.records import TrialRecord
from sweeps.tracking import Tracker, retry

log = logging.getLogger("servesweep")
SKIP_REASONS = ("rule", "duplicate", "degraded", "infeasible", "other")
SKIP_COLUMNS = ("trial", "reason", "failure_class", "detail", "config")
CONFIRM_ROLE = "confirmation"


def skip_reason(r: TrialRecord) -> str:
    """Why a proposal was not launched: one of :data:`SKIP_REASONS`."""
    if r.duplicate_of is not None:
        return "duplicate"
    if r.status == "infeasible":
        return "infeasible"
    if r.skipped_by_rule:
        return "degraded" if str(r.skipped_by_rule).startswith("degraded:") else "rule"
    return "other"


def skipped(records: list[TrialRecord]) -> list[TrialRecord]:
    """Finished proposals that spent no GPU time."""
    return [r for r in records if not r.launched and r.state not in ("RUNNING", "WAITING")]


def skip_rows(records: list[TrialRecord]) -> list[dict[str, Any]]:
    """One row per skipped proposal (columns :data:`SKIP_COLUMNS`)."""
    rows = []
    for r in skipped(records):
        reason = skip_reason(r)
        detail = {"duplicate": f"duplicate of t{r.duplicate_of}", "infeasible": "; ".join(r.violated)}.get(
            reason, f"rule {r.skipped_by_rule}: {r.failure_signature or ''}")
        rows.append({"trial": r.number, "reason": reason, "failure_class": r.failure_class or "",
                     "detail": detail, "config": json.dumps(r.params, sort_keys=True, default=str)})
    return rows


def skip_counts(records: list[TrialRecord]) -> tuple[dict[str, float], dict[str, str]]:
    """``(metrics, tags)`` for the parent: ``skipped_total``, ``skipped_<reason>`` per reason
    and ``trials_launched`` as metrics; ``skipped_by_class.<class>`` counts as tags."""
    rows = skipped(records)
    by_reason = Counter(skip_reason(r) for r in rows)
    by_class = Counter(r.failure_class for r in rows if r.failure_class)
    metrics: dict[str, float] = {f"skipped_{k}": float(by_reason.get(k, 0)) for k in SKIP_REASONS}
    metrics["skipped_total"] = float(len(rows))
    metrics["trials_launched"] = float(sum(r.launched for r in records))
    return metrics, {f"skipped_by_class.{k}": str(v) for k, v in sorted(by_class.items())}


def write_skip_table(records: list[TrialRecord], path: Path) -> Path:
    """``skipped.csv`` (header :data:`SKIP_COLUMNS`, one row per skipped proposal) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SKIP_COLUMNS)
        w.writeheader()
        w.writerows(skip_rows(records))
    return path


def winner_entry(confirmation: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The confirmation entry of the winner (None when nothing was confirmed)."""
    conf = confirmation or {}
    return next((e for e in conf.get("entries", []) if conf.get("winner") is not None
                 and e.get("trial") == conf["winner"]), None)


def confirmed_fields(confirmation: Mapping[str, Any] | None, objective: str) -> tuple[dict[str, float], dict[str, str]]:
    """``(metrics, tags)`` of the confirmed winner: ``confirmed_<objective>`` (the mean over the
    repeats), ``confirmed_<objective>_ci_low/high``, ``confirmed_speedup_vs_baseline`` and its
    ``_ci_low/high``, ``confirmed_repeats``; tags ``confirmed_trial``, ``confirmation_note``.
    Empty when nothing was confirmed."""
    e = winner_entry(confirmation)
    if e is None:
        return {}, {}
    sp = e.get("speedup_ci") or [None, None]
    m = {f"confirmed_{objective}": e.get("mean"), f"confirmed_{objective}_ci_low": e.get("ci_low"),
         f"confirmed_{objective}_ci_high": e.get("ci_high"), "confirmed_repeats": e.get("n"),
         "confirmed_speedup_vs_baseline": e.get("speedup_mean"),
         "confirmed_speedup_vs_baseline_ci_low": sp[0], "confirmed_speedup_vs_baseline_ci_high": sp[1]}
    metrics = {k: float(v) for k, v in m.items() if isinstance(v, int | float) and math.isfinite(float(v))}
    tags = {"confirmed_trial": str(e["trial"]),
            "confirmation_note": str((confirmation or {}).get("winner_note") or "")}
    return metrics, tags


def _existing_confirm_keys(tracker: Tracker) -> set[str]:
    runs = retry(lambda: tracker.client.search_runs(
        [tracker.experiment_id], max_results=5000,
        filter_string=f"tags.`servesweep.study_run` = '{tracker.parent_run_id}'"), "search confirmation runs")
    return {r.data.tags.get("confirm_key", "") for r in runs}


def sync_confirmation(tracker: Tracker, study_name: str, confirmation: Mapping[str, Any] | None,
                      objective: str, run_id_of: Callable[[int], str | None],
                      context: Mapping[str, str] | None = None) -> int:
    """One MLflow run per confirmation launch, nested under the confirmed trial's run
    (``mlflow.parentRunId`` = that run, tag ``servesweep.role=confirmation``): FINISHED with
    ``<objective>`` for a repeat that measured, FAILED for one that did not, tagged with
    ``context`` too (``backend``, ``node_profile``: as the trial runs are). Idempotent
    (``confirm_key`` = ``<study>/confirm/<date>/<trial>/<repeat>``). Returns runs created."""
    conf = confirmation or {}
    if not conf.get("entries"):
        return 0
    done = _existing_confirm_keys(tracker)
    n = 0
    for e in conf["entries"]:
        parent = run_id_of(int(e["trial"]))
        if parent is None:
            continue
        for rep in range(int(conf.get("repeats") or len(e.get("values") or []))):
            key = f"{study_name}/confirm/{conf.get('date', '')}/{e['trial']}/{rep}"
            if key in done:
                continue
            _log_confirm_run(tracker, key, parent, e, rep, objective, context or {})
            n += 1
    return n


def _log_confirm_run(tracker: Tracker, key: str, parent: str, e: Mapping[str, Any], rep: int, objective: str,
                     context: Mapping[str, str]) -> None:
    vals = list(e.get("values") or [])
    ok = rep < len(vals)
    tags = {**context, "mlflow.parentRunId": parent, "servesweep.role": CONFIRM_ROLE, "confirm_key": key,
            "servesweep.study_run": tracker.parent_run_id or "", "confirms_trial": str(e["trial"]),
            "repeat": str(rep), "status": "ok" if ok else "failed", "verdict": str(e.get("verdict") or "")}
    if not ok:
        tags["failure_class"] = ", ".join(e.get("failures") or []) or "failed"
    run = retry(lambda: tracker.client.create_run(
        tracker.experiment_id, run_name=f"t{int(e['trial']):03d} confirm #{rep + 1}",
        tags={"mlflow.parentRunId": parent, "confirm_key": key}), "create confirmation run")
    rid = run.info.run_id
    ms = [Metric(objective, float(vals[rep]), int(time.time() * 1000), 0)] if ok else []
    ps = [Param(k, str(v)) for k, v in (e.get("config") or {}).items()]
    retry(lambda: tracker.client.log_batch(rid, metrics=ms, params=ps,
                                           tags=[RunTag(k, v) for k, v in tags.items() if v]), "log confirmation")
    retry(lambda: tracker.client.set_terminated(rid, "FINISHED" if ok else "FAILED"), "terminate confirmation")


def log_truth(tracker: Tracker, spec: Any, study_name: str, study: Any, recs: list[TrialRecord],
              reports_dir: Path) -> None:
    """Log to the parent run: skip counts (by reason and class) and ``skipped.csv``; the
    confirmed winner (``confirmed_<objective>`` and its CI, the speedup CI, ``confirmed_trial``,
    ``best_trial``, ``best_run``, the deployable ``best_launch_command``) and its confirmation runs."""
    from sweeps.deploy import deploy_command_for

    obj = spec.objective_set.primary.name
    metrics, tags = skip_counts(recs)
    conf = study.user_attrs.get("confirmation")
    cm, ct = confirmed_fields(conf, obj)
    metrics.update(cm)
    tags.update(ct)

    def run_id_of(number: int) -> str | None:
        runs = tracker.client.search_runs([tracker.experiment_id], max_results=1,
                                          filter_string=f"tags.trial_key = '{study_name}/{number}'")
        return runs[0].info.run_id if runs else None

    try:
        sync_confirmation(tracker, study_name, conf, obj, run_id_of,
                          {"backend": spec.backend.kind, "node_profile": spec.node.name})
    except Exception as e:  # noqa: BLE001 - the parent's numbers still go out
        log.warning("could not log the confirmation runs to MLflow: %s", e)
    if ct.get("confirmed_trial"):
        number = int(ct["confirmed_trial"])
        winner = next((r for r in recs if r.number == number), None)
        if winner is not None:
            cmd = deploy_command_for(spec, winner.params) or ""
            tags.update(best_trial=str(number), best_launch_command=cmd, confirmed_launch_command=cmd)
        run = run_id_of(number)
        if run:
            tags["best_run"] = run
    tracker.log_parent_metrics(metrics)
    tracker.set_parent_tags(tags)
    tracker.log_parent_artifact(write_skip_table(recs, reports_dir / "skipped.csv"))


def relog(spec: Any, study: Any, study_name: str, parent_run_id: str) -> None:
    """Re-log what can change after a sweep to its parent run (``python -m sweeps.report``):
    ``summary.txt`` and everything :func:`log_truth` logs (findings and plots: the report)."""
    from sweeps import records as R
    from sweeps.deploy import deploy_command_for, node_label
    from sweeps.progress import Progress

    tracker = Tracker(spec.mlflow_uri, spec.sweep.name, spec.artifact_location)
    tracker.parent_run_id = parent_run_id
    objs = spec.objective_set
    recs = R.load_records(study)
    conf = study.user_attrs.get("confirmation") or {}
    best = next((r for r in recs if r.number == conf.get("winner")), None) or R.best_record(recs, objs)
    progress = Progress(study_name, spec.sweep.budget.trials, objective=objs.primary,
                        deploy=lambda p: deploy_command_for(spec, p), node=node_label(spec))
    reports = spec.store_dir / "reports" / study_name
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "summary.txt").write_text(progress.summary_text(
        recs, best, R.baseline_value(recs, objs), None, spec.findings_path, confirmation=conf))
    log_truth(tracker, spec, study_name, study, recs, reports)
    tracker.log_parent_artifact(reports / "summary.txt")
