"""Benchmark client over the OpenAI-compatible streaming ``/v1/completions`` (vLLM's API).

Prompts are token-id lists (``"prompt": [int, ...]``), so no tokenizer is involved on either
side of the measurement; ``return_token_ids`` makes every chunk carry the ids it adds, so a
chunk's token count is exact (with speculative decoding one chunk carries every token accepted
in one step). ``ignore_eos`` keeps the output length exact. The metric definitions are
:mod:`tasks.bench`'s (TTFT, ITL = gaps between content chunks, decode tok/s per request,
output tok/s over the measured phase), computed by :func:`tasks.bench.summarize`.

Acceptance length comes from the server's Prometheus counters (:func:`spec_counters`):
``1 + Δ vllm:spec_decode_num_accepted_tokens_total / Δ vllm:spec_decode_num_drafts_total``
taken around the measured requests (the counters are cumulative since launch, warmup
included).
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tasks.bench import BenchError, RequestRecord, request_timeouts, summarize
from tasks.types import BenchSpec

#: Prompt ids are drawn from [PROMPT_ID_LOW, PROMPT_ID_HIGH): ids every served vocabulary has
#: (byte-level tokens of real tokenizers; the tiny model's vocab is 512), above the special ids.
PROMPT_ID_LOW, PROMPT_ID_HIGH = 3, 259
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"


def prompt_ids(n: int, seed: int, index: int) -> list[int]:
    """Deterministic prompt token ids for request ``index`` (``n`` ids in [3, 259))."""
    rng = random.Random(seed * 1_000_003 + index)
    return [rng.randrange(PROMPT_ID_LOW, PROMPT_ID_HIGH) for _ in range(n)]


def served_model(client: httpx.Client, base_url: str, timeout_s: float = 10.0) -> str:
    """The model id the server serves (first entry of ``GET /v1/models``).

    Raises:
        BenchError(http | connection): the endpoint failed.
    """
    try:
        r = client.get(base_url + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise BenchError(f"/v1/models failed: {type(e).__name__}", "connection") from None
    if r.status_code != 200 or not r.json().get("data"):
        raise BenchError(f"/v1/models returned HTTP {r.status_code}: {r.text[:200]}", "http")
    return str(r.json()["data"][0]["id"])


def spec_counters(client: httpx.Client, base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """Sum of each speculative-decoding counter over its label sets, from ``GET /metrics``
    (``{}`` when the endpoint fails or the server does no speculative decoding)."""
    try:
        text = client.get(base_url + "/metrics", timeout=timeout_s).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in (ACCEPTED, DRAFTS):
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


def acceptance_length(before: dict[str, float], after: dict[str, float]) -> float:
    """``1 + Δaccepted / Δdrafts`` between two :func:`spec_counters` readings; 1.0 when no draft
    was proposed in between (no speculative decoding)."""
    drafts = after.get(DRAFTS, 0.0) - before.get(DRAFTS, 0.0)
    if drafts <= 0:
        return 1.0
    return 1.0 + (after.get(ACCEPTED, 0.0) - before.get(ACCEPTED, 0.0)) / drafts


def _events(r: httpx.Response, t_end: float | None) -> list[tuple[float, int]]:
    """``(arrival time, tokens in chunk)`` for every chunk that carries output tokens."""
    out: list[tuple[float, int]] = []
    for line in r.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        if "error" in chunk:
            raise BenchError(f"stream error: {str(chunk['error'])[:200]}", "http")
        for choice in chunk.get("choices") or []:
            n = len(choice.get("token_ids") or [])
            if n:
                out.append((time.perf_counter(), n))
        if t_end is not None and time.monotonic() > t_end:
            raise BenchError(f"benchmark exceeded its time limit (backend.timeouts.bench_s) after {len(out)} chunks",
                             "stall")
    return out


def stream_completion(client: httpx.Client, base_url: str, model: str, prompt: list[int], max_tokens: int,
                      timeout_s: float, t_end: float | None = None) -> RequestRecord:
    """POST one streaming greedy ``/v1/completions`` and record chunk arrival times and tokens.

    Raises:
        BenchError: ``stall`` when no byte arrives for ``timeout_s`` (s) or the stream runs past
            ``t_end`` (``time.monotonic()``); ``http`` on an error status or an error chunk;
            ``connection`` when the server is gone; ``short`` on fewer tokens than asked.
    """
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    rec = RequestRecord(t_send=time.perf_counter())
    try:
        with client.stream("POST", base_url + "/v1/completions", json=body,
                           timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))) as r:
            if r.status_code != 200:
                r.read()
                raise BenchError(f"/v1/completions returned HTTP {r.status_code}: {r.text[:200]}", "http")
            events = _events(r, t_end)
    except httpx.ReadTimeout:
        raise BenchError(f"stream stalled: no data for {timeout_s:.0f} s", "stall") from None
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as e:
        raise BenchError(f"connection lost: {type(e).__name__}", "connection") from None
    total = 0
    for t, n in events:
        total += n
        rec.chunk_times.append(t)
        rec.chunk_tokens.append(total)
    if not events:
        raise BenchError("stream ended without any output token", "short")
    rec.completion_tokens, rec.t_done = total, rec.chunk_times[-1]
    if total < max_tokens:
        raise BenchError(f"got {total} of {max_tokens} tokens", "short")
    return rec


def run_benchmark(base_url: str, spec: BenchSpec,
                  deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """Warm up, then ``spec.repeats`` measured requests, ``spec.concurrency`` in flight at once.

    Returns:
        ``(metrics, records)``: :func:`tasks.bench.summarize`'s metrics, with ``accept_length``
        from the ``/metrics`` counter deltas around the measured requests.
    Raises:
        BenchError: the first failed request; ``stall`` past ``deadline_s`` (s).
    """
    timeout, t_end = request_timeouts(spec.request_timeout_s, deadline_s)

    with httpx.Client(limits=httpx.Limits(max_connections=max(10, 2 * spec.concurrency))) as client:
        model = served_model(client, base_url)
        for i in range(spec.warmup_requests):
            stream_completion(client, base_url, model, prompt_ids(spec.input_len, spec.seed, -1 - i),
                              spec.warmup_output_len, timeout(), t_end)

        def one(i: int) -> RequestRecord:
            return stream_completion(client, base_url, model, prompt_ids(spec.input_len, spec.seed, i),
                                     spec.output_len, timeout(), t_end)

        before = spec_counters(client, base_url)
        t0 = time.perf_counter()
        if spec.concurrency == 1:
            records = [one(i) for i in range(spec.repeats)]
        else:
            with ThreadPoolExecutor(spec.concurrency) as pool:
                records = list(pool.map(one, range(spec.repeats)))
        wall = time.perf_counter() - t0
        after = spec_counters(client, base_url)
    metrics = summarize(records, wall)
    metrics["accept_length"] = acceptance_length(before, after)
    metrics["concurrency"] = float(spec.concurrency)
    return metrics, records


def records_json(records: list[RequestRecord]) -> list[dict[str, Any]]:
    """JSON-able per-request records (:meth:`tasks.bench.RequestRecord.to_dict`)."""
    return [r.to_dict() for r in records]
