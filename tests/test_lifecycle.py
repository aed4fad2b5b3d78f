"""The trial lifecycle (tasks.trial.run_trial) against the real emulated server process:
success, startup failure, crash mid-benchmark, stall, hang; nothing survives teardown."""

from __future__ import annotations

import sys
import time

import psutil
import pytest
from filelock import FileLock, Timeout

from sweeps.config.spec import backend_dict, load_spec
from tasks.backends import get_backend
from tasks.backends.sglang.knobs import render_launch
from tasks.server import PORT_LOCK_DIR, reserve_ports
from tasks.trial import run_trial
from tasks.types import BenchSpec, Timeouts, TrialSpec
from tests.conftest import compose_cfg
from tests.procs import trial_processes

FAST_BENCH = BenchSpec(input_len=16, output_len=32, warmup_requests=1, warmup_output_len=4, repeats=2,
                       request_timeout_s=3.0)


@pytest.fixture(scope="module")
def base():
    spec = load_spec(compose_cfg(["backend.emulator.time_scale=0.002"]))
    return spec, get_backend(spec.backend.kind).profile(spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))


def _trial(base, params, env=None, bench=FAST_BENCH, timeouts=None, tmp_path=None, **emu):
    spec, profile = base
    profile = {**profile, "emulator": {**profile["emulator"], **emu}}
    argv, renv, exp = render_launch(params, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    ts = TrialSpec(sweep="lifecycle", trial_number=7, params=params, argv=argv, env={**renv, **(env or {})},
                   backend="emulated", gpus=8, bench=bench,
                   timeouts=timeouts or Timeouts(startup_s=20, health_request_s=2, bench_s=30, term_grace_s=2),
                   expected_paths=exp)
    res = run_trial(ts, profile, str(tmp_path))
    time.sleep(0.2)
    return res, leftovers_of(tmp_path)


def leftovers_of(tmp_path) -> list[list[str]]:
    """Command lines of processes of this test's trial that are still alive."""
    out = []
    for p in trial_processes(tmp_path):
        try:
            out.append(p.cmdline())
        except psutil.Error:
            continue
    return out


NCCL = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}


def test_success_measures_and_leaves_nothing(base, tmp_path):
    res, left = _trial(base, NCCL, tmp_path=tmp_path)
    assert res.status == "ok", res.log_tail
    m = res.metrics
    assert 80 < m["decode_tok_s"] < 100  # calibrated 89.5 tok/s, 1-2 % noise
    assert m["ttft_ms_p50"] > 0 and m["itl_ms_p50"] > 0 and m["accept_length"] == 1.0
    assert res.startup_s > 0 and res.bench_s > 0 and res.gpu_s == pytest.approx(res.wall_s * 8)
    assert "--port" in res.launch_command and "--nccl-port" in res.launch_command
    assert res.fingerprint.get("gpu_arch") and "ready to roll" in res.server_log
    assert left == []


def test_startup_failure_is_classified(base, tmp_path):
    res, left = _trial(base, {**NCCL, "allreduce": "flashinfer_fusion"}, tmp_path=tmp_path)
    assert res.status == "failed"
    assert res.failure_class == "flashinfer_allreduce_fusion_unsupported_arch"
    assert res.failure_kind == "deterministic" and res.phase == "startup"
    assert "[<N>, <N>]" in res.failure_signature or "<N>" in res.failure_signature
    assert left == []


def test_crash_mid_benchmark(base, tmp_path):
    res, left = _trial(base, NCCL, env={"SERVESWEEP_EMULATOR_FAULT": "crash_bench"}, tmp_path=tmp_path)
    assert res.status == "failed" and res.phase == "bench"
    # the emulator's crash prints a CUDA illegal-address error: a specific class beats server_crash
    assert res.failure_class in ("server_crash", "cuda_illegal_memory_access"), res.failure_class
    assert res.failure_kind == "transient"
    assert left == []


def test_stall_mid_benchmark_is_bench_stall(base, tmp_path):
    res, left = _trial(base, NCCL, env={"SERVESWEEP_EMULATOR_FAULT": "stall_bench"}, tmp_path=tmp_path)
    assert res.status == "failed" and res.failure_class == "bench_stall" and res.phase == "bench"
    assert left == []


def test_hang_before_healthy_is_startup_timeout(base, tmp_path):
    res, left = _trial(base, NCCL, env={"SERVESWEEP_EMULATOR_FAULT": "hang_startup"}, tmp_path=tmp_path,
                       timeouts=Timeouts(startup_s=3, health_request_s=1, bench_s=10, term_grace_s=1))
    assert res.status == "failed" and res.failure_class == "startup_timeout" and res.phase == "startup"
    assert left == []


def test_sigterm_ignored_still_torn_down(base, tmp_path):
    res, left = _trial(base, NCCL, env={"SERVESWEEP_EMULATOR_FAULT": "ignore_sigterm"}, tmp_path=tmp_path)
    assert res.status == "ok"
    assert left == []


def test_missing_launcher_is_a_clear_failure(base, tmp_path):
    spec, profile = base
    ts = TrialSpec(sweep="lifecycle", trial_number=1, params=NCCL, argv=["/nonexistent/launcher", "--tp-size", "8"],
                   env={}, bench=FAST_BENCH, timeouts=Timeouts(startup_s=5, term_grace_s=1))
    res = run_trial(ts, profile, str(tmp_path))
    assert res.status == "failed" and res.failure_class == "cli_arg_error"
    assert "launcher not found" in res.server_log


def test_reserved_ports_are_distinct_and_exclusive():
    with reserve_ports(3) as a, reserve_ports(3) as b:
        assert len(set(a)) == 3 and not set(a) & set(b)
        with pytest.raises(Timeout):  # held: another reservation cannot take it
            FileLock(PORT_LOCK_DIR / f"{a[0]}.lock", timeout=0).acquire()
    lock = FileLock(PORT_LOCK_DIR / f"{a[0]}.lock", timeout=0)
    lock.acquire()  # released when the block ends
    lock.release()


def test_renamed_flag_version_serves(tmp_path):
    """SGLang 0.5.20 (--cuda-graph-max-bs-decode, no old alias): the emulated server takes the
    rendered launch and serves, through the whole lifecycle."""
    spec = load_spec(compose_cfg(["backend.emulator.time_scale=0.002", "backend.sglang_version=0.5.20"]))
    be = get_backend("emulated")
    profile = be.profile(spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    res, left = _trial((spec, profile), NCCL, tmp_path=tmp_path)
    assert res.status == "ok", (res.failure_class, res.log_tail[-600:])
    assert "--cuda-graph-max-bs-decode 128" in res.launch_command
    assert left == []


def test_benchmark_time_limit_is_enforced(base, tmp_path):
    long = BenchSpec(input_len=16, output_len=400, warmup_requests=0, repeats=3, request_timeout_s=30.0)
    t0 = time.monotonic()
    res, left = _trial(base, NCCL, bench=long, tmp_path=tmp_path,
                       timeouts=Timeouts(startup_s=20, health_request_s=2, bench_s=2.0, term_grace_s=2))
    assert res.status == "failed" and res.failure_class == "bench_stall" and res.phase == "bench"
    assert "bench_s" in res.server_log
    assert time.monotonic() - t0 < 15  # 3 x 400 tokens at ~90 tok/s would take ~13 s of benchmark alone
    assert left == []


# A server whose streams go silent and who, SIGTERMed, prints a decisive crash line: what it
# writes while being torn down must not turn the stall the benchmark saw into a crash.
_SILENT_THEN_LOUD = r'''
import json, signal, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def loud(*_):
    print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
    sys.exit(1)

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200); self.end_headers()
        if not body.get("stream"):
            self.wfile.write(b'{"text": "x", "meta_info": {}}'); return
        time.sleep(3600)
    def log_message(self, *a):
        pass

signal.signal(signal.SIGTERM, loud)
port = int(sys.argv[sys.argv.index("--port") + 1])
print("The server is fired up and ready to roll!", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_what_the_server_says_while_torn_down_is_not_evidence(base, tmp_path):
    spec, profile = base
    script = tmp_path / "silent_then_loud.py"
    script.write_text(_SILENT_THEN_LOUD)
    ts = TrialSpec(sweep="lifecycle", trial_number=2, params=NCCL, argv=[sys.executable, str(script)],
                   env={}, backend="sglang", bench=FAST_BENCH, timeouts=Timeouts(startup_s=10, term_grace_s=2))
    res = run_trial(ts, None, str(tmp_path))
    assert (res.status, res.failure_class, res.phase) == ("failed", "bench_stall", "bench"), res.failure_signature
    assert "illegal memory access" in res.server_log  # kept for the reader, not used as evidence


# A server that fails by itself at startup: the parent exits at once, its engine child (busy
# finishing its own crash, deaf to SIGTERM) prints the decisive NCCL line a moment later.
_EXITS_CHILD_SPEAKS_LATE = r'''
import subprocess, sys
# The parent exits only once its child ignores SIGTERM: a child still starting its interpreter
# when teardown's SIGTERM arrives would die of it and never say its late line.
CHILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('child ignores SIGTERM', flush=True)
sys.stdout.close()
time.sleep(1.0)
print('NCCL WARN Error : no algorithm/protocol available for function AllGather with datatype '
      'ncclBfloat16. NCCL_ALGO was set to Tree.', file=sys.stderr, flush=True)
"""
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE)
child.stdout.readline()
print("scheduler died during init, exiting", flush=True)
sys.exit(1)
'''


def test_a_server_that_exited_by_itself_keeps_its_childrens_late_lines(base, tmp_path):
    script = tmp_path / "exits_child_speaks_late.py"
    script.write_text(_EXITS_CHILD_SPEAKS_LATE)
    ts = TrialSpec(sweep="lifecycle", trial_number=3, params=NCCL, argv=[sys.executable, str(script)],
                   env={}, backend="sglang", bench=FAST_BENCH, timeouts=Timeouts(startup_s=10, term_grace_s=3))
    res = run_trial(ts, None, str(tmp_path))
    assert (res.status, res.failure_class, res.phase) == ("failed", "nccl_env_algo_proto_invalid", "startup"), (
        res.failure_class, res.failure_signature, res.log_tail)
    assert res.failure_kind == "deterministic"


def test_a_port_whose_server_closed_its_connections_is_free():
    """The server side of a connection the server closed sits in TIME_WAIT on its port: not bound."""
    import socket

    from tasks.server import port_is_free

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    assert not port_is_free(port)  # listening
    conn.close()  # the server closes first: its side goes to TIME_WAIT
    cli.recv(1)
    cli.close()
    srv.close()
    plain = socket.socket()
    with pytest.raises(OSError):  # what a bind without SO_REUSEADDR makes of it
        plain.bind(("127.0.0.1", port))
    plain.close()
    assert port_is_free(port)
