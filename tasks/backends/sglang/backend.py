"""The real SGLang server (``backend=sglang``): flags from the knob table, SGLang's own parser,
native streaming ``/generate`` benchmark, acceptance length from ``/server_info``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tasks.backends.base import Backend, Launch, ProbeSupport
from tasks.backends.sglang.cli import DEFAULT_SGLANG_VERSION, SGLangUnavailable, check_many
from tasks.backends.sglang.client import fetch_server_info, run_benchmark
from tasks.backends.sglang.knobs import FLOAT_KNOBS, INT_KNOBS, KNOWN_KNOBS, render_launch
from tasks.bench_client import SUMMARY_METRICS
from tasks.failures import detect_perf_tags
from tasks.types import BenchSpec

#: Interpreter of the contract venv (scripts/contract_env.sh): SGLang's parser on CPU torch,
#: used to validate argvs when SGLang is not importable here and ``backend.python`` is unset.
CONTRACT_PYTHON = Path(__file__).resolve().parents[3] / ".contract-venv" / "bin" / "python"
#: what :func:`tasks.bench_client.summarize` returns, plus the lifecycle's
#: :func:`tasks.quality.quality_metrics` (``itl_ms_max``, ``decode_tok_s_cv``)
BENCH_METRICS = SUMMARY_METRICS | {"itl_ms_max", "decode_tok_s_cv"}


def strip_launcher(argv: Sequence[str], launcher: Sequence[str]) -> list[str]:
    """``argv`` without its ``backend.launcher`` prefix (``{python}`` matches any interpreter), so
    any launcher (the emulated server's module, a container command) leaves the server args;
    an argv that does not start with the launcher is returned as is."""
    n = len(launcher)
    if n and len(argv) >= n and all(x == "{python}" or x == a for x, a in zip(launcher, argv)):
        return list(argv[n:])
    return list(argv)


class SGLangBackend(Backend):
    """SGLang ``launch_server`` on a GPU node (see :class:`tasks.backends.base.Backend`)."""

    kind = "sglang"
    engine = "sglang"
    engine_label = "SGLang"
    version_key = "sglang_version"
    default_version = DEFAULT_SGLANG_VERSION
    fingerprint_key = "sglang"
    # SGLang passes --json-model-override-args to the EAGLE-3 draft too (tasks.probe.probe_layers)
    probe = ProbeSupport(override_flag="--json-model-override-args", speculative_flag="--speculative-algorithm",
                         speculative_json=False, cuts_eagle3_target=False)
    bench_metrics = BENCH_METRICS
    launches_server = True
    checks_gpus = True
    ports = ("port", "nccl_port")
    # /health answered 200 without generating in older releases; /health_generate runs a
    # 1-token generation, so a 200 means the model serves.
    health_path = "/health_generate"
    ready_request = ("/generate", {"input_ids": [1, 2, 3, 4],
                                   "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
    load_api = "sglang"
    known_knobs = KNOWN_KNOBS
    int_knobs = INT_KNOBS
    float_knobs = FLOAT_KNOBS

    def render(self, params: Mapping[str, Any], node: Mapping[str, Any], model: Mapping[str, Any],
               backend_cfg: Mapping[str, Any]) -> Launch:
        return Launch(*render_launch(params, node, model, backend_cfg))

    def validate(self, argvs: list[list[str]], backend_cfg: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """SGLang's parser: in-process when SGLang is importable, else ``backend.python`` or the
        contract venv's interpreter (one subprocess for the whole batch); None when none has it."""
        python = backend_cfg.get("python")
        if python is None and CONTRACT_PYTHON.exists():
            python = str(CONTRACT_PYTHON)
        launcher = [str(x) for x in backend_cfg.get("launcher") or ()]
        try:
            return check_many([strip_launcher(a, launcher) for a in argvs], python=python)
        except SGLangUnavailable:
            return None

    def server_argv(self, argv: Sequence[str], host: str, ports: Sequence[int]) -> list[str]:
        port, nccl_port = ports
        return [*argv, "--host", host, "--port", str(port), "--nccl-port", str(nccl_port)]

    def benchmark(self, base_url: str, bench: BenchSpec,
                  deadline_s: float | None) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Streaming greedy ``/generate`` with token ids (:func:`tasks.backends.sglang.client.run_benchmark`)."""
        metrics, records = run_benchmark(base_url, bench, deadline_s=deadline_s)
        return metrics, [r.to_dict() for r in records]

    def post_bench_metrics(self, base_url: str, metrics: dict[str, float]) -> dict[str, float]:
        """Acceptance length from ``/server_info``'s ``internal_states[0].avg_spec_accept_length``
        when the streams carried no ``spec_verify_ct`` (``accept_length`` still 1.0)."""
        info = fetch_server_info(base_url)
        states = info.get("internal_states") or [{}]
        if metrics.get("accept_length", 1.0) == 1.0 and states[0].get("avg_spec_accept_length"):
            metrics["accept_length"] = float(states[0]["avg_spec_accept_length"])
        return metrics

    def paths_taken(self, log: str, expected: Mapping[str, Any]) -> list[str]:
        """``allreduce_path_degraded`` etc. from SGLang's log lines (:func:`tasks.failures.detect_perf_tags`):
        a path turned off counts only when the launch expected it (``{"allreduce": "custom"}``);
        with no expectation (``{}``) every turned-off path counts."""
        return detect_perf_tags(log, expected or None)


BACKEND = SGLangBackend()
