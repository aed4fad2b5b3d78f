"""`run_sweep.py backend=sglang dry_run=true`: render + validate with SGLang's parser, launch nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

CONTRACT_PY = REPO / ".contract-venv" / "bin" / "python"


def _needs_contract_env():
    if not CONTRACT_PY.exists():
        msg = "contract venv missing: run `make contract-env` (SGLang 0.5.23's parser on CPU torch)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)


def _dry(tmp_path, *extra):
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "backend=sglang", "dry_run=true",
           f"tracking.store_dir={tmp_path / 'store'}", *extra]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    return r, time.monotonic() - t0


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_campaign_dry_run_validates_every_trial_quickly(tmp_path):
    _needs_contract_env()
    r, wall = _dry(tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert len(lines) >= 31 and all(ln.startswith("[valid] ") for ln in lines)
    assert "validated with SGLang's parser" in r.stdout
    assert any("--speculative-algorithm EAGLE3" in ln for ln in lines)
    assert any("NCCL_ALGO=Tree" in ln for ln in lines)
    assert wall < 30, f"dry run took {wall:.1f} s"
    assert not (tmp_path / "store").exists(), "a dry run must not create stores or start Ray"


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_dry_run_reports_a_flag_sglang_rejects(tmp_path):
    _needs_contract_env()
    r, _ = _dry(tmp_path, "dry_run_sample=3", "backend.extra_args=[--cuda-graph-max-bs,'64']")
    assert r.returncode == 2
    assert "REJECTED by SGLang's parser" in r.stdout and "--cuda-graph-max-bs" in r.stdout
