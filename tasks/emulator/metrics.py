"""``/metrics`` of the emulated server: Prometheus text in SGLang 0.5.23's metric names.

SGLang serves them when started with ``--enable-metrics`` (srt/observability/metrics_collector.py:
the scheduler's gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:num_used_tokens``, ``sglang:token_usage``, ``sglang:gen_throughput``,
``sglang:max_total_num_tokens``; the tokenizer manager's counters
``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``, ``sglang:num_requests_total``
and histograms ``sglang:time_to_first_token_seconds``, ``sglang:e2e_request_latency_seconds``).
Labels: ``model_name`` and ``engine_type="unified"``, the scheduler's gauges also ``tp_rank="0"``
and ``pp_rank="0"`` (one scheduler is emulated). Histogram buckets are a subset of SGLang's.
"""

from __future__ import annotations

import bisect
from typing import Any

#: seconds (a subset of SGLang's TTFT / E2E buckets)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class _Hist:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets, self.counts, self.sum, self.n = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        i = bisect.bisect_left(self.buckets, v)
        for j in range(i, len(self.buckets)):
            self.counts[j] += 1
        self.sum += v
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        return [*out, f'{name}_bucket{{{labels},le="+Inf"}} {self.n}', f"{name}_sum{{{labels}}} {self.sum}",
                f"{name}_count{{{labels}}} {self.n}"]


class ServerMetrics:
    """Counters and histograms of the requests served (updated by the HTTP handlers)."""

    def __init__(self) -> None:
        self.prompt_tokens = self.generation_tokens = self.requests = 0
        self.ttft = _Hist(TTFT_BUCKETS)
        self.e2e = _Hist(E2E_BUCKETS)

    def started(self, prompt_tokens: int) -> None:
        """A generation entered the scheduler with ``prompt_tokens`` prompt tokens."""
        self.prompt_tokens += prompt_tokens

    def finished(self, out_tokens: int, t_recv: float, t_first: float | None, t_end: float, t_start: float) -> None:
        """A generation ended (monotonic clock s: received, first chunk or None, end)."""
        self.generation_tokens += out_tokens
        self.requests += 1
        if t_first is not None:
            self.ttft.observe(t_first - t_recv)
        self.e2e.observe(t_end - t_recv)

    def render(self, engine: Any, model_name: str, gen_throughput: float) -> str:
        """The Prometheus text exposition (``engine``: the ``ServingEngine``, None before ready)."""
        base = f'model_name="{model_name}",engine_type="unified"'
        sched = f'{base},tp_rank="0",pp_rank="0"'
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float, labels: str) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"])

        if engine is not None:
            sch = engine.sch
            sch.advance(engine.now_s())
            cap = engine.config.max_total_tokens
            metric("sglang:num_running_reqs", "gauge", "The number of running requests.", len(sch.running), sched)
            metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                   len(sch.waiting) + len(sch.prefilling), sched)
            metric("sglang:num_used_tokens", "gauge", "The number of used tokens.", sch.kv_used, sched)
            metric("sglang:token_usage", "gauge", "The token usage.", sch.kv_used / cap if cap else 0.0, sched)
            metric("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
                   cap, sched)
            metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", gen_throughput, sched)
        metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens, base)
        metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
               self.generation_tokens, base)
        metric("sglang:num_requests_total", "counter", "Number of requests processed.", self.requests, base)
        out += ["# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.",
                "# TYPE sglang:time_to_first_token_seconds histogram",
                *self.ttft.lines("sglang:time_to_first_token_seconds", base),
                "# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds",
                "# TYPE sglang:e2e_request_latency_seconds histogram",
                *self.e2e.lines("sglang:e2e_request_latency_seconds", base)]
        return "\n".join(out) + "\n"
