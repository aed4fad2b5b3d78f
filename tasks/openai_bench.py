"""OpenAI's streaming ``/v1/completions`` as vLLM serves it: the adapter of the one benchmark
client (:mod:`tasks.bench_client`, which holds the metric definitions), used by ``backend=vllm``
and by the load client's ``api: openai``.

* Prompts are token-id lists (``"prompt": [int, ...]``), so no tokenizer is involved on the way in.
* Counting output tokens: ``return_token_ids`` makes a vLLM server put the ids of each chunk in
  ``choices[0].token_ids`` (vllm/entrypoints/openai/completion/serving.py of 0.32), so a chunk's
  count is exact (with speculative decoding one chunk carries every token accepted in one step).
  A server that sends no ids is counted by retokenizing: each chunk's text encoded with the
  model's tokenizer (as SGLang 0.5.23's ``sglang-oai`` ITL, serving.py:1173-1181), a chunk whose
  text is empty (a detokenizer holding back an incomplete character) as one token, and the
  request's total from the final ``usage`` chunk (``stream_options.include_usage``, as vLLM's own
  client asks, endpoint_request_func.py:214-217) when the server sends one. Without a loadable
  tokenizer a chunk with text counts one token (``counted="chunks"`` on the record).
* ``ignore_eos`` keeps the output length exact.

Acceptance length comes from the server's Prometheus counters (:func:`spec_counters`):
``1 + Δ vllm:spec_decode_num_accepted_tokens_total / Δ vllm:spec_decode_num_drafts_total``
taken around the measured requests (the counters are cumulative since launch, warmup
included).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import aiohttp

from tasks.bench_client import BenchError, RequestRecord, StreamProtocol
from tasks.bench_client import run_benchmark as run_with
from tasks.types import BenchSpec

#: Prompt ids are drawn from [PROMPT_ID_LOW, PROMPT_ID_HIGH): ids every served vocabulary has
#: (byte-level tokens of real tokenizers; the tiny model's vocab is 512), above the special ids.
PROMPT_ID_LOW, PROMPT_ID_HIGH = 3, 259
#: how a record's tokens were counted, most exact first (a record says its least exact)
_COUNTED_RANK = {"ids": 0, "retokenized": 1, "chunks": 2}
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"


def prompt_ids(n: int, seed: int, index: int) -> list[int]:
    """Deterministic prompt token ids for request ``index`` (``n`` ids in [3, 259))."""
    rng = random.Random(seed * 1_000_003 + index)
    return [rng.randrange(PROMPT_ID_LOW, PROMPT_ID_HIGH) for _ in range(n)]


def parse_metric_counters(text: str) -> dict[str, float]:
    """Sum of each speculative-decoding counter over its label sets in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in (ACCEPTED, DRAFTS):
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


async def spec_counters(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The speculative-decoding counters from ``GET /metrics`` (``{}`` when the endpoint fails
    or the server does no speculative decoding)."""
    try:
        async with session.get(base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return parse_metric_counters(await r.text())
    except (aiohttp.ClientError, TimeoutError):
        return {}


def acceptance_length(before: dict[str, float], after: dict[str, float]) -> float:
    """``1 + Δaccepted / Δdrafts`` between two :func:`spec_counters` readings; 1.0 when no draft
    was proposed in between (no speculative decoding)."""
    drafts = after.get(DRAFTS, 0.0) - before.get(DRAFTS, 0.0)
    if drafts <= 0:
        return 1.0
    return 1.0 + (after.get(ACCEPTED, 0.0) - before.get(ACCEPTED, 0.0)) / drafts


async def served_model(session: aiohttp.ClientSession, base_url: str,
                       timeout_s: float = 10.0) -> dict[str, Any]:
    """The first entry of ``GET /v1/models`` (``id``; vLLM adds ``root``, the model's path).

    Raises:
        BenchError(http | connection): the endpoint failed or lists no model.
    """
    try:
        async with session.get(base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = await r.text()
            status = r.status
    except (aiohttp.ClientError, TimeoutError) as e:
        raise BenchError(f"/v1/models failed: {type(e).__name__}", "connection") from None
    try:
        data = json.loads(text).get("data") if status == 200 else None
    except ValueError:
        data = None
    if not data:
        raise BenchError(f"/v1/models returned HTTP {status}: {text[:200]}", "http")
    return dict(data[0])


class Retokenizer:
    """The model's tokenizer (``tokenizer.json`` of a Hugging Face model directory, read with
    the ``tokenizers`` library), loaded on first use; :attr:`error` says why none could be."""

    def __init__(self, path: str | None):
        self.path = path
        self._tok: Any = None
        self.error: str | None = None

    def count(self, text: str) -> int | None:
        """Tokens of ``text`` (no special tokens added); None when no tokenizer can be loaded."""
        if self._tok is None and self.error is None:
            f = Path(self.path or "") / "tokenizer.json"
            try:
                from tokenizers import Tokenizer

                self._tok = Tokenizer.from_file(str(f))
            except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a missing/bad file
                self.error = f"{f}: {type(e).__name__}: {str(e)[:120]}"
        if self._tok is None:
            return None
        return len(self._tok.encode(text, add_special_tokens=False).ids)


def completion_record(t_send: float, events: list[tuple[float, dict[str, Any]]],
                      tokenizer: Retokenizer | None = None) -> RequestRecord:
    """A :class:`RequestRecord` from ``(arrival time, chunk JSON)`` of one ``/v1/completions``
    stream (see the module docstring for how tokens are counted). Pure.

    Without ``token_ids`` and without a tokenizer (``tokenizer`` None or unloadable), a chunk
    with text counts as one token (``counted="chunks"``); the total is still the server's
    ``usage`` when it sends one.

    Raises:
        BenchError: ``http`` on an error chunk; ``short`` when no chunk carried output.
    """
    rec = RequestRecord(t_send=t_send)
    usage_total: int | None = None
    total = 0
    for t, chunk in events:
        if "error" in chunk:
            raise BenchError(f"stream error: {str(chunk['error'])[:200]}", "http")
        if chunk.get("usage"):
            usage_total = int(chunk["usage"].get("completion_tokens") or 0)
        n = 0
        for choice in chunk.get("choices") or []:
            ids, text = choice.get("token_ids"), choice.get("text") or ""
            if ids is not None:
                n += len(ids)
                continue
            if text:
                k = tokenizer.count(text) if tokenizer is not None else None
                n += max(1, k or 0)
                how = "retokenized" if k is not None else "chunks"
            elif choice.get("finish_reason") is None:
                n += 1  # text held back by the detokenizer: the chunk still carries a token
                how = "retokenized"
            else:
                continue  # a finish-only chunk carries nothing
            rec.counted = max(rec.counted, how, key=_COUNTED_RANK.__getitem__)
        if n > 0:
            total += n
            rec.chunk_times.append(t)
            rec.chunk_tokens.append(total)
    if not rec.chunk_times:
        raise BenchError("stream ended without any output token", "short")
    rec.completion_tokens = usage_total if (rec.counted != "ids" and usage_total) else total
    rec.t_done = rec.chunk_times[-1]
    return rec


class CompletionsProtocol(StreamProtocol):
    """Streaming greedy ``/v1/completions`` with token-id prompts, ``return_token_ids`` and
    ``stream_options.include_usage``.

    Args:
        model: the served model id (None: the first of ``GET /v1/models``).
        tokenizer_path: the model directory whose ``tokenizer.json`` counts chunks sent without
            ids (None: ``root`` of ``GET /v1/models``, which vLLM sets to the model's path).
        spec_metrics: read :func:`spec_counters` around the measured requests (``accept_length``).
    """

    path = "/v1/completions"

    def __init__(self, model: str | None = None, tokenizer_path: str | None = None, spec_metrics: bool = True):
        self.model = model
        self.tokenizer = Retokenizer(tokenizer_path)
        self.spec_metrics = spec_metrics
        self._before: dict[str, float] = {}

    async def prepare(self, session: aiohttp.ClientSession, base_url: str) -> None:
        if self.model is not None and self.tokenizer.path is not None:
            return
        entry = await served_model(session, base_url)
        self.model = self.model or str(entry["id"])
        if self.tokenizer.path is None:
            self.tokenizer.path = str(entry.get("root") or entry["id"])

    def prompt_ids(self, n: int, seed: int, index: int) -> list[int]:
        return prompt_ids(n, seed, index)

    def body(self, prompt_ids: list[int], max_tokens: int) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True}

    def record(self, t_send: float, events: list[tuple[float, str]]) -> RequestRecord:
        return completion_record(t_send, [(t, json.loads(p)) for t, p in events], self.tokenizer)

    async def before_measure(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._before = await spec_counters(session, base_url) if self.spec_metrics else {}

    async def after_measure(self, session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
        if not self.spec_metrics:
            return {}
        return {"accept_length": acceptance_length(self._before, await spec_counters(session, base_url))}


def run_benchmark(base_url: str, spec: BenchSpec,
                  deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """Warm up, then ``spec.repeats`` measured requests, ``spec.concurrency`` in flight at once
    (:func:`tasks.bench_client.run_benchmark` over :class:`CompletionsProtocol`).

    Returns:
        ``(metrics, records)``: :func:`tasks.bench_client.summarize`'s metrics, with
        ``accept_length`` from the ``/metrics`` counter deltas around the measured requests and
        ``concurrency``.
    Raises:
        BenchError: the first failed request; ``stall`` past ``deadline_s`` (s).
    """
    metrics, records = run_with(base_url, spec, CompletionsProtocol(), deadline_s)
    metrics["concurrency"] = float(spec.concurrency)
    return metrics, records


def records_json(records: list[RequestRecord]) -> list[dict[str, Any]]:
    """JSON-able per-request records (:meth:`tasks.bench_client.RequestRecord.to_dict`)."""
    return [r.to_dict() for r in records]
