"""Team scale with the real components (tests/team.py), started once for the module:
Debian's PostgreSQL 15, an ``mlflow server`` on it (artifacts proxied by the server) and a
two-node Ray cluster of ``ray start`` processes (head 127.0.0.2, worker 127.0.0.3, 8 logical
GPUs each, token authentication on). Everything is stopped by PID, also when a test fails.

A sweep through all three (trials in PostgreSQL, runs and artifacts in the server, trials on
both nodes, the ``node`` tag naming the Ray node); refusals before anything is created (Ray
token auth, MLflow 403, a second driver on a leased study: exit 2 naming the holder); the
code shipped to a node without the repo; a worker node killed mid-trial."""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest
import sqlalchemy as sa
from mlflow.tracking import MlflowClient

from sweeps.store import records as trial_records
from tests.conftest import REPO
from tests.team import PG_BIN, MlflowServer, Postgres, RayCluster, bare_python
from tests.test_shipped_package import shipped_files
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

EXPERIMENT = "smoke"  # MLflow experiment = sweep name; studies differ per test
EMU = ["backend=emulated", "sweep=smoke", "backend.emulator.time_scale=0.002", "bench.repeats=2",
       "bench.warmup_output_len=4"]


class Team:
    """The started pieces plus the sweep command that uses all three."""

    def __init__(self, root: Path):
        self.root = root
        self.pg = Postgres()
        self.mlflow: MlflowServer | None = None
        self.ray = RayCluster(head_gpus=8)
        self.startup_s: dict[str, float] = {}

    def start(self) -> Team:
        self.pg.start()
        self.startup_s["postgresql"] = self.pg.startup_s
        self.mlflow = MlflowServer(self.pg.url("mlflow"), self.root / "mlflow-server").start()
        self.startup_s["mlflow_server_first"] = self.mlflow.startup_s
        self.ray.start_head()
        self.ray.add_worker("127.0.0.3", gpus=8)
        self.startup_s.update({f"ray_{k}": v for k, v in self.ray.startup_s.items()})
        return self

    def stop(self) -> None:
        self.ray.stop()
        if self.mlflow:
            self.mlflow.stop()
        self.pg.stop()

    def cmd(self, store: Path, study: str, extra: list[str], uri: str | None = None) -> list[str]:
        return [sys.executable, str(REPO / "run_sweep.py"), *EMU, f"study_name={study}",
                f"ray.address={self.ray.address}", f"tracking.uri={uri or self.mlflow.url}",
                f"tracking.optuna_storage={self.pg.url()}", f"tracking.rules_db={self.pg.url()}",
                f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}", *extra]

    def popen(self, store: Path, study: str, extra: list[str], log: Path, env: dict | None = None,
              uri: str | None = None) -> subprocess.Popen:
        store.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(self.cmd(store, study, extra, uri), cwd=str(store), stdout=open(log, "w"),
                                stderr=subprocess.STDOUT, env=env or self.ray.driver_env(), start_new_session=True)

    def records(self, study: str) -> list[trial_records.TrialRecord]:
        return trial_records.load_records(optuna.load_study(study_name=study, storage=self.pg.url()))

    def running(self, study: str) -> int:
        e = sa.create_engine(self.pg.url())
        try:
            with e.connect() as c:
                return c.execute(sa.text("select count(*) from trials t join studies s using (study_id) "
                                         "where s.study_name = :s and t.state = 'RUNNING'"), {"s": study}).scalar_one()
        except sa.exc.SQLAlchemyError:
            return 0
        finally:
            e.dispose()


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    if not (PG_BIN / "postgres").exists():
        pytest.skip("PostgreSQL 15 not installed (scripts/ci_team_setup.sh)")
    t = Team(tmp_path_factory.mktemp("team"))
    try:
        yield t.start()
    finally:
        t.stop()
    print("\nteam start-up (s):", json.dumps({k: round(v, 2) for k, v in t.startup_s.items()}))


def _wait(proc: subprocess.Popen, log: Path, timeout: float) -> tuple[int, str]:
    """Wait for a sweep (SIGKILL after ``timeout`` s); returns (rc, its output)."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode, log.read_text(errors="replace")


@pytest.fixture(scope="module")
def swept(team, tmp_path_factory):
    """One small sweep through the whole stack; shared by the checks below."""
    root = tmp_path_factory.mktemp("sweep")
    log = root / "sweep.log"
    t0 = time.monotonic()
    rc, out = _wait(team.popen(root / "store", "team-smoke", ["bench.output_len=64"], log), log, 300)
    team.startup_s["sweep_s"] = time.monotonic() - t0
    return rc, out


def test_startup_is_measured_and_quick(team):
    assert set(team.startup_s) >= {"postgresql", "mlflow_server_first", "ray_head", "ray_127.0.0.3"}
    assert all(0 < v < 120 for v in team.startup_s.values()), team.startup_s


def test_mlflow_server_refuses_unlisted_host_headers(team):
    ok = httpx.get(team.mlflow.url + "/health", timeout=5)
    bad = httpx.get(team.mlflow.url + "/api/2.0/mlflow/experiments/search?max_results=1",
                    headers={"Host": "mlflow.example.internal:5000"}, timeout=5)
    assert ok.status_code == 200 and bad.status_code == 403, (ok.status_code, bad.status_code, bad.text[:200])


def test_sweep_through_postgres_mlflow_server_and_two_ray_nodes(team, swept):
    rc, out = swept
    assert rc == 0 and "Traceback" not in out, out[-4000:]
    assert "2 trial slot(s) over 2 node(s)" in out, out[-4000:]
    recs = team.records("team-smoke")
    done = [r for r in recs if r.state in ("COMPLETE", "PRUNED", "FAIL")]
    finished = {f"team-smoke/{r.number}" for r in done if r.launched}  # one child run per launched trial
    assert len(finished) >= 5 and not [r for r in recs if r.state == "RUNNING"]
    c = MlflowClient(tracking_uri=team.mlflow.url)
    exp = c.get_experiment_by_name(EXPERIMENT)
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    keys = [r.data.tags["trial_key"] for r in runs if r.data.tags.get("trial_key", "").startswith("team-smoke/")]
    assert len(keys) == len(set(keys)) and set(keys) == finished, (sorted(keys), sorted(finished))
    parent = next(r for r in runs if r.data.tags.get("servesweep.role") == "study" and r.info.run_name == "team-smoke")
    assert parent.data.metrics["skipped_total"] == len([r for r in done if not r.launched])  # skips: on the parent


def _ray_nodes(team) -> dict[str, str]:
    code = ("import json, sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(json.dumps({n['NodeManagerAddress']: n['NodeID'] for n in ray.nodes() if n['Alive']}))")
    r = subprocess.run([sys.executable, "-c", code, team.ray.address], env=team.ray.driver_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_trials_ran_on_both_nodes(team, swept):
    nodes = _ray_nodes(team)
    assert set(nodes) >= {"127.0.0.2", "127.0.0.3"}
    used = {r.node.rsplit("/", 1)[-1] for r in team.records("team-smoke") if r.launched}
    assert used == {nodes["127.0.0.2"][:12], nodes["127.0.0.3"][:12]}, (used, nodes)


def test_artifacts_go_through_the_server(team, swept):
    c = MlflowClient(tracking_uri=team.mlflow.url)
    exp = c.get_experiment_by_name(EXPERIMENT)
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    served = team.mlflow.root / "artifacts"
    assert list(served.rglob("server.log*")) and list(served.rglob("*.md")), sorted(served.rglob("*"))[:20]


def test_artifacts_through_the_server_with_an_explicit_location(team, tmp_path):
    """An explicit ``tracking.artifact_location`` (here ``mlflow-artifacts:/<sweep>``, what an
    HTTP tracking URI gets by default) for a new experiment: logs, findings and plots land in
    the server's --artifacts-destination, not on the driver machine."""
    log = tmp_path / "sweep.log"
    extra = ["sweep.name=smoke-art", "sweep.budget.trials=3", "tracking.artifact_location=mlflow-artifacts:/smoke-art"]
    rc, out = _wait(team.popen(tmp_path / "store", "team-art", extra, log), log, 240)
    assert rc == 0, out[-3000:]
    exp = MlflowClient(tracking_uri=team.mlflow.url).get_experiment_by_name("smoke-art")
    assert exp.artifact_location == "mlflow-artifacts:/smoke-art"
    served = team.mlflow.root / "artifacts" / "smoke-art"
    names = {p.name for p in served.rglob("*") if p.is_file()}
    assert {"server.log", "result.json", "launch_command.txt", "team-art.md"} <= names, sorted(names)[:30]  # findings: <study>.md
    assert not (tmp_path / "store" / "artifacts").exists() or not any((tmp_path / "store" / "artifacts").rglob("*.log"))


def test_report_rebuilds_from_the_postgresql_study(team, swept, tmp_path):
    """``python -m sweeps.report <study> --storage <url>`` (docs/team.md step 5): the findings
    from the PostgreSQL study, re-logged to the parent run through the server."""
    r = subprocess.run([sys.executable, "-m", "sweeps.report", "team-smoke", "--storage", team.pg.url(),
                        "--store-dir", str(tmp_path / "store"), f"tracking.uri={team.mlflow.url}",
                        f"tracking.findings_dir={tmp_path / 'findings'}"], cwd=str(REPO), capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0 and "could not log" not in r.stderr, r.stdout[-2000:] + r.stderr[-3000:]
    doc = tmp_path / "findings" / "team-smoke.md"
    assert doc.is_file() and f"findings: {doc}" in r.stdout
    n_launched = len([x for x in team.records("team-smoke") if x.launched])
    assert n_launched >= 5 and "team-smoke" in doc.read_text()


def test_node_tag_names_the_ray_node(team, swept):
    nodes = _ray_nodes(team)
    c = MlflowClient(tracking_uri=team.mlflow.url)
    exp = c.get_experiment_by_name(EXPERIMENT)
    by_id = {v[:12]: ip for ip, v in nodes.items()}
    ok = "tags.status = 'ok' and tags.trial_key LIKE 'team-smoke/%'"
    for run in c.search_runs([exp.experiment_id], filter_string=ok, max_results=100):
        tag = run.data.tags["node"]
        nid = tag.rsplit("/", 1)[-1]
        assert nid in by_id and by_id[nid] in tag, (tag, nodes)


AUTH_PROBE = """
import json, sys, time
import ray
from sweeps.run.ray_auth import explain_init_error
t0 = time.monotonic()
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print(json.dumps({"ok": True}))
except Exception as e:
    print(json.dumps({"ok": False, "type": type(e).__name__, "msg": explain_init_error(e, sys.argv[1]),
                      "s": round(time.monotonic() - t0, 1)}))
"""


def _no_auth_env(team, home: Path, **extra: str) -> dict:
    env = {k: v for k, v in team.ray.driver_env().items() if not k.startswith("RAY_AUTH")}
    return {**env, "HOME": str(home), **extra}  # a HOME without ~/.ray/auth_token


def test_token_auth_mismatch_is_explained(team, tmp_path):
    from sweeps.run.ray_auth import explain_init_error

    assert explain_init_error(ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379"), "x") is None
    cases = {"mode unset": _no_auth_env(team, tmp_path),
             "no token": _no_auth_env(team, tmp_path, RAY_AUTH_MODE="token"),
             "wrong token": _no_auth_env(team, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)}
    procs = {k: subprocess.Popen([sys.executable, "-c", AUTH_PROBE, team.ray.address], env=env, cwd=str(REPO),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k, env in cases.items()}
    got = {}
    for k, p in procs.items():
        out, err = p.communicate(timeout=120)
        assert out.strip(), (k, err[-2000:])
        got[k] = json.loads(out.strip().splitlines()[-1])
    print("\nauth mismatch:", json.dumps({k: (v["type"], v["s"]) for k, v in got.items()}))
    for k, v in got.items():
        assert not v["ok"] and v["msg"], (k, v)
        assert "RAY_AUTH_MODE=token" in v["msg"] and "ray get-auth-token" in v["msg"], (k, v)
    assert "RAY_AUTH_MODE=unset" in got["mode unset"]["msg"] and "RAY_AUTH_TOKEN" in got["wrong token"]["msg"]


def test_sweep_without_the_token_says_ray_auth_mode(team, tmp_path):
    log = tmp_path / "sweep.log"
    rc, out = _wait(team.popen(tmp_path / "store", "team-noauth", [], log, env=_no_auth_env(team, tmp_path)), log, 180)
    assert rc == 1 and "RAY_AUTH_MODE=token" in out and "Traceback" not in out, out[-3000:]
    assert "team-noauth" not in optuna.get_all_study_names(storage=team.pg.url())  # nothing created
    c = MlflowClient(tracking_uri=team.mlflow.url)
    assert not c.search_runs([c.get_experiment_by_name(EXPERIMENT).experiment_id], "attributes.run_name = 'team-noauth'")


SHIP_PROBE = """
import json, os, subprocess, sys
import ray
from sweeps.run.ray_auth import code_runtime_env

@ray.remote(num_cpus=0, resources={"bare": 0.01}, max_retries=0)
def probe():
    out = {"python": sys.executable, "cwd": os.getcwd()}
    try:
        import tasks.remote  # noqa: F401  (what a trial task imports)
        out["tasks"] = sys.modules["tasks"].__file__
    except ImportError as e:
        out["error"] = repr(e)
    c = subprocess.run([sys.executable, "-c", "import tasks; print(tasks.__file__)"], capture_output=True, text=True)
    out["child"] = c.stdout.strip()  # a server launched by the trial imports it too
    return out

# working_dir is a job-level option (ray.init): Ray refuses a local path in a task's options
ray.init(address=sys.argv[1], log_to_driver=False, runtime_env=code_runtime_env() if sys.argv[2] == "ship" else None)
print(json.dumps(ray.get(probe.remote())))
"""


def test_runtime_env_ships_the_code_to_a_node_without_it(team, tmp_path):
    py = bare_python(tmp_path / "bare-venv")
    r = subprocess.run([str(py), "-c", "import ray, psutil, httpx; import tasks"], cwd="/", capture_output=True, text=True)
    assert r.returncode != 0 and "No module named 'tasks'" in r.stderr, r.stderr[-1000:]  # the node lacks the repo
    node = team.ray.add_worker("127.0.0.4", gpus=0, resources='{"bare": 1}', python=py)
    try:
        procs = {k: subprocess.Popen([sys.executable, "-c", SHIP_PROBE, team.ray.address, k], env=team.ray.driver_env(),
                                     cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for k in ("bare", "ship")}  # not cwd=REPO: Ray adds the driver's cwd to every worker's sys.path
        outs = {k: p.communicate(timeout=180) for k, p in procs.items()}
    finally:
        team.ray.stop_node(node)
    for k, p in procs.items():
        assert p.returncode == 0, (k, outs[k][0][-1500:], outs[k][1][-3000:])
    bare, shipped = (json.loads(outs[k][0].strip().splitlines()[-1]) for k in ("bare", "ship"))
    assert bare["python"].startswith(str(tmp_path)) and "No module named 'tasks'" in bare["error"], bare
    assert "error" not in shipped and not shipped["tasks"].startswith(str(REPO)), shipped
    assert shipped["tasks"].startswith(str(team.ray.root)) and shipped["child"] == shipped["tasks"], shipped
    pushed = re.search(r"Pushing file package '[^']+' \(([\d.]+)MiB\)", outs["ship"][1])
    if pushed:  # the first job with this content uploads it; a later one (same hash) reuses the stored package
        mib = float(pushed.group(1))
    else:  # what the package holds
        mib = sum((REPO / f).stat().st_size for f in shipped_files()) / 2**20
    assert mib < 5, outs["ship"][1][-2000:]  # well under Ray's 512 MiB cap
    print(f"\nshipped package: {mib:.2f} MiB")


#: the experiment the admin makes on the basic-auth server, where ``reader`` holds only READ
AUTH_EXPERIMENT = "team-auth"


@pytest.fixture(scope="module")
def auth_server(team, tmp_path_factory):
    """A second ``mlflow server`` on the same backend store with MLflow's basic-auth app, a user
    ``reader`` that has only the default READ permission, and an experiment
    :data:`AUTH_EXPERIMENT` the admin made. Yields (server, admin auth, reader auth, its id): the
    tests on it depend on no experiment an earlier test made."""
    admin_pw, reader_pw = secrets.token_hex(12), secrets.token_hex(12)
    srv = MlflowServer.with_basic_auth(team.pg.url("mlflow"), team.pg.url("mlflow_auth"),
                                       tmp_path_factory.mktemp("auth-server"), admin_pw)
    try:
        srv.start()
        r = httpx.post(srv.url + "/api/2.0/mlflow/users/create", json={"username": "reader", "password": reader_pw},
                       auth=("admin", admin_pw), timeout=30)
        assert r.status_code == 200, r.text[:500]
        r = httpx.post(srv.url + "/api/2.0/mlflow/experiments/create", json={"name": AUTH_EXPERIMENT},
                       auth=("admin", admin_pw), timeout=30)
        assert r.status_code == 200, r.text[:500]
        yield srv, ("admin", admin_pw), ("reader", reader_pw), r.json()["experiment_id"]
    finally:
        srv.stop()


def test_basic_auth_server_needs_credentials_and_edit_permission(team, auth_server):
    srv, _, reader, exp_id = auth_server
    search = srv.url + "/api/2.0/mlflow/experiments/search?max_results=5"
    assert httpx.get(search, timeout=30).status_code == 401
    assert httpx.get(search, auth=reader, timeout=30).status_code == 200  # READ by default
    r = httpx.post(srv.url + "/api/2.0/mlflow/experiments/create", json={"name": "by-reader"}, auth=reader, timeout=30)
    assert r.status_code in (200, 403), r.text[:300]  # creating is allowed: the creator gets MANAGE on it
    r = httpx.post(srv.url + "/api/2.0/mlflow/runs/create", json={"experiment_id": exp_id}, auth=reader, timeout=30)
    assert r.status_code == 403, (r.status_code, r.text[:300])  # someone else's experiment: READ only


def test_sweep_without_edit_permission_exits_2_before_any_trial(team, auth_server, tmp_path):
    srv, admin, (user, pw), exp_id = auth_server
    env = {**team.ray.driver_env(), "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": pw}
    log = tmp_path / "sweep.log"
    rc, out = _wait(team.popen(tmp_path / "store", "team-403", [f"sweep.name={AUTH_EXPERIMENT}"], log, env=env,
                               uri=srv.url), log, 180)
    if rc != 2:  # say what the server held: the reader's grant, and the log's MLflow lines
        grant = httpx.get(srv.url + "/api/2.0/mlflow/experiments/permissions/get", auth=admin, timeout=30,
                          params={"experiment_id": exp_id, "username": user}).text[:300]
        mlflow_lines = "\n".join(ln for ln in out.splitlines() if "mlflow" in ln.lower())[:3000]
        pytest.fail(f"rc={rc}; experiment {exp_id}; {user}'s grant: {grant}\n{mlflow_lines}\n...\n{out[-2000:]}")
    assert f"experiment {AUTH_EXPERIMENT!r}" in out and "EDIT" in out and "Traceback" not in out, out[-3000:]
    assert "team-403" not in optuna.get_all_study_names(storage=team.pg.url())


def test_two_drivers_on_one_study_neither_crash_nor_rerun(team, tmp_path):
    study, extra = "team-two", ["bench.output_len=150", "sweep.budget.trials=4"]
    a = team.popen(tmp_path / "a", study, extra, tmp_path / "a.log")
    try:
        wait_for(lambda: team.running(study) >= 1, 180, what=lambda: (tmp_path / "a.log").read_text()[-2000:])
        rc_b, out_b = _wait(team.popen(tmp_path / "b", study, extra, tmp_path / "b.log"), tmp_path / "b.log", 180)
    finally:
        rc_a, out_a = _wait(a, tmp_path / "a.log", 240)
    assert rc_b == 2 and f"pid {a.pid}" in out_b and " since " in out_b and "Traceback" not in out_b, out_b[-3000:]
    assert not (tmp_path / "b" / "trials").exists()  # refused before it ran or wrote anything
    assert rc_a == 0 and "Traceback" not in out_a, out_a[-3000:]
    recs = team.records(study)
    assert all(r.attempts <= 1 and r.status != "infra_error" for r in recs), [(r.number, r.status, r.attempts) for r in recs]
    launched = [trial_records.config_key(r.params) for r in recs if r.launched]
    assert len(launched) == len(set(launched)), launched  # no finished config ran twice
    assert sum(r.budgeted for r in recs) == 4  # the re-question probes are outside the trial budget


def _cmdline(p) -> str:
    """A process's command line, "" once it has exited (a trial's process can end between being
    listed and being read)."""
    import psutil

    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ""


def test_worker_node_killed_mid_trial_reruns_on_the_head(team, tmp_path):
    """Runs last: it kills the worker node (and starts a new one after)."""
    from tests.procs import trial_processes

    study, store, log = "team-kill", tmp_path / "store", tmp_path / "sweep.log"
    proc = team.popen(store, study, ["bench.output_len=150", "sweep.budget.trials=3"], log)
    try:
        def two_serving() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            servers = [p for p in trial_processes(store) if "tasks.emulator.server" in _cmdline(p)]
            return team.running(study) >= 2 and len(servers) >= 2

        wait_for(two_serving, 180, what=lambda: log.read_text()[-3000:])  # one per node (8 GPUs each)
        killed = team.ray.stop_node("127.0.0.3", sig=signal.SIGKILL)
        rc, out = _wait(proc, log, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if "127.0.0.3" not in team.ray.nodes:
            team.ray.add_worker("127.0.0.3", gpus=8)
    assert killed and rc == 0, out[-4000:]
    assert "infrastructure failure (node_lost)" in out, out[-4000:]
    head = _ray_nodes(team)["127.0.0.2"][:12]
    recs = team.records(study)
    retried = [r for r in recs if r.attempts >= 2]
    assert retried and not [r for r in recs if r.state == "RUNNING"], [(r.number, r.attempts, r.status) for r in recs]
    assert all(r.node.rsplit("/", 1)[-1] == head and r.status in ("ok", "failed") for r in retried), retried
