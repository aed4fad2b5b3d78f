"""What the MLflow parent run says about a study: skips counted, the confirmed winner, and
the confirmation launches as runs nested under the trial they confirm.

Child runs are launched trials only (:meth:`sweeps.store.tracking.Tracker.sync`); a proposal
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

from sweeps.publish.summary import SKIP_REASONS, skip_reason, skipped  # noqa: F401 - re-exported: the parent's counts
from sweeps.store.records import TrialRecord
from sweeps.store.tracking import Tracker, retry

log = logging.getLogger("servesweep")
SKIP_COLUMNS = ("trial", "reason", "failure_class", "detail", "config")
CONFIRM_ROLE = "confirmation"


def skip_rows(records: list[TrialRecord]) -> list[dict[str, Any]]:
    """One row per skipped proposal (columns :data:`SKIP_COLUMNS`)."""
    rows = []
    for r in skipped(records):
        reason = skip_reason(r)
        detail = {"duplicate": f"duplicate of t{r.duplicate_of}", "infeasible": "; ".join(r.violated_constraints)}.get(
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
    metrics["trials_launched"] = float(sum(r.budgeted for r in records))  # re-question probes: not of the budget
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
    ``_ci_low/high`` (Fieller, never below 0; no ``_ci_high`` when unbounded), ``confirmed_repeats``;
    tags ``confirmed_trial``, ``confirmation_note``, ``confirmation_round`` (the current round),
    ``confirmation_tie_group`` (``t13,t24``) and ``confirmation_decision`` (the race's status).
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
    conf = confirmation or {}
    tags = {"confirmed_trial": str(e["trial"]), "confirmation_note": str(conf.get("winner_note") or ""),
            "confirmation_round": str(conf.get("round") or 0),
            "confirmation_tie_group": ",".join(f"t{t}" for t in conf.get("tie_group") or []),
            "confirmation_decision": str((conf.get("decision") or {}).get("status") or "")}
    return metrics, tags


def _existing_confirm_runs(tracker: Tracker) -> dict[str, Any]:
    """The confirmation runs under this parent, by ``confirm_key``."""
    runs = retry(lambda: tracker.client.search_runs(
        [tracker.experiment_id], max_results=5000,
        filter_string=f"tags.`servesweep.study_run` = '{tracker.parent_run_id}'"), "search confirmation runs")
    return {r.data.tags.get("confirm_key", ""): r for r in runs if r.data.tags.get("servesweep.role") == CONFIRM_ROLE}


def confirm_run_of(tracker: Tracker, trial: int) -> str | None:
    """The run id of ``trial``'s first current confirmation run under this parent (the lowest
    repeat that measured, else the lowest repeat): the run that stands for a config only the
    race measured (no trial run). None when ``trial`` has no current confirmation run."""
    runs = [r for r in _existing_confirm_runs(tracker).values()
            if r.data.tags.get("confirms_trial") == str(trial) and r.data.tags.get("current") != "false"]
    pool = [r for r in runs if r.data.tags.get("status") == "ok"] or runs
    return min(pool, key=lambda r: int(r.data.tags.get("repeat") or 0)).info.run_id if pool else None


def confirm_launches(confirmation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The confirmation's launches (``trial``, ``repeat``, ``round``, ``status``, ``value``,
    ``failure``); a confirmation stored before launches were kept gives its entries' values
    (and one failed launch per missing repeat) in its round."""
    if "launches" in confirmation:
        return list(confirmation.get("launches") or [])
    rnd = int(confirmation.get("round") or 0)
    out = []
    for e in confirmation.get("entries", []):
        vals = list(e.get("values") or [])
        for rep in range(max(len(vals), int(confirmation.get("repeats") or 0))):
            ok = rep < len(vals)
            out.append({"trial": int(e["trial"]), "repeat": rep, "round": rnd, "status": "ok" if ok else "failed",
                        "value": vals[rep] if ok else None, "failure": None if ok else ", ".join(e.get("failures") or [])})
    return out


def sync_confirmation(tracker: Tracker, study_name: str, confirmation: Mapping[str, Any] | None,
                      objective: str, run_id_of: Callable[[int], str | None],
                      context: Mapping[str, str] | None = None) -> int:
    """One MLflow run per confirmation launch, nested under the confirmed trial's run
    (``mlflow.parentRunId`` = that run; the study's parent run for a config only the race
    measured, ``derived_from`` tagged), tag ``servesweep.role=confirmation``), named by trial
    and repeat (``t013 confirm r2``; repeats count over all rounds of the evidence): FINISHED
    with ``<objective>`` for a repeat that measured, FAILED for one that did not, tagged with
    ``context`` too (``backend``, ``node_profile``: as the trial runs are), ``confirm_round``
    (the round that launched it), ``decision_round`` (the current decision's round) and
    ``current``. The runs of the current evidence carry the current ``verdict`` of their trial
    (re-tagged on every call: one decision is current); any other confirmation run of the parent
    (a superseded evidence set) is tagged ``current=false`` and loses its ``verdict``.
    Idempotent (``confirm_key`` = ``<study>/confirm/e<epoch>/<trial>/<repeat>``). Returns runs created."""
    conf = confirmation or {}
    if not conf.get("entries"):
        return 0
    existing = _existing_confirm_runs(tracker)
    verdict = {int(e["trial"]): str(e.get("verdict") or "") for e in conf["entries"]}
    entry = {int(e["trial"]): e for e in conf["entries"]}
    epoch, rnd = int(conf.get("epoch") or 0), int(conf.get("round") or 0)
    current: set[str] = set()
    n = 0
    for x in confirm_launches(conf):
        trial = int(x["trial"])
        parent = run_id_of(trial) if trial in entry else None
        if parent is None and trial in entry and entry[trial].get("in_study") is False:
            parent = tracker.parent_run_id  # a config only the race measured: no trial run to nest under
        if parent is None:
            continue
        key = f"{study_name}/confirm/e{epoch}/{trial}/{x['repeat']}"
        current.add(key)
        live = {"decision_round": str(rnd), "current": "true", "verdict": verdict.get(trial, "")}
        if key in existing:
            old = existing[key].data.tags
            if any(old.get(k, "") != v for k, v in live.items()):
                rid = existing[key].info.run_id
                retag = [RunTag(k, v) for k, v in live.items() if v]
                retry(lambda rid=rid, retag=retag: tracker.client.log_batch(rid, tags=retag), "re-tag confirmation")
                if not live["verdict"] and old.get("verdict"):
                    retry(lambda rid=rid: tracker.client.delete_tag(rid, "verdict"), "untag confirmation")
            continue
        _log_confirm_run(tracker, key, parent, entry[trial], x, objective,
                         {**(context or {}), **live, "confirm_round": str(x.get("round", rnd)),
                          "confirm_epoch": str(epoch)})
        n += 1
    for key, run in existing.items():
        if key in current or run.data.tags.get("current") == "false":
            continue
        rid = run.info.run_id
        retry(lambda rid=rid: tracker.client.set_tag(rid, "current", "false"), "supersede confirmation")
        if "verdict" in run.data.tags:
            retry(lambda rid=rid: tracker.client.delete_tag(rid, "verdict"), "untag superseded confirmation")
    return n


def _log_confirm_run(tracker: Tracker, key: str, parent: str, e: Mapping[str, Any], x: Mapping[str, Any],
                     objective: str, extra: Mapping[str, str]) -> None:
    rep = int(x["repeat"])
    ok = x.get("status") == "ok" and x.get("value") is not None
    tags = {**extra, "mlflow.parentRunId": parent, "servesweep.role": CONFIRM_ROLE, "confirm_key": key,
            "servesweep.study_run": tracker.parent_run_id or "", "confirms_trial": str(e["trial"]),
            "repeat": str(rep), "status": "ok" if ok else "failed",
            "derived_from": str(e["derived_from"]) if e.get("derived_from") is not None else "",
            "step": str(e.get("step") or "")}
    if not ok:
        tags["failure_class"] = str(x.get("failure") or "") or ", ".join(e.get("failures") or []) or "failed"
    run = retry(lambda: tracker.client.create_run(
        tracker.experiment_id, run_name=f"t{int(e['trial']):03d} confirm r{rep + 1}",
        tags={"mlflow.parentRunId": parent, "confirm_key": key}), "create confirmation run")
    rid = run.info.run_id
    ms = [Metric(objective, float(x["value"]), int(time.time() * 1000), 0)] if ok else []
    ps = [Param(k, str(v)) for k, v in (e.get("config") or {}).items()]
    retry(lambda: tracker.client.log_batch(rid, metrics=ms, params=ps,
                                           tags=[RunTag(k, v) for k, v in tags.items() if v]), "log confirmation")
    retry(lambda: tracker.client.set_terminated(rid, "FINISHED" if ok else "FAILED"), "terminate confirmation")


def log_truth(tracker: Tracker, spec: Any, study_name: str, study: Any, recs: list[TrialRecord],
              reports_dir: Path) -> None:
    """Log to the parent run: skip counts (by reason and class) and ``skipped.csv``; the
    confirmed winner (``confirmed_<objective>`` and its CI, the speedup CI, ``confirmed_trial``,
    ``best_trial``, ``best_run``: the winner's trial run, or its first confirmation run
    (:func:`confirm_run_of`) for a config only the race measured; the deployable
    ``best_launch_command``) and its confirmation runs."""
    from sweeps.publish.deploy import deploy_command_for

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
        from sweeps.search.confirm import config_record

        winner = config_record(recs, conf, number)  # also a config only the race measured
        if winner is not None:
            cmd = deploy_command_for(spec, winner.params) or ""
            tags.update(best_trial=str(number), best_launch_command=cmd, confirmed_launch_command=cmd)
        # a config only the race measured has no trial run: its confirmation run stands for it
        run = run_id_of(number) or confirm_run_of(tracker, number)
        if run:
            tags["best_run"] = run
    tracker.log_parent_metrics(metrics)
    tracker.set_parent_tags(tags)
    tracker.log_parent_artifact(write_skip_table(recs, reports_dir / "skipped.csv"))


def relog(spec: Any, study: Any, study_name: str, parent_run_id: str) -> None:
    """Re-log what can change after a sweep to its parent run (``python -m sweeps.report``):
    ``summary.txt`` and everything :func:`log_truth` logs (findings and plots: the report)."""
    from sweeps.publish.deploy import deploy_command_for, is_emulated, node_label
    from sweeps.run.progress import Progress
    from sweeps.store import records as trial_records

    tracker = Tracker(spec.mlflow_uri, spec.sweep.name, spec.artifact_location)
    tracker.parent_run_id = parent_run_id
    objs = spec.objective_set
    recs = trial_records.load_records(study)
    conf = study.user_attrs.get("confirmation") or {}
    from sweeps.search.confirm import config_record

    best = config_record(recs, conf, conf.get("winner")) or trial_records.best_record(recs, objs)
    progress = Progress(study_name, spec.sweep.budget.trials, objective=objs.primary,
                        deploy=lambda p: deploy_command_for(spec, p), node=node_label(spec),
                        emulated=is_emulated(spec))
    reports = spec.store_dir / "reports" / study_name
    reports.mkdir(parents=True, exist_ok=True)
    kw: dict[str, Any] = {"confirmation": conf}
    summary = None
    if not objs.multi:
        from sweeps.publish.summary import summary_of_study

        summary = summary_of_study(spec, study, recs)
        kw.update(headline=summary.lines(), classes=summary.counts.by_class, reference=summary.baseline.value,
                  winner=summary.winner)
    (reports / "summary.txt").write_text(progress.summary_text(
        recs, best, trial_records.baseline_value(recs, objs), None, spec.findings_path, **kw))
    log_truth(tracker, spec, study_name, study, recs, reports)
    if summary is not None:
        tracker.set_parent_tags({**summary.parent_tags(), "mlflow.note.content": summary.markdown()})
        tracker.log_parent_metrics(summary.parent_metrics())
    tracker.log_parent_artifact(reports / "summary.txt")
