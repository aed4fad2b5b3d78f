"""How a sweep ends: one exception -> exit-code table (sweeps/errors.py), only the entry points
exit, ``run()`` returns the objective's value, and a sweep that measured nothing says so (exit 3,
a FAILED MLflow parent with ``sweep_outcome``, one line naming the failure classes and the next step).

The in-process cases run :func:`sweeps.app.driver.run` with the ``instant`` backend and an
in-process driver (no Ray); one slow case runs ``run_sweep.py`` itself for exit code 3. The other
codes' entry-point tests: 0 and 1 tests/test_sweep_e2e.py, 2 tests/test_bad_input.py, 130
tests/test_interrupt.py; the emulated all-failing/stalling/timeout sweeps tests/test_failed_sweeps.py.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from sweeps import errors
from sweeps.app.driver import run
from sweeps.app.inprocess import InProcessDriver
from sweeps.config.spec import ConfigError
from sweeps.errors import EXIT_CODES, ConfigurationError, Interrupted, NothingMeasured, SweepError, exit_code
from tests.conftest import REPO, compose_cfg

#: every config of this space fails at startup on the emulated RTX PRO 6000 node (SM120 has no
#: FlashInfer allreduce fusion: a deterministic class, learned as a rule after the first launch)
ALL_FAIL = ["sweep.params.allreduce.choices=[flashinfer_fusion]", "sweep.seed_each_level_of=[]",
            "sweep.baseline.allreduce=flashinfer_fusion"]
#: the baseline fails the same way, every other config of the smoke space is measured
BASELINE_FAILS = ["sweep.baseline.allreduce=flashinfer_fusion"]


def _cfg(tmp_path: Path, *extra: str):
    return compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.trials=4", "sweep.confirm.top_k=0",
                        f"tracking.store_dir={tmp_path / 'store'}", f"tracking.findings_dir={tmp_path / 'findings'}",
                        *extra])


def _in_process(track: bool = False, findings: bool = False):
    return partial(InProcessDriver, track=track, findings=findings)


# ---- the table ----------------------------------------------------------------------------------
def test_every_kind_of_error_has_its_code():
    from sweeps.run.cluster import RayUnavailable
    from sweeps.run.engine_check import PreflightFailed
    from sweeps.run.stores import StoreError
    from sweeps.search.load_objective import ObjectiveMissing
    from sweeps.store.lease import LeaseHeld, LeaseLost  # noqa: F401 - LeaseLost is internal (abandon -> 1)
    from sweeps.store.mlflow_access import MlflowDenied, NotMlflow
    from sweeps.store.retry import StoreWriteError
    from sweeps.store.study import StudyInUse
    from sweeps.store.tracking import MlflowStoreBroken

    twos = [ConfigError("x"), MlflowDenied("x"), NotMlflow("x"), StudyInUse("x"), StoreError("x"),
            ObjectiveMissing("x"), PreflightFailed("x"), MlflowStoreBroken("x"),
            LeaseHeld.__new__(LeaseHeld)]
    assert [exit_code(e) for e in twos] == [2] * len(twos)
    ones = (SweepError("x"), RayUnavailable("x"), StoreWriteError("x", 1.0, "database is locked"))
    assert [exit_code(e) for e in ones] == [1, 1, 1]
    assert exit_code(NothingMeasured("x")) == 3
    assert exit_code(Interrupted("")) == 130 and exit_code(KeyboardInterrupt()) == 130
    assert exit_code(ValueError("a bug")) is None  # not ours: the entry point keeps the traceback


def test_the_readme_lists_every_exit_code():
    text = (REPO / "README.md").read_text()
    section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    listed = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    assert listed == {errors.EXIT_OK} | {code for _, code, _ in EXIT_CODES}, listed


def test_errors_is_the_ground_floor():
    tree = ast.parse((REPO / "sweeps" / "errors.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
        [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("sweeps")], imported


def _exits(path: Path) -> list[str]:
    """``sys.exit(...)`` calls and ``raise SystemExit`` outside a ``main`` function, the
    ``if __name__ == "__main__"`` block and a package's ``__main__.py`` (entry points all)."""
    if path.name == "__main__.py":
        return []
    tree = ast.parse(path.read_text())
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "main" or \
                isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            allowed |= {id(n) for n in ast.walk(node)}
    bad = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit", "os._exit"):
            bad.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc):
            bad.append(f"{path.name}:{node.lineno}")
    return bad


def test_only_the_entry_points_exit():
    bad = [b for p in sorted((REPO / "sweeps").rglob("*.py")) for b in _exits(p)]
    assert bad == [], f"sys.exit outside an entry point's main: {bad}"
    assert _exits(REPO / "run_sweep.py") == []


# ---- run() returns the objective's value ------------------------------------------------------------
def test_run_returns_the_objective_not_decode_tok_s(tmp_path):
    """Regression: run() returned the best trial's decode tok/s whatever the objective."""
    import optuna

    from sweeps.config.objective import Objective
    from sweeps.store.records import best_record, load_records, rankable

    got = run(_cfg(tmp_path, "sweep.objective=ttft_ms_p50", "sweep.direction=minimize"), _in_process())
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path / 'store' / 'optuna.db'}")
    recs = load_records(study)
    ttft = Objective("ttft_ms_p50", "minimize")
    best = best_record(recs, ttft)
    assert best is not None and isinstance(got, float)
    assert got == best.metrics["ttft_ms_p50"], (got, best.metrics)
    assert got != best.metrics["decode_tok_s"]
    assert got == min(r.metrics["ttft_ms_p50"] for r in recs if rankable(r, ttft))  # the best by TTFT
    from sweeps.config.spec import load_spec
    from sweeps.publish.outcome import MEASURED, sweep_outcome

    assert sweep_outcome(recs, load_spec(_cfg(tmp_path)), "smoke").kind == MEASURED  # baseline measured too


def test_run_returns_one_value_per_objective_of_a_multi_objective_study(tmp_path):
    got = run(_cfg(tmp_path, "sweep.objective=[decode_tok_s,ttft_ms_p50]", "sweep.direction=[maximize,minimize]"),
              _in_process())
    assert isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, float) for v in got), got
    assert got[0] > 10 and got[1] > 0 and got[0] != got[1]


def test_a_config_error_is_raised_not_exited():
    with pytest.raises(ConfigurationError, match="sweep.params.allreduce.choices") as e:
        run(compose_cfg(["sweep=smoke", "sweep.params.allreduce.choices=[]"]))
    assert exit_code(e.value) == 2 and "nothing was started" in str(e.value)


# ---- a sweep that measured nothing ----------------------------------------------------------------
def _parent(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    exp = c.get_experiment_by_name("smoke")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`servesweep.role` = 'study'")
    assert len(runs) == 1, [r.data.tags for r in runs]
    return runs[0]


def test_an_all_failing_sweep_says_why_and_fails_its_parent(tmp_path, capfd):
    with pytest.raises(NothingMeasured) as e:
        run(_cfg(tmp_path, *ALL_FAIL), _in_process(track=True, findings=True))
    line = str(e.value)
    assert exit_code(e.value) == 3
    assert "\n" not in line and line.startswith("nothing was measured:"), line
    assert "flashinfer_allreduce_fusion_unsupported_arch" in line and "the baseline too" in line, line
    assert "Next:" in line and "sweep.params" in line, line  # deterministic: widen the space
    out, err = capfd.readouterr()
    assert "There are no complete trials" not in out + err
    assert line in out  # the summary's last line
    assert "best configurations" not in out  # no empty table
    parent = _parent(tmp_path)
    assert parent.info.status == "FAILED"
    assert parent.data.tags["sweep_outcome"] == "nothing_measured"
    assert parent.data.tags["sweep_outcome_reason"] == line


def test_a_wall_time_budget_spent_before_any_launch_is_named(tmp_path, capfd):
    # the adversarial case: sweep.budget.wall_time_s=12 spent on startup; the next step is that
    # budget, not the known dead ends
    with pytest.raises(NothingMeasured) as e:
        run(_cfg(tmp_path, "sweep.budget.wall_time_s=0.001"), _in_process(track=True))
    line = str(e.value)
    assert exit_code(e.value) == 3 and "no trial was launched" in line, line
    assert "Next: wall-time budget spent (0 s) before any launch" in line and "raise sweep.budget.wall_time_s" in line, line
    assert "dead ends" not in line, line
    assert line in capfd.readouterr().out  # the summary's last line says the same
    assert _parent(tmp_path).data.tags["sweep_outcome_reason"] == line


def test_a_failed_baseline_says_its_speedups_are_missing(tmp_path, capfd):
    import optuna

    from sweeps.config.spec import load_spec
    from sweeps.publish.outcome import NO_BASELINE, sweep_outcome
    from sweeps.store.records import load_records

    cfg = _cfg(tmp_path, *BASELINE_FAILS)
    got = run(cfg, _in_process())
    assert isinstance(got, float) and got > 10  # the others were measured: a result, exit 0
    out, _ = capfd.readouterr()
    last = out.strip().splitlines()[-1]
    assert last.startswith("speedups vs the baseline are missing") and "flashinfer_allreduce_fusion_unsupported_arch" \
        in last, last
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path / 'store' / 'optuna.db'}")
    assert sweep_outcome(load_records(study), load_spec(cfg), "smoke").kind == NO_BASELINE  # the parent's tag


@pytest.mark.slow  # a local Ray: ~30 s on 2 cores, minutes when they are shared
def test_run_sweep_exits_3_when_nothing_was_measured(tmp_path):
    """The entry point: exit code 3, the one line on stderr, no traceback."""
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "backend=instant", "sweep=smoke", "sweep.budget.trials=3",
           "sweep.confirm.top_k=0", f"tracking.store_dir={tmp_path / 'store'}",
           f"tracking.findings_dir={tmp_path / 'findings'}", "+backend.env.HF_TOKEN=hf_s3cr3t", *ALL_FAIL]
    r = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "There are no complete trials" not in r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("servesweep: nothing was measured:") and "Next:" in last, last
    # the run's overrides are kept on the study for the findings' next-step commands, the secret masked
    import optuna

    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path / 'store' / 'optuna.db'}")
    kept = study.user_attrs["run_overrides"]
    assert kept[:3] == ["backend=instant", "sweep=smoke", "sweep.budget.trials=3"] and "+backend.env.HF_TOKEN=***" in kept
    assert not any("hf_s3cr3t" in o for o in kept)


def test_an_unreachable_optuna_database_is_one_line_exit_2_without_its_password(tmp_path):
    """A PostgreSQL storage that refuses the connection stops before anything starts: one
    ``servesweep:`` line naming the setting and the cause, exit 2, the password masked."""
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, str(REPO / "run_sweep.py"), "backend=instant", "sweep=smoke",
                        f"tracking.optuna_storage=postgresql+psycopg://u:s3cr3tpw@127.0.0.1:{port}/x",
                        f"tracking.store_dir={tmp_path / 'store'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    err = r.stderr + r.stdout
    assert r.returncode == 2 and "Traceback" not in err, err[-3000:]
    line = next(ln for ln in err.splitlines() if ln.startswith("servesweep:"))
    assert "tracking.optuna_storage" in line and "Connection refused" in line and "***" in line
    assert "s3cr3tpw" not in err and not any("s3cr3tpw" in p.read_text(errors="replace")
                                            for p in tmp_path.rglob("*") if p.is_file())


def test_a_sweep_interrupted_before_any_trial_finished_says_so_and_resumes(tmp_path):
    """Its only launch was interrupted: the line says no trial finished and one was re-queued (not
    'no trial was launched' beside a count of one launch), and the next step is the same command."""
    from sweeps.config.spec import load_spec
    from sweeps.publish.outcome import NOTHING_MEASURED, sweep_outcome
    from sweeps.store.records import TrialRecord

    recs = [TrialRecord(0, "COMPLETE", {"allreduce": "nccl"}, "interrupted", {}, is_baseline=True)]
    out = sweep_outcome(recs, load_spec(_cfg(tmp_path)), "smoke")
    assert out.kind == NOTHING_MEASURED and out.line is not None
    assert "no trial finished: 1 interrupted when the sweep stopped" in out.line, out.line
    assert "no trial was launched" not in out.line and "Next: run the same command again" in out.line, out.line
