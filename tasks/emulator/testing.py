"""Helpers to start the emulated server in tests (also usable by the lifecycle tests).

Example::

    srv = launch_emulated(tmp_path, flags=baseline_flags(128), emulator={"time_scale": 0.002})
    srv.wait_healthy()
    ... httpx.post(srv.url + "/generate", json=...) ...
    srv.stop()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tasks.emulator.profile import PROFILE_ENV, REPO_ROOT, default_profile, write_profile

MODEL = "moonshotai/Kimi-K2.5"
NCCL_FLAGS = ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion"]
EAGLE_FLAGS = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "AQ-MedAI/Kimi-K25-eagle3",
               "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def baseline_flags(max_bs: int = 128, *extra: str) -> list[str]:
    """Campaign baseline flags (NCCL level, --cuda-graph-max-bs-decode ``max_bs``)."""
    return ["--model-path", MODEL, "--tp-size", "8", "--trust-remote-code", *NCCL_FLAGS,
            "--cuda-graph-max-bs-decode", str(max_bs), *extra]


def free_port() -> int:
    """An ephemeral loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EmulatedProcess:
    """A running emulated server: ``proc`` (own session/process group), ``url``, ``log_path``."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 30.0) -> float:
        """Poll /health until 200; returns seconds waited. Raises RuntimeError (with the log) on exit/timeout."""
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"emulated server exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"emulated server not healthy after {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGKILL the whole process group (test cleanup); returns the exit code."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def launch_emulated(workdir: Path, flags: list[str], env: dict[str, str] | None = None,
                    emulator: dict | None = None, port: int | None = None) -> EmulatedProcess:
    """Write a profile JSON into ``workdir`` and start ``python -m tasks.emulator.server``.

    Args:
        workdir: directory for ``profile.json`` and ``server.log``.
        flags: SGLang flags without --host/--port (added here).
        env: extra environment (NCCL_ALGO, SERVESWEEP_EMULATOR_FAULT, ...).
        emulator: runtime profile overrides (default ``{"time_scale": 0.002, "noise": 0.0}``).
        port: HTTP port (default: a free one).
    """
    workdir = Path(workdir)
    port = port or free_port()
    prof = default_profile({"time_scale": 0.002, "noise": 0.0, **(emulator or {})})
    ppath = write_profile(prof, workdir / "profile.json")
    full_env = {**os.environ, PROFILE_ENV: ppath, **(env or {})}
    full_env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    log_path = workdir / f"server-{port}.log"
    argv = [sys.executable, "-m", "tasks.emulator.server", *flags, "--host", "127.0.0.1", "--port", str(port),
            "--nccl-port", str(free_port())]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO_ROOT),
                                start_new_session=True)
    return EmulatedProcess(proc, port, log_path)
