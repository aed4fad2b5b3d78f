"""Engines are plugins: a backend is its module and its conf/backend YAML, nothing else.

* A NEW backend (``toy``) written to a temporary directory (its module and ``conf/backend/toy.yaml``
  only; a sweep of its knobs beside them) runs an instant-style sweep in-process: discovered by
  ``tasks.backends``, composed by Hydra through ``hydra.searchpath``, validated with its own
  version field and metrics, ranked by its own objective, logged to MLflow.
* A misspelled ``sweep.objective`` is refused before Ray starts (exit 2), listing the metrics
  the backend logs.
* Every metric a trial returns reaches its MLflow child run: there is no allow-list.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

import tasks.backends
from sweeps.config.spec import ConfigError, load_spec, logged_metrics
from tests.conftest import REPO, compose_cfg

TOY_MODULE = '''
"""A toy engine: trials are evaluated in-process (instant-style) from a closed form."""

from __future__ import annotations

import math

from tasks.backends.base import Backend, KnobError, Launch
from tasks.backends.lifecycle import launch_command, new_result


class ToyBackend(Backend):
    kind = "toy"
    engine = "toy"
    engine_label = "Toy"
    emulated = True
    launches_server = False
    checks_gpus = False
    ports = ()
    version_key = "toy_version"
    default_version = "1.0"
    fingerprint_key = "toy"
    known_knobs = frozenset({"batch", "mode"})
    int_knobs = frozenset({"batch"})
    bench_metrics = frozenset({"toy_tok_s", "toy_latency_ms"})

    def render(self, params, node, model, backend_cfg):
        if set(params) - self.known_knobs:
            raise KnobError(f"unknown toy knob(s) {sorted(set(params) - self.known_knobs)}")
        if params.get("mode") not in ("fast", "steady"):
            raise KnobError(f"mode={params.get('mode')!r}: choose fast or steady")
        argv = [*backend_cfg["launcher"], "--batch", str(int(params["batch"])), "--mode", str(params["mode"]),
                "--version", self.engine_version(backend_cfg)]
        return Launch(argv, {}, {})

    def fingerprint(self, profile, gpu_indices):
        return {"toy": self.default_version, "gpu_name": "Toy GPU"}

    def run_trial(self, spec, profile, workdir):
        res, argv, env = new_result(self, spec, profile)
        batch = int(argv[argv.index("--batch") + 1])
        fast = argv[argv.index("--mode") + 1] == "fast"
        tok = 100.0 * batch / (1.0 + 0.02 * batch * batch) * (1.3 if fast else 1.0)
        res.launch_command = launch_command(argv, env)
        res.metrics = {"toy_tok_s": tok, "toy_latency_ms": 1000.0 / tok,
                       # in no list anywhere (not even bench_metrics): still reaches MLflow
                       "toy_queue_depth_max": float(batch),
                       "toy p99@1s": 2.5,                # '@' is no MLflow metric-name character
                       "toy_unmeasured": math.nan}       # MLflow takes finite values only
        return res


BACKEND = ToyBackend()
'''

TOY_YAML = """\
kind: toy
launcher: ["toy-server"]
toy_version: "1.2"
timeouts: {}
"""

TOY_SWEEP = """\
name: toy_sweep
description: a sweep of the toy engine's knobs
objective: toy_tok_s
direction: maximize
mode: search
baseline: {batch: 1, mode: steady}
seed_each_level_of: [mode]
params:
  batch: {type: int, low: 1, high: 16}
  mode: {type: categorical, choices: [steady, fast]}
budget: {trials: 8, max_asks: 60}
sampler: {name: tpe, seed: 0, n_startup_trials: 4}
confirm: {top_k: 0}
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The toy backend's module in a temporary directory on ``tasks.backends``' search path, its
    YAML (and a sweep of its knobs) in a temporary Hydra config dir; returns that config dir."""
    plugins, conf = tmp_path / "plugins", tmp_path / "conf"
    plugins.mkdir()
    (plugins / "toy.py").write_text(TOY_MODULE)
    (conf / "backend").mkdir(parents=True)
    (conf / "backend" / "toy.yaml").write_text(TOY_YAML)
    (conf / "sweep").mkdir()
    (conf / "sweep" / "toy_sweep.yaml").write_text(TOY_SWEEP)
    monkeypatch.setattr(tasks.backends, "__path__", list(tasks.backends.__path__))  # restored after the test
    monkeypatch.setenv(tasks.backends.PATH_ENV, str(plugins))
    yield conf
    sys.modules.pop("tasks.backends.toy", None)


def _toy_spec(conf: Path, tmp_path: Path, extra: list[str] = ()):
    store = tmp_path / "store"
    return load_spec(compose_cfg([f"hydra.searchpath=[file://{conf}]", "backend=toy", "sweep=toy_sweep",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}",
                                  *extra]))


def test_a_new_backend_is_its_module_and_its_yaml(toy, tmp_path):
    from sweeps.app.inprocess import run_in_process
    from sweeps.store import records

    assert "toy" in tasks.backends.available_backends()
    spec = _toy_spec(toy, tmp_path)
    assert spec.backend.toy_version == "1.2"  # the backend's own version field, no field in sweeps/
    assert "toy_tok_s" in logged_metrics(spec) and "decode_tok_s" not in logged_metrics(spec)
    drv = run_in_process(spec, track=True)
    recs = records.load_records(drv.study)
    ok = [r for r in recs if r.status == "ok"]
    assert len(ok) >= 6, [(r.number, r.status, r.failure_class) for r in recs]
    assert {r.params["mode"] for r in ok} == {"steady", "fast"}
    assert all(r.launch_command.startswith("toy-server --batch") and "--version 1.2" in r.launch_command for r in ok)
    best = records.best_record(recs, spec.objective_set)
    assert best.params["mode"] == "fast" and best.metrics["toy_tok_s"] == max(r.metrics["toy_tok_s"] for r in ok)
    # MLflow: every finite metric the trial returned, under a name MLflow takes
    from mlflow.tracking import MlflowClient

    client = MlflowClient(spec.mlflow_uri)
    exp = client.get_experiment_by_name(spec.sweep.name)
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("trial_key")]
    assert len(runs) == len(ok)
    for run in runs:
        m = run.data.metrics
        assert {"toy_tok_s", "toy_latency_ms", "toy_queue_depth_max", "toy p99_1s"} <= set(m), sorted(m)
        assert "toy_unmeasured" not in m
        assert m["toy_queue_depth_max"] == float(run.data.params["batch"])


def test_the_new_backend_refuses_a_metric_it_does_not_log(toy, tmp_path):
    with pytest.raises(ConfigError) as e:
        _toy_spec(toy, tmp_path, ["sweep.objective=decode_tok_s"])
    msg = str(e.value)
    assert "sweep.objective: 'decode_tok_s' is not a metric this sweep's trials log" in msg
    assert "backend=toy" in msg and "toy_tok_s" in msg and "toy_latency_ms" in msg
    with pytest.raises(ConfigError, match=r"backend\.sglang_version: not a field of backend=toy \(its engine "
                                          r"version is backend\.toy_version\)"):
        _toy_spec(toy, tmp_path, ["+backend.sglang_version=0.5.23"])


def test_a_misspelled_objective_is_refused_before_ray_starts(tmp_path):
    store = tmp_path / "store"
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "backend=instant", "sweep=smoke", "sweep.objective=decode_tok_z",
           f"tracking.store_dir={store}", f"tracking.findings_dir={tmp_path / 'findings'}"]
    r = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "sweep.objective: 'decode_tok_z' is not a metric this sweep's trials log" in r.stderr, r.stderr[-2000:]
    for metric in ("decode_tok_s", "output_tok_s", "ttft_ms_p50", "itl_ms_p99", "speedup_vs_baseline"):
        assert f"'{metric}'" in r.stderr  # the list of what backend=instant logs
    assert "nothing was started" in r.stderr and "Traceback" not in r.stderr
    assert "Started a local Ray instance" not in r.stdout + r.stderr
    assert not store.exists() or not any(store.iterdir())  # no study, no MLflow run, no rule


@pytest.mark.parametrize("extra,name,listed", [
    (["sweep.objective=max_rate_at_slo_req_s"], None, None),  # the load search's (bench=goodput-style)
    (["sweep.objective=cost_usd_per_mtok"], "cost_usd_per_mtok", "set node.gpu_hour_usd"),
    (["sweep.objective_constraints=['ttft_ms_p99 <= 100']"], "ttft_ms_p99", "'ttft_ms_p50'"),
    (["sweep.objective_constraints=['ttft_ms_p50 <= 100']"], None, None),
])
def test_objective_names_are_checked_against_what_the_bench_logs(extra, name, listed):
    bench = ["bench=chat_goodput"] if "max_rate" in extra[0] else []
    cfg = compose_cfg(["backend=instant", "sweep=smoke", *bench, *extra])
    if name is None:
        assert load_spec(cfg)
        return
    with pytest.raises(ConfigError) as e:
        load_spec(cfg)
    assert f"'{name}' is not a metric this sweep's trials log" in str(e.value) and listed in str(e.value)


def test_declared_metrics_cover_what_instant_trials_return(tmp_path):
    """A valid objective is never refused: what a trial returns is within the backend's declared
    metrics, for the fixed benchmark, a load search and concurrency levels."""
    from sweeps.app.inprocess import run_in_process

    for bench in ("decode_single_stream", "chat_goodput", "concurrency_sweep"):
        spec = load_spec(compose_cfg(["backend=instant", "sweep=smoke", f"bench={bench}", "sweep.budget.trials=2",
                                      "sweep.confirm.top_k=0", f"tracking.store_dir={tmp_path / bench}"]))
        drv = run_in_process(spec)
        from sweeps.store import records

        got = set().union(*(r.metrics for r in records.load_records(drv.study) if r.status == "ok"))
        assert got and got <= logged_metrics(spec), (bench, sorted(got - logged_metrics(spec)))


def test_mlflow_metrics_keeps_every_finite_metric_under_a_valid_name():
    from sweeps.store.tracking import mlflow_metrics

    got = mlflow_metrics({"decode_tok_s": 80.0, "output_tok_s_c16": 1.5e3, "a@b": 1, "x" * 300: 2.0,
                          "bad": math.inf, "none": None, "text": "n/a", "a//b": 3.0, "flag": True})
    assert got["decode_tok_s"] == 80.0 and got["output_tok_s_c16"] == 1500.0
    assert got["a_b"] == 1.0 and got["x" * 250] == 2.0 and got["a__b"] == 3.0 and got["flag"] == 1.0
    assert not {"bad", "none", "text"} & set(got)
