"""SGLang's native streaming ``/generate`` (token ids, no tokenizer): the adapter of the one
benchmark client (:mod:`tasks.bench_client`, which holds the metric definitions).

* New tokens of a chunk = differences of ``meta_info.completion_tokens``, as SGLang 0.5.23's
  ``sglang/benchmark/serving.py:790-791``; with EAGLE a chunk carries the tokens accepted in one
  verify cycle.
* acceptance length = sum(completion_tokens) / sum(spec_verify_ct) from ``meta_info``
  (1.0 without speculative decoding).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import httpx

from tasks.bench_client import BenchError, RequestRecord, StreamProtocol, request_timeouts, summarize
from tasks.bench_client import run_benchmark as run_with
from tasks.types import BenchSpec

__all__ = ["BenchError", "GenerateProtocol", "RequestRecord", "fetch_server_info", "prompt_ids",
           "record_from_events", "request_timeouts", "run_benchmark", "summarize"]


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


def prompt_ids(n: int, seed: int, index: int) -> list[int]:
    """Deterministic random prompt token ids (vocab 1000..30000) for request ``index``."""
    rng = random.Random(seed * 1_000_003 + index)
    return [rng.randrange(1000, 30000) for _ in range(n)]


class GenerateProtocol(StreamProtocol):
    """Streaming greedy ``/generate`` with ``input_ids`` and ``ignore_eos`` (exact output length)."""

    path = "/generate"

    def prompt_ids(self, n: int, seed: int, index: int) -> list[int]:
        return prompt_ids(n, seed, index)

    def body(self, prompt_ids: list[int], max_tokens: int) -> dict[str, Any]:
        return {"input_ids": prompt_ids, "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}}

    def record(self, t_send: float, events: list[tuple[float, str]]) -> RequestRecord:
        chunks = []
        for t, payload in events:
            chunk = json.loads(payload)
            if isinstance(chunk, dict) and "error" in chunk:
                raise BenchError(f"stream error: {str(chunk['error'])[:200]}", "http")
            chunks.append((t, chunk))
        return record_from_events(t_send, chunks)


def run_benchmark(base_url: str, spec: BenchSpec,
                  deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """Warm up, then ``spec.repeats`` measured ``/generate`` requests ``spec.concurrency`` at a
    time (:func:`tasks.bench_client.run_benchmark`).

    Returns:
        ``(metrics, records)``: see :func:`tasks.bench_client.summarize`.
    Raises:
        BenchError: the first failed request (warmup or measured); ``stall`` past ``deadline_s``.
    """
    return run_with(base_url, spec, GenerateProtocol(), deadline_s)


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


if __name__ == "__main__":  # python -m tasks.backends.sglang.client --url URL ...: see tasks.bench_cli
    import runpy

    # the CLI is the generic client's (it sends through this adapter and the OpenAI one); run by
    # name so this adapter does not depend on it
    runpy.run_module("tasks.bench_cli", run_name="__main__", alter_sys=True)
