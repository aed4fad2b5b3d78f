"""Plain data passed between the driver (sweeps/) and the node (tasks/).

The specs here are dataclasses of builtins so they pickle cheaply through Ray; what a trial
returns is the validated :class:`tasks.outcome.Outcome` (``TrialResult`` names it here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.outcome import Outcome, Status

#: What one trial returns to the driver: the one outcome model (``tasks.outcome``), under
#: the name the node's side has always used.
TrialResult = Outcome
#: a trial's status (``tasks.outcome.Status``)
TrialStatus = Status


@dataclass(frozen=True)
class SloSpec:
    """A latency SLO, ms: p99 TTFT and p99 TPOT per load level (``tasks.load_search.Slo``);
    ``e2e_ms`` (optional) joins TTFT/TPOT as a per-request bound for ``goodput_req_s``
    (``sglang/benchmark/goodput.py``)."""

    ttft_ms_p99: float
    tpot_ms_p99: float
    e2e_ms: float | None = None


@dataclass(frozen=True)
class LoadSearchSpec:
    """Bounds of the in-trial rate search (``tasks.load_search.max_rate_at_slo``): req/s range,
    level budget (<= 6) and relative tolerance."""

    rate_lo: float
    rate_hi: float
    max_levels: int = 6
    rel_tol: float = 0.05


@dataclass(frozen=True)
class BenchSpec:
    """The benchmark a trial runs once healthy (its requests are the backend's: SGLang's native
    streaming ``/generate``, vLLM's OpenAI ``/v1/completions``).

    Attributes:
        input_len: prompt length in tokens (random token ids, fixed by ``seed``).
        output_len: output tokens per measured request (``ignore_eos`` keeps it exact).
        warmup_requests: requests sent and discarded before measuring.
        warmup_output_len: output tokens of each warmup request.
        repeats: measured requests (sequential, batch 1); the objective is their median.
        concurrency: requests in flight at once (1 = single stream).
        request_timeout_s: per-request timeout, s; a stream silent this long is a stall.
        seed: seed of the prompt token ids.
        workload: a :func:`tasks.workloads.parse_workload` mapping (validated at config time)
            for serving-under-load benchmarks, or None (the fixed batch-1/concurrency bench above).
        slo: per-level SLO, or None.
        load_search: search the highest rate meeting ``slo`` (needs ``workload`` with an open-loop
            arrival and ``slo``), or None.
        concurrency_levels: closed-loop levels (e.g. ``(1, 4, 16, 64)``) run on ``workload``;
            per-level metrics are keyed ``<metric>@c<N>``. Empty: none.
        incumbent_rate: the best config's ``max_rate_at_slo_req_s`` so far (set by the driver), req/s.
        max_repeat_cv: repeats whose decode tok/s spread (sd / mean) exceeds this make the
            trial ``unstable`` (re-measured once, then kept out of the winner).
    """

    input_len: int = 128
    output_len: int = 128
    warmup_requests: int = 1
    warmup_output_len: int = 16
    repeats: int = 3
    concurrency: int = 1
    request_timeout_s: float = 60.0
    seed: int = 0
    workload: dict[str, Any] | None = None
    slo: SloSpec | None = None
    load_search: LoadSearchSpec | None = None
    concurrency_levels: tuple[int, ...] = ()
    incumbent_rate: float | None = None
    max_repeat_cv: float = 0.10


@dataclass(frozen=True)
class Timeouts:
    """Trial lifecycle deadlines, all in seconds."""

    startup_s: float = 900.0
    health_request_s: float = 5.0
    bench_s: float = 600.0
    term_grace_s: float = 10.0
    gpu_release_s: float = 30.0


@dataclass(frozen=True)
class TrialSpec:
    """One fully rendered trial, ready to run on a node.

    Attributes:
        sweep: sweep (study) name.
        trial_number: Optuna trial number.
        params: knob values as sampled, e.g. ``{"allreduce": "nccl", "cuda_graph_max_bs": 128}``.
        argv: launcher argv *without* host/port flags (the node adds them from the ports it
            reserves, see ``tasks.backends.base.Backend.server_argv``), e.g.
            ``["python", "-m", "sglang.launch_server", "--model-path", ...]``.
        env: environment variables set for the server on top of the node's
            (e.g. ``{"NCCL_ALGO": "Ring"}``).
        backend: the backend kind that runs it (``tasks.backends.available_backends()``:
            ``"emulated"``, ``"sglang"``, ``"instant"``, ...).
        gpus: GPUs the trial holds (TP × DP).
        bench: the benchmark to run once healthy.
        timeouts: lifecycle deadlines.
        container_name: set when ``argv`` runs in a container, so teardown can stop it by name.
        expected_paths: allreduce path expectations checked against the server log
            (e.g. ``{"custom_allreduce": True}``); a mismatch tags ``allreduce_path_degraded``.
        trial_key: stable id ``"<sweep>/<trial_number>"`` used to sync MLflow idempotently.
        probe: a probe launch (``tasks.probe.probe_argv``: dummy weights, cut layers): the
            server starts and is torn down once healthy, with no benchmark.
    """

    sweep: str
    trial_number: int
    params: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    backend: str = "emulated"
    gpus: int = 8
    bench: BenchSpec = field(default_factory=BenchSpec)
    timeouts: Timeouts = field(default_factory=Timeouts)
    container_name: str | None = None
    expected_paths: dict[str, Any] = field(default_factory=dict)
    probe: bool = False

    @property
    def trial_key(self) -> str:
        return f"{self.sweep}/{self.trial_number}"
