"""``python -m sweeps.ui``: the MLflow UI on 127.0.0.1:5000 against the sweep's store.

Creates the store's schema first (an empty store would otherwise show an error page),
then execs ``mlflow ui`` with the same absolute SQLite URI and artifact root the driver uses.
"""

from __future__ import annotations

import argparse
import os
import sys

from mlflow.tracking import MlflowClient

from sweeps.config import REPO_ROOT


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store-dir", default=str(REPO_ROOT / "mlflow"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", default="5000")
    a = ap.parse_args(argv)
    store = os.path.abspath(a.store_dir)
    os.makedirs(os.path.join(store, "artifacts"), exist_ok=True)
    uri = f"sqlite:///{os.path.join(store, 'mlflow.db')}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates/migrates the schema
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--default-artifact-root", f"file://{os.path.join(store, 'artifacts')}",
           "--host", a.host, "--port", str(a.port), "--workers", "1"]
    # MLflow 3 opens on its GenAI overview; this view lists the runs (trials) with their metrics.
    print(f"MLflow UI: http://{a.host}:{a.port}/#/experiments?workflowType=machine_learning  (store {uri})", flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
