"""Load client: one workload level against a running server, as SGLang 0.5.23's
``sglang/benchmark/serving.py`` sends it, into :func:`tasks.serving_metrics.summarize`.

* Closed loop (``arrival.kind: closed``): every request is ready at t=0, at most
  ``concurrency`` in flight (serving.py's ``--max-concurrency`` semaphore with
  ``--request-rate inf``).
* Open loop (``poisson`` / ``trace``): each request is sent at its planned arrival offset
  whether or not earlier ones finished (serving.py:1092-1129 ``get_request``).
* Bounded in count (``workload.num_requests``) and time (``deadline_s``: requests not sent by
  then are not sent; in-flight ones are cancelled and count as failed).
* APIs: the one benchmark client's adapters (:mod:`tasks.bench_client`): SGLang's native
  streaming ``/generate`` (:class:`tasks.backends.sglang.client.GenerateProtocol`) and OpenAI's
  streaming ``/v1/completions`` (:class:`tasks.openai_bench.CompletionsProtocol`: token ids per
  chunk, or the chunk texts retokenized with the model's tokenizer when the server sends none).

ITL is reported both per token (``itl_ms_*``) and per chunk (``itl_chunk_ms_*``), see
:func:`tasks.serving_metrics.summarize`. Async (aiohttp): one event loop sends every request,
so open-loop arrivals keep their times.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import numpy as np

from tasks.backends.sglang.client import GenerateProtocol
from tasks.bench_client import BenchError, StreamProtocol, stream_request
from tasks.openai_bench import CompletionsProtocol
from tasks.serving_metrics import RequestRecord, summarize
from tasks.workloads import PlannedRequest, Workload, build_requests

Api = Literal["sglang", "openai"]
#: token-id range of prompts: /generate (SGLang models' vocab) and OpenAI (byte-level ids above the
#: specials; the tiny test model's vocab is 512), as tasks.backends.sglang.client / tasks.openai_bench use
PROMPT_IDS = {"sglang": (1000, 30000), "openai": (3, 259)}


@dataclass(frozen=True)
class Target:
    """A running server: base URL (``http://127.0.0.1:30000``), API, and for OpenAI the served
    model id (None: the first of ``GET /v1/models``)."""

    base_url: str
    api: Api = "sglang"
    model: str | None = None


def prompt_ids(api: Api, n: int, seed: int, index: int, level: int = 0) -> list[int]:
    """Deterministic prompt token ids of request ``index`` of load level ``level`` (``n`` ids in
    the API's range).

    Each level of one server gets prompts of its own: SGLang's radix cache and vLLM's prefix
    cache (both on by default) would otherwise serve a later level's prompts from an earlier
    one's KV cache, and its TTFT would time less prefill than the workload asks.
    """
    lo, hi = PROMPT_IDS[api]
    return np.random.default_rng((seed, index + 2**20, level)).integers(lo, hi, size=n).tolist()


def protocol_for(t: Target) -> StreamProtocol:
    """The wire protocol's adapter of :mod:`tasks.bench_client` for ``t`` (``/metrics`` is not read)."""
    if t.api == "sglang":
        return GenerateProtocol()
    return CompletionsProtocol(model=t.model, spec_metrics=False)


async def send_one(session: aiohttp.ClientSession, t: Target, req: PlannedRequest, ids: list[int],
                   timeout_s: float, protocol: StreamProtocol | None = None) -> RequestRecord:
    """Send one streaming request (:func:`tasks.bench_client.stream_request`); a failure is a
    record with ``ok=False`` and its error (``<kind>: <message>``)."""
    protocol = protocol or protocol_for(t)
    send = time.perf_counter()
    try:
        rec = await stream_request(session, t.base_url, protocol, ids, req.output_len, timeout_s)
    except BenchError as e:
        return RequestRecord(send, [], [], req.prompt_len, ok=False, error=f"{e.kind}: {e}"[:300])
    except ValueError as e:  # a message that is not JSON
        return RequestRecord(send, [], [], req.prompt_len, ok=False, error=f"{type(e).__name__}: {e}"[:300])
    return rec.to_serving(req.prompt_len)


async def run_plan(t: Target, plan: tuple[PlannedRequest, ...], max_concurrency: int | None, *, seed: int = 0,
                   level: int = 0, request_timeout_s: float = 60.0,
                   deadline_s: float | None = None) -> tuple[list[RequestRecord], float]:
    """Send ``plan`` (arrival offsets in s) and return ``(records, duration_s)``; records are in
    plan order, the duration runs from the first send to the last response. ``level``: which
    prompt set (:func:`prompt_ids`)."""
    prompts = [prompt_ids(t.api, r.prompt_len, seed, i, level) for i, r in enumerate(plan)]
    limit = max(100, 2 * (max_concurrency or len(plan)))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit)) as session:
        protocol = protocol_for(t)
        try:
            await protocol.prepare(session, t.base_url)
        except BenchError as e:
            raise RuntimeError(f"{t.base_url}/v1/models: {e}") from None
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        t0 = time.perf_counter()
        stop = t0 + deadline_s if deadline_s else None

        async def one(i: int, req: PlannedRequest) -> RequestRecord:
            if sem is None:
                return await send_one(session, t, req, prompts[i], request_timeout_s, protocol)
            async with sem:
                return await send_one(session, t, req, prompts[i], request_timeout_s, protocol)

        tasks: list[asyncio.Task] = []
        for i, req in enumerate(plan):
            wait = t0 + req.arrival_s - time.perf_counter()
            if stop is not None and t0 + req.arrival_s > stop:
                break
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(i, req)))
        left = None if stop is None else max(0.0, stop - time.perf_counter())
        done, pending = await asyncio.wait(tasks, timeout=left) if tasks else (set(), set())
        for p in pending:
            p.cancel()
        dur = time.perf_counter() - t0
    records = []
    for i, task in enumerate(tasks):
        if task in done and not task.cancelled():
            records.append(task.result())
        else:
            records.append(RequestRecord(t0, [], [], plan[i].prompt_len, ok=False, error="deadline"))
    records += [RequestRecord(t0, [], [], r.prompt_len, ok=False, error="not sent: deadline")
                for r in plan[len(tasks):]]
    return records, dur


def run_level(t: Target, w: Workload, *, slos_ms: dict[str, float] | None = None, seed: int = 0, level: int = 0,
              request_timeout_s: float = 60.0, deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """One load level: ``w``'s requests against ``t`` -> (:func:`tasks.serving_metrics.summarize`
    metrics plus ``offered_rate_req_s`` (open loop) or ``concurrency`` (closed loop), records).
    ``level``: the level's number on this server, which picks its own prompts (:func:`prompt_ids`).

    Raises:
        ValueError: a bad workload (its dataset rows); RuntimeError: OpenAI server lists no model.
    """
    plan = build_requests(w)
    records, dur = asyncio.run(run_plan(t, plan.requests, plan.max_concurrency, seed=seed, level=level,
                                        request_timeout_s=request_timeout_s, deadline_s=deadline_s))
    metrics = summarize(records, duration_s=dur if dur > 0 else None, slos_ms=slos_ms)
    if plan.max_concurrency is not None:
        metrics["concurrency"] = float(plan.max_concurrency)
    elif w.arrival.kind == "poisson":
        metrics["offered_rate_req_s"] = float(w.arrival.rate_req_s)
    return metrics, records


def records_json(records: list[RequestRecord], limit: int = 2000) -> list[dict[str, Any]]:
    """JSON-able records (the first ``limit``), times relative to the first send."""
    if not records:
        return []
    t0 = min(r.send_s for r in records)
    return [{"send_s": r.send_s - t0, "chunk_times_s": [round(x - t0, 6) for x in r.chunk_times_s],
             "chunk_tokens": [int(n) for n in r.chunk_tokens], "prompt_len": r.prompt_len, "ok": r.ok,
             "error": r.error, "output_len": r.output_len, "end_s": None if r.end_s is None else r.end_s - t0}
            for r in records[:limit]]
