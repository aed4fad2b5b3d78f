"""``run_trial``: what runs on the GPU node as one Ray task.

Reserve ports -> (check GPUs free) -> launch the server -> wait healthy -> check the
allreduce path taken -> warm up + benchmark -> tear the process tree down -> check the
port (and GPUs) released -> return a :class:`tasks.types.TrialResult`.

Expected failures (the config fails, the server crashes or stalls) are data in the
result; only infrastructure failures (node or worker death) surface as Ray exceptions.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

from tasks.bench import BenchError, fetch_server_info, run_benchmark
from tasks.failures import KIND, classify, detect_perf_tags
from tasks.redact import redact_argv, redact_env, redact_text
from tasks.server import LifecycleError, launched_server, port_is_free, reserve_ports
from tasks.types import TrialResult, TrialSpec

LOG_TAIL_LINES = 60
PROFILE_ENV = "SERVESWEEP_EMULATOR_PROFILE"


def _tail(text: str, n: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-n:])


def launch_command(argv: list[str], env: dict[str, str]) -> str:
    """Shell-quoted, redacted command with its env prefix (for humans and MLflow only)."""
    e = redact_env(env)
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(e.items())), *map(shlex.quote, redact_argv(argv))])


def _node_name() -> str:
    try:
        import ray

        if ray.is_initialized():
            return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:12]}"
    except Exception:  # noqa: BLE001 - outside Ray, or an old Ray: the hostname is enough
        pass
    return socket.gethostname()


def _gpu_indices() -> list[int]:
    try:
        import ray

        if ray.is_initialized():
            return [int(x) for x in ray.get_gpu_ids()]
    except Exception:  # noqa: BLE001
        pass
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(x) for x in vis.split(",") if x.strip().isdigit()]


def emulated_fingerprint(profile: dict[str, Any]) -> dict[str, str]:
    """The emulated node's environment fingerprint (``profile["emulator"]["fingerprint"]``,
    GPU arch, driver, CUDA, NCCL, torch, SGLang, FlashInfer) as strings."""
    fp = (profile.get("emulator") or {}).get("fingerprint") or {}
    return {str(k): str(v) for k, v in sorted(fp.items())}


def node_fingerprint(backend: str, profile: dict[str, Any] | None, gpu_indices: list[int] | None = None) -> dict[str, str]:
    """Fingerprint of this node: the emulator's declared stack, or the real one (NVML, packages)."""
    if backend in ("emulated", "instant") and profile is not None:
        return emulated_fingerprint(profile)
    from tasks.fingerprint import collect_fingerprint

    return collect_fingerprint(gpu_indices)


def _fingerprint(spec: TrialSpec, profile: dict[str, Any] | None) -> dict[str, str]:
    return node_fingerprint(spec.backend, profile, _gpu_indices())


def _failure(res: TrialResult, log: str, exit_code: int | None, phase: str, harness_class: str | None) -> TrialResult:
    c = classify(redact_text(log), exit_code, phase)  # the signature leaves the node: classify the redacted log
    cls, sig = c.failure_class, c.signature
    if harness_class and (cls in ("unknown", "startup_timeout", "server_crash") or c.kind == "perf"):
        cls = harness_class
        sig = sig or harness_class
    res.status = "infra_error" if KIND.get(cls) == "infra" else "failed"
    res.failure_class, res.failure_kind, res.failure_signature = cls, KIND.get(cls, "transient"), sig
    res.phase, res.exit_code = phase, exit_code
    return res


def run_trial(spec: TrialSpec, profile: dict[str, Any] | None = None, workdir: str | None = None) -> TrialResult:
    """Run one trial end to end on this node and return its result (never raises for
    expected failures).

    Args:
        spec: the rendered trial (argv without host/port flags).
        profile: emulator profile ``{"node", "model", "emulator"}`` (emulated/instant backends).
        workdir: where trial directories go (server log, bench JSON); default
            ``<tmp>/servesweep-trials``.
    Returns:
        :class:`TrialResult`; ``gpu_s`` = wall time holding the GPUs × ``spec.gpus``.
    """
    t0 = time.monotonic()
    argv = [sys.executable if a == "{python}" else a for a in spec.argv]
    env = dict(spec.env)
    res = TrialResult(status="ok", node=_node_name(), gpu_ids=_gpu_indices())
    try:
        res.fingerprint = _fingerprint(spec, profile)
    except Exception as e:  # noqa: BLE001 - a fingerprint problem must not kill the trial
        res.fingerprint = {"error": f"{type(e).__name__}: {e}"}
    if spec.backend == "instant":
        return _run_instant(spec, profile or {}, argv, env, res, t0)

    base = Path(workdir or Path(os.environ.get("TMPDIR", "/tmp")) / "servesweep-trials")
    tdir = base / spec.sweep / f"t{spec.trial_number:05d}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    tdir.mkdir(parents=True, exist_ok=True)
    log_path = tdir / "server.log"
    if profile is not None:
        (tdir / "profile.json").write_text(json.dumps(profile))
        env[PROFILE_ENV] = str(tdir / "profile.json")
    phase = "startup"
    srv = None
    try:
        if spec.backend == "sglang":
            from tasks.gpus import GpuBusyError, assert_gpus_free

            try:
                assert_gpus_free(_gpu_indices())
            except GpuBusyError as e:
                raise LifecycleError(str(e), "preflight", "gpu_busy") from None
        with reserve_ports(2) as (port, nccl_port):
            full = [*argv, "--host", "127.0.0.1", "--port", str(port), "--nccl-port", str(nccl_port)]
            res.launch_command = launch_command(full, spec.env)
            base_url = f"http://127.0.0.1:{port}"
            with launched_server(full, env, log_path, base_url, spec.timeouts, spec.container_name) as srv:
                res.startup_s = srv.wait_healthy()
                t_bench = time.monotonic()
                phase = "bench"
                try:
                    metrics, records = run_benchmark(base_url, spec.bench, deadline_s=spec.timeouts.bench_s)
                except BenchError as e:
                    # a lost connection usually means the server is exiting: wait for its code
                    rc = srv.returncode() if e.kind == "stall" else srv.wait_exit(2.0)
                    if rc is None and e.kind == "stall":
                        raise LifecycleError(str(e), "bench", "bench_stall") from None
                    if rc is None:
                        raise LifecycleError(str(e), "bench", "server_crash") from None
                    raise LifecycleError(str(e), "bench", "early_exit" if rc == 0 else "server_crash", rc) from None
                res.bench_s = time.monotonic() - t_bench
                info = fetch_server_info(base_url)
                states = info.get("internal_states") or [{}]
                if metrics.get("accept_length", 1.0) == 1.0 and states[0].get("avg_spec_accept_length"):
                    metrics["accept_length"] = float(states[0]["avg_spec_accept_length"])
                res.metrics = metrics
                res.bench = [r.to_dict() for r in records]
                phase = "teardown"
            if not port_is_free(port):
                time.sleep(1.0)
                if not port_is_free(port):
                    raise LifecycleError(f"port {port} still bound after teardown", "teardown", "teardown_timeout")
        if spec.backend == "sglang":
            from tasks.gpus import wait_gpus_released

            if not wait_gpus_released(_gpu_indices(), spec.timeouts.gpu_release_s):
                raise LifecycleError("GPU memory not released after teardown", "teardown", "teardown_timeout")
    except LifecycleError as e:
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(f"\n[servesweep] {e.phase}: {e}\n")
        rc = e.exit_code  # observed before teardown; after it a SIGTERMed server exits 0
        _failure(res, log_path.read_text(errors="replace"), rc, e.phase, e.failure_class)
    except Exception as e:  # noqa: BLE001 - a harness bug is an infra error, never a crashed sweep
        res.status, res.phase, res.failure_class, res.failure_kind = "infra_error", phase, "unknown", "infra"
        res.failure_signature = redact_text(f"harness error: {type(e).__name__}: {e}")[:500]
    # KeyboardInterrupt / Ray task cancellation propagate: launched_server already tore down.
    return _finish(res, log_path, spec, t0)


def _finish(res: TrialResult, log_path: Path, spec: TrialSpec, t0: float) -> TrialResult:
    log = redact_text(log_path.read_text(errors="replace")) if log_path.exists() else ""
    if res.status == "ok":
        res.perf_tags = detect_perf_tags(log)
    res.server_log = log[-(1 << 20):]
    res.log_tail = _tail(log)
    res.wall_s = time.monotonic() - t0
    res.gpu_s = res.wall_s * spec.gpus
    return res


def _run_instant(spec: TrialSpec, profile: dict[str, Any], argv: list[str], env: dict[str, str],
                 res: TrialResult, t0: float) -> TrialResult:
    """The emulator's model evaluated in-process: what the trial would measure and cost."""
    from tasks.emulator.instant import simulate

    out = simulate(profile, argv, env, spec.bench, seed=spec.trial_number)
    res.launch_command = launch_command(argv, spec.env)
    res.server_log = redact_text(out.get("log", ""))
    res.log_tail = _tail(res.server_log)
    res.startup_s = float(out.get("startup_s", 0.0))
    res.bench_s = float(out.get("bench_s", 0.0))
    res.gpu_s = float(out.get("gpu_s", 0.0))
    res.wall_s = time.monotonic() - t0
    if out.get("status") == "ok":
        res.metrics = dict(out.get("metrics") or {})
        res.perf_tags = detect_perf_tags(res.server_log)
    else:
        c = classify(res.server_log, out.get("exit_code"), out.get("phase") or "startup")
        res.status = "infra_error" if c.kind == "infra" else "failed"
        res.failure_class = out.get("failure_class") or c.failure_class
        res.failure_kind = KIND.get(res.failure_class, c.kind)
        res.failure_signature = out.get("failure_signature") or c.signature
        res.phase = out.get("phase") or "startup"
    return res
