"""Bad input of every kind: a clear error naming the problem, a non-zero exit, and nothing
created or lost (no study, no MLflow run, no failure rule learned from it). Knob values reach
the server as argv elements only: a value like ``"1; rm -rf /"`` is just a bad value."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.app.driver import emulator_profile
from sweeps.config.spec import backend_dict, load_spec
from tasks.backends.sglang.knobs import render_launch
from tasks.trial import run_trial
from tasks.types import BenchSpec, Timeouts, TrialSpec
from tests.conftest import REPO, compose_cfg
from tests.waiting import holds_for


def _sweep(tmp_path: Path, extra: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    store = tmp_path / "store"
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "sweep=smoke", f"tracking.store_dir={store}",
           f"tracking.findings_dir={tmp_path / 'findings'}", *extra]
    return subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)


def _nothing_created(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for name in ("optuna.db", "mlflow.db", "servesweep.db"):
        assert not (store / name).exists(), f"{name} was created for a bad input"


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    d = tmp_path / "conf" / "sweep"
    d.mkdir(parents=True)
    (d / "broken.yaml").write_text("name: broken\nparams: {a: [1, 2\n")
    r = _sweep(tmp_path, ["sweep=broken", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"])
    assert r.returncode != 0
    assert "broken.yaml" in r.stderr and "line" in r.stderr
    _nothing_created(tmp_path)


def test_unknown_group_lists_the_options(tmp_path):
    r = _sweep(tmp_path, ["sweep=no_such_sweep"])
    assert r.returncode != 0
    assert "no_such_sweep" in r.stderr and "smoke" in r.stderr  # Hydra lists the available options
    _nothing_created(tmp_path)


@pytest.mark.parametrize("override,field", [
    ("bench.repeats=0", "bench.repeats"),
    ("backend.tp_size=16", "backend.tp_size"),
    ("sweep.params.allreduce.choices=[]", "sweep.params.allreduce.choices"),
])
def test_out_of_range_values_name_the_field(tmp_path, override, field):
    r = _sweep(tmp_path, [override])
    assert r.returncode == 2 and field in r.stderr and "nothing was started" in r.stderr, r.stderr[-1500:]
    _nothing_created(tmp_path)


def test_constraints_that_exclude_everything(tmp_path):
    r = _sweep(tmp_path, ["sweep.constraints=[{name:never,expr:'cuda_graph_max_bs<0'}]"])
    assert r.returncode == 2
    assert "no config in the space satisfies every constraint" in r.stderr
    _nothing_created(tmp_path)


def test_missing_launcher_stops_before_any_trial(tmp_path):
    r = _sweep(tmp_path, ["backend.launcher=[/nonexistent/sglang]"])
    assert r.returncode == 1
    assert "'/nonexistent/sglang' is not an executable on PATH" in r.stderr
    _nothing_created(tmp_path)  # above all: no cli_arg_error rule learned for every config


def test_unwritable_store(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    store = blocker / "store"  # parent is a regular file: mkdir fails even as root
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "sweep=smoke", f"tracking.store_dir={store}",
           f"tracking.findings_dir={tmp_path / 'findings'}"]
    r = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2  # the README's row for a store that takes no write: nothing was measured
    assert f"cannot write to {store}" in r.stderr and "tracking.store_dir" in r.stderr
    assert "fix its permissions" in r.stderr  # ENOTDIR: not a full disk


@pytest.mark.parametrize("override, field", [("backend.emulator.time_scale=-1", "backend.emulator.time_scale"),
                                             ("backend.emulator.time_scale=abc", "backend.emulator.time_scale"),
                                             ("backend.emulator.seed=abc", "backend.emulator.seed")])
def test_a_bad_emulator_override_is_a_config_error(override, field):
    from sweeps.config.spec import ConfigError

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_spec(compose_cfg([override]))


def test_an_optuna_storage_in_a_new_directory_is_created(tmp_path):
    from sweeps.store.study import open_study

    db = tmp_path / "not" / "yet" / "optuna.db"
    spec = load_spec(compose_cfg(["backend=instant", f"tracking.store_dir={tmp_path / 'store'}",
                                  f"tracking.optuna_storage=sqlite:///{db}"]))
    assert open_study(spec).study_name == spec.study and db.exists()


@pytest.mark.slow
def test_unreachable_ray_address(tmp_path):
    t0 = time.monotonic()
    r = _sweep(tmp_path, ["ray.address=127.0.0.1:1"], timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "127.0.0.1:1" in r.stderr and "ray.address" in r.stderr, r.stderr[-2000:]
    assert time.monotonic() - t0 < 170


INJECT = "1; touch {sentinel}"


def test_shell_metacharacters_in_a_knob_value_are_one_argv_element(tmp_path):
    spec = load_spec(compose_cfg(["backend.emulator.time_scale=0.002"]))
    sentinel = tmp_path / "pwned"
    bad = INJECT.format(sentinel=sentinel)
    params = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128, "mem_fraction_static": bad,
              "nccl_algo": f"Ring; touch {sentinel}"}
    argv, env, exp = render_launch(params, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    i = argv.index("--mem-fraction-static")
    assert argv[i + 1] == bad  # the whole value, one element, unquoted, never split
    assert env["NCCL_ALGO"] == f"Ring; touch {sentinel}"
    ts = TrialSpec(sweep="inject", trial_number=1, params=params, argv=argv, env=env, backend="emulated", gpus=8,
                   bench=BenchSpec(output_len=8, repeats=1), timeouts=Timeouts(startup_s=20, term_grace_s=1),
                   expected_paths=exp)
    res = run_trial(ts, emulator_profile(spec), str(tmp_path / "work"))
    # the server's own argument parser rejects the value: a bad value, nothing executed
    assert res.status == "failed" and res.failure_class == "cli_arg_error", (res.failure_class, res.log_tail)
    assert "--mem-fraction-static" in res.server_log
    holds_for(lambda: not sentinel.exists(), 0.5, what="no shell ran the injected command")
