"""The backend protocol: what the driver and the generic trial lifecycle ask an engine.

A backend answers, for one engine (SGLang, vLLM, the emulated node):

* what it is (class attributes, read by the driver instead of asking for a backend by name):
  its engine, whether its numbers are emulated, the config and fingerprint fields that carry
  the engine version, how its launch becomes a probe (:class:`ProbeSupport`), and the metrics
  its trials return (:meth:`Backend.metrics`);
* driver side (no GPU): its engine and version, the emulator profile it needs, how a knob
  set becomes argv + env (:meth:`Backend.render`), how argvs are validated by the engine's
  own parser (:meth:`Backend.validate`), the node's environment fingerprint;
* node side (the generic lifecycle in :mod:`tasks.backends.lifecycle`): which ports a trial
  reserves and how host/ports reach argv, the readiness URL, what a benchmark request looks
  like, metrics read after the benchmark, how the log tells the path actually taken.

:meth:`Backend.run_trial` runs the generic lifecycle; a backend that launches nothing
(``instant``) overrides it. Backends are stateless singletons: every method takes what it
needs (config mappings are plain dicts, see ``sweeps.config.spec.backend_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tasks.types import BenchSpec, TrialResult, TrialSpec


class KnobError(ValueError):
    """A knob name or value that cannot be rendered (names the knob and the fix); what
    :meth:`Backend.render` raises for a launch it cannot make."""


class Launch(NamedTuple):
    """A rendered launch: ``argv`` without host/port flags (the node adds them, see
    :meth:`Backend.server_argv`), ``env`` set on top of the node's, and ``expected`` paths
    the server log must show (e.g. ``{"allreduce": "custom"}``)."""

    argv: list[str]
    env: dict[str, str]
    expected: dict[str, Any]


@dataclass(frozen=True)
class ProbeSupport:
    """How an engine's launch becomes a probe launch (:mod:`tasks.probe`): the same argv with
    dummy weights and the model cut to few layers through the engine's config-override flag.

    Attributes:
        override_flag: the flag taking a JSON patch of the model's HF config (SGLang
            ``--json-model-override-args``, vLLM ``--hf-overrides``).
        speculative_flag: the flag naming the speculative method in a launch argv.
        speculative_json: True when that flag's value is a JSON object with a ``method`` key
            (vLLM's ``--speculative-config``), False for the bare method name (SGLang's
            ``--speculative-algorithm``).
        cuts_eagle3_target: True when the override reaches the target model only, so an EAGLE-3
            probe may cut the target's layers (vLLM); False when it reaches the draft too and an
            EAGLE-3 probe keeps every layer (SGLang; the reasoning is in
            :func:`tasks.probe.probe_layers`).
        load_format_flag: the flag selecting dummy weights (``--load-format dummy``; both engines).
    """

    override_flag: str
    speculative_flag: str
    speculative_json: bool = False
    cuts_eagle3_target: bool = False
    load_format_flag: str = "--load-format"


class Backend:
    """Base class of every backend; subclasses set the class attributes and override the hooks.

    Attributes:
        kind: ``backend.kind`` this module serves (``"sglang"``, ``"emulated"``, ...).
        engine: the engine whose flags and HTTP API it speaks (``"sglang"`` | ``"vllm"``).
        engine_label: the engine's name in messages (``"SGLang"``; empty: :attr:`engine`).
        version_key: the ``backend.*`` config field naming the targeted engine version
            (``"sglang_version"``); config validation accepts it, :meth:`engine_version` reads it.
        default_version: the version targeted when the config leaves :attr:`version_key` unset.
        fingerprint_key: the fingerprint field carrying the engine's installed version
            (``"sglang"``): part of the stack failure rules and shipped knowledge are keyed by.
        probe: how a launch becomes a probe launch; None when this backend cannot probe.
        bench_metrics: the metrics a trial's fixed benchmark returns (the serving-under-load
            ones come on top, see :meth:`metrics`).
        launches_server: False when trials run in-process (no ports, no server process).
        emulated: True when the numbers are the emulated node's, not a real engine's on real GPUs.
        checks_gpus: True for real engines: NVML checks the assigned GPUs are free before
            launch and released after teardown.
        ports: names of the TCP ports one trial reserves, in the order
            :meth:`server_argv` receives them (SGLang: HTTP port and NCCL port).
        health_path: readiness endpoint polled until it answers 200.
        ready_request: ``(path, JSON body)`` of the one-token generation that must be served
            after health is green (:func:`tasks.readiness.first_generation`); None: ready once healthy.
        load_api: the HTTP API the load client speaks to it for load searches and concurrency
            levels (:data:`tasks.load_client.Api`: ``"sglang"`` native, ``"openai"``).
        known_knobs: every knob name :meth:`render` takes.
        int_knobs, float_knobs: knobs the engine parses as int / float (a sweep level of
            another type would only fail at launch, so config validation refuses it).
    """

    kind: str = ""
    engine: str = "sglang"
    engine_label: str = ""
    version_key: str = ""
    default_version: str = ""
    fingerprint_key: str = ""
    probe: ProbeSupport | None = None
    bench_metrics: frozenset[str] = frozenset()
    launches_server: bool = True
    emulated: bool = False
    checks_gpus: bool = True
    ports: tuple[str, ...] = ("port",)
    health_path: str = "/health"
    ready_request: tuple[str, Mapping[str, Any]] | None = None
    load_api: str = "sglang"
    known_knobs: frozenset[str] = frozenset()
    int_knobs: frozenset[str] = frozenset()
    float_knobs: frozenset[str] = frozenset()

    # --- driver side -------------------------------------------------------------------
    def engine_version(self, backend_cfg: Mapping[str, Any]) -> str:
        """The engine version trials target (selects flag names in the knob table):
        ``backend.<version_key>``, else :attr:`default_version`."""
        return str((backend_cfg.get(self.version_key) if self.version_key else None) or self.default_version)

    def metrics(self, bench: BenchSpec) -> frozenset[str]:
        """Every metric name a trial of this backend can return for ``bench``: :attr:`bench_metrics`
        plus the load search's and concurrency levels' (:func:`tasks.trial_load.load_metric_names`).

        A superset is safe (an objective naming a metric that is listed but not logged still
        stops the sweep at its first benchmarked trial); a missing name would refuse a valid
        objective, so list generously.
        """
        from tasks.trial_load import load_metric_names

        return self.bench_metrics | load_metric_names(bench)

    @property
    def label(self) -> str:
        """:attr:`engine_label`, else :attr:`engine` (e.g. ``"SGLang"``)."""
        return self.engine_label or self.engine

    def profile(self, node: Mapping[str, Any], model: Mapping[str, Any],
                backend_cfg: Mapping[str, Any]) -> dict[str, Any] | None:
        """The emulator profile ``{"node", "model", "emulator"}`` trials need; None for real engines."""
        return None

    def render(self, params: Mapping[str, Any], node: Mapping[str, Any], model: Mapping[str, Any],
               backend_cfg: Mapping[str, Any]) -> Launch:
        """Knob values -> :class:`Launch` for this engine and version.

        Raises:
            KnobError: unknown knob/value, a missing config field, or a flag the
                targeted version lacks (the message names it).
        """
        raise NotImplementedError

    #: argv prefix of the deployable command on the target node (no venv path, no emulator).
    deploy_launcher: tuple[str, ...] = ("python", "-m", "sglang.launch_server")
    #: the port the deployable command serves on (SGLang's default).
    deploy_port: int = 30000

    def deploy_argv(self, params: Mapping[str, Any], node: Mapping[str, Any], model: Mapping[str, Any],
                    backend_cfg: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
        """``(argv, env)`` to deploy ``params`` on the TARGET node with the real engine: the same
        :meth:`render` the dry run validates, with :attr:`deploy_launcher` instead of
        ``backend.launcher`` and ``--host 0.0.0.0 --port`` :attr:`deploy_port` (no ephemeral ports).

        Raises:
            KnobError: as :meth:`render`.
        """
        cfg = {**dict(backend_cfg), "launcher": list(self.deploy_launcher), "python": None}
        launch = self.render(params, node, model, cfg)
        return [*launch.argv, "--host", "0.0.0.0", "--port", str(self.deploy_port)], dict(launch.env)

    def deploy_command(self, params: Mapping[str, Any], node: Mapping[str, Any], model: Mapping[str, Any],
                       backend_cfg: Mapping[str, Any]) -> str:
        """The deployable shell command for ``params`` (see :meth:`deploy_argv`): env knobs as a
        ``VAR=value`` prefix, every word shell-quoted, e.g.
        ``NCCL_PROTO=LL python -m sglang.launch_server --model-path moonshotai/Kimi-K2.5 ... --host 0.0.0.0 --port 30000``.

        Raises:
            KnobError: as :meth:`render`.
        """
        import shlex

        argv, env = self.deploy_argv(params, node, model, backend_cfg)
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        return " ".join([*prefix, *(shlex.quote(a) for a in argv)])

    def validate(self, argvs: list[list[str]], backend_cfg: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """Check every argv with the engine's own argument parser.

        Returns:
            one ``{"ok": bool, "error": str | None, "flag": str | None}`` per argv, or None
            when the engine's parser is not available here (nothing was checked).
        """
        return None

    def fingerprint(self, profile: Mapping[str, Any] | None, gpu_indices: list[int] | None) -> dict[str, str]:
        """This node's environment fingerprint (GPU arch, driver, CUDA, NCCL, torch, engine versions)."""
        from tasks.fingerprint import collect_fingerprint

        return collect_fingerprint(gpu_indices)

    # --- node side: the lifecycle hooks -----------------------------------------------
    def server_argv(self, argv: Sequence[str], host: str, ports: Sequence[int]) -> list[str]:
        """``argv`` plus the flags that bind the server to ``host`` and the reserved ``ports``
        (one per name in :attr:`ports`)."""
        raise NotImplementedError

    def benchmark(self, base_url: str, bench: BenchSpec,
                  deadline_s: float | None) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Warm up and measure a healthy server.

        Returns:
            ``(metrics, records)``: the trial metrics (``decode_tok_s``, ``output_tok_s``,
            ``ttft_ms_p50``, ``itl_ms_p50``/``p99`` in ms, ``accept_length``, ...) and one
            JSON-able record per measured request.
        Raises:
            tasks.bench_client.BenchError: a request failed; ``kind`` ``stall`` | ``http`` |
                ``connection`` | ``short`` decides the failure class.
        """
        raise NotImplementedError

    def post_bench_metrics(self, base_url: str, metrics: dict[str, float]) -> dict[str, float]:
        """Metrics completed from the server after the benchmark (default: unchanged)."""
        return metrics

    def paths_taken(self, log: str, expected: Mapping[str, Any]) -> list[str]:
        """Perf tags from a healthy server's (redacted) log: a path the launch asked for but
        the engine did not take (e.g. ``allreduce_path_degraded``). Default: none."""
        return []

    def run_trial(self, spec: TrialSpec, profile: dict[str, Any] | None, workdir: str | None) -> TrialResult:
        """Run one trial end to end on this node (the generic server lifecycle by default).

        Never raises for expected failures: they are data in the :class:`TrialResult`.
        """
        from tasks.backends.lifecycle import run_server_trial

        return run_server_trial(self, spec, profile, workdir)
