"""Server lifecycle on the node: reserve ports, launch, wait healthy, tear down.

One readable context manager, :func:`launched_server`::

    with reserve_ports(2) as ports, launched_server(argv, env, log_path, base_url, timeouts) as srv:
        srv.wait_healthy()
        ...benchmark base_url (http://127.0.0.1:{ports[0]})...
    # leaving the block kills the whole process tree (SIGTERM -> grace -> SIGKILL)

Modelled on SGLang's ``popen_launch_server`` / ``kill_process_tree`` and the Ray docs on
user-spawned processes, plus what SGLang's test helpers lack: an own session/process
group, PR_SET_PDEATHSIG through an exec shim, and a psutil snapshot of the whole tree
(TP ranks are grandchildren and may leave the group).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from filelock import FileLock, Timeout

from tasks.proc_marker import MARKER_ENV, marked, new_marker
from tasks.types import Timeouts

PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "servesweep-ports"
READY_LINE = "The server is fired up and ready to roll!"


class LifecycleError(RuntimeError):
    """A lifecycle failure with the phase and a harness failure class.

    Attributes:
        failure_class: canonical class id when the harness itself decides it
            (``startup_timeout``, ``port_in_use``, ``teardown_timeout``, ...), or None when
            the server log decides (the classifier runs on it).
        phase: ``startup`` | ``warmup`` | ``bench`` | ``teardown``.
        exit_code: the server's exit code if it exited.
        log_upto: size of the server log in bytes when the failure was seen in a server still
            running (set by :func:`launched_server` before it signals the tree), or None (the
            server exited by itself: its whole log, children's late lines included, is
            evidence). What a live server writes after that answers our SIGTERM/SIGKILL (e.g.
            vLLM's EngineDeadError when its stopped engine core is killed), not the fault.
    """

    def __init__(self, msg: str, phase: str, failure_class: str | None = None, exit_code: int | None = None):
        super().__init__(msg)
        self.phase = phase
        self.failure_class = failure_class
        self.exit_code = exit_code
        self.log_upto: int | None = None


@contextlib.contextmanager
def reserve_ports(n: int = 2, host: str = "127.0.0.1") -> Iterator[list[int]]:
    """Reserve ``n`` free TCP ports on ``host`` for one trial (``--port``, ``--nccl-port``, ...).

    Each port is held by an exclusive file lock (``filelock``, ``flock`` underneath) on
    ``<tmp>/servesweep-ports/<port>.lock`` for the whole block, so concurrent trials on the
    same host never pick the same port; the probing sockets are closed before yielding so the
    server can bind.

    Yields:
        list of ``n`` distinct port numbers.
    Raises:
        LifecycleError(port_in_use): no free ports after 200 attempts.
    """
    PORT_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    held: list[tuple[int, FileLock]] = []
    try:
        for _ in range(200):
            if len(held) == n:
                break
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if any(p == port for p, _ in held):
                continue
            lock = FileLock(PORT_LOCK_DIR / f"{port}.lock", timeout=0)
            try:
                lock.acquire()
            except Timeout:
                continue
            held.append((port, lock))
        if len(held) < n:
            raise LifecycleError(f"could not reserve {n} free ports on {host}", "startup", "port_in_use")
        yield [p for p, _ in held]
    finally:
        for _, lock in held:
            lock.release()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on ``host:port`` (bind test).

    With ``SO_REUSEADDR``, as servers bind (uvicorn, aiohttp): the connections a server closed
    itself linger in TIME_WAIT on its port for a minute, which would fail a plain bind though
    nothing listens and the next server binds fine; only a listening socket makes it fail.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


@dataclass
class ServerProcess:
    """A launched server: its Popen, log file, base URL and every pid ever seen in its tree."""

    proc: subprocess.Popen
    log_path: Path
    base_url: str
    timeouts: Timeouts
    container_name: str | None = None
    container_runtime: str = "docker"
    health_path: str = "/health_generate"
    t_launch: float = field(default_factory=time.monotonic)
    t_healthy: float | None = None
    seen: dict[int, float] = field(default_factory=dict)  # pid -> create_time
    marker: str | None = None  # SERVESWEEP_TRIAL value of this launch (tasks.proc_marker)

    def snapshot_tree(self) -> None:
        """Remember every live process of the server's tree (pid + create time)."""
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    self.seen.setdefault(p.pid, p.create_time())
        except psutil.Error:
            pass
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            pgid = os.getpgid(self.proc.pid)
            for p in psutil.process_iter(["pid"]):
                with contextlib.suppress(psutil.Error, ProcessLookupError):
                    if os.getpgid(p.pid) == pgid:
                        self.seen.setdefault(p.pid, p.create_time())
        for p in marked(self.marker) if self.marker else ():  # detached helpers (setsid, double fork)
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(p.pid, p.create_time())

    def alive_pids(self) -> list[int]:
        """Pids from :attr:`seen` that are still the same running process (not reused, not zombie)."""
        out = []
        for pid, ctime in self.seen.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if abs(p.create_time() - ctime) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
        return out

    def returncode(self) -> int | None:
        return self.proc.poll()

    def wait_exit(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` (s) for the server to exit; its exit code, or None if it runs on.

        A server that closes its sockets while exiting is seen by the client a moment before
        the kernel reports the exit (measured: a few ms); without this wait an early exit
        (code 0) looks like a stall.
        """
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_text(self, max_bytes: int = 1 << 20) -> str:
        """The server log (last ``max_bytes`` bytes), decoded leniently."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_healthy(self, client: httpx.Client | None = None) -> float:
        """Poll :attr:`health_path` until 200, watching the process on every loop.

        Returns:
            startup time, s (launch -> healthy).
        Raises:
            LifecycleError: the server exited (phase ``startup``, class decided from its
                log), or ``startup_timeout`` after ``timeouts.startup_s``.
        """
        own = client is None
        client = client or httpx.Client(timeout=self.timeouts.health_request_s)
        deadline = self.t_launch + self.timeouts.startup_s
        delay = 0.05
        try:
            while True:
                self.snapshot_tree()
                rc = self.proc.poll()
                if rc is not None:
                    raise LifecycleError(f"server exited with code {rc} during startup", "startup", None, rc)
                try:
                    r = client.get(self.base_url + self.health_path, timeout=self.timeouts.health_request_s)
                    if r.status_code == 200:
                        self.t_healthy = time.monotonic()
                        self.snapshot_tree()
                        return self.t_healthy - self.t_launch
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise LifecycleError(
                        f"server not healthy after {self.timeouts.startup_s:.0f} s", "startup", "startup_timeout"
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)
        finally:
            if own:
                client.close()

    def terminate(self) -> bool:
        """Tear down the whole tree: SIGTERM to the group and every seen pid, wait
        ``term_grace_s``, then SIGKILL; stop the container by name if one is configured.

        Returns:
            True when every process of the tree is gone; False if something survived SIGKILL
            (``teardown_timeout``).
        """
        self.snapshot_tree()
        if self.container_name:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [self.container_runtime, "stop", "-t", str(int(self.timeouts.term_grace_s)), self.container_name],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=self.timeouts.term_grace_s + 30,
                )
        self._signal_all(signal.SIGTERM)
        if not self._wait_gone(self.timeouts.term_grace_s):
            self.snapshot_tree()  # anything forked while it was shutting down
            self._signal_all(signal.SIGKILL)
            self._wait_gone(5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1.0)
        return not self.alive_pids()

    def _wait_gone(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` (s) for the tree to exit: ``psutil.wait_procs`` on the
        descendants, ``Popen.wait`` on the server itself (so its exit code is kept, not reaped
        by psutil). True when nothing of the tree is alive."""
        t_end = time.monotonic() + timeout_s
        others = []
        for pid in self.alive_pids():
            if pid != self.proc.pid:
                with contextlib.suppress(psutil.Error):
                    others.append(psutil.Process(pid))
        psutil.wait_procs(others, timeout=timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=max(0.0, t_end - time.monotonic()))
        return not self.alive_pids()

    def _signal_all(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # own session: pgid == pid
        for pid in self.alive_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def launch(
    argv: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    timeouts: Timeouts,
    base_url: str,
    container_name: str | None = None,
    pdeathsig: bool = True,
    health_path: str = "/health_generate",
) -> ServerProcess:
    """Start the server: argv list (never a shell), own session, output to a file.

    The server's stdout/stderr go to ``log_path`` (never an undrained PIPE, which blocks at
    64 KiB and looks like a hang). With ``pdeathsig`` the command runs behind
    :mod:`tasks.pdeathsig`, so it dies with the Ray worker, and the shim starts a
    :mod:`tasks.reaper` that kills the rest of its process group if the worker dies without
    tearing down.

    Raises:
        LifecycleError(cli_arg_error): the launcher executable does not exist.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if not argv or shutil.which(argv[0]) is None:
        raise LifecycleError(f"launcher not found: {argv[0] if argv else '<empty argv>'!r} is not an executable on PATH",
                             "startup", "cli_arg_error")
    marker = new_marker(log_path.parent)
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "SERVESWEEP_PARENT_PID": str(os.getpid()),
                "SERVESWEEP_REAPER": "1", MARKER_ENV: marker}
    cmd = list(argv)
    if pdeathsig and sys.platform.startswith("linux"):
        cmd = [sys.executable, "-m", "tasks.pdeathsig", "--", *cmd]
    log = open(log_path, "ab", buffering=0)
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=full_env,
            start_new_session=True, close_fds=True,
        )
    except FileNotFoundError as e:
        raise LifecycleError(f"launcher not found: {argv[0]!r} ({e.strerror})", "startup", "cli_arg_error") from None
    finally:
        log.close()
    srv = ServerProcess(proc=proc, log_path=log_path, base_url=base_url, timeouts=timeouts, container_name=container_name,
                        health_path=health_path, marker=marker)
    srv.snapshot_tree()
    return srv


@contextlib.contextmanager
def launched_server(
    argv: Sequence[str], env: dict[str, str], log_path: Path, base_url: str, timeouts: Timeouts,
    container_name: str | None = None, health_path: str = "/health_generate",
) -> Iterator[ServerProcess]:
    """Context manager around :func:`launch`; always tears the tree down on exit.

    Raises:
        LifecycleError(teardown_timeout): a process survived SIGKILL (only when the body
            itself succeeded, so the body's own error is never masked).
    """
    srv = launch(argv, env, log_path, timeouts, base_url, container_name, health_path=health_path)
    ok = False
    try:
        yield srv
        ok = True
    except LifecycleError as e:
        if srv.returncode() is None:  # a live server we are about to signal; one that exited said its piece
            with contextlib.suppress(OSError):
                e.log_upto = log_path.stat().st_size
        raise
    finally:
        clean = srv.terminate()
        if ok and not clean:
            raise LifecycleError("server processes survived SIGKILL", "teardown", "teardown_timeout")
