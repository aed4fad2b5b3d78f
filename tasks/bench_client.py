"""The one streaming benchmark client: warm-up, then measured requests ``concurrency`` at a
time, over a per-protocol adapter (:class:`StreamProtocol`).

The adapters: SGLang's native ``/generate`` (:class:`tasks.backends.sglang.client.GenerateProtocol`)
and OpenAI's ``/v1/completions`` as vLLM serves it (:class:`tasks.openai_bench.CompletionsProtocol`).
The load client (:mod:`tasks.load_client`) sends its workloads through the same adapters.

How requests are sent, as vLLM 0.32's ``vllm bench serve`` sends them
(``vllm/benchmarks/serve.py`` and ``vllm/benchmarks/lib/endpoint_request_func.py``, line numbers
of that release) and SGLang 0.5.23's ``sglang/benchmark/serving.py``:

* One event loop, one ``aiohttp.ClientSession`` whose keep-alive connector holds at most
  ``concurrency`` connections (serve.py:826-834): a request reuses an idle connection. One
  difference: an idle connection is kept :data:`KEEPALIVE_S` (4 s), not vLLM's 60 s, so that one
  the server is closing (uvicorn's 5 s) is not reused; a request lost before any response is
  sent once more (:func:`stream_request`).
* The clock starts right before the POST, after the body is built (endpoint_request_func.py:228,
  serving.py:342); connection acquisition and the body's encoding are inside TTFT, as theirs.
* Per received read (``iter_any``, endpoint_request_func.py:244) only its arrival time and bytes are
  kept; JSON is parsed after the stream ends (:meth:`StreamProtocol.record`), so a chunk's arrival
  is never delayed by the parsing of another stream's chunk in the same loop.

Metric definitions (:func:`summarize`):

* TTFT (ms): send -> first chunk carrying output tokens (endpoint_request_func.py:262-266,
  serving.py:786-788).
* ``itl_ms_*``, per token, SGLang's ``adjust_itl`` (serving.py:790-797): a chunk carrying n new
  tokens after a gap g adds g / n, n times (:meth:`tasks.serving_metrics.RequestRecord.itls_s`).
* ``itl_chunk_ms_*``, per chunk, vLLM's (endpoint_request_func.py:267-270, ``output.itl.append(
  timestamp - most_recent_timestamp)`` for every chunk after the first; serve.py:632 pools them):
  the raw gap between successive chunks carrying output tokens. Equal to the per-token ITL when
  every chunk carries one token; with speculative decoding (several tokens per chunk) the
  per-chunk gap is larger.
* decode tok/s of one request = (output tokens - tokens of the first chunk) / (t_last - t_first);
  the objective is its median over the measured requests.
* output tok/s = all measured output tokens / wall time of the measured phase (TTFT included),
  as ``sglang.bench_serving`` reports ``output_throughput``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np

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
    """One measured request. Times are ``time.perf_counter()`` seconds.

    Attributes:
        t_send: when the request was sent.
        chunk_times: arrival of each chunk that carried output tokens.
        chunk_tokens: cumulative completion tokens after each of those chunks.
        completion_tokens: the request's output tokens.
        spec_verify_ct: SGLang's verify cycles (``meta_info.spec_verify_ct``), None without.
        output_ids: the output token ids when the server sent them whole (SGLang), else [].
        t_done: the last token-carrying chunk's arrival.
        t_stream_end: the stream's end (``[DONE]`` or the connection's close), None if unknown.
        counted: how tokens were counted: ``ids`` (the server's token counts or ids) or
            ``retokenized`` (the chunk texts encoded with the model's tokenizer).
    """

    t_send: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    spec_verify_ct: int | None = None
    output_ids: list[int] = field(default_factory=list)
    t_done: float = 0.0
    counted: str = "ids"
    t_stream_end: float | None = None

    @property
    def ttft_ms(self) -> float:
        return (self.chunk_times[0] - self.t_send) * 1e3

    @property
    def itl_ms(self) -> list[float]:
        """Per-token ITLs, ms (chunk gap / tokens in the chunk, repeated per token)."""
        return [float(x) * 1e3 for x in self.to_serving().itls_s()]

    @property
    def itl_chunk_ms(self) -> list[float]:
        """Per-chunk ITLs, ms: gaps between successive token-carrying chunks (vLLM's ITL)."""
        return [float(x) * 1e3 for x in np.diff(np.asarray(self.chunk_times, dtype=float))]

    def to_serving(self, prompt_len: int = 0) -> serving_metrics.RequestRecord:
        """The same stream as a :class:`tasks.serving_metrics.RequestRecord`: output length
        :attr:`completion_tokens`, E2E ending at :attr:`t_stream_end` when known (as SGLang's,
        see :mod:`tasks.serving_metrics`)."""
        end = self.t_stream_end if self.t_stream_end is not None else self.t_done
        rec = serving_metrics.RequestRecord.from_cumulative(self.t_send, self.chunk_times, self.chunk_tokens,
                                                            prompt_len, end_s=end)
        return dataclasses.replace(rec, output_len=self.completion_tokens)

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


#: the keys of :func:`summarize` (what every backend using this client logs per trial)
SUMMARY_METRICS = frozenset({"decode_tok_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_mean", "itl_ms_p50", "itl_ms_p99",
                             "itl_ms_mean", "itl_chunk_ms_p50", "itl_chunk_ms_p99", "itl_chunk_ms_mean",
                             "accept_length", "e2e_s_p50", "completed"})


def summarize(records: list[RequestRecord], wall_s: float) -> dict[str, float]:
    """Aggregate measured requests into the trial metrics (see module docstring).

    Args:
        records: the measured requests (warmup excluded).
        wall_s: wall time of the measured phase, s.
    Returns:
        ``decode_tok_s``, ``output_tok_s``, ``ttft_ms_p50``/``ttft_ms_mean``,
        ``itl_ms_p50``/``p99``/``mean`` (per token), ``itl_chunk_ms_p50``/``p99``/``mean``
        (per chunk), ``accept_length``, ``e2e_s_p50``, ``completed``. ``decode_tok_s`` is the
        median over the requests whose tokens arrived over more than one read: a stream the
        client read in one go (a server flushing several steps per write to a lagging client)
        has no decode span to time; nan when no request has one.
    """
    itl = [x for r in records for x in r.itl_ms]
    decode = [d for d in (r.decode_tok_s for r in records) if math.isfinite(d)]
    itl_chunk = [x for r in records for x in r.itl_chunk_ms]
    tokens = sum(r.completion_tokens for r in records)
    verify = [r.spec_verify_ct for r in records if r.spec_verify_ct]
    accept = (sum(r.completion_tokens for r in records if r.spec_verify_ct) / sum(verify)) if verify else 1.0
    nan = float("nan")
    return {
        "decode_tok_s": statistics.median(decode) if decode else nan,
        "output_tok_s": tokens / wall_s if wall_s > 0 else nan,
        "ttft_ms_p50": statistics.median(r.ttft_ms for r in records),
        "ttft_ms_mean": statistics.fmean(r.ttft_ms for r in records),
        "itl_ms_p50": percentile(itl, 0.50),
        "itl_ms_p99": percentile(itl, 0.99),
        "itl_ms_mean": statistics.fmean(itl) if itl else nan,
        "itl_chunk_ms_p50": percentile(itl_chunk, 0.50),
        "itl_chunk_ms_p99": percentile(itl_chunk, 0.99),
        "itl_chunk_ms_mean": statistics.fmean(itl_chunk) if itl_chunk else nan,
        "accept_length": accept,
        "e2e_s_p50": statistics.median(r.t_done - r.t_send for r in records),
        "completed": float(len(records)),
    }


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


class StreamProtocol(ABC):
    """One wire protocol of a streaming generation endpoint.

    Attributes:
        path: the endpoint's path (``/generate``, ``/v1/completions``).
    """

    path: str = ""

    async def prepare(self, session: aiohttp.ClientSession, base_url: str) -> None:
        """Learn what requests need from the server before any is sent (default: nothing).

        Raises:
            BenchError: the server cannot be asked.
        """
        return None

    @abstractmethod
    def prompt_ids(self, n: int, seed: int, index: int) -> list[int]:
        """Deterministic prompt token ids (``n`` of them) of request ``index``."""

    @abstractmethod
    def body(self, prompt_ids: list[int], max_tokens: int) -> dict[str, Any]:
        """The JSON body of one streaming greedy request with exactly ``max_tokens`` output tokens."""

    @abstractmethod
    def record(self, t_send: float, events: list[tuple[float, str]]) -> RequestRecord:
        """The request's record from its stream: ``(arrival time, SSE data payload)`` per
        message, ``[DONE]`` excluded.

        Raises:
            BenchError: ``http`` on an error message; ``short`` when no chunk carried a token.
        """

    async def before_measure(self, session: aiohttp.ClientSession, base_url: str) -> None:
        """Called right before the measured requests (default: nothing)."""
        return None

    async def after_measure(self, session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
        """Metrics read from the server right after the measured requests (default: none)."""
        return {}


def sse_payloads(buf: bytes) -> tuple[list[str], bytes]:
    """Complete SSE messages' ``data:`` payloads in ``buf`` and the incomplete rest.

    Messages end with a blank line (``\\n\\n``); a message may have several lines, of which the
    ``data:`` ones are kept (comments and other fields are skipped).
    """
    out: list[str] = []
    *done, rest = buf.replace(b"\r\n", b"\n").split(b"\n\n")
    for msg in done:
        for line in msg.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(line[5:].strip().decode())
    return out, rest


async def stream_request(session: aiohttp.ClientSession, base_url: str, protocol: StreamProtocol,
                         prompt_ids: list[int], max_tokens: int, timeout_s: float,
                         t_end: float | None = None) -> RequestRecord:
    """POST one streaming request and record each message's arrival.

    Args:
        timeout_s: a stream silent this long (s) is a stall.
        t_end: the whole benchmark's deadline on ``time.monotonic()`` (None: none).
    Raises:
        BenchError: ``stall`` when no byte arrives for ``timeout_s`` or the stream runs past
            ``t_end``; ``http`` on an error status or message; ``connection`` when the server is
            gone (a request lost before any response is sent once more first: under load a
            kept-alive connection is seen closed as it is reused, "Can not write request body",
            even within :data:`KEEPALIVE_S`); ``short`` on fewer tokens than ``max_tokens``.
    """
    body = protocol.body(prompt_ids, max_tokens)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s, sock_connect=min(timeout_s, 10.0))
    for attempt in range(2):
        events: list[tuple[float, str]] = []
        responded = False
        t_send = time.perf_counter()
        try:
            async with session.post(base_url + protocol.path, json=body, timeout=timeout) as r:
                responded = True
                if r.status != 200:
                    text = (await r.text())[:200]
                    raise BenchError(f"{protocol.path} returned HTTP {r.status}: {text}", "http")
                buf = b""
                async for data in r.content.iter_any():
                    t = time.perf_counter()
                    payloads, buf = sse_payloads(buf + data)
                    events += [(t, p) for p in payloads]
                    if t_end is not None and time.monotonic() > t_end:
                        raise BenchError("benchmark exceeded its time limit (backend.timeouts.bench_s) after "
                                         f"{len(events)} chunks", "stall")
                if buf.strip():
                    payloads, _ = sse_payloads(buf + b"\n\n")
                    events += [(time.perf_counter(), p) for p in payloads]
                t_stream_end = time.perf_counter()
            break
        except TimeoutError:
            raise BenchError(f"stream stalled: no data for {timeout_s:.0f} s after {len(events)} chunks",
                             "stall") from None
        except aiohttp.ClientError as e:
            if not responded and attempt == 0:
                # lost before any response: a keep-alive connection the server closed as this request
                # reused it ("Can not write request body", ServerDisconnectedError). Sent once more,
                # on another connection; a server that is gone refuses that one too
                continue
            # the errno and the peer say which loss it was (refused, reset, payload cut short)
            raise BenchError(f"connection lost after {len(events)} chunks: {type(e).__name__}: {str(e)[:200]}",
                             "connection") from None
    rec = protocol.record(t_send, [(t, p) for t, p in events if p != "[DONE]"])
    rec.t_stream_end = next((t for t, p in events if p == "[DONE]"), t_stream_end)
    if rec.completion_tokens < max_tokens:
        raise BenchError(f"got {rec.completion_tokens} of {max_tokens} tokens", "short")
    return rec


#: Seconds an idle connection is kept for reuse. Below uvicorn's default ``timeout_keep_alive``
#: (5 s, uvicorn/config.py; vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, SGLang's default): a
#: connection the server may be closing at that instant is not reused ("Can not write request
#: body"; under load it is still seen, hence the one resend). vLLM's ``bench serve`` keeps 60 s; within a
#: benchmark a connection is reused at once, so only a pause (load loading, a slow warmup) differs.
KEEPALIVE_S = 4.0


def connector(concurrency: int) -> aiohttp.TCPConnector:
    """A keep-alive connector holding at most ``concurrency`` connections (vLLM's
    serve.py:826-834; at least 1), each kept idle at most :data:`KEEPALIVE_S`."""
    n = max(1, int(concurrency))
    return aiohttp.TCPConnector(limit=n, limit_per_host=n, keepalive_timeout=KEEPALIVE_S, force_close=False)


async def measure(base_url: str, spec: BenchSpec, protocol: StreamProtocol,
                  deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """:func:`run_benchmark` inside a running event loop."""
    timeout, t_end = request_timeouts(spec.request_timeout_s, deadline_s)
    async with aiohttp.ClientSession(connector=connector(spec.concurrency)) as session:
        await protocol.prepare(session, base_url)
        for i in range(spec.warmup_requests):
            await stream_request(session, base_url, protocol, protocol.prompt_ids(spec.input_len, spec.seed, -1 - i),
                                 spec.warmup_output_len, timeout(), t_end)
        prompts = [protocol.prompt_ids(spec.input_len, spec.seed, i) for i in range(spec.repeats)]
        sem = asyncio.Semaphore(max(1, spec.concurrency))

        async def one(i: int) -> RequestRecord:
            async with sem:
                return await stream_request(session, base_url, protocol, prompts[i], spec.output_len,
                                            timeout(), t_end)

        await protocol.before_measure(session, base_url)
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(i)) for i in range(spec.repeats)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in tasks if t in done and t.exception() is not None]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - t0
        records = [t.result() for t in tasks]
        extra = await protocol.after_measure(session, base_url)
    metrics = summarize(records, wall)
    metrics.update(extra)
    return metrics, records


def run_benchmark(base_url: str, spec: BenchSpec, protocol: StreamProtocol,
                  deadline_s: float | None = None) -> tuple[dict[str, float], list[RequestRecord]]:
    """Warm up (``spec.warmup_requests`` one at a time), then ``spec.repeats`` measured requests,
    ``spec.concurrency`` in flight at once.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:30000``.
        protocol: the wire protocol's adapter.
        deadline_s: the whole benchmark's time limit, s (``backend.timeouts.bench_s``); a
            server trickling tokens just under the per-request stall timeout is stopped here.
    Returns:
        ``(metrics, records)``: :func:`summarize`'s metrics plus the adapter's
        :meth:`StreamProtocol.after_measure`, and the measured records in request order.
    Raises:
        BenchError: the first failed request (warmup or measured); ``stall`` past ``deadline_s``.
    """
    return asyncio.run(measure(base_url, spec, protocol, deadline_s))
