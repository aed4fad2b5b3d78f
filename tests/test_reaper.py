"""The reaper sidecar kills the server's whole process group (TP-rank grandchildren
included) when the process that launched it dies without tearing down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil

from tests.conftest import REPO
from tests.waiting import wait_for

# A stand-in for the Ray worker: launches a server whose child ("TP rank") ignores its
# parent's death, prints the pids, then waits to be SIGKILLed.
WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tasks.server import launch
    from tasks.types import Timeouts
    server = [sys.executable, "-c",
              "import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"]
    srv = launch(server, {}, Path(sys.argv[1]), Timeouts(term_grace_s=1), "http://127.0.0.1:1")
    time.sleep(1.0)
    srv.snapshot_tree()
    print(" ".join(str(p) for p in srv.seen), flush=True)
    time.sleep(120)
""")


def test_group_killed_when_the_worker_dies(tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "server.log")], cwd=str(REPO),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = [int(x) for x in worker.stdout.readline().split()]
        assert len(pids) >= 2, pids  # the server and its child
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        def alive() -> list[int]:
            out = []
            for p in pids:
                try:
                    if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                        out.append(p)
                except psutil.NoSuchProcess:
                    pass
            return out

        wait_for(lambda: alive() == [], 10, what=lambda: f"the group to die with the worker; alive: {alive()}")
    finally:
        for p in psutil.process_iter():
            try:
                if "time.sleep(120)" in " ".join(p.cmdline()):
                    p.kill()
            except psutil.Error:
                pass


def test_reaper_exits_by_itself_after_a_normal_teardown(tmp_path):
    from tasks.server import launch
    from tasks.types import Timeouts

    srv = launch([sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "s.log",
                 Timeouts(term_grace_s=1), "http://127.0.0.1:1")
    wait_for(lambda: _reapers_for(srv.proc.pid), 5, interval=0.05, what="a reaper watching the server's group")
    assert srv.terminate()
    # the watcher itself leaves once the group is gone
    wait_for(lambda: _reapers_for(srv.proc.pid) == [], 5, what="the reaper to exit after teardown")


def _reapers_for(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "tasks.reaper" in cmd and cmd[-1] == str(pgid):
            out.append(p.pid)
    return out
