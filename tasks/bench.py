"""Benchmark client over SGLang's native streaming ``/generate`` (token ids, no tokenizer).

Metric definitions:

* TTFT (ms): request sent -> first chunk carrying output tokens.
* ITL (ms), per token as SGLang 0.5.23's ``sglang/benchmark/serving.py:790-797``
  (``adjust_itl``): a chunk carrying n new tokens after a gap g adds g / n, n times (with
  EAGLE a chunk carries the tokens accepted in one verify cycle); see
  :meth:`tasks.serving_metrics.RequestRecord.itls_s`.
* decode tok/s of one request = (output tokens - 1) / (t_last_token - t_first_token);
  the objective is its median over the measured repeats.
* output tok/s = all measured output tokens / wall time of the measured phase (TTFT
  included), as ``sglang.bench_serving`` reports ``output_throughput``.
* acceptance length = sum(completion_tokens) / sum(spec_verify_ct) from ``meta_info``
  (1.0 without speculative decoding).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from tasks import serving_metrics
from tasks.stats import percentile
from tasks.types import BenchSpec


class BenchError(RuntimeError):
    """A benchmark request failed. ``kind`` is ``stall`` (stream silent past the request
    timeout), ``http`` (error status), ``connection`` (server gone) or ``short`` (fewer
    tokens than asked)."""

    def __init__(self, msg: str, kind: str):
        super().__init__(msg)
        self.kind = kind


@dataclass
class RequestRecord:
    """One measured request. Times are ``time.perf_counter()`` seconds."""

    t_send: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)  # cumulative completion tokens per chunk
    completion_tokens: int = 0
    spec_verify_ct: int | None = None
    output_ids: list[int] = field(default_factory=list)
    t_done: float = 0.0

    @property
    def ttft_ms(self) -> float:
        return (self.chunk_times[0] - self.t_send) * 1e3

    @property
    def itl_ms(self) -> list[float]:
        """Per-token ITLs, ms (chunk gap / tokens in the chunk, repeated per token)."""
        return [float(x) * 1e3 for x in self.to_serving().itls_s()]

    def to_serving(self, prompt_len: int = 0) -> serving_metrics.RequestRecord:
        """The same stream as a :class:`tasks.serving_metrics.RequestRecord`."""
        return serving_metrics.RequestRecord.from_cumulative(self.t_send, self.chunk_times, self.chunk_tokens,
                                                             prompt_len, end_s=self.t_done)

    @property
    def decode_tok_s(self) -> float:
        """(tokens - 1) / (t_last - t_first): excludes the first token (prefill)."""
        span = self.chunk_times[-1] - self.chunk_times[0]
        first = self.chunk_tokens[0]
        return (self.completion_tokens - first) / span if span > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ttft_ms=self.ttft_ms, decode_tok_s=self.decode_tok_s)
        return d


def record_from_events(t_send: float, events: Iterable[tuple[float, dict[str, Any]]]) -> RequestRecord:
    """Build a :class:`RequestRecord` from ``(arrival_time_s, chunk_json)`` pairs.

    Chunks without new tokens (``completion_tokens`` unchanged) are ignored. Pure: used by
    the live client and by tests on known streams.

    Raises:
        BenchError(short): no chunk carried a token.
    """
    rec = RequestRecord(t_send=t_send)
    last = 0
    for t, chunk in events:
        meta = chunk.get("meta_info") or {}
        n = int(meta.get("completion_tokens", last))
        if n > last:
            rec.chunk_times.append(t)
            rec.chunk_tokens.append(n)
            last = n
        if "spec_verify_ct" in meta:
            rec.spec_verify_ct = int(meta["spec_verify_ct"])
        if "output_ids" in chunk:
            rec.output_ids = list(chunk["output_ids"])
    if not rec.chunk_times:
        raise BenchError("stream ended without any output token", "short")
    rec.completion_tokens = last
    rec.t_done = rec.chunk_times[-1]
    return rec


def summarize(records: list[RequestRecord], wall_s: float) -> dict[str, float]:
    """Aggregate measured requests into the trial metrics (see module docstring).

    Args:
        records: the measured requests (warmup excluded).
        wall_s: wall time of the measured phase, s.
    Returns:
        ``decode_tok_s``, ``output_tok_s``, ``ttft_ms_p50``, ``itl_ms_p50``, ``itl_ms_p99``,
        ``accept_length``, ``e2e_s_p50``, ``completed``.
    """
    itl = [x for r in records for x in r.itl_ms]
    tokens = sum(r.completion_tokens for r in records)
    verify = [r.spec_verify_ct for r in records if r.spec_verify_ct]
    accept = (sum(r.completion_tokens for r in records if r.spec_verify_ct) / sum(verify)) if verify else 1.0
    return {
        "decode_tok_s": statistics.median(r.decode_tok_s for r in records),
        "output_tok_s": tokens / wall_s if wall_s > 0 else float("nan"),
        "ttft_ms_p50": statistics.median(r.ttft_ms for r in records),
        "itl_ms_p50": percentile(itl, 0.50),
        "itl_ms_p99": percentile(itl, 0.99),
        "accept_length": accept,
        "e2e_s_p50": statistics.median(r.t_done - r.t_send for r in records),
        "completed": float(len(records)),
    }


def prompt_ids(n: int, seed: int, index: int) -> list[int]:
    """Deterministic random prompt token ids (vocab 1000..30000) for request ``index``."""
    rng = random.Random(seed * 1_000_003 + index)
    return [rng.randrange(1000, 30000) for _ in range(n)]


def stream_generate(client: httpx.Client, base_url: str, input_ids: list[int], max_new_tokens: int,
                    timeout_s: float, t_end: float | None = None) -> RequestRecord:
    """POST one streaming greedy ``/generate`` and record chunk arrival times.

    Raises:
        BenchError: ``stall`` when no byte arrives for ``timeout_s`` or the stream runs past
            ``t_end`` (``time.monotonic()``); ``http`` on an error status; ``connection`` when
            the server is gone; ``short`` on fewer tokens.
    """
    body = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    events: list[tuple[float, dict[str, Any]]] = []
    t_send = time.perf_counter()
    try:
        with client.stream("POST", base_url + "/generate", json=body,
                           timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))) as r:
            if r.status_code != 200:
                r.read()
                raise BenchError(f"/generate returned HTTP {r.status_code}: {r.text[:200]}", "http")
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                events.append((time.perf_counter(), json.loads(payload)))
                if t_end is not None and time.monotonic() > t_end:
                    raise BenchError("benchmark exceeded its time limit (backend.timeouts.bench_s) after "
                                     f"{len(events)} chunks", "stall")
    except httpx.ReadTimeout:
        raise BenchError(f"stream stalled: no data for {timeout_s:.0f} s after {len(events)} chunks", "stall") from None
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as e:
        raise BenchError(f"connection lost after {len(events)} chunks: {type(e).__name__}", "connection") from None
    rec = record_from_events(t_send, events)
    if rec.completion_tokens < max_new_tokens:
        raise BenchError(f"got {rec.completion_tokens} of {max_new_tokens} tokens", "short")
    return rec


def request_timeouts(request_timeout_s: float,
                     deadline_s: float | None) -> tuple[Callable[[], float], float | None]:
    """``(timeout, t_end)``: ``timeout()`` gives the next request's timeout, s
    (``request_timeout_s`` cut to what is left of the whole benchmark's ``deadline_s``,
    ``backend.timeouts.bench_s``; None: no limit) and raises :class:`BenchError` ``stall``
    once it has passed; ``t_end`` is that deadline on the monotonic clock (None: none).
    """
    t_end = time.monotonic() + deadline_s if deadline_s else None

    def timeout() -> float:
        if t_end is None:
            return request_timeout_s
        left = t_end - time.monotonic()
        if left <= 0:
            raise BenchError(f"benchmark exceeded its {deadline_s:.0f} s limit (backend.timeouts.bench_s)", "stall")
        return min(request_timeout_s, left)
    return timeout, t_end


def run_benchmark(base_url: str, spec: BenchSpec,
                  deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """Warm up, then run ``spec.repeats`` measured requests ``spec.concurrency`` at a time.

    Args:
        deadline_s: the whole benchmark's time limit, s (``backend.timeouts.bench_s``); a
            server trickling tokens just under the per-request stall timeout is stopped here.
    Returns:
        ``(metrics, records)``: see :func:`summarize`.
    Raises:
        BenchError: the first failed request (warmup or measured); ``stall`` past ``deadline_s``.
    """
    timeout, t_end = request_timeouts(spec.request_timeout_s, deadline_s)

    with httpx.Client() as client:
        for i in range(spec.warmup_requests):
            stream_generate(client, base_url, prompt_ids(spec.input_len, spec.seed, -1 - i),
                            spec.warmup_output_len, timeout(), t_end)

        def one(i: int) -> RequestRecord:
            return stream_generate(client, base_url, prompt_ids(spec.input_len, spec.seed, i),
                                   spec.output_len, timeout(), t_end)

        t0 = time.perf_counter()
        if spec.concurrency == 1:
            records = [one(i) for i in range(spec.repeats)]
        else:
            with ThreadPoolExecutor(spec.concurrency) as pool:
                records = list(pool.map(one, range(spec.repeats)))
        wall = time.perf_counter() - t0
    return summarize(records, wall), records


def fetch_server_info(base_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """``GET /server_info`` (falls back to ``/get_server_info``); {} when neither answers."""
    for path in ("/server_info", "/get_server_info"):
        try:
            r = httpx.get(base_url + path, timeout=timeout_s)
            if r.status_code == 200:
                return r.json()
        except (httpx.HTTPError, ValueError):
            continue
    return {}


if __name__ == "__main__":  # python -m tasks.bench --url URL ...: see tasks.bench_cli
    from tasks.bench_cli import main

    raise SystemExit(main())
