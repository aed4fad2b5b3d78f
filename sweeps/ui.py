"""``python -m sweeps.ui``: the MLflow UI on 127.0.0.1:5000 against the sweep's store.

Creates the store's schema first (an empty store would otherwise show an error page), then
starts ``mlflow ui`` with the same absolute SQLite URI and artifact root the driver uses, in
the background (its own session, output in ``<store>/ui.log``), and returns once the server
answers ``GET /health``: the URL it prints is one a browser can open now (``mlflow ui`` prints
its own about 40 s before it listens). A server already answering on the port is reused.
``--foreground`` keeps the server in this process instead (Ctrl-C stops it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import httpx
from mlflow.tracking import MlflowClient

from sweeps.config.spec import REPO_ROOT

#: how long to wait for the server to answer, s (measured: ~40 s on 2 shared cores)
READY_TIMEOUT_S = 180.0
#: pause between readiness polls, s
POLL_S = 0.5


def answers(url: str, timeout: float = 2.0) -> bool:
    """True when ``url`` + ``/health`` returns 200 (MLflow's health endpoint)."""
    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Return once the server at ``url`` answers.

    Raises:
        RuntimeError: the server exited first, or did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if answers(url):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow ui exited with code {proc.returncode} before answering")
        time.sleep(POLL_S)
    raise RuntimeError(f"mlflow ui did not answer {url}/health within {timeout_s:.0f} s (still running, "
                       f"pid {proc.pid})")


def main(argv: list[str] | None = None) -> int:
    """Start (or reuse) the UI server and return once it answers; the exit code (1: it did not come up)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store-dir", default=str(REPO_ROOT / "mlflow"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", default="5000")
    ap.add_argument("--foreground", action="store_true", help="run the server in this process (Ctrl-C stops it)")
    a = ap.parse_args(argv)
    store = os.path.abspath(a.store_dir)
    os.makedirs(os.path.join(store, "artifacts"), exist_ok=True)
    uri = f"sqlite:///{os.path.join(store, 'mlflow.db')}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates/migrates the schema
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--default-artifact-root", f"file://{os.path.join(store, 'artifacts')}",
           "--host", a.host, "--port", str(a.port), "--workers", "1"]
    base = f"http://{a.host}:{a.port}"
    # MLflow 3 opens on its GenAI overview; this view lists the runs (trials) with their metrics.
    view = f"{base}/#/experiments?workflowType=machine_learning"
    if a.foreground:
        print(f"MLflow UI: {view}  (store {uri}; listening once mlflow says so)", flush=True)
        os.execv(cmd[0], cmd)
    if answers(base):
        print(f"MLflow UI: {view}  (a server already answers on port {a.port})", flush=True)
        return 0
    log_path = os.path.join(store, "ui.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # outlives this command (and make's process group)
    print(f"starting the MLflow UI (pid {proc.pid}, log {log_path}) ...", flush=True)
    try:
        wait_ready(base, proc)
    except RuntimeError as e:
        print(f"error: {e}; see {log_path}", file=sys.stderr)
        return 1
    print(f"MLflow UI: {view}  (store {uri}; stop it with: kill -- -{proc.pid})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
