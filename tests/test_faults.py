"""Every emulator fault (SERVESWEEP_EMULATOR_FAULT) ends as the right failure class within
its timeout, and no process of the trial survives teardown.

A watcher thread records every process (pid + create time) whose environment points into
the test's trial directory while the trial runs (the server and the TP-rank children it
spawns inherit SERVESWEEP_EMULATOR_PROFILE); after ``run_trial`` returns, each of them
must be gone (psutil), whatever the lifecycle code itself believed it killed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from sweeps.app.driver import emulator_profile
from sweeps.config.spec import backend_dict, load_spec
from tasks.backends.sglang.knobs import render_launch
from tasks.reaper import POLL_S
from tasks.trial import run_trial
from tasks.types import BenchSpec, Timeouts, TrialSpec
from tests.conftest import compose_cfg

pytestmark = pytest.mark.slow  # ~45 s: ten real emulated server launches

NCCL = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}
# request_timeout_s is the stall deadline of one stream (a silent stream past it is bench_stall)
BENCH = BenchSpec(input_len=16, output_len=32, warmup_requests=1, warmup_output_len=4, repeats=2, request_timeout_s=2.0)
TIMEOUTS = Timeouts(startup_s=6, health_request_s=1, bench_s=20, term_grace_s=1, gpu_release_s=1)
# Slack on top of a fault's deadline: teardown SIGTERM->grace->SIGKILL (term_grace_s=1) plus
# the emulated startup at time_scale=0.002 (~2 s measured on 2 cores) and Python start-up.
SLACK_S = 6.0  # +2 s since the emulated server loads its shipped tokenizer (tasks/emulator/tokenizer_k25) at start
#: How long the reaper sidecar may outlive a trial: it notices the server's group is gone on its
#: next poll (tasks.reaper.POLL_S), which a loaded 2-core machine can delay by a few periods
REAPER_GRACE_S = 4 * POLL_S


@pytest.fixture(scope="module")
def base():
    spec = load_spec(compose_cfg(["backend.emulator.time_scale=0.002"]))
    return spec, emulator_profile(spec)


@dataclass
class Watch:
    """Processes seen in a trial's tree: pid -> create_time."""

    root: Path
    seen: dict[int, float]
    stop: threading.Event

    def survivors(self, grace_s: float = REAPER_GRACE_S) -> list[tuple[int, list[str]]]:
        """The seen processes still alive ``grace_s`` after the trial returned: the reaper
        sidecar (tasks.reaper) exits on its next poll once the server's group is gone, so it
        gets its poll period and a loaded machine's scheduling delay; nothing else may outlive
        the trial at all."""
        deadline = time.monotonic() + grace_s
        while True:
            out = []
            for pid, ct in self.seen.items():
                try:
                    p = psutil.Process(pid)
                    if abs(p.create_time() - ct) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                        out.append((pid, p.cmdline()))
                except psutil.Error:
                    continue
            if not any("tasks.reaper" in cmd for _, c in out for cmd in c) or time.monotonic() >= deadline:
                return out
            time.sleep(0.1)


def _watch(root: Path) -> Watch:
    w = Watch(root, {}, threading.Event())
    marker = str(root)

    def loop() -> None:
        while not w.stop.is_set():
            for p in psutil.process_iter(["pid"]):
                try:
                    if marker in p.environ().get("SERVESWEEP_EMULATOR_PROFILE", ""):
                        w.seen.setdefault(p.pid, p.create_time())
                except psutil.Error:
                    continue
            time.sleep(0.05)

    threading.Thread(target=loop, daemon=True).start()
    return w


def _run(base, tmp_path: Path, fault: str | None, timeouts: Timeouts = TIMEOUTS, **emu):
    spec, profile = base
    profile = {**profile, "emulator": {**profile["emulator"], **emu}}
    argv, env, exp = render_launch(NCCL, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    if fault:
        env = {**env, "SERVESWEEP_EMULATOR_FAULT": fault}
    ts = TrialSpec(sweep="faults", trial_number=3, params=NCCL, argv=argv, env=env, backend="emulated", gpus=8,
                   bench=BENCH, timeouts=timeouts, expected_paths=exp)
    w = _watch(tmp_path)
    t0 = time.monotonic()
    try:
        res = run_trial(ts, profile, str(tmp_path))
    finally:
        elapsed = time.monotonic() - t0
        time.sleep(0.15)  # one more watcher pass
        w.stop.set()
    return res, elapsed, w


# fault -> (status, failure_class(es), phase, deadline_s: the timeout that bounds the trial)
CASES = {
    # crashes while loading weights: an unrecognised traceback -> unknown with its signature
    "crash_startup": ("failed", {"unknown"}, "startup", 0.0),
    # never healthy: the startup deadline ends it
    "hang_startup": ("failed", {"startup_timeout"}, "startup", TIMEOUTS.startup_s),
    # CUDA illegal address mid-stream: the specific class beats server_crash
    "crash_bench": ("failed", {"cuda_illegal_memory_access", "server_crash"}, "bench", 0.0),
    # the stream goes silent while the server stays up: the per-request stall deadline ends it
    "stall_bench": ("failed", {"bench_stall"}, "bench", BENCH.request_timeout_s),
    # exit code 0 before the benchmark finished
    "early_exit": ("failed", {"early_exit"}, "bench", 0.0),
    # binds its port 2 s after it says it is ready (within the startup deadline): still ok
    "late_bind": ("ok", {None}, None, 2.0),
    # SIGTERM ignored by the server and its ranks: SIGKILL after term_grace_s ends them
    "ignore_sigterm": ("ok", {None}, None, TIMEOUTS.term_grace_s),
}


@pytest.mark.parametrize("fault", list(CASES))
def test_fault_class_deadline_and_no_survivors(base, tmp_path, fault):
    status, classes, phase, deadline = CASES[fault]
    res, elapsed, w = _run(base, tmp_path, fault)
    assert res.status == status, (res.failure_class, res.failure_signature, res.log_tail[-1500:])
    assert res.failure_class in classes, (res.failure_class, res.failure_signature)
    if phase:
        assert res.phase == phase
        assert res.failure_kind == "transient"
    assert elapsed <= deadline + SLACK_S, f"{fault}: {elapsed:.1f} s > {deadline} + {SLACK_S} s"
    # the watcher saw the server and its two TP-rank children (a startup crash kills its ranks
    # within milliseconds: the polling watcher may see only the server), and none survived
    assert len(w.seen) >= (1 if fault == "crash_startup" else 3), w.seen
    assert w.survivors() == []


def test_late_bind_past_the_startup_deadline_is_startup_timeout(base, tmp_path):
    t = Timeouts(startup_s=3, health_request_s=1, bench_s=10, term_grace_s=1)
    res, elapsed, w = _run(base, tmp_path, "late_bind", timeouts=t, fault_after_s=30.0)
    assert res.status == "failed" and res.failure_class == "startup_timeout" and res.phase == "startup"
    assert elapsed <= t.startup_s + SLACK_S
    assert w.seen and w.survivors() == []


def test_early_exit_after_the_deadline_of_a_stall_is_not_a_stall(base, tmp_path):
    """An early exit some time into the benchmark (fault_after_s) is still early_exit, with
    the exit code 0 observed (the client sees the socket close before the exit is reaped)."""
    res, _, w = _run(base, tmp_path, "early_exit", fault_after_s=0.3)
    assert res.failure_class == "early_exit" and res.exit_code == 0, (res.failure_class, res.exit_code)
    assert w.survivors() == []


def test_no_fault_is_ok_and_leaves_nothing(base, tmp_path):
    res, elapsed, w = _run(base, tmp_path, None)
    assert res.status == "ok" and res.metrics["decode_tok_s"] > 0
    assert len(w.seen) >= 3 and w.survivors() == []
