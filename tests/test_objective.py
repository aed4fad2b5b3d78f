"""The sweep objective is wired everywhere: Optuna's direction, the records' ranking, the
speedup, confirmation, the summary and the MLflow parent's ``best_run`` all follow
``sweep.objective`` / ``sweep.direction`` / ``sweep.objective_constraints``."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from sweeps.app.inprocess import run_in_process
from sweeps.config.objective import MetricConstraint, Objective, ObjectiveSet
from sweeps.config.spec import ConfigError, load_spec
from sweeps.search.confirm import candidates, summarize
from sweeps.store import records
from sweeps.store import study as study_store
from tasks.types import TrialResult
from tests.conftest import REPO, compose_cfg

FAST = ["backend=instant", "sweep=smoke", "sweep.budget.trials=8", "sweep.confirm.top_k=0",
        "sweep.budget.wall_time_s=null"]


def _spec(tmp_path, extra):
    store = tmp_path / "store"
    return load_spec(compose_cfg([*FAST, *extra, f"tracking.store_dir={store}",
                                  f"tracking.findings_dir={store / 'findings'}"]))


def _children(spec, experiment: str):
    c = MlflowClient(spec.mlflow_uri)
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    parent = next(r for r in runs if r.data.tags.get("servesweep.role") == "study")
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, kids


def _eligible(kids, metric):
    """Launched, ok, non-degraded, non-duplicate children that logged ``metric``."""
    return [r for r in kids if r.data.tags.get("status") == "ok" and not r.data.tags.get("duplicate_of")
            and "allreduce_path_degraded" not in r.data.tags.get("perf_tags", "") and metric in r.data.metrics]


@pytest.mark.parametrize("metric,direction", [("decode_tok_s", "maximize"), ("output_tok_s", "minimize"),
                                              ("ttft_ms_p50", "minimize"), ("itl_ms_p50", "maximize")])
def test_best_run_follows_objective_and_direction(tmp_path, metric, direction):
    spec = _spec(tmp_path, [f"sweep.objective={metric}", f"sweep.direction={direction}"])
    drv = run_in_process(spec, track=True)
    assert drv.study.direction.name == direction.upper()
    # Optuna was told the objective's metric, nothing else
    for t in drv.study.get_trials(states=(TrialState.COMPLETE,)):
        assert t.value == pytest.approx(records.record_from_trial(t).metrics[metric])
    parent, kids = _children(spec, "smoke")
    ok = _eligible(kids, metric)
    assert len(ok) >= 3
    pick = min if direction == "minimize" else max
    want = pick(ok, key=lambda r: r.data.metrics[metric])
    assert parent.data.tags["best_run"] == want.info.run_id
    assert parent.data.metrics[f"best_{metric}"] == pytest.approx(want.data.metrics[metric])
    # the speedup is the objective's improvement ratio (> 1 = better in the chosen direction)
    recs = records.load_records(drv.study)
    base = records.baseline_value(recs, spec.objective_set)
    for r in recs:
        v = records.value_of(r, spec.objective_set)
        if v is not None and base and "speedup_vs_baseline" in r.metrics:
            exp = v / base if direction == "maximize" else base / v
            assert r.metrics["speedup_vs_baseline"] == pytest.approx(exp)
    assert records.best_record(recs, spec.objective_set).number == int(parent.data.tags["best_trial"])


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_cli_minimize_output_tok_s_names_the_slowest_child(tmp_path):
    """The issue's command (with a smaller budget): ranked and reported by the lowest output_tok_s."""
    store = tmp_path / "store"
    args = ["backend=instant", "sweep.objective=output_tok_s", "sweep.direction=minimize", "sweep.confirm.top_k=0",
            "sweep.budget.trials=10", f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]
    r = subprocess.run([sys.executable, str(REPO / "run_sweep.py"), *args], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    spec = load_spec(compose_cfg(args))
    parent, kids = _children(spec, spec.sweep.name)
    ok = _eligible(kids, "output_tok_s")
    want = min(ok, key=lambda k: k.data.metrics["output_tok_s"])
    assert max(ok, key=lambda k: k.data.metrics["output_tok_s"]).info.run_id != want.info.run_id
    assert parent.data.tags["best_run"] == want.info.run_id
    assert "best_output_tok_s" in parent.data.metrics
    assert f"best: trial {parent.data.tags['best_trial']}," in r.stdout


def test_constraint_violators_are_never_best_and_told_infeasible(tmp_path):
    # a bound between the trials' TTFTs: some trials violate it
    spec0 = _spec(tmp_path / "a", [])
    drv0 = run_in_process(spec0)
    # measured trials (a level whose probe showed it silently falls back ends ok without a benchmark)
    ttfts = sorted(r.metrics["ttft_ms_p50"] for r in records.load_records(drv0.study) if "ttft_ms_p50" in r.metrics)
    bound = ttfts[len(ttfts) // 2]
    spec = _spec(tmp_path / "b", [f"sweep.objective_constraints=['ttft_ms_p50 < {bound}']"])
    drv = run_in_process(spec)
    recs = records.load_records(drv.study)
    violators = {r.number for r in recs if r.status == "ok" and r.metrics.get("ttft_ms_p50", -1) >= bound}
    assert violators
    best = records.best_record(recs, spec.objective_set)
    assert best is not None and best.number not in violators and best.metrics["ttft_ms_p50"] < bound
    for t in drv.study.get_trials(states=(TrialState.COMPLETE,)):
        if t.number in violators and t.user_attrs.get("duplicate_of") is None:
            assert t.constraints["feasible"] > 0
    top, _ = candidates(recs, 10, spec.objective_set)
    assert not {r.number for r in top} & violators
    # unconstrained, the top decode trial is among the violators' peers: the constraint mattered
    assert records.best_record(recs).metrics["decode_tok_s"] >= best.metrics["decode_tok_s"]


def test_config_errors_name_the_field(tmp_path):
    for bad, field in [(["sweep.direction=down"], "sweep.direction"),
                       (["sweep.objective_constraints=['ttft_ms_p99 <== 3']"], "sweep.objective_constraints"),
                       (["sweep.objective=[decode_tok_s,output_tok_s]", "sweep.direction=[maximize]"], "sweep.direction"),
                       (["sweep.objective=''"], "sweep.objective")]:
        with pytest.raises(ConfigError) as e:
            _spec(tmp_path, bad)
        assert field in str(e.value), (bad, str(e.value))


def test_multi_objective_fits_the_types(tmp_path):
    spec = _spec(tmp_path, ["sweep.objective=[output_tok_s,ttft_ms_p50]", "sweep.direction=[maximize,minimize]",
                            "sweep.objective_constraints=['itl_ms_p99 <= 1000']"])
    objs = spec.objective_set
    assert objs.multi and objs.directions == ["maximize", "minimize"]
    spec.store_dir.mkdir(parents=True)
    study = study_store.open_study(spec)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    t = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    v = study_store.verdict_for("ok", metrics={"output_tok_s": 90.0, "ttft_ms_p50": 80.0, "itl_ms_p99": 12.0}, objectives=objs)
    assert v.state == TrialState.COMPLETE and v.values == (90.0, 80.0) and v.constraint == 0.0
    study_store.tell(study, t, v)
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert done[0].values == [90.0, 80.0] and done[0].constraints["feasible"] == 0.0
    bad = study_store.verdict_for("ok", metrics={"output_tok_s": 90.0, "ttft_ms_p50": 80.0, "itl_ms_p99": 1500.0},
                        objectives=objs)
    assert bad.constraint == pytest.approx(500.0)
    assert study_store.verdict_for("ok", metrics={"output_tok_s": 90.0}, objectives=objs) == study_store.IGNORED


def test_confirmation_ranks_by_the_objective():
    obj = Objective("ttft_ms_p50", "minimize")
    mk = lambda n, v, b=False: records.TrialRecord(n, "COMPLETE", {"cuda_graph_max_bs": n}, "ok",  # noqa: E731
                                             {"ttft_ms_p50": v, "decode_tok_s": 100.0 - v}, is_baseline=b)
    base, fast, slow = mk(0, 90.0, True), mk(1, 60.0), mk(2, 80.0)
    top, b = candidates([base, fast, slow], 2, obj)
    assert [r.number for r in top] == [1, 2] and b is base
    runs = {0: [90.0, 91.0, 89.0], 1: [61.0, 60.0, 59.0], 2: [80.0, 81.0, 79.0]}
    todo = [(base, True), (fast, False), (slow, False)]
    res = {i: [TrialResult(status="ok", metrics={"ttft_ms_p50": v}) for v in vs] for i, vs in runs.items()}
    out = summarize(todo, res, 3, 0.95, obj)
    assert out["winner"] == 1
    e = next(x for x in out["entries"] if x["trial"] == 1)
    assert e["speedup_mean"] == pytest.approx(90.0 / 60.0)  # latency 1.5x lower = 1.5x better
    assert summarize(todo, res, 3, 0.95, Objective("ttft_ms_p50", "maximize"))["winner"] == 0
    # a constraint the fastest config breaks on its repeats: it cannot win
    for x in res[1]:
        x.metrics["itl_ms_p99"] = 50.0
    for i in (0, 2):
        for x in res[i]:
            x.metrics["itl_ms_p99"] = 10.0
    strict = Objective("ttft_ms_p50", "minimize", (MetricConstraint.parse("itl_ms_p99 <= 20"),))
    out = summarize(todo, res, 3, 0.95, strict)
    assert out["winner"] == 2
    assert next(x for x in out["entries"] if x["trial"] == 1)["verdict"] == "violates itl_ms_p99 <= 20: cannot win"
    assert ObjectiveSet.from_config("ttft_ms_p50", "minimize").primary == obj


def test_study_identity_refuses_another_setup_and_old_studies_adopt_it(tmp_path):
    from sweeps.store.study import IDENTITY_ATTR, SweepError, open_study

    spec = _spec(tmp_path, [])
    spec.store_dir.mkdir(parents=True)
    study = open_study(spec)
    ident = study.user_attrs[IDENTITY_ATTR]
    assert ident["backend"] == "instant" and ident["objective"] == "decode_tok_s maximize"
    assert ident["engine_version"] == spec.backend.sglang_version and ident["node"] == spec.node.name
    assert open_study(spec).user_attrs[IDENTITY_ATTR] == ident  # same setup: resumes
    ranked = study.ask()
    study.tell(ranked, 80.0)  # the objective has ranked a trial: changing it would mix results
    for extra, field in [(["backend=emulated"], "backend"), (["backend.sglang_version=0.5.20"], "engine_version"),
                         (["sweep.objective=output_tok_s"], "objective"),
                         (["sweep.direction=minimize"], "direction")]:
        other = load_spec(compose_cfg([*FAST, *extra, f"tracking.store_dir={spec.store_dir}",
                                       f"tracking.findings_dir={spec.store_dir / 'findings'}"]))
        with pytest.raises(SweepError) as e:
            open_study(other)
        msg = str(e.value)
        assert field in msg and "new_study=true" in msg and "study_name=" in msg, msg
    # a study recorded before identities existed adopts the current one
    study._storage.set_study_user_attr(study._study_id, IDENTITY_ATTR, None)
    assert study.user_attrs.get(IDENTITY_ATTR) is None
    other = load_spec(compose_cfg([*FAST, "sweep.objective=output_tok_s", f"tracking.store_dir={spec.store_dir}",
                                   f"tracking.findings_dir={spec.store_dir / 'findings'}"]))
    assert open_study(other).user_attrs[IDENTITY_ATTR]["objective"] == "output_tok_s maximize"


def test_findings_written_by_the_sweep_carry_its_confirmation(tmp_path):
    """The publisher hands the findings the study itself, so the stored confirmation (and
    the confirmed winner) reach the document the sweep writes at the end."""
    spec = _spec(tmp_path, ["sweep.confirm.top_k=1", "sweep.confirm.repeats=2"])
    drv = run_in_process(spec, findings=True)
    conf = drv.study.user_attrs.get("confirmation")
    assert conf and conf.get("winner") is not None, conf
    text = spec.findings_path.read_text()
    assert "### Confirmation" in text, text[-2000:]
    assert f"t{conf['winner']}" in text.split("### Confirmation", 1)[1]


def test_a_reconfirmation_adds_fresh_measurements(tmp_path):
    """Repeats accumulate: confirming again with more repeats keeps the first round's values and
    adds launches of its own, each drawing its own run-to-run noise."""
    from sweeps.search.confirm import confirm_top

    spec = _spec(tmp_path, ["sweep.confirm.top_k=1", "sweep.confirm.repeats=3"])
    drv = run_in_process(spec)
    first = {e["trial"]: e["values"] for e in drv.study.user_attrs["confirmation"]["entries"]}
    again = confirm_top(drv, k=1, repeats=4, max_repeats=4)
    second = {e["trial"]: e["values"] for e in again["entries"]}
    assert first.keys() == second.keys()
    for t in first:
        assert second[t][:3] == first[t] and len(second[t]) == 4, (t, first[t], second[t])
        assert len(set(second[t])) == len(second[t])  # repeats differ, within and across rounds


@pytest.mark.parametrize("override", ["sweep.objective=nonsense_metric",
                                      "sweep.objective_constraints=['bogus_metric <= 3']"])
def test_a_metric_no_trial_logs_is_refused_before_the_sweep_starts(tmp_path, override):
    store = tmp_path / "store"
    args = [*FAST, override, f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]
    r = subprocess.run([sys.executable, str(REPO / "run_sweep.py"), *args], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(tmp_path))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    name = override.split("=", 1)[1].strip("[]'").split()[0]
    assert "is not a metric this sweep's trials log" in r.stderr and name in r.stderr, r.stderr[-2000:]
    assert "decode_tok_s" in r.stderr  # the message lists what trials do log
    assert "Traceback" not in r.stderr
    assert "nothing was started" in r.stderr
    assert not (store / "optuna.db").exists()  # refused with the config: no study was created


def test_a_study_nothing_was_ranked_in_takes_a_new_objective(tmp_path):
    from sweeps.store.study import IDENTITY_ATTR, SweepError, open_study

    spec = _spec(tmp_path, [])
    spec.store_dir.mkdir(parents=True)
    study = open_study(spec)
    failed = study.ask()
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    other = load_spec(compose_cfg([*FAST, "sweep.objective=output_tok_s", f"tracking.store_dir={spec.store_dir}",
                                   f"tracking.findings_dir={spec.store_dir / 'findings'}"]))
    assert open_study(other).user_attrs[IDENTITY_ATTR]["objective"] == "output_tok_s maximize"
    backend = load_spec(compose_cfg([*FAST, "backend=emulated", f"tracking.store_dir={spec.store_dir}",
                                     f"tracking.findings_dir={spec.store_dir / 'findings'}"]))
    with pytest.raises(SweepError, match="backend"):
        open_study(backend)  # only the objective: another backend measured something else
