"""The driver's wiring of the study lease, MLflow's permission and artifacts (fast, in process):
a second driver from another store dir on a leased study is refused before it writes anything;
a driver that loses its lease mid-sweep stops without writing its running trial; the lease is
released after a sweep; 401/403 are told apart from outages; an HTTP tracking URI sends
artifacts through the server; a local artifact location under a server is warned about."""

from __future__ import annotations

import contextlib
import functools
import http.server
import logging
import threading
import time
from types import SimpleNamespace

import optuna
import pytest
import sqlalchemy as sa
from mlflow.exceptions import MlflowException, get_error_code

from sweeps.app.inprocess import InProcessDriver, run_in_process
from sweeps.app.lifecycle import execute
from sweeps.config.spec import load_spec
from sweeps.run import ownership
from sweeps.store import lease as study_lease
from sweeps.store import mlflow_access
from sweeps.store.study import SweepError
from tests.conftest import compose_cfg


def _spec(store, storage, trials=3, extra=()):
    return load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  f"sweep.budget.trials={trials}", "sweep.confirm.top_k=0", "study_name=shared",
                                  f"tracking.optuna_storage={storage}", f"tracking.store_dir={store}",
                                  f"tracking.findings_dir={store / 'findings'}", *extra]))


def test_a_second_driver_from_another_store_is_refused_before_writing(tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    a = InProcessDriver(_spec(tmp_path / "a", storage), "shared")
    a.setup()
    try:
        n_trials = len(a.study.trials)
        b = InProcessDriver(_spec(tmp_path / "b", storage), "shared")
        with pytest.raises(study_lease.LeaseHeld) as e:
            execute(b)  # the file lock of b's store dir is free: only the lease stops it
        assert isinstance(e.value, ownership.REFUSALS)
        assert " since " in str(e.value) and "pid " in str(e.value)
        assert not hasattr(b, "study") and not hasattr(b, "executor")  # refused before Ray, the study, MLflow
        assert len(optuna.load_study(study_name="shared", storage=storage).trials) == n_trials
        assert study_lease.StudyLease(storage, "shared").holder().holder_id == a.hold.lease.holder_id  # a's lease intact
    finally:
        a.release()
    assert study_lease.StudyLease(storage, "shared").holder() is None


def test_a_finished_sweep_releases_its_lease(tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    drv = run_in_process(_spec(tmp_path / "a", storage, trials=2), "shared")
    assert drv.launched == 2 and study_lease.StudyLease(storage, "shared").holder() is None
    again = run_in_process(_spec(tmp_path / "b", storage, trials=3), "shared")  # another store dir resumes it
    assert again.launched == 3


def test_a_driver_that_loses_its_lease_stops_without_writing(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setattr(ownership, "StudyLease", functools.partial(study_lease.StudyLease, ttl_s=0.6))  # renewed every 0.15 s
    engine = sa.create_engine(storage)
    taken = []

    def take_over(args):
        if args[0].trial_number == 1 and not taken:  # what another driver's takeover does to the row
            with engine.begin() as c:
                c.execute(sa.text(f"UPDATE {study_lease.TABLE} SET holder_id = 'other' WHERE study_name = 'shared'"))
            taken.append(time.monotonic())
            time.sleep(0.6)  # the keeper notices at its next renewal
        return None

    drv = InProcessDriver(_spec(tmp_path / "a", storage, trials=5), "shared", task_hook=take_over)
    with pytest.raises(SweepError, match="taken over by another driver.*stopped without writing its 1 running"):
        execute(drv)
    trials = optuna.load_study(study_name="shared", storage=storage).trials
    assert trials[0].state.is_finished() and trials[1].state == optuna.trial.TrialState.RUNNING
    assert "record" not in trials[1].user_attrs and "status" not in trials[1].user_attrs
    with engine.connect() as c:  # the new holder's row is left alone
        assert c.execute(sa.text(f"SELECT holder_id FROM {study_lease.TABLE}")).scalar_one() == "other"
    engine.dispose()


def test_http_tracking_sends_artifacts_through_the_server(tmp_path):
    local = _spec(tmp_path, "sqlite:///x.db")
    assert local.artifact_location == (tmp_path / "artifacts").as_uri()
    served = _spec(tmp_path, "sqlite:///x.db", extra=["tracking.uri=http://127.0.0.1:5000"])
    assert served.artifact_location == "mlflow-artifacts:/smoke"
    explicit = _spec(tmp_path, "sqlite:///x.db", extra=["tracking.uri=http://127.0.0.1:5000",
                                                        "tracking.artifact_location=s3://bucket/smoke"])
    assert explicit.artifact_location == "s3://bucket/smoke"


def test_401_403_are_refusals_and_an_outage_is_not(monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "reader")
    for k, v in mlflow_access.HTTP_ENV.items():  # what check_access sets, restored after the test
        monkeypatch.setenv(k, v)
    body = "API request to endpoint /api/2.0/mlflow/experiments/set-experiment-tag failed with error code 403 != 200."
    # what MLflow's REST client raises for a 403 / 401 (mlflow.utils.rest_utils: get_error_code(status))
    assert mlflow_access.denied_status(MlflowException(body, error_code=get_error_code(403))) == 403
    assert mlflow_access.denied_status(MlflowException("x", error_code=get_error_code(401))) == 401
    assert mlflow_access.denied_status(RuntimeError(body)) == 403
    assert mlflow_access.denied_status(ConnectionError("Connection refused")) is None
    msg = mlflow_access.denied_message(403, "http://mlflow:5000", "smoke")
    assert "'smoke'" in msg and "EDIT" in msg and "reader" in msg
    assert "MLFLOW_TRACKING_PASSWORD" in mlflow_access.denied_message(401, "http://mlflow:5000", "smoke")
    mlflow_access.check_access("sqlite:///x.db", "smoke")  # local stores have no permissions: nothing asked
    with caplog.at_level(logging.WARNING, logger="servesweep.tracking"):
        mlflow_access.check_access("http://127.0.0.1:9", "smoke")  # nothing listens on port 9: an outage, not a refusal
    assert "unreachable" in caplog.text


class _NotMlflow(http.server.BaseHTTPRequestHandler):
    """Answers every GET as one kind of non-MLflow service (``kind`` set per server)."""

    kind = "static"
    ANSWERS = {"json404": (404, "application/json", b'{"detail": "Not Found"}'),  # FastAPI-style
               "json200": (200, "application/json", b'{"status": "ok"}'),  # a catch-all health page
               "html200": (200, "text/html", b"<html><body>welcome</body></html>")}

    def do_GET(self):
        code, ctype, body = self.ANSWERS[self.kind]
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def _serving(handler):
    """An HTTP server on a free loopback port, in a thread, for the block; yields its port."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("kind", ["static", "json404", "json200", "html200"])
def test_a_server_without_mlflow_is_refused_before_anything_is_created(kind, tmp_path, monkeypatch):
    """A ``tracking.uri`` naming another HTTP service answers, but not as MLflow's REST API:
    a configuration error (exit 2, nothing recorded), not an outage to wait out."""
    for k, v in mlflow_access.HTTP_ENV.items():
        monkeypatch.setenv(k, v)
    handler = http.server.SimpleHTTPRequestHandler if kind == "static" else type(kind, (_NotMlflow,), {"kind": kind})
    with _serving(handler) as port:
        uri = f"http://127.0.0.1:{port}"
        with pytest.raises(mlflow_access.NotMlflow, match="not as an MLflow tracking server"):
            mlflow_access.check_access(uri, "smoke")
        drv = InProcessDriver(_spec(tmp_path / "store", f"sqlite:///{tmp_path}/optuna.db",
                                    extra=[f"tracking.uri={uri}"]), "shared", track=True)
        with pytest.raises(mlflow_access.NotMlflow) as e:
            execute(drv)
        assert isinstance(e.value, ownership.REFUSALS)  # the driver's exit 2
        assert not hasattr(drv, "study")  # refused before the study and the parent run exist


def test_tls_against_a_plain_http_port_is_a_wrong_scheme(monkeypatch):
    with _serving(http.server.SimpleHTTPRequestHandler) as port:
        why = mlflow_access.api_mismatch(f"https://127.0.0.1:{port}", "smoke", timeout_s=5)
    assert why is not None and "TLS handshake failed" in why and "scheme" in why
    assert mlflow_access.api_mismatch("http://127.0.0.1:9", "smoke", timeout_s=2) is None  # nothing listens: an outage


def test_a_local_artifact_location_under_a_server_is_warned_about(caplog):
    exp = SimpleNamespace(name="smoke", artifact_location="file:///home/a/servesweep/mlflow/artifacts")
    with caplog.at_level(logging.WARNING, logger="servesweep.tracking"):
        assert mlflow_access.warn_local_artifacts(exp, "http://mlflow:5000")
    assert "never changes" in caplog.text and "sweep.name=" in caplog.text
    assert not mlflow_access.warn_local_artifacts(exp, "sqlite:///x.db")
    assert not mlflow_access.warn_local_artifacts(SimpleNamespace(name="s", artifact_location="mlflow-artifacts:/s"),
                                      "http://mlflow:5000")
