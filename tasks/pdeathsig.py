"""Exec shim: ``python -m tasks.pdeathsig -- ARGV...`` sets PR_SET_PDEATHSIG, then execs ARGV.

``preexec_fn`` is unsafe in threaded processes (Ray workers are threaded), so the trial
runner starts this shim instead: the kernel sends SIGKILL to the server when the process
that spawned it (the Ray worker) dies. It reaches only the direct child; the server's own
children (TP ranks) are killed by the process-group/tree teardown in :mod:`tasks.server`.
Source: prctl(2), ``PR_SET_PDEATHSIG`` = 1.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(argv: list[str]) -> None:
    """Set PR_SET_PDEATHSIG (Linux), optionally start the reaper, exec ``argv`` (exit 2 if empty)."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m tasks.pdeathsig -- COMMAND [ARGS...]\n")
        sys.exit(2)
    expected_parent = int(os.environ.pop("SERVESWEEP_PARENT_PID", "0") or 0)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl: then we are already orphaned.
        if expected_parent and os.getppid() != expected_parent:
            os._exit(1)
        if expected_parent and os.environ.pop("SERVESWEEP_REAPER", "") == "1":
            start_reaper(expected_parent, os.getpgid(0))
    os.execvp(argv[0], argv)


def start_reaper(watch_pid: int, pgid: int) -> None:
    """Double-fork :mod:`tasks.reaper` into its own session before exec'ing the server.

    Done here (a single-threaded process) rather than from the Ray worker: the reaper exists
    before the server starts, and it is nobody's direct child (Ray kills a dying worker's
    direct children, and the server's group dies with the server), so it outlives both and
    can SIGKILL the server's TP-rank children that PR_SET_PDEATHSIG does not reach.
    """
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                env = {k: v for k, v in os.environ.items() if not k.startswith("SERVESWEEP_")}
                os.execve(sys.executable, [sys.executable, "-m", "tasks.reaper", str(watch_pid), str(pgid)], env)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


if __name__ == "__main__":
    main(sys.argv[1:])
