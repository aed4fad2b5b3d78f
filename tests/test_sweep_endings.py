"""The ends of a sweep that used to lose or hide something: findings per study, enqueued trials
left WAITING at a budget stop, a Host-header 403 diagnosed as a permission, Ray's token
warnings before the fix line. In-process drivers and the ``instant`` backend (no Ray)."""

from __future__ import annotations

import http.server
import os
from functools import partial
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeps.app.driver import run
from sweeps.app.inprocess import InProcessDriver
from sweeps.app.lifecycle import execute
from sweeps.config.spec import load_spec
from sweeps.search.unlaunched import A_NOT_LAUNCHED_REASON
from sweeps.store import mlflow_access
from sweeps.store.records import NOT_LAUNCHED, load_records
from tests.conftest import compose_cfg
from tests.test_ownership import _serving


def _overrides(tmp_path: Path, *extra: str) -> list[str]:
    return ["backend=instant", "sweep=smoke", "sweep.budget.trials=2", "sweep.confirm.top_k=0",
            f"tracking.store_dir={tmp_path / 'store'}", f"tracking.findings_dir={tmp_path / 'findings'}", *extra]


# ---- findings per study --------------------------------------------------------------------------
def test_new_studies_keep_their_own_findings_and_never_overwrite_the_resumable_one(tmp_path):
    drv = partial(InProcessDriver, findings=True)
    run(compose_cfg(_overrides(tmp_path)), drv)
    resumable = tmp_path / "findings" / "smoke.md"
    before = resumable.read_bytes()
    run(compose_cfg(_overrides(tmp_path, "new_study=true")), drv)
    run(compose_cfg(_overrides(tmp_path, "new_study=true")), drv)
    studies = {s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'store' / 'optuna.db'}")}
    assert len(studies) == 3 and "smoke" in studies, studies
    docs = {p.stem for p in (tmp_path / "findings").glob("*.md")}
    assert docs == studies, (docs, studies)  # one document per study, named after it
    assert resumable.read_bytes() == before
    for name in studies - {"smoke"}:
        assert name in (tmp_path / "findings" / f"{name}.md").read_text()


# ---- budget stop: enqueued, never launched ----------------------------------------------------------------
def _study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path / 'store' / 'optuna.db'}")


def test_a_finished_study_run_again_says_its_overrides_changed_nothing(tmp_path, capfd):
    """The same command with an override of the search after the study spent its trial budget
    reprints the earlier run's summary; a line says nothing new was searched and how to search
    again (a fresh study, or a higher budget). The first run says nothing of the kind."""
    drv = partial(InProcessDriver, findings=False)
    storage = f"sqlite:///{tmp_path / 'store' / 'optuna.db'}"

    def launched() -> int:
        return sum(r.launched for r in load_records(optuna.load_study(study_name="smoke", storage=storage)))
    run(compose_cfg(_overrides(tmp_path)), drv)
    assert "already spent its trial budget" not in capfd.readouterr().err
    first = launched()
    run(compose_cfg(_overrides(tmp_path, "sweep.sampler.seed=7")), drv)
    err = capfd.readouterr().err
    assert "study 'smoke' had already spent its trial budget (2 launched)" in err and "new_study=true" in err, err
    assert launched() == first


def test_a_budget_stop_tells_the_unlaunched_trials_and_a_resume_runs_them(tmp_path):
    # the baseline and one seed per allreduce level are enqueued; a budget of 1 launches the baseline only
    execute(InProcessDriver(load_spec(compose_cfg(_overrides(tmp_path, "sweep.budget.trials=1")))))
    study = _study(tmp_path)
    assert study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) == []
    told = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("status") == NOT_LAUNCHED]
    assert len(told) == 2, [(t.number, t.state, t.user_attrs) for t in study.trials]  # custom, flashinfer_fusion
    assert all(t.state == TrialState.FAIL for t in told)  # FAIL: the sampler learns nothing from them
    assert all("trial budget spent" in t.user_attrs[A_NOT_LAUNCHED_REASON] for t in told)
    recs = load_records(study)
    assert sum(r.launched for r in recs) == 1 and not any(r.launched for r in recs if r.status == NOT_LAUNCHED)
    # the same command with a larger budget runs what the first run had queued
    execute(InProcessDriver(load_spec(compose_cfg(_overrides(tmp_path, "sweep.budget.trials=3")))))
    study = _study(tmp_path)
    launched = [r for r in load_records(study) if r.launched]
    assert {r.params["allreduce"] for r in launched} == {"nccl", "custom", "flashinfer_fusion"}, launched
    assert study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) == []


# ---- a 403 that is the Host header ---------------------------------------------------------------------
class _Forbidden(http.server.BaseHTTPRequestHandler):
    body = b""
    content_type = "text/plain"

    def _answer(self) -> None:
        self.send_response(403)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = _answer

    def log_message(self, *a) -> None:  # quiet
        pass


def test_a_host_header_refusal_names_allowed_hosts_not_a_permission(monkeypatch):
    for k, v in mlflow_access.HTTP_ENV.items():
        monkeypatch.setenv(k, v)
    # what `mlflow server --allowed-hosts example.com` answers every API call (MLflow 3.x, text/plain)
    host = type("Host", (_Forbidden,), {"body": mlflow_access.INVALID_HOST_MSG.encode()})
    with _serving(host) as port:
        with pytest.raises(mlflow_access.MlflowDenied) as e:
            mlflow_access.check_access(f"http://127.0.0.1:{port}", "smoke")
    msg = str(e.value)
    assert "--allowed-hosts" in msg and f"127.0.0.1:{port}" in msg and "not a permission problem" in msg, msg
    assert "EDIT permission" not in msg and "admin" not in msg


def test_a_permission_refusal_still_asks_for_edit(monkeypatch):
    for k, v in mlflow_access.HTTP_ENV.items():
        monkeypatch.setenv(k, v)
    perm = type("Perm", (_Forbidden,), {"content_type": "application/json", "body":
                                        b'{"error_code": "PERMISSION_DENIED", "message": "Permission denied"}'})
    with _serving(perm) as port:
        with pytest.raises(mlflow_access.MlflowDenied) as e:
            mlflow_access.check_access(f"http://127.0.0.1:{port}", "smoke")
    assert "EDIT permission" in str(e.value) and "--allowed-hosts" not in str(e.value)


# ---- Ray's token warnings ----------------------------------------------------------------------------
def test_ray_auth_warnings_give_way_to_one_fix_line(capfd, monkeypatch):
    from sweeps.run.ray_auth import auth_warnings_filtered

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    warning = (b"[2026-12-01 23:00:00,000 W 4242 4243] gcs_client.cc:185: Failed to connect to GCS: "
               b"InvalidAuthToken: Authentication token is missing or incorrect\n")
    with auth_warnings_filtered("127.0.0.2:6379") as seen:
        os.write(2, b"an unrelated line\n")
        for _ in range(10):
            os.write(2, warning)
        os.write(2, b"another unrelated line\n")
    err = capfd.readouterr().err
    assert "InvalidAuthToken" not in err and "gcs_client.cc" not in err, err
    assert err.count("servesweep:") == 1 and "RAY_AUTH_MODE=token" in err and "127.0.0.2:6379" in err, err
    assert "an unrelated line" in err and "another unrelated line" in err
    assert err.index("servesweep:") < err.index("another unrelated line")  # at the first warning, not at the end
    assert seen.count == 10 and seen.printed
    os.write(2, warning)  # the filter is gone after the block
    assert "InvalidAuthToken" in capfd.readouterr().err


def test_a_ray_that_does_not_start_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """Ray raises a bare ``Exception`` when its node times out starting (an overloaded machine)."""
    import ray

    from sweeps.errors import exit_code
    from sweeps.run.cluster import RayUnavailable, start_ray

    def init(*a, **k):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(RayUnavailable, match="timed out during startup") as e:
        start_ray(load_spec(compose_cfg(_overrides(tmp_path))))
    assert exit_code(e.value) == 1
    # a local start: the advice is to run again, never to drop an address that was not given
    assert "could not start a local Ray" in str(e.value) and "ray.address" not in str(e.value)
