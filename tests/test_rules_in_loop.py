"""Failure knowledge in the real driver loop.

- The emulated campaign sweep (60 launched trials, TPE, instant backend): at most one launch
  per distinct dead end, >= 90 % of launched trials start, later matching proposals are
  skipped by rule at 0 GPU-seconds (Optuna PRUNED + violated constraint, MLflow tag
  ``skipped_by_rule``), duplicates are answered from the earlier result.
  Once through ``run_sweep.py`` (Ray + MLflow, slow) and once in process
  (:class:`sweeps.app.inprocess.InProcessDriver`: the same Driver code, Ray replaced inline).
- Infrastructure failures are retried and never count against the config; transient
  failures are retried once; the circuit breaker stops a sweep whose recent trials fail
  with infrastructure or unknown classes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeps.app.inprocess import run_in_process
from sweeps.config.spec import load_spec
from sweeps.rules.store import RuleStore, implicated_params, load_implicated_knobs
from sweeps.store import records
from tests.conftest import REPO, compose_cfg

CAMPAIGN = ["backend=instant", "sweep=eagle3_allreduce", "sweep.budget.trials=60", "sweep.budget.wall_time_s=null",
            "sweep.budget.max_asks=1500", "sweep.budget.max_consecutive_skips=400"]
MAPPING = load_implicated_knobs()


@pytest.fixture
def fast_tmp(tmp_path):
    """Scratch dir on tmpfs when available (SQLite commits without fsync), else tmp_path."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="servesweep-loop-", dir=shm))
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path


def _stores(store: Path) -> list[str]:
    return [f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]


def dead_end_key(r: records.TrialRecord) -> tuple:
    """A failure's distinct dead end: class + the knob values it implicates (conf/failure_knobs.yaml);
    a silently replaced allreduce level is one dead end per level."""
    if r.status == "ok":
        return (records.DEGRADED, (("allreduce", r.params.get("allreduce")),))
    knobs = implicated_params(r.failure_class or "unknown", r.params, MAPPING, r.failure_signature)
    return (r.failure_class, tuple(sorted(knobs.items())))


def check_campaign(study: optuna.Study, rules: RuleStore, n_launched: int = 60) -> dict[str, float]:
    """The issue-5 acceptance checks on a finished campaign study; returns the measured rates."""
    recs = records.load_records(study)
    launched = [r for r in recs if r.launched]
    # the trial budget counts launches; re-question probes (probe-only) come on top of it
    assert sum(r.budgeted for r in launched) == n_launched
    # a trial that ended at its probe (sweeps/search/probes.py: a dead end or a degraded level) cost
    # a fraction of a full launch (~8 GPUs x 180 s)
    probe_only = {t.number: t.user_attrs["probe"] for t in study.trials
                  if (t.user_attrs.get("probe") or {}).get("dead_end")}
    assert probe_only and all(p["gpu_s"] < 0.2 * 8 * 180 for p in probe_only.values()), probe_only
    # one launch per distinct dead end (failed launches and degraded-level launches)
    dead = [r for r in launched if r.status != "ok" or not records.counts_for_level(r)]
    per_end = Counter(dead_end_key(r) for r in dead)
    assert dead and max(per_end.values()) == 1, per_end
    # no config was launched twice
    keys = Counter(records.config_key(r.params) for r in launched)
    assert max(keys.values()) == 1, keys.most_common(3)
    # >= 90 % of launches started (the server came up: ok, or failed after startup)
    started = [r for r in launched if r.status == "ok" or r.phase not in ("startup", None)]
    start_rate = len(started) / len(launched)
    # 60 launches: >= 90 % (issue 5). Shorter sweeps: the seeds probe each level of allreduce,
    # moe_a2a_backend, and NCCL Tree is a seed trial, so the campaign's 4 startup dead ends are all launched once.
    assert start_rate >= (0.90 if n_launched >= 60 else 1 - 4 / n_launched), start_rate
    # later proposals into a dead end were answered by its rule, without GPU time
    skipped = [r for r in recs if r.skipped_by_rule and not r.skipped_by_rule.startswith("degraded:")]
    assert skipped, "no proposal was skipped by a rule"
    for r in skipped:
        assert r.state == "PRUNED" and r.timings.get("gpu_s") == 0.0 and r.status == "skipped"
        rule = rules.get(int(r.skipped_by_rule))
        assert rule is not None and rule.failure_class == r.failure_class
        assert all(r.params.get(k) == v for k, v in rule.knobs.items())
        assert (rule.failure_class, tuple(sorted(rule.knobs.items()))) in per_end  # launched once before
    trials = {t.number: t for t in study.trials}
    for r in skipped:
        assert trials[r.number].constraints == {"feasible": 1.0}  # TPE ranks it infeasible
    # duplicates answered from the earlier result
    dups = [r for r in recs if r.duplicate_of is not None]
    for r in dups:
        src = trials[r.duplicate_of]
        assert records.config_key(r.params) == records.config_key(dict(src.params))
        if src.state == TrialState.COMPLETE:
            assert trials[r.number].value == src.value
    for cls in {c for c, _ in per_end if c != records.DEGRADED}:
        assert rules.list(failure_class=cls), cls
    return {"start_rate": start_rate, "rule_skips": len(skipped), "duplicates": len(dups), "asks": len(recs)}


@pytest.mark.parametrize("n", [20, pytest.param(60, marks=[pytest.mark.slow, pytest.mark.timeout(900)])])
def test_campaign_in_process_one_launch_per_dead_end(fast_tmp, n):
    store = fast_tmp / "store"
    spec = load_spec(compose_cfg([*CAMPAIGN, f"sweep.budget.trials={n}", *_stores(store)]))
    drv = run_in_process(spec)
    assert drv.stop_reason == f"trial budget spent ({n} launched)"
    rates = check_campaign(drv.study, RuleStore(spec.rules_db), n)
    assert rates["rule_skips"] >= 4


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~3 min idle; >5 min on a loaded 2-core machine
def test_campaign_through_ray_and_mlflow(fast_tmp):
    store = fast_tmp / "store"
    cmd = [sys.executable, str(REPO / "run_sweep.py"), *CAMPAIGN, *_stores(store)]
    r = subprocess.run(cmd, cwd=str(fast_tmp), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "trial budget spent (60 launched)" in r.stdout
    study = optuna.load_study(study_name="eagle3_allreduce", storage=f"sqlite:///{store / 'optuna.db'}")
    check_campaign(study, RuleStore(f"sqlite:///{store / 'servesweep.db'}"))
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = c.get_experiment_by_name("eagle3_allreduce")
    # rule skips are not runs: they are counted on the parent and listed in skipped.csv
    assert not c.search_runs([exp.experiment_id], filter_string="tags.status = 'skipped'", max_results=2000)
    parent = c.search_runs([exp.experiment_id], filter_string="tags.`servesweep.role` = 'study'")[0]
    recs = records.load_records(study)
    by_rule = [r for r in recs if not r.launched and str(r.skipped_by_rule or "").isdigit()]
    assert by_rule and parent.data.metrics["skipped_rule"] == len(by_rule)
    import csv

    table = Path(c.download_artifacts(parent.info.run_id, "skipped.csv", str(fast_tmp)))
    rows = [x for x in csv.DictReader(table.open()) if x["reason"] == "rule"]
    assert sorted(int(x["trial"]) for x in rows) == sorted(r.number for r in by_rule)
    assert all(x["failure_class"] for x in rows)


# ---------------------------------------------------------------------------------------
# retries and the circuit breaker
# ---------------------------------------------------------------------------------------
SMOKE = ["sweep=smoke", "sweep.budget.wall_time_s=null"]


def test_infra_failures_are_retried_and_never_count_against_the_config(fast_tmp):
    """A node failure on the first attempt of every trial: each is re-run on a fresh task and
    ends with the config's own outcome; no infra failure is recorded or learned as a rule."""
    seen: Counter = Counter()

    def hook(args: tuple) -> BaseException | None:
        tspec = args[0]
        seen[tspec.trial_number] += 1
        if seen[tspec.trial_number] == 1:
            return RuntimeError("The actor died unexpectedly (emulated node loss)")
        return None

    spec = load_spec(compose_cfg(["backend=instant", *SMOKE, "sweep.budget.trials=3", *_stores(fast_tmp / "s")]))
    drv = run_in_process(spec, task_hook=hook)
    recs = [r for r in records.load_records(drv.study) if r.launched]
    assert sum(r.budgeted for r in recs) == 3 and all(r.attempts == 2 for r in recs)
    # smoke seeds every allreduce level: flashinfer fusion fails on SM120 by itself
    assert all(r.status == "ok" or r.failure_kind == "deterministic" for r in recs), recs
    assert sum(r.status == "ok" for r in recs) >= 2
    assert {x.failure_class for x in drv.rules.list()} == {r.failure_class for r in recs if r.status == "failed"}
    assert "node_lost" not in {x.failure_class for x in drv.rules.list()}


def test_persistent_infra_failure_is_fail_not_a_rule_and_trips_the_breaker(fast_tmp):
    spec = load_spec(compose_cfg(["backend=instant", *SMOKE, "sweep.budget.trials=20",
                                  "+sweep.circuit_breaker.window=3", *_stores(fast_tmp / "s")]))
    drv = run_in_process(spec, task_hook=lambda args: RuntimeError("node died (emulated)"))
    assert drv.stop_reason and drv.stop_reason.startswith("circuit breaker: 3 of the last 3 trials")
    assert "check the node" in drv.stop_reason
    recs = [r for r in records.load_records(drv.study) if r.launched]
    assert len(recs) == 3  # stopped instead of burning the budget (20)
    assert all(r.state == "FAIL" and r.status == "infra_error" and r.failure_kind == "infra" for r in recs)
    assert all(r.attempts == 1 + spec.backend.retries_transient + 1 for r in recs)  # retried on fresh tasks
    assert drv.rules.list() == []  # never counts against the config
    assert all(not t.constraints for t in drv.study.trials if t.state == TrialState.FAIL)


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_transient_failure_retried_once_then_breaker_on_unknown_class(fast_tmp):
    """Emulated servers that crash at startup with an unclassified error (class ``unknown``,
    kind transient): each trial is launched twice, then the breaker stops the sweep."""
    spec = load_spec(compose_cfg(["backend=emulated", *SMOKE, "sweep.budget.trials=20",
                                  "+sweep.circuit_breaker.window=3", "+backend.emulator.fault=crash_startup",
                                  "backend.emulator.time_scale=0.002", "bench.output_len=32", "bench.repeats=2",
                                  "bench.warmup_output_len=4", *_stores(fast_tmp / "s")]))
    drv = run_in_process(spec)
    assert drv.stop_reason and drv.stop_reason.startswith("circuit breaker")
    recs = [r for r in records.load_records(drv.study) if r.launched]
    assert len(recs) == 3
    assert all(r.failure_class == "unknown" and r.attempts == 2 for r in recs)
    for r in recs:  # the first attempt's log is kept beside the final one (a probe's, for a trial ended at its probe)
        d = records.trial_dir(spec.store_dir, drv.study_name, r.number)
        assert (d / ("server.probe.attempt1.log" if r.probe is not None else "server.attempt1.log")).exists(), \
            sorted(x.name for x in d.iterdir())
    # a transient class never becomes a rule, and the config is not a dead end (Optuna FAIL)
    assert drv.rules.list() == []
    assert all(t.state == TrialState.FAIL for t in drv.study.trials if records.record_from_trial(t).launched)
