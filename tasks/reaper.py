"""Reaper sidecar: ``python -m tasks.reaper WATCH_PID PGID`` (started by :mod:`tasks.pdeathsig`).

PR_SET_PDEATHSIG (tasks.pdeathsig) reaches only the server itself; SGLang's TP ranks are
its children and survive it. When the Ray worker that owns a trial dies (the driver was
SIGKILLed, the node is shutting down), nobody is left to run the normal teardown. This tiny
process, started in its own session next to the server, watches the worker's pid and then
SIGKILLs the server's whole process group. It exits by itself as soon as the group is empty
(the normal teardown ran) or after killing it. Poll period: 0.5 s.

It is double-forked into its own session, so it is nobody's direct child: Ray kills a dying
worker's direct children (the server) but not the server's children, which is exactly what
this sidecar must outlive. A dead worker may linger as a zombie, so "dead" means gone, a
zombie, or a reused pid.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

POLL_S = 0.5


def _identity(pid: int) -> float | None:
    """The process's create time, or None if it is gone or a zombie."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except psutil.Error:
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(watch_pid: int, pgid: int, poll_s: float = POLL_S) -> str:
    """Block until the group is gone (returns ``"group_gone"``) or the watched process died
    (kills the group, returns ``"killed"``)."""
    identity = _identity(watch_pid)
    while True:
        if not _group_alive(pgid):
            return "group_gone"
        if identity is None or _identity(watch_pid) != identity:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return "killed"
        time.sleep(poll_s)


def main(argv: list[str]) -> int:
    """``python -m tasks.reaper WATCH_PID PGID``; 0 when the watch ends, 2 on bad arguments."""
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        sys.stderr.write("usage: python -m tasks.reaper WATCH_PID PGID\n")
        return 2
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the group's end or the watched pid's death stop it
    watch(int(argv[0]), int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
