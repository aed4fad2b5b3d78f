"""MLflow tracking, written by the driver only, synced idempotently from Optuna.

Experiment = sweep name; one parent run per study (its id kept in the study's user
attributes, reopened on resume); one child run per finished launched trial (a proposal
answered without a launch is counted on the parent, see :mod:`sweeps.publish.parent_run`) with an explicit
``mlflow.parentRunId`` tag and a ``trial_key`` tag (``<study>/<number>``) that makes
the sync idempotent: a crash or an MLflow outage delays a run, never duplicates or
loses it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import optuna
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import (
    MAX_ENTITIES_PER_BATCH,
    MAX_ENTITY_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
    path_not_unique,
)

from sweeps.config.objective import Objective, metric_text
from sweeps.errors import ConfigurationError
from sweeps.store.mlflow_access import HTTP_ENV, denied_status, warn_local_artifacts
from sweeps.store.records import DEFAULT_OBJECTIVE, TrialRecord, trial_dir, value_of
from sweeps.store.retry import StoreWriteError, brief, retrying
from tasks.load_search import censored_text

log = logging.getLogger("servesweep.tracking")
PARENT_ATTR = "mlflow_parent_run_id"
T = TypeVar("T")
#: a character MLflow refuses in a metric name (it allows alphanumerics, ``_ - . / :`` and
#: spaces: ``mlflow.utils.validation.validate_param_and_metric_name``)
_BAD_KEY_CHAR = re.compile(r"[^\w\-./: ]")
OUTAGE_BACKOFF_S = 10.0  # s between sync attempts while MLflow is unreachable
#: failed sync attempts in a row after which a LOCAL store (sqlite/file: no outage to wait out)
#: is declared broken and the sweep stops; each attempt already retried busy errors (:func:`retry`)
LOCAL_FAILURES_MAX = 3


class MlflowStoreBroken(ConfigurationError, RuntimeError):
    """A local MLflow store failed every call of several sync attempts in a row (exit 2)."""


def retry(fn: Callable[[], T], what: str, attempts: int = 5, base_delay_s: float = 0.2) -> T:
    """Call ``fn``: a lock/busy error of the store is ridden out for
    :data:`sweeps.store.retry.RETRY_S` (as every store write), other errors (an unreachable
    server) are retried ``attempts`` times with exponential backoff.

    Raises:
        StoreWriteError: still locked after the busy budget; else the last exception.
    """
    for i in range(attempts):
        try:
            return retrying(fn, what)
        except StoreWriteError:
            raise
        except Exception as e:  # noqa: BLE001 - MLflow raises many types for a busy/unreachable store
            if i == attempts - 1 or denied_status(e):  # a 401/403 stays one
                raise
            log.debug("%s failed (%s), retrying", what, e)
            time.sleep(base_delay_s * 2**i)
    raise AssertionError("unreachable")


#: the campaign's knobs, which :func:`run_name` renders compactly (``nccl/Ring g128 3/1/4``)
CAMPAIGN_KNOBS = frozenset({"speculative", "allreduce", "nccl_algo", "nccl_proto", "cuda_graph_max_bs",
                            "eagle_num_steps", "eagle_topk", "eagle_num_draft_tokens", "moe_a2a_backend"})


def run_name(r: TrialRecord) -> str:
    """Readable child run name, e.g. ``t012 eagle3 nccl/Ring g128`` for the campaign's knobs;
    any other space names every knob: ``t005 max_num_seqs=32 dtype=bfloat16 ...``."""
    p = r.params
    if not set(p) <= CAMPAIGN_KNOBS:
        return " ".join([f"t{r.number:03d}", *(f"{k}={v}" for k, v in p.items() if v is not None)])
    bits = [f"t{r.number:03d}", str(p.get("speculative", "none"))]
    ar = str(p.get("allreduce", "nccl"))
    if "allreduce_path_degraded" in r.perf_tags:
        ar += "->nccl"
    nccl = "/".join(str(p[k]) for k in ("nccl_algo", "nccl_proto") if p.get(k) not in (None, "default"))
    bits.append(f"{ar}/{nccl}" if nccl else ar)
    if p.get("cuda_graph_max_bs") is not None:
        bits.append(f"g{p['cuda_graph_max_bs']}")
    if p.get("speculative") == "eagle3":
        bits.append(f"{p.get('eagle_num_steps')}/{p.get('eagle_topk')}/{p.get('eagle_num_draft_tokens')}")
    if p.get("moe_a2a_backend") not in (None, "none"):
        bits.append(f"a2a:{p['moe_a2a_backend']}")
    return " ".join(bits)


def run_label(r: TrialRecord, objective: Objective = DEFAULT_OBJECTIVE) -> str:
    """Child run name with its outcome, so the MLflow runs table is readable without
    configuring columns: ``t012 eagle3 nccl/Ring g128 3/1/4 · 54.1 tok/s`` (the sweep's
    ``objective``: ``· 2.6 max_rate_at_slo_req_s`` for a goodput sweep) or
    ``t003 none flashinfer_fusion g512 · flashinfer_allreduce_fusion_unsupported_arch``; a value
    only bounded by its load search reads ``· max_rate_at_slo_req_s < 2.65 req/s``."""
    v = value_of(r, objective)
    if v is not None:
        return f"{run_name(r)} · {metric_text(objective.name, v)}"
    if r.status == "ok" and (cens := censored_text(r.metrics, objective.name)) is not None:
        return f"{run_name(r)} · {objective.name} {cens}"
    outcome = r.failure_class or r.status
    if r.skipped_by_rule:
        outcome = f"skipped: {outcome}"
    elif r.duplicate_of is not None:
        outcome = f"duplicate of t{r.duplicate_of:03d}"
    return f"{run_name(r)} · {outcome}"


def mlflow_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Every metric of a trial as MLflow takes it: each finite number under its own key; a
    character MLflow refuses in a name becomes ``_`` (and a ``/`` that would make the name an
    unnormalised path, e.g. ``a//b``), a name longer than MLflow's 250 characters is cut. A
    non-finite or non-numeric value is left out (MLflow's metric value is a finite double for
    charts and comparisons). When two names map to one key the first is kept (logged at debug)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(x):
            continue
        key = _BAD_KEY_CHAR.sub("_", str(k))[:MAX_ENTITY_KEY_LENGTH]
        if path_not_unique(key):
            key = key.replace("/", "_")
        if key in out:
            log.debug("metric %r maps to MLflow key %r already taken; left out", k, key)
            continue
        out[key] = x
    return out


def _ms(dt: Any) -> int | None:
    """A datetime as epoch milliseconds (MLflow's run times), or None."""
    return int(dt.timestamp() * 1000) if dt is not None else None


def _tag(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s[:MAX_TAG_VAL_LENGTH]


class Tracker:
    """The driver's MLflow writer.

    Args:
        tracking_uri: e.g. ``sqlite:////abs/mlflow/mlflow.db`` or ``http://mlflow:5000``.
        experiment: experiment name (= sweep name).
        artifact_location: absolute artifact root URI for a new experiment.
    """

    def __init__(self, tracking_uri: str, experiment: str, artifact_location: str):
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.uri = tracking_uri
        if tracking_uri.startswith(("http://", "https://")):
            # MLflow's HTTP client retries 7 times with backoff factor 2 (minutes) by default: an
            # outage would stall the sweep. Fail fast; sync() backs off and catches up later.
            for k, v in HTTP_ENV.items():
                os.environ.setdefault(k, v)
        self._retry_at = 0.0  # monotonic s: no sync attempt before this after a failure
        self._failures = 0  # failed sync attempts in a row
        #: the value a child run's name shows (the sweep's primary objective)
        self.objective: Objective = DEFAULT_OBJECTIVE
        exp = retry(lambda: self.client.get_experiment_by_name(experiment), "get experiment")
        if exp is None:
            self.experiment_id = retry(
                lambda: self.client.create_experiment(experiment, artifact_location=artifact_location),
                "create experiment",
            )
        else:
            warn_local_artifacts(exp, tracking_uri)  # MLflow never changes it: say so, and the fix
            if exp.lifecycle_stage == "deleted":
                retry(lambda: self.client.restore_experiment(exp.experiment_id), "restore experiment")
            self.experiment_id = exp.experiment_id
        # MLflow 3 opens an experiment without this tag on its GenAI traces overview; with it the
        # default view is the runs table (trials with their metrics), readable without configuration.
        if exp is None or exp.tags.get("mlflow.experimentKind") != "custom_model_development":
            retry(lambda: self.client.set_experiment_tag(self.experiment_id, "mlflow.experimentKind",
                                                         "custom_model_development"), "experiment kind")
        self.parent_run_id: str | None = None
        self._synced: set[str] | None = None

    # ---- parent run -----------------------------------------------------------------
    def open_parent(self, study: optuna.Study, description: str, params: dict[str, Any]) -> str:
        """Reopen the study's parent run (id in the study's user attrs) or create it."""
        rid = study.user_attrs.get(PARENT_ATTR)
        if rid:
            try:
                run = retry(lambda: self.client.get_run(rid), "get parent run")
                if run.info.lifecycle_stage == "active":
                    retry(lambda: self.client.update_run(rid, status="RUNNING"), "reopen parent")
                    self.parent_run_id = rid
                    return rid
            except Exception:  # noqa: BLE001 - parent gone (deleted store): create a new one
                log.warning("parent run %s not found; creating a new one", rid)
        run = retry(
            lambda: self.client.create_run(
                self.experiment_id,
                run_name=study.study_name,
                tags={"mlflow.note.content": description, "servesweep.role": "study", "study": study.study_name},
            ),
            "create parent run",
        )
        self.parent_run_id = run.info.run_id
        study.set_user_attr(PARENT_ATTR, self.parent_run_id)
        self.log_params(self.parent_run_id, params)
        return self.parent_run_id

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        ps = [Param(k, _tag(v)[:6000]) for k, v in params.items()]
        if ps:
            retry(lambda: self.client.log_batch(run_id, params=ps), "log params")

    def close_parent(self, status: str = "FINISHED") -> None:
        if self.parent_run_id:
            retry(lambda: self.client.set_terminated(self.parent_run_id, status), "close parent")

    def set_parent_tags(self, tags: dict[str, Any]) -> None:
        assert self.parent_run_id
        rt = [RunTag(k, _tag(v)) for k, v in tags.items()]
        retry(lambda: self.client.log_batch(self.parent_run_id, tags=rt), "parent tags")

    def log_parent_metrics(self, metrics: dict[str, float]) -> None:
        assert self.parent_run_id
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None and math.isfinite(v)]
        if ms:
            retry(lambda: self.client.log_batch(self.parent_run_id, metrics=ms), "parent metrics")

    def log_parent_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        assert self.parent_run_id
        retry(lambda: self.client.log_artifact(self.parent_run_id, str(path), artifact_path), "parent artifact")

    # ---- child runs -------------------------------------------------------------------
    def synced_keys(self) -> set[str]:
        """trial_key tags of finished child runs of the parent (loaded once, then cached)."""
        if self._synced is None:
            keys: set[str] = set()
            token = None
            while True:
                page = retry(
                    lambda token=token: self.client.search_runs(
                        [self.experiment_id],
                        filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_run_id}'",
                        max_results=1000,
                        page_token=token,
                    ),
                    "search child runs",
                )
                for run in page:
                    key = run.data.tags.get("trial_key")
                    if not key:
                        continue
                    if run.info.status in ("FINISHED", "FAILED", "KILLED"):
                        keys.add(key)
                    else:  # half-written by a crashed driver: drop it and its nested runs, it is rewritten below
                        self._delete_with_children(run.info.run_id)
                token = page.token
                if not token:
                    break
            self._synced = keys
        return self._synced

    def _delete_with_children(self, run_id: str) -> None:
        """Delete a half-written trial run and the runs nested under it (its probe run): they are
        written again with the trial, and a nested run left behind would stay RUNNING under a deleted
        parent."""
        kids = retry(lambda: self.client.search_runs([self.experiment_id],
                                                     filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'",
                                                     max_results=1000), "search nested runs")
        for kid in kids:
            retry(lambda kid=kid: self.client.delete_run(kid.info.run_id), "delete a partial run's nested run")
        retry(lambda: self.client.delete_run(run_id), "delete partial run")

    def sync(self, study_name: str, records: list[TrialRecord], store_dir: Path, extra_tags: dict[str, str]) -> int:
        """Log every finished trial not yet in MLflow. Returns how many were logged.

        Never raises for an MLflow outage: the error is logged and a later sync retries
        (not before ``OUTAGE_BACKOFF_S`` after a failure, so an outage costs the sweep one
        failed attempt per backoff period, not one per trial).
        """
        if time.monotonic() < self._retry_at:
            return 0
        try:
            done = self.synced_keys()
        except Exception as e:  # noqa: BLE001
            self._failed(e)
            log.warning("MLflow unreachable (%s); trials will be synced later", brief(e))
            return 0
        n = 0
        for r in records:
            # a proposal answered without a launch is counted on the parent (sweeps.publish.parent_run), not a run
            if r.state in ("RUNNING", "WAITING") or not r.launched:
                continue
            key = f"{study_name}/{r.number}"
            if key in done:
                continue
            try:
                self._log_child(key, r, trial_dir(store_dir, study_name, r.number), extra_tags)
            except Exception as e:  # noqa: BLE001
                self._failed(e)
                log.warning("MLflow sync of %s failed (%s); will retry", key, brief(e))
                return n
            done.add(key)
            n += 1
        self._failures = 0
        return n

    @property
    def behind(self) -> bool:
        """True when the last sync attempt failed: trials may be missing from MLflow until the next one."""
        return self._failures > 0

    def _failed(self, e: Exception) -> None:
        """One failed sync attempt: back off; a local store failing attempt after attempt is broken.

        Raises:
            MlflowStoreBroken: :data:`LOCAL_FAILURES_MAX` failed attempts in a row on a local store.
        """
        self._synced = None
        self._retry_at = time.monotonic() + OUTAGE_BACKOFF_S
        self._failures += 1
        if self._failures >= LOCAL_FAILURES_MAX and not self.uri.startswith(("http://", "https://")):
            raise MlflowStoreBroken(
                f"the MLflow store {self.uri} failed {self._failures} sync attempts in a row "
                f"({str(e).splitlines()[0][:200]}); a local store has no outage to wait out. The trials are "
                f"kept in Optuna: repair or move the store (e.g. mv mlflow.db mlflow.db.broken) and run the "
                f"same command again; it syncs every trial.") from e

    def _log_child(self, key: str, r: TrialRecord, tdir: Path, extra_tags: dict[str, str]) -> None:
        tags = {
            "mlflow.parentRunId": self.parent_run_id,
            "trial_key": key,
            "trial_number": str(r.number),
            "status": str(r.status),
            "failure_class": r.failure_class or "",
            "failure_kind": r.failure_kind or "",
            "failure_signature": r.failure_signature or "",
            "phase": r.phase or "",
            "perf_tags": ",".join(r.perf_tags),
            "skipped_by_rule": r.skipped_by_rule or "",
            "duplicate_of": "" if r.duplicate_of is None else str(r.duplicate_of),
            "is_baseline": str(r.is_baseline).lower(),
            "probe_result": (r.probe or {}).get("result") or "",  # its probe is a run nested under this one
            "node": r.node,
            "launch_command": r.launch_command,
            f"{self.objective.name}_censored": censored_text(r.metrics, self.objective.name) or "",
            **{f"fp.{k}": str(v) for k, v in r.fingerprint.items()},
            **extra_tags,
        }
        tags = {k: v for k, v in tags.items() if v not in ("", None)}
        tags["status"] = str(r.status)
        run = retry(
            lambda: self.client.create_run(self.experiment_id, run_name=run_label(r, self.objective),
                                           start_time=_ms(r.datetime_start),
                                           tags={"trial_key": key, "mlflow.parentRunId": self.parent_run_id}),
            "create child run",
        )
        rid = run.info.run_id
        now = int(time.time() * 1000)
        metrics = mlflow_metrics({**r.metrics, **{k: v for k, v in r.timings.items()
                                                  if k in ("startup_s", "bench_s", "gpu_s", "wall_s")}})
        ms = [Metric(k, v, now, 0) for k, v in metrics.items()]
        ps = [Param(k, str(v)) for k, v in r.params.items()]
        rt = [RunTag(k, _tag(v)) for k, v in tags.items()]
        # one batch holds at most MAX_ENTITIES_PER_BATCH entities and MAX_METRICS_PER_BATCH metrics
        first = min(MAX_METRICS_PER_BATCH, max(0, MAX_ENTITIES_PER_BATCH - len(ps) - len(rt)))
        retry(lambda: self.client.log_batch(rid, metrics=ms[:first], params=ps, tags=rt), "log child")
        for i in range(first, len(ms), MAX_METRICS_PER_BATCH):
            retry(lambda i=i: self.client.log_batch(rid, metrics=ms[i:i + MAX_METRICS_PER_BATCH]), "log child metrics")
        if tdir.is_dir():
            for f in sorted(tdir.iterdir()):
                if f.is_file() and f.stat().st_size > 0:
                    retry(lambda f=f: self.client.log_artifact(rid, str(f)), "log artifact")
        if r.probe:
            self._log_probe(key, r, rid, extra_tags)
        status = "FINISHED" if r.status in ("ok",) else ("KILLED" if r.status == "interrupted" else "FAILED")
        # the run's duration in the UI is the trial's (Optuna start -> complete), not the sync's
        retry(lambda: self.client.set_terminated(rid, status, end_time=_ms(r.datetime_complete)), "terminate child")

    def _log_probe(self, key: str, r: TrialRecord, trial_run: str, extra_tags: dict[str, str]) -> None:
        """The trial's probe launch as a run nested under the trial's run (tags ``probe=true``,
        ``servesweep.role=probe``; FINISHED when it reached ready, FAILED when not): it spent
        ``gpu_s`` GPU-seconds (counted in the trial's own ``gpu_s``), no trial budget."""
        p = r.probe or {}
        ok = p.get("result") == "ok"
        outcome = "ok" if ok else (p.get("failure_class") or p.get("result") or "failed")
        tags = {"probe": "true", "servesweep.role": "probe", "probe_key": f"{key}/probe", "trial_number": str(r.number),
                "status": str(p.get("result") or ""), "failure_class": p.get("failure_class") or "",
                "failure_signature": p.get("signature") or "", "reason": p.get("reason") or "",
                "dead_end": str(bool(p.get("dead_end"))).lower(), **extra_tags}
        run = retry(lambda: self.client.create_run(
            self.experiment_id, run_name=f"t{r.number:03d} probe · {outcome}", start_time=_ms(r.datetime_start),
            tags={"mlflow.parentRunId": trial_run, "probe_key": f"{key}/probe"}), "create probe run")
        pid = run.info.run_id
        now = int(time.time() * 1000)
        ms = [Metric(k, float(p[k]), now, 0) for k in ("gpu_s", "startup_s")
              if isinstance(p.get(k), (int, float)) and math.isfinite(float(p[k]))]
        rt = [RunTag(k, _tag(v)) for k, v in tags.items() if v not in ("", None)]
        retry(lambda: self.client.log_batch(pid, metrics=ms, params=[Param(k, str(v)) for k, v in r.params.items()],
                                            tags=rt), "log probe")
        retry(lambda: self.client.set_terminated(pid, "FINISHED" if ok else "FAILED"), "terminate probe")
