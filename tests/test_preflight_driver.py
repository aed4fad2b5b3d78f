"""Preflight through the driver: a real backend that cannot run here stops with exit 2 before
any trial, naming the field, and nothing is recorded (no study, no MLflow run, no rule)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CONTRACT_PY = REPO / ".contract-venv" / "bin" / "python"


def _sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    store = tmp_path / "store"
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "sweep=smoke", f"tracking.store_dir={store}",
           f"tracking.findings_dir={tmp_path / 'findings'}", *overrides]
    return subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _nothing_recorded(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for name in ("optuna.db", "mlflow.db", "servesweep.db"):
        assert not (store / name).exists(), f"{name} was created by a sweep that could not start"
    assert not (tmp_path / "findings").exists()


def test_sglang_backend_without_sglang_exits_2_naming_the_engine(tmp_path):
    r = _sweep(tmp_path, "backend=sglang")  # this venv has no SGLang (it lives in the contract venv only)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "preflight failed" in r.stderr and "backend.python" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    _nothing_recorded(tmp_path)


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
@pytest.mark.skipif(not CONTRACT_PY.exists(), reason="contract venv (SGLang's parser) missing: make contract-env")
def test_gpu_node_without_nvml_exits_2_naming_the_node(tmp_path):
    # SGLang imports in the contract venv, so the engine check passes and the GPU check is what stops it
    r = _sweep(tmp_path, "backend=sglang", f"backend.python={CONTRACT_PY}")
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "node: 'rtx_pro_6000x8' is a GPU node but" in r.stderr and "NVML" in r.stderr, r.stderr[-3000:]
    _nothing_recorded(tmp_path)


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_vllm_model_path_that_does_not_exist_exits_2_naming_model_path(tmp_path):
    r = _sweep(tmp_path, "backend=vllm", "node=local_cpu", "model=tiny_llama", "sweep=cpu_real",
               "model.path=/nonexistent")
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "model.path: '/nonexistent' does not exist" in r.stderr, r.stderr[-3000:]
    _nothing_recorded(tmp_path)
