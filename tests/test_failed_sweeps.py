"""Sweeps in which nothing was measured, on the emulated node with a fault injected into every
launch (``backend.emulator.fault``): every startup crashing, every stream stalling, every
startup timing out. Each ends with exit code 3 (:class:`sweeps.errors.NothingMeasured`), a FAILED
MLflow parent tagged ``sweep_outcome=nothing_measured`` and one line naming the class and the
next step. Real server processes: a trial budget of 1 (the baseline, retried once when its
class is transient) keeps each case to a few launches.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from sweeps.app.driver import run
from sweeps.app.inprocess import InProcessDriver
from sweeps.errors import NothingMeasured, exit_code
from tests.conftest import compose_cfg
from tests.procs import trial_processes
from tests.test_exit_codes import _parent

pytestmark = pytest.mark.slow  # emulated server launches: 55-130 s a case measured on 2 cores at load average ~13


def _cfg(tmp_path: Path, fault: str, *extra: str):
    return compose_cfg([
        "backend=emulated", "sweep=smoke", "sweep.budget.wall_time_s=null", "sweep.budget.trials=1",
        "sweep.confirm.top_k=0", f"+backend.emulator.fault={fault}", "backend.emulator.time_scale=0.002",
        "bench.output_len=32", "bench.repeats=2", "bench.warmup_output_len=4", "backend.timeouts.term_grace_s=1",
        f"tracking.store_dir={tmp_path / 'store'}", f"tracking.findings_dir={tmp_path / 'findings'}", *extra])


@pytest.mark.parametrize("fault, startup_s, cls, step", [
    ("crash_startup", 60, "unknown", "server logs"),
    ("stall_bench", 60, "bench_stall", "stopped streaming"),  # a stream silent for request_timeout_s
    ("hang_startup", 4, "startup_timeout", "backend.timeouts.startup_s=4 s"),
])
def test_a_sweep_that_measured_nothing_ends_with_exit_3_and_says_why(tmp_path, capfd, fault, startup_s, cls, step):
    cfg = _cfg(tmp_path, fault, "bench.request_timeout_s=2", f"backend.timeouts.startup_s={startup_s}")
    with pytest.raises(NothingMeasured) as e:
        run(cfg, partial(InProcessDriver, track=True, findings=True))
    line = str(e.value)
    assert exit_code(e.value) == 3
    assert line.startswith("nothing was measured:") and "\n" not in line, line
    assert f"{cls} x" in line and "the baseline too" in line and step in line, line
    assert str(tmp_path / "store" / "trials" / "smoke") in line  # where the server logs are
    out, err = capfd.readouterr()
    assert line in out and "There are no complete trials" not in out + err
    parent = _parent(tmp_path)
    assert parent.info.status == "FAILED" and parent.data.tags["sweep_outcome"] == "nothing_measured"
    assert trial_processes(tmp_path / "store") == []
