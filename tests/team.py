"""Real team components for tests: Debian's PostgreSQL 15, an ``mlflow server`` on it and a
Ray cluster of ``ray start`` processes on loopback addresses (127.0.0.2 head, 127.0.0.3, ...).

Every piece is a subprocess this module starts in its own session and stops by PID: the
process tree is snapshotted (psutil) plus every process whose command line names the piece's
private directory (Ray reparents its workers), then SIGTERM / SIGINT, a grace period, SIGKILL.
Never ``ray stop`` (it stops every Ray of the host) nor ``pg_ctlcluster`` (the host's clusters).

Ray token authentication (Ray 2.60): ``ray start`` with ``RAY_AUTH_MODE=token`` refuses to
start without a token (it does not generate one), so :class:`RayCluster` writes a random one to
its own file and hands ``RAY_AUTH_MODE=token`` + ``RAY_AUTH_TOKEN_PATH`` to every node and to
drivers (:meth:`RayCluster.driver_env`); nothing touches ``~/.ray/auth_token``.

Each ``start()`` records how long the piece took in ``startup_s``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

PG_BIN = Path("/usr/lib/postgresql/15/bin")
VENV_BIN = Path(sys.executable).parent
RAY_READY = "Ray runtime started"


def free_port(host: str = "") -> int:
    """A TCP port free on all interfaces right now (bound to ``host``, default any)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int, exclude: set[int] = frozenset()) -> list[int]:
    """``n`` distinct TCP ports free right now: all bound at once (so the OS cannot hand out
    one twice, which separate :func:`free_port` calls can), none in ``exclude``."""
    socks: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
            if s.getsockname()[1] not in exclude:
                ports.append(s.getsockname()[1])
        return ports
    finally:
        for s in socks:
            s.close()


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` (a private directory)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and any(marker in a for a in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            continue
    return out


def stop_tree(proc: subprocess.Popen | None, marker: str | None = None, sig: int = signal.SIGTERM,
              grace_s: float = 15.0, root_first: bool = True) -> list[int]:
    """Stop ``proc``, its descendants and every process naming ``marker``, by PID.

    ``root_first``: ``sig`` goes to the root only, which shuts its own children down (a
    ``ray start --block`` process takes ~2 s; signalling all of Ray's processes at once makes
    them wait on each other for > 12 s, measured), up to ``grace_s``; then SIGTERM to what is
    left, and SIGKILL 5 s later. Otherwise ``sig`` goes to every process at once.

    Returns:
        the PIDs found (root, descendants, marked).
    """
    procs: dict[int, psutil.Process] = {}
    root = None
    if proc is not None and proc.poll() is None:
        try:
            root = psutil.Process(proc.pid)
            procs[root.pid] = root
            procs.update({c.pid: c for c in root.children(recursive=True)})
        except psutil.Error:
            root = None
    if marker:
        procs.update({p.pid: p for p in _marked(marker)})

    def signal_all(targets: list[psutil.Process], s: int) -> None:
        for p in targets:
            try:
                p.send_signal(s)
            except psutil.Error:
                pass

    alive = list(procs.values())
    if root_first and root is not None:
        signal_all([root], sig)
        psutil.wait_procs([root], timeout=grace_s)
        _, alive = psutil.wait_procs(alive, timeout=2)
        sig, grace_s = signal.SIGTERM, 5.0
    signal_all(alive, sig)
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return sorted(procs)


def _as_postgres() -> dict:
    """Popen arguments that run a command as the ``postgres`` user when we are root
    (PostgreSQL refuses to run as root); nothing otherwise."""
    return {"user": "postgres", "group": "postgres", "extra_groups": []} if os.geteuid() == 0 else {}


class Postgres:
    """A private PostgreSQL 15 cluster: ``initdb`` in a fresh directory, the ``postgres``
    server on 127.0.0.1:``port`` (scram-sha-256 over TCP, trust on its private socket),
    a login role ``servesweep`` and the databases ``servesweep`` (Optuna, rules),
    ``mlflow`` (MLflow's backend store) and ``mlflow_auth`` (its basic-auth users)."""

    def __init__(self, port: int | None = None, user: str = "servesweep"):
        self.port = port or free_port("127.0.0.1")
        self.user, self.password = user, secrets.token_hex(8)
        self.root: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.startup_s = 0.0

    def url(self, db: str = "servesweep", driver: str = "postgresql+psycopg") -> str:
        """SQLAlchemy URL of ``db`` (``postgresql+psycopg://`` or plain ``postgresql://``)."""
        return f"{driver}://{self.user}:{self.password}@127.0.0.1:{self.port}/{db}"

    def _run(self, argv: list[str]) -> None:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/", **_as_postgres())
        if r.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-1500:]}")

    def _psql(self, sql: str, db: str = "postgres") -> None:
        self._run([str(PG_BIN / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", "postgres", "-d", db,
                   "-v", "ON_ERROR_STOP=1", "-q", "-c", sql])

    def start(self, timeout_s: float = 60) -> Postgres:
        """initdb + server + role + databases; raises RuntimeError naming the failing step."""
        if not (PG_BIN / "postgres").exists():
            raise RuntimeError(f"no PostgreSQL 15 at {PG_BIN}: run scripts/ci_team_setup.sh (apt-get install postgresql)")
        t0 = time.monotonic()
        # /tmp itself: pytest's tmp dirs are mode 700 root, which the postgres user cannot enter
        self.root = Path(tempfile.mkdtemp(prefix="ss-pg-"))
        os.chmod(self.root, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        data = self.root / "data"
        self._run([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-E", "UTF8", "--no-sync",
                   "--auth-local=trust", "--auth-host=scram-sha-256"])
        # test settings: durability off (a test database), few connections
        self.proc = subprocess.Popen(
            [str(PG_BIN / "postgres"), "-D", str(data), "-p", str(self.port), "-h", "127.0.0.1", "-k", str(self.root),
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=100", "-c", "shared_buffers=32MB"],
            stdout=open(self.root / "server.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True,
            cwd="/", **_as_postgres())
        deadline = time.monotonic() + timeout_s
        while subprocess.run([str(PG_BIN / "pg_isready"), "-q", "-h", str(self.root), "-p", str(self.port)]).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {self.log_tail()}")
            time.sleep(0.1)
        self._psql(f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}'")
        for db in ("servesweep", "mlflow", "mlflow_auth"):
            self._psql(f"CREATE DATABASE {db} OWNER {self.user}")
        self.startup_s = time.monotonic() - t0
        return self

    def log_tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of the server log."""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-n:]
        except (OSError, TypeError):
            return ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT: disconnect clients, checkpoint) by PID, then remove the data dir."""
        stop_tree(self.proc, sig=signal.SIGINT)
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)


class MlflowServer:
    """``mlflow server`` with a PostgreSQL (or any SQLAlchemy) backend store, artifacts proxied
    by the server (``--serve-artifacts`` into ``--artifacts-destination``), on 127.0.0.1.

    ``--allowed-hosts``: MLflow 3.17's security middleware answers 403 to a ``Host:`` header it
    does not list; the loopback names are listed here, a team lists its server's DNS names.
    """

    def __init__(self, backend_uri: str, root: Path, port: int | None = None, allowed_hosts: list[str] | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None):
        self.backend_uri, self.root = backend_uri, root
        self.extra_args, self.extra_env = list(extra_args or []), dict(env or {})
        self.port = port or free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        self.allowed_hosts = allowed_hosts or [f"127.0.0.1:{self.port}", "127.0.0.1", f"localhost:{self.port}", "localhost"]
        self.proc: subprocess.Popen | None = None
        self.startup_s = 0.0

    def argv(self) -> list[str]:
        """The exact server command (docs/team.md shows the same)."""
        return [str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", self.backend_uri,
                "--serve-artifacts", "--artifacts-destination", (self.root / "artifacts").as_uri(),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                "--allowed-hosts", ",".join(self.allowed_hosts), *self.extra_args]

    def start(self, timeout_s: float = 180) -> MlflowServer:
        """Start and wait for ``/health`` (the first start creates the schema: ~tens of s)."""
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **self.extra_env}  # no job-runner workers
        self.proc = subprocess.Popen(self.argv(), stdout=open(self.root / "server.log", "ab"), stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True, cwd=str(self.root))
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"mlflow server not healthy after {timeout_s} s: {self.log_tail()}")
            time.sleep(0.3)
        self.startup_s = time.monotonic() - t0
        return self

    def log_tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of the server log."""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    @classmethod
    def with_basic_auth(cls, backend_uri: str, auth_db_uri: str, root: Path, admin_password: str) -> MlflowServer:
        """A server with MLflow's basic-auth app (needs Flask-WTF: the ``team`` extra): users and
        permissions in ``auth_db_uri``, admin ``admin`` with ``admin_password``, new users get
        READ on every experiment (``default_permission``)."""
        root.mkdir(parents=True, exist_ok=True)
        ini = root / "basic_auth.ini"
        ini.write_text("[mlflow]\ndefault_permission = READ\n"
                       f"database_uri = {auth_db_uri}\nadmin_username = admin\n"
                       "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        env = {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
               "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
        return cls(backend_uri, root, extra_args=["--app-name", "basic-auth"], env=env)

    def stop(self) -> None:
        """SIGTERM the server and its gunicorn/uvicorn workers by PID (SIGKILL after 15 s)."""
        stop_tree(self.proc, root_first=False)


def bare_python(root: Path) -> Path:
    """A Python with the venv's packages (Ray, ...) but not servesweep: a venv whose only
    ``.pth`` adds the main venv's site-packages as a plain path, so the editable install's
    finder (itself a ``.pth`` there) is never run. Models a GPU node without the repo."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib"))
    rel = site.relative_to(Path(sys.prefix))
    (root / rel).mkdir(parents=True, exist_ok=True)
    (root / rel / "servesweep-deps.pth").write_text(str(site) + "\n")
    return root / "bin" / "python"


class RayCluster:
    """A Ray cluster of ``ray start --block`` processes on loopback addresses: the head on
    127.0.0.2 and workers on 127.0.0.3, 127.0.0.4, ... (Ray replaces 127.0.0.1 by the host's
    interface address), token authentication on, every port explicit (other Ray instances
    on the host keep theirs)."""

    def __init__(self, head_gpus: int = 8, object_store_mb: int = 80):
        self.root = Path(tempfile.mkdtemp(prefix="ssr-"))  # short: Ray's socket paths are length-capped
        self.token_path = self.root / "auth_token"
        self.token_path.write_text(secrets.token_hex(32))
        os.chmod(self.token_path, 0o600)
        self.head_gpus, self.object_store_mb = head_gpus, object_store_mb
        self.port = free_port()
        self.address = f"127.0.0.2:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.startup_s: dict[str, float] = {}

    def env(self) -> dict[str, str]:
        """Environment of every node and driver: token auth on, this cluster's token file."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path),
                "RAY_USAGE_STATS_ENABLED": "0"}

    driver_env = env

    def _ports(self, head: bool) -> list[str]:
        # distinct in one call: Ray refuses a node whose components share a port
        p = free_ports(23, exclude={self.port})
        argv = ["--node-manager-port", str(p[0]), "--object-manager-port", str(p[1]),
                "--dashboard-agent-listen-port", str(p[2]), "--dashboard-agent-grpc-port", str(p[3]),
                "--metrics-export-port", str(p[4]), "--runtime-env-agent-port", str(p[5]),
                "--worker-port-list", ",".join(str(x) for x in sorted(p[7:]))]
        if head:
            argv += ["--port", str(self.port), "--ray-client-server-port", str(p[6])]
        return argv

    def _start_node(self, name: str, argv: list[str], python: Path | None, timeout_s: float) -> None:
        t0 = time.monotonic()
        log = self.root / f"{name}.log"
        py = str(python or sys.executable)
        cmd = [py, "-m", "ray.scripts.scripts", "start", *argv, "--block", "--disable-usage-stats",
               "--object-store-memory", str(self.object_store_mb * 1024 * 1024)]
        proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=self.env(),
                                start_new_session=True, cwd=str(self.root))
        self.nodes[name] = proc
        while RAY_READY not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"ray node {name} did not start: {log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        self.startup_s[name] = time.monotonic() - t0

    def start_head(self, timeout_s: float = 120) -> RayCluster:
        """``ray start --head --node-ip-address=127.0.0.2`` with ``head_gpus`` logical GPUs."""
        self._start_node("head", ["--head", "--node-ip-address=127.0.0.2", "--num-cpus", "1",
                                  "--num-gpus", str(self.head_gpus), "--include-dashboard", "false",
                                  "--temp-dir", str(self.root / "t"), *self._ports(True)], None, timeout_s)
        return self

    def add_worker(self, ip: str = "127.0.0.3", gpus: int = 8, resources: str | None = None,
                   python: Path | None = None, timeout_s: float = 120) -> str:
        """``ray start --address=<head> --node-ip-address=<ip>``; returns the node's name (its ip).

        ``python``: the interpreter the node (and so its workers) runs, e.g. :func:`bare_python`.
        """
        argv = [f"--address={self.address}", f"--node-ip-address={ip}", "--num-cpus", "1", "--num-gpus", str(gpus),
                *self._ports(False)]
        if resources:
            argv += ["--resources", resources]
        self._start_node(ip, argv, python, timeout_s)
        return ip

    def stop_node(self, name: str, sig: int = signal.SIGTERM) -> list[int]:
        """Stop one node (its ``ray start`` process and what it spawned) by PID; ``sig=SIGKILL``
        kills all its processes at once, the way a machine dies.

        Only the tree is used: all nodes share the cluster's temp dir, so the marker would
        take the others too. Returns the PIDs signalled."""
        # SIGKILL: every process of the node at once (a crash); otherwise ray start's own shutdown
        return stop_tree(self.nodes.pop(name), sig=sig, grace_s=10, root_first=sig != signal.SIGKILL)

    def stop(self) -> None:
        """Stop every node (workers first) and anything still naming the cluster's directory."""
        for name in [n for n in self.nodes if n != "head"] + (["head"] if "head" in self.nodes else []):
            self.stop_node(name)
        stop_tree(None, marker=str(self.root), grace_s=10)
        shutil.rmtree(self.root, ignore_errors=True)
