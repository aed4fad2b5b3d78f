"""Load client: one workload level against a running server, as SGLang 0.5.23's
``sglang/benchmark/serving.py`` sends it, into :func:`tasks.serving_metrics.summarize`.

* Closed loop (``arrival.kind: closed``): every request is ready at t=0, at most
  ``concurrency`` in flight (serving.py's ``--max-concurrency`` semaphore with
  ``--request-rate inf``).
* Open loop (``poisson`` / ``trace``): each request is sent at its planned arrival offset
  whether or not earlier ones finished (serving.py:1092-1129 ``get_request``).
* Bounded in count (``workload.num_requests``) and time (``deadline_s``: requests not sent by
  then are not sent; in-flight ones are cancelled and count as failed).
* APIs: SGLang's native streaming ``/generate`` (token-id prompts; new tokens per chunk =
  differences of ``meta_info.completion_tokens``, serving.py:790-791) and OpenAI's streaming
  ``/v1/completions`` (token-id prompts, ``return_token_ids`` so a chunk's tokens are counted,
  as vLLM returns them; a chunk without ids counts 1 token per non-empty text).

ITL is per token for both APIs (:meth:`tasks.serving_metrics.RequestRecord.itls_s`).
Async (aiohttp): one event loop sends every request, so open-loop arrivals keep their times.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import numpy as np

from tasks.serving_metrics import RequestRecord, summarize
from tasks.workloads import PlannedRequest, Workload, build_requests

Api = Literal["sglang", "openai"]
#: token-id range of prompts: /generate (SGLang models' vocab) and OpenAI (byte-level ids above the
#: specials; the tiny test model's vocab is 512), as tasks.bench / tasks.openai_bench use
PROMPT_IDS = {"sglang": (1000, 30000), "openai": (3, 259)}


@dataclass(frozen=True)
class Target:
    """A running server: base URL (``http://127.0.0.1:30000``), API, and for OpenAI the served
    model id (None: the first of ``GET /v1/models``)."""

    base_url: str
    api: Api = "sglang"
    model: str | None = None


def prompt_ids(api: Api, n: int, seed: int, index: int) -> list[int]:
    """Deterministic prompt token ids of request ``index`` (``n`` ids in the API's range)."""
    lo, hi = PROMPT_IDS[api]
    return np.random.default_rng((seed, index + 2**20)).integers(lo, hi, size=n).tolist()


def _body(t: Target, ids: list[int], max_tokens: int) -> tuple[str, dict[str, Any]]:
    if t.api == "sglang":
        return "/generate", {"input_ids": ids, "stream": True, "sampling_params": {
            "max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}}
    return "/v1/completions", {"model": t.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                               "ignore_eos": True, "stream": True, "return_token_ids": True}


def _chunk_tokens(api: Api, chunk: dict[str, Any], seen: int) -> tuple[int, int]:
    """(new tokens in this chunk, running total) for one streamed JSON chunk."""
    if api == "sglang":
        total = int((chunk.get("meta_info") or {}).get("completion_tokens", seen))
        return max(0, total - seen), max(total, seen)
    n = 0
    for choice in chunk.get("choices") or []:
        ids = choice.get("token_ids")
        n += len(ids) if ids else (1 if choice.get("text") else 0)
    return n, seen + n


async def send_one(session: aiohttp.ClientSession, t: Target, req: PlannedRequest, ids: list[int],
                   timeout_s: float) -> RequestRecord:
    """Send one streaming request; a failure is a record with ``ok=False`` and its error."""
    path, body = _body(t, ids, req.output_len)
    times: list[float] = []
    news: list[int] = []
    seen = 0
    send = time.perf_counter()
    try:
        async with session.post(t.base_url + path, json=body,
                                timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s)) as r:
            if r.status != 200:
                text = (await r.text())[:200]
                return RequestRecord(send, [], [], req.prompt_len, ok=False, error=f"HTTP {r.status}: {text}")
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise ValueError(f"stream error: {str(chunk['error'])[:200]}")
                n, seen = _chunk_tokens(t.api, chunk, seen)
                if n > 0:
                    times.append(time.perf_counter())
                    news.append(n)
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        return RequestRecord(send, times, news, req.prompt_len, ok=False, error=f"{type(e).__name__}: {e}"[:300])
    end = time.perf_counter()
    if seen < req.output_len or not times:
        return RequestRecord(send, times, news, req.prompt_len, ok=False,
                             error=f"short: {seen} of {req.output_len} tokens")
    return RequestRecord(send, times, news, req.prompt_len, output_len=seen, end_s=end)


async def served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model id of ``GET /v1/models``.

    Raises:
        RuntimeError: no answer or no model listed.
    """
    async with session.get(base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
        data = await r.json() if r.status == 200 else {}
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model (HTTP {r.status})")
    return str(models[0]["id"])


async def run_plan(t: Target, plan: tuple[PlannedRequest, ...], max_concurrency: int | None, *, seed: int = 0,
                   request_timeout_s: float = 60.0, deadline_s: float | None = None) -> tuple[list[RequestRecord], float]:
    """Send ``plan`` (arrival offsets in s) and return ``(records, duration_s)``; records are in
    plan order, the duration runs from the first send to the last response."""
    prompts = [prompt_ids(t.api, r.prompt_len, seed, i) for i, r in enumerate(plan)]
    limit = max(100, 2 * (max_concurrency or len(plan)))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit)) as session:
        if t.api == "openai" and t.model is None:
            t = Target(t.base_url, t.api, await served_model(session, t.base_url))
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        t0 = time.perf_counter()
        stop = t0 + deadline_s if deadline_s else None

        async def one(i: int, req: PlannedRequest) -> RequestRecord:
            if sem is None:
                return await send_one(session, t, req, prompts[i], request_timeout_s)
            async with sem:
                return await send_one(session, t, req, prompts[i], request_timeout_s)

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


def run_level(t: Target, w: Workload, *, slos_ms: dict[str, float] | None = None, seed: int = 0,
              request_timeout_s: float = 60.0, deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """One load level: ``w``'s requests against ``t`` -> (:func:`tasks.serving_metrics.summarize`
    metrics plus ``offered_rate_req_s`` (open loop) or ``concurrency`` (closed loop), records).

    Raises:
        ValueError: a bad workload (its dataset rows); RuntimeError: OpenAI server lists no model.
    """
    plan = build_requests(w)
    records, dur = asyncio.run(run_plan(t, plan.requests, plan.max_concurrency, seed=seed,
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
