"""The generic trial lifecycle on the node, asking its backend at every engine-specific step.

Reserve the backend's ports -> (check GPUs free) -> launch ``backend.server_argv(...)`` ->
poll ``backend.health_path`` -> ``backend.benchmark`` -> ``backend.post_bench_metrics`` ->
tear the process tree down -> check the port (and GPUs) released -> ``backend.paths_taken``
on the log -> :class:`tasks.types.TrialResult`.

Expected failures (the config fails, the server crashes or stalls) are data in the result;
only infrastructure failures (node or worker death) surface as Ray exceptions.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from tasks import trial_load
from tasks.bench_client import BenchError
from tasks.failures import KIND, classify
from tasks.quality import tag_quality
from tasks.readiness import ensure_serving, is_http_5xx
from tasks.redact import redact_argv, redact_env, redact_text
from tasks.server import LifecycleError, ServerProcess, launched_server, port_is_free, reserve_ports
from tasks.types import BenchSpec, TrialResult, TrialSpec
from tasks.workdir import workdir_failure

LOG_TAIL_LINES = 60
PROFILE_ENV = "SERVESWEEP_EMULATOR_PROFILE"
HOST = "127.0.0.1"


class Backend(Protocol):
    """What the lifecycle asks of a backend (:class:`tasks.backends.base.Backend` documents each)."""

    ports: tuple[str, ...]
    health_path: str
    checks_gpus: bool
    engine: str
    ready_request: tuple[str, Mapping[str, Any]] | None
    load_api: str

    def fingerprint(self, profile: Mapping[str, Any] | None, gpu_indices: list[int] | None) -> dict[str, str]: ...
    def server_argv(self, argv: Sequence[str], host: str, ports: Sequence[int]) -> list[str]: ...
    def benchmark(self, base_url: str, bench: BenchSpec,
                  deadline_s: float | None) -> tuple[dict[str, float], list[dict[str, Any]]]: ...
    def post_bench_metrics(self, base_url: str, metrics: dict[str, float]) -> dict[str, float]: ...
    def paths_taken(self, log: str, expected: Mapping[str, Any]) -> list[str]: ...


def tail(text: str, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` lines of ``text``."""
    return "\n".join(text.splitlines()[-n:])


def launch_command(argv: list[str], env: dict[str, str]) -> str:
    """Shell-quoted, redacted command with its env prefix (for humans and MLflow only)."""
    e = redact_env(env)
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(e.items())), *map(shlex.quote, redact_argv(argv))])


def node_name() -> str:
    """The Ray node the trial runs on, ``<node ip>/<node id, first 12 hex>`` (the address and
    id ``ray status`` / ``ray.nodes()`` show; nodes of one host differ by IP), else the hostname."""
    try:
        import ray

        if ray.is_initialized():
            return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:12]}"
    except Exception:  # noqa: BLE001 - outside Ray, or an old Ray: the hostname is enough
        pass
    return socket.gethostname()


def gpu_indices() -> list[int]:
    """The GPU indices Ray assigned to this task, else ``CUDA_VISIBLE_DEVICES``'s."""
    try:
        import ray

        if ray.is_initialized():
            return [int(x) for x in ray.get_gpu_ids()]
    except Exception:  # noqa: BLE001
        pass
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(x) for x in vis.split(",") if x.strip().isdigit()]


def new_result(backend: Backend, spec: TrialSpec,
               profile: dict[str, Any] | None) -> tuple[TrialResult, list[str], dict[str, str]]:
    """A fresh ``ok`` result with node, GPUs and fingerprint, and the argv (``{python}`` resolved
    to this interpreter) and env to launch."""
    argv = [sys.executable if a == "{python}" else a for a in spec.argv]
    res = TrialResult(status="ok", node=node_name(), gpu_ids=gpu_indices())
    try:
        res.fingerprint = backend.fingerprint(profile, gpu_indices())
    except Exception as e:  # noqa: BLE001 - a fingerprint problem must not kill the trial
        res.fingerprint = {"error": f"{type(e).__name__}: {e}"}
    return res, argv, dict(spec.env)


def _failure(res: TrialResult, log: str, exit_code: int | None, phase: str, harness_class: str | None) -> TrialResult:
    c = classify(redact_text(log), exit_code, phase)  # the signature leaves the node: classify the redacted log
    cls, sig = c.failure_class, c.signature
    # a server_crash the log names (a decisive line, e.g. vLLM's EngineDeadError under an API
    # server that then exits 0) outranks the harness's view; the exit-code fallback does not
    # bench_stall is only ever the phase fallback (no signature row names it): the harness knows better
    generic = cls in ("unknown", "startup_timeout", "bench_stall") or (cls == "server_crash" and not c.line)
    if harness_class and (generic or c.kind == "perf"):
        cls = harness_class
        sig = sig or harness_class
    res.status = "infra_error" if KIND.get(cls) == "infra" else "failed"
    res.failure_class, res.failure_kind, res.failure_signature = cls, KIND.get(cls, "transient"), sig
    res.failure_line = c.decisive_line if cls == c.failure_class else ""
    res.phase, res.exit_code = phase, exit_code
    return res


def _trial_dir(spec: TrialSpec, workdir: str | None) -> Path:
    base = Path(workdir or Path(os.environ.get("TMPDIR", "/tmp")) / "servesweep-trials")
    tdir = base / spec.sweep / f"t{spec.trial_number:05d}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    tdir.mkdir(parents=True, exist_ok=True)
    return tdir


def _measure(backend: Backend, srv: ServerProcess, spec: TrialSpec, res: TrialResult) -> None:
    """Benchmark a healthy server into ``res`` (metrics, records, bench_s).

    Raises:
        LifecycleError: ``bench_stall``, ``server_crash`` or ``early_exit`` (phase ``bench``).
    """
    t_bench = time.monotonic()
    try:
        metrics, records = backend.benchmark(srv.base_url, spec.bench, spec.timeouts.bench_s)
        if trial_load.wants_load(spec.bench):  # load search / concurrency levels on the same server
            metrics, records = trial_load.with_load(backend.load_api, srv.base_url, spec.bench, metrics, records,
                                                    t_bench, spec.timeouts.bench_s)
    except BenchError as e:
        # a lost connection usually means the server is exiting: wait for its code
        rc = srv.returncode() if e.kind == "stall" else srv.wait_exit(2.0)
        if rc is None and e.kind == "stall":
            raise LifecycleError(str(e), "bench", "bench_stall") from None
        if rc is None and is_http_5xx(e):  # the server answered with an error: transient, retried once
            raise LifecycleError(str(e), "bench", "server_http_error") from None
        if rc is None:
            raise LifecycleError(str(e), "bench", "server_crash") from None
        raise LifecycleError(str(e), "bench", "early_exit" if rc == 0 else "server_crash", rc) from None
    bench_s = time.monotonic() - t_bench
    res.metrics = backend.post_bench_metrics(srv.base_url, metrics)
    tag_quality(res.metrics, records, res.perf_tags,  # itl_ms_max, decode_tok_s_cv; 'unstable' on a freeze
                judge=spec.bench.concurrency == 1 and not trial_load.wants_load(spec.bench),
                max_cv=spec.bench.max_repeat_cv)
    res.bench, res.bench_s = records, bench_s  # bench_s set last: it marks the teardown phase


def _serve_and_measure(backend: Backend, spec: TrialSpec, argv: list[str], env: dict[str, str],
                       log_path: Path, res: TrialResult) -> None:
    """Ports -> GPUs free -> launch -> healthy -> benchmark -> teardown -> ports/GPUs released.

    Raises:
        LifecycleError: any lifecycle failure, with its phase and harness class.
    """
    if backend.checks_gpus:
        from tasks.gpus import GpuBusyError, assert_gpus_free

        try:
            assert_gpus_free(gpu_indices())
        except GpuBusyError as e:
            raise LifecycleError(str(e), "preflight", "gpu_busy") from None
    with reserve_ports(len(backend.ports)) as ports:
        full = backend.server_argv(argv, HOST, ports)
        res.launch_command = launch_command(full, spec.env)
        base_url = f"http://{HOST}:{ports[0]}"
        with launched_server(full, env, log_path, base_url, spec.timeouts, spec.container_name,
                             health_path=backend.health_path) as srv:
            res.startup_s = srv.wait_healthy()
            if not spec.probe:  # a probe only has to reach ready; a trial must also serve one generation
                res.warmup_s = ensure_serving(base_url, backend.ready_request, spec.timeouts.startup_s - res.startup_s)
                _measure(backend, srv, spec, res)
        deadline = time.monotonic() + max(1.0, spec.timeouts.term_grace_s)  # a SIGKILLed tree releases it late
        while not port_is_free(ports[0]):
            if time.monotonic() > deadline:
                raise LifecycleError(f"port {ports[0]} still bound after teardown", "teardown", "teardown_timeout")
            time.sleep(0.2)
    if backend.checks_gpus:
        from tasks.gpus import wait_gpus_released

        if not wait_gpus_released(gpu_indices(), spec.timeouts.gpu_release_s):
            raise LifecycleError("GPU memory not released after teardown", "teardown", "teardown_timeout")


def run_server_trial(backend: Backend, spec: TrialSpec, profile: dict[str, Any] | None,
                     workdir: str | None) -> TrialResult:
    """Run one trial end to end through a launched server and return its result (never raises
    for expected failures).

    Args:
        backend: the backend that launches, benchmarks and reads the server.
        spec: the rendered trial (argv without host/port flags).
        profile: emulator profile ``{"node", "model", "emulator"}`` (written to the trial
            directory and passed in ``SERVESWEEP_EMULATOR_PROFILE``), or None.
        workdir: where trial directories go (server log); default ``<tmp>/servesweep-trials``.
    Returns:
        :class:`TrialResult`; ``gpu_s`` = wall time holding the GPUs × ``spec.gpus``.
    """
    t0 = time.monotonic()
    res, argv, env = new_result(backend, spec, profile)
    try:
        tdir = _trial_dir(spec, workdir)
        log_path = tdir / "server.log"
        if profile is not None:
            (tdir / "profile.json").write_text(json.dumps(profile))
            env[PROFILE_ENV] = str(tdir / "profile.json")
    except OSError as e:  # full / read-only work dir: this node cannot run trials
        return workdir_failure(res, e, t0)
    try:
        _serve_and_measure(backend, spec, argv, env, log_path, res)
    except LifecycleError as e:
        verdict = f"\n[servesweep] {e.phase}: {e}\n"
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(verdict)
        # the evidence is the log as it stood when the failure was seen, before teardown
        evidence = log_path.read_bytes()[:e.log_upto].decode(errors="replace") + verdict
        rc = e.exit_code  # observed before teardown; after it a SIGTERMed server exits 0
        _failure(res, evidence, rc, e.phase, e.failure_class)
    except Exception as e:  # noqa: BLE001 - a harness bug is an infra error, never a crashed sweep
        phase = "teardown" if res.bench_s else "bench" if res.startup_s else "startup"
        res.status, res.phase, res.failure_class, res.failure_kind = "infra_error", phase, "unknown", "infra"
        res.failure_signature = redact_text(f"harness error: {type(e).__name__}: {e}")[:500]
    # KeyboardInterrupt / Ray task cancellation propagate: launched_server already tore down.
    log = redact_text(log_path.read_text(errors="replace")) if log_path.exists() else ""
    if res.status == "ok":
        res.perf_tags = [*backend.paths_taken(log, spec.expected_paths), *res.perf_tags]  # + tasks.quality's
    res.server_log = log[-(1 << 20):]
    res.log_tail = tail(log)
    res.wall_s = time.monotonic() - t0
    res.gpu_s = res.wall_s * spec.gpus
    return res
