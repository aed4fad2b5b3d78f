"""Helpers to start the emulated server in tests, through the real lifecycle code.

The server is launched by :func:`tasks.server.launch` (argv list, own session, output to a
file, PR_SET_PDEATHSIG shim) on ports held by :func:`tasks.server.reserve_ports`, and torn
down by :meth:`tasks.server.ServerProcess.terminate` (SIGTERM -> grace -> SIGKILL to the
whole tree), exactly as a trial does. Example::

    with emulated_servers(tmp_path) as start:
        srv = start(baseline_flags(128), emulator={"time_scale": 0.002})
        srv.wait_healthy()                       # polls /health_generate, watches the process
        httpx.post(srv.base_url + "/generate", json=...)
    # every started server is terminated and its ports released here
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from tasks.emulator.profile import PROFILE_ENV, REPO_ROOT, default_profile, write_profile
from tasks.server import ServerProcess, launch, reserve_ports
from tasks.types import Timeouts

# Test deadlines (s): emulated startup at time_scale 0.002-0.02 takes 0.4-4 s.
TEST_TIMEOUTS = Timeouts(startup_s=30.0, health_request_s=1.0, bench_s=30.0, term_grace_s=2.0, gpu_release_s=0.0)

MODEL = "moonshotai/Kimi-K2.5"
NCCL_FLAGS = ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion"]
EAGLE_FLAGS = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "AQ-MedAI/Kimi-K25-eagle3",
               "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def baseline_flags(max_bs: int = 128, *extra: str) -> list[str]:
    """Campaign baseline flags (NCCL level, --cuda-graph-max-bs-decode ``max_bs``)."""
    return ["--model-path", MODEL, "--tp-size", "8", "--trust-remote-code", *NCCL_FLAGS,
            "--cuda-graph-max-bs-decode", str(max_bs), *extra]


def launch_emulated(workdir: Path, flags: list[str], ports: list[int], env: dict[str, str] | None = None,
                    emulator: dict | None = None, timeouts: Timeouts = TEST_TIMEOUTS) -> ServerProcess:
    """Write a profile JSON into ``workdir`` and start ``python -m tasks.emulator.server``
    with :func:`tasks.server.launch`.

    Args:
        workdir: directory for ``profile-<port>.json`` and ``server-<port>.log``.
        flags: SGLang flags without --host/--port/--nccl-port (added here).
        ports: (HTTP port, NCCL port), held by the caller (``tasks.server.reserve_ports``).
        env: extra environment (NCCL_ALGO, SERVESWEEP_EMULATOR_FAULT, ...).
        emulator: runtime profile overrides (default ``{"time_scale": 0.002, "noise": 0.0}``).
        timeouts: lifecycle deadlines for ``wait_healthy`` / ``terminate`` (s).

    Returns:
        the :class:`tasks.server.ServerProcess` (``proc``, ``base_url``, ``log_text()``).
    Raises:
        LifecycleError: the interpreter could not be started.
    """
    workdir = Path(workdir)
    port, nccl_port = ports[0], ports[1]
    prof = default_profile({"time_scale": 0.002, "noise": 0.0, **(emulator or {})})
    ppath = write_profile(prof, workdir / f"profile-{port}.json")
    pp = os.environ.get("PYTHONPATH")
    full_env = {PROFILE_ENV: ppath, "PYTHONPATH": str(REPO_ROOT) + (os.pathsep + pp if pp else ""), **(env or {})}
    argv = [sys.executable, "-m", "tasks.emulator.server", *flags, "--host", "127.0.0.1", "--port", str(port),
            "--nccl-port", str(nccl_port)]
    return launch(argv, full_env, workdir / f"server-{port}.log", timeouts, f"http://127.0.0.1:{port}")


@contextlib.contextmanager
def emulated_servers(workdir: Path, timeouts: Timeouts = TEST_TIMEOUTS) -> Iterator[Callable[..., ServerProcess]]:
    """A factory ``start(flags, env=None, emulator=None) -> ServerProcess``; on exit every
    started server is torn down with ``ServerProcess.terminate`` and its ports released."""
    started: list[ServerProcess] = []
    with contextlib.ExitStack() as stack:
        def start(flags: list[str], env: dict[str, str] | None = None, emulator: dict | None = None) -> ServerProcess:
            ports = stack.enter_context(reserve_ports(2))
            srv = launch_emulated(workdir, flags, ports, env=env, emulator=emulator, timeouts=timeouts)
            started.append(srv)
            return srv

        try:
            yield start
        finally:
            for srv in started:
                srv.terminate()
