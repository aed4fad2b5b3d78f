"""The one benchmark client (tasks.bench_client) and its OpenAI adapter against a small in-process
OpenAI-style server on 127.0.0.1 that streams as vLLM 0.32 does: connection reuse, both ITL
definitions, counting a server that sends no token_ids by retokenizing, and the vLLM backend's
load-scaled startup budget."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tasks.bench_client import BenchError, RequestRecord, sse_payloads, summarize
from tasks.load_client import Target, run_level
from tasks.openai_bench import CompletionsProtocol, Retokenizer, completion_record, run_benchmark
from tasks.types import BenchSpec
from tasks.workloads import parse_workload

WORDS = [f"w{i}" for i in range(64)]


def _tokenizer_dir(tmp: Path) -> Path:
    """A word-level tokenizer.json (one token per space-separated word) written with `tokenizers`."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(["<unk>", *WORDS])}, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(tmp / "tokenizer.json"))
    return tmp


class FakeOpenAI:
    """Streams ``max_tokens`` tokens, ``per_chunk`` per chunk, ``gap_s`` apart, as vLLM's
    completions stream (a usage chunk with ``choices: []`` when ``stream_options.include_usage``).
    ``token_ids=False`` leaves the ids out; every ``hold_every``-th chunk then has empty text (a
    detokenizer holding back an incomplete character). Counts the TCP connections it served."""

    def __init__(self, root: Path, token_ids: bool = True, per_chunk: int = 1, gap_s: float = 0.002,
                 hold_every: int = 0, suffix: str = ""):
        self.root, self.token_ids, self.per_chunk, self.gap_s, self.hold_every = root, token_ids, per_chunk, gap_s, hold_every
        self.suffix = suffix
        self.peers: set[tuple[str, int]] = set()
        self.bodies: list[dict] = []

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny", "root": str(self.root)}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.peers.add(request.transport.get_extra_info("peername"))
        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n, sent, k = int(body["max_tokens"]), 0, 0
        while sent < n:
            m = min(self.per_chunk, n - sent)
            k += 1
            held = self.hold_every and k % self.hold_every == 0
            text = "" if held else "".join(f" {WORDS[(sent + j) % len(WORDS)]}" for j in range(m)) + self.suffix
            choice = {"index": 0, "text": text, "finish_reason": "length" if sent + m == n else None}
            if self.token_ids:
                choice["token_ids"] = list(range(sent, sent + m))
            # unescaped non-ASCII, as vLLM's pydantic JSON sends it
            await resp.write(f"data: {json.dumps({'choices': [choice]}, ensure_ascii=False)}\n\n".encode())
            sent += m
            await asyncio.sleep(self.gap_s)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": n}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


@contextlib.contextmanager
def serve(app_obj: FakeOpenAI) -> Iterator[str]:
    """Run ``app_obj`` on a free loopback port in a thread; yields the base URL."""
    app = web.Application()
    app.router.add_get("/v1/models", app_obj.models)
    app.router.add_post("/v1/completions", app_obj.completions)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp has no public accessor
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


SPEC = BenchSpec(input_len=16, output_len=24, warmup_requests=1, warmup_output_len=4, repeats=16, concurrency=4,
                 request_timeout_s=10)


def test_measured_requests_reuse_one_connection_per_stream_in_flight(tmp_path):
    fake = FakeOpenAI(tmp_path)
    with serve(fake) as url:
        m, recs = run_benchmark(url, SPEC)
    assert m["completed"] == 16 and all(r.completion_tokens == 24 for r in recs)
    # 1 warm-up + 16 measured requests, 4 at a time, over at most 4 kept-alive connections
    assert len(fake.bodies) == 17 and len(fake.peers) <= SPEC.concurrency
    body = fake.bodies[-1]
    assert body["return_token_ids"] is True and body["stream_options"] == {"include_usage": True}
    assert body["prompt"] == [int(x) for x in body["prompt"]] and len(body["prompt"]) == 16


def test_text_with_unicode_line_separators_is_not_split(tmp_path):
    # a random model's text holds U+2028 / U+2029 / U+0085, which JSON sends unescaped and which
    # str.splitlines() (httpx's iter_lines) treats as line ends: a client reading lines that way
    # failed with "JSONDecodeError: Unterminated string" against a real vLLM. SSE ends lines at \n.
    fake = FakeOpenAI(tmp_path, suffix="\u2028a\x85b\x1cc\u2029")
    with serve(fake) as url:
        m, recs = run_benchmark(url, SPEC)
    assert m["completed"] == 16 and all(r.completion_tokens == 24 for r in recs)


def test_both_itl_definitions_on_a_speculative_stream(tmp_path):
    # 3 tokens per chunk, chunks ~gap apart: per-chunk ITL ~= 3 x per-token ITL
    fake = FakeOpenAI(tmp_path, per_chunk=3, gap_s=0.02)
    with serve(fake) as url:
        m, _ = run_benchmark(url, BenchSpec(input_len=8, output_len=30, warmup_requests=0, repeats=2, concurrency=2))
    assert m["itl_chunk_ms_p50"] == pytest.approx(3 * m["itl_ms_p50"], rel=1e-6)
    assert m["itl_chunk_ms_p50"] >= 20.0


def test_per_chunk_itl_is_the_raw_gap():
    r = RequestRecord(t_send=0.0, chunk_times=[0.1, 0.13, 0.19], chunk_tokens=[1, 4, 5], completion_tokens=5,
                      t_done=0.19)
    assert r.itl_chunk_ms == pytest.approx([30.0, 60.0])
    assert r.itl_ms == pytest.approx([10.0, 10.0, 10.0, 60.0])
    m = summarize([r], 1.0)
    assert m["itl_chunk_ms_mean"] == pytest.approx(45.0) and m["itl_ms_mean"] == pytest.approx(22.5)
    assert m["ttft_ms_mean"] == pytest.approx(100.0)



def test_decode_rate_leaves_out_a_stream_read_in_one_go():
    """A stream whose 128 tokens all arrived in one read has no decode span (its rate is nan):
    the median is over the requests that have one, and nan only when none has."""
    def rec(times: list[float]) -> RequestRecord:
        return RequestRecord(t_send=0.0, chunk_times=times, chunk_tokens=[1, 128][-len(times):] if len(times) < 3
                             else [1, 64, 128], completion_tokens=128, t_done=times[-1])
    one_read = rec([0.2])
    assert one_read.decode_tok_s != one_read.decode_tok_s  # nan
    m = summarize([rec([0.1, 0.5, 1.37]), one_read, one_read, rec([0.1, 0.6, 1.37])], 2.0)
    assert m["decode_tok_s"] == pytest.approx(127 / 1.27)
    assert summarize([one_read], 1.0)["decode_tok_s"] != summarize([one_read], 1.0)["decode_tok_s"]

def test_server_without_token_ids_is_counted_by_retokenizing(tmp_path):
    # vLLM without return_token_ids: ids absent, every 5th chunk's text held back (empty)
    fake = FakeOpenAI(_tokenizer_dir(tmp_path), token_ids=False, per_chunk=2, hold_every=5)
    with serve(fake) as url:
        m, recs = run_benchmark(url, SPEC)
    assert m["completed"] == 16
    for r in recs:
        assert r.counted == "retokenized" and r.completion_tokens == 24  # the usage chunk's count
        # per chunk: 2 words retokenize to 2, a held-back (empty) chunk counts 1: 10 x 2 + 2 x 1
        assert r.chunk_tokens[-1] == 22 and len(r.chunk_times) == 12
    # the load client: the same server was failed as "short: 100 of 128" before
    w = parse_workload({"num_requests": 6, "arrival": {"kind": "closed", "concurrency": 3}, "prompt_len": 8,
                        "output_len": 24})
    with serve(FakeOpenAI(tmp_path, token_ids=False, per_chunk=2, hold_every=5)) as url:
        lm, lrecs = run_level(Target(url, "openai"), w)
    assert lm["completed"] == 6 and lm["failed"] == 0 and all(r.n_output == 24 for r in lrecs)


def test_retokenized_counts_per_chunk(tmp_path):
    tok = Retokenizer(str(_tokenizer_dir(tmp_path)))
    events = [(0.1, {"choices": [{"text": " w1 w2 w3", "finish_reason": None}]}),
              (0.2, {"choices": [{"text": "", "finish_reason": None}]}),
              (0.3, {"choices": [{"text": " w4", "finish_reason": "length"}]}),
              (0.4, {"choices": [], "usage": {"completion_tokens": 5}})]
    r = completion_record(0.0, events, tok)
    assert r.chunk_tokens == [3, 4, 5] and r.completion_tokens == 5 and r.counted == "retokenized"
    ids = completion_record(0.0, [(0.1, {"choices": [{"text": "", "token_ids": [7, 8]}]}),
                                  (0.2, {"choices": [{"text": "x", "token_ids": []}]})])
    assert ids.chunk_tokens == [2] and ids.counted == "ids"


def test_no_tokenizer_counts_one_token_per_text_chunk_and_trusts_usage(tmp_path):
    tok = Retokenizer(str(tmp_path / "none"))
    events = [(0.1, {"choices": [{"text": " w1 w2"}]}),
              (0.2, {"choices": [{"text": " w3", "finish_reason": "length"}], "usage": {"completion_tokens": 3}})]
    r = completion_record(0.0, events, tok)
    assert r.counted == "chunks" and r.chunk_tokens == [1, 2] and r.completion_tokens == 3
    assert tok.error and "tokenizer.json" in tok.error


class DroppingOpenAI(FakeOpenAI):
    """Drops a request with no answer (aborts its connection after reading it), as a server does
    that closes a kept-alive connection just as the client reuses it: every request (``idle_s``
    None), or one arriving on a connection idle longer than ``idle_s`` since its last answer."""

    def __init__(self, root: Path, idle_s: float | None = None):
        super().__init__(root)
        self.idle_s, self.dropped, self.answered_at = idle_s, 0, {}
        self.drop_only: int | None = None  # drop at most this many (None: no limit)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername")
        last = self.answered_at.get(peer)
        room = self.drop_only is None or self.dropped < self.drop_only
        if room and (self.idle_s is None or (last is not None and time.monotonic() - last > self.idle_s)):
            await request.read()
            self.dropped += 1
            request.transport.abort()
            return web.Response()
        resp = await super().completions(request)
        self.answered_at[peer] = time.monotonic()
        return resp


def test_a_request_the_server_drops_twice_is_a_lost_connection_that_names_its_cause(tmp_path):
    fake = DroppingOpenAI(tmp_path)
    with serve(fake) as url, pytest.raises(BenchError) as e:
        run_benchmark(url, SPEC)
    assert e.value.kind == "connection" and "after 0 chunks: ServerDisconnectedError: " in str(e.value), str(e.value)
    assert fake.dropped == 2 and not fake.bodies  # the warm-up sent once more, then the benchmark stopped


def test_a_request_dropped_once_before_any_answer_is_sent_once_more(tmp_path):
    fake = DroppingOpenAI(tmp_path, idle_s=None)
    fake.drop_only = 1
    with serve(fake) as url:
        m, recs = run_benchmark(url, SPEC)
    assert fake.dropped == 1 and m["completed"] == 16 and all(r.completion_tokens == 24 for r in recs)
    assert len(fake.bodies) == 17  # every request answered once: the dropped one on its second sending


@pytest.mark.parametrize("keepalive_s, lost", [(0.2, False), (60.0, True)])
def test_a_connection_idle_past_the_keepalive_is_not_reused(tmp_path, monkeypatch, keepalive_s, lost):
    # a server closing connections idle longer than 0.5 s (uvicorn's timeout_keep_alive, scaled):
    # a client keeping them alive longer reuses one the server drops (and has to send it again)
    from tasks import bench_client

    monkeypatch.setattr(bench_client, "KEEPALIVE_S", keepalive_s)
    fake = DroppingOpenAI(tmp_path, idle_s=0.5)
    protocol = CompletionsProtocol(model="tiny")

    async def two_requests_a_pause_apart():
        async with aiohttp.ClientSession(connector=bench_client.connector(1)) as session:
            await bench_client.stream_request(session, url, protocol, [1, 2, 3], 4, 10.0)
            await asyncio.sleep(0.8)
            return await bench_client.stream_request(session, url, protocol, [1, 2, 3], 4, 10.0)

    with serve(fake) as url:
        # the request after the pause arrives on a fresh connection, or on the stale one (dropped,
        # then sent once more on another)
        assert asyncio.run(two_requests_a_pause_apart()).completion_tokens == 4
    assert fake.dropped == (1 if lost else 0)


def test_the_client_lets_go_of_idle_connections_before_uvicorn_closes_them():
    from tasks import bench_client

    async def keepalive() -> float:
        conn = bench_client.connector(4)
        try:
            return conn._keepalive_timeout  # noqa: SLF001 - aiohttp has no public accessor
        finally:
            await conn.close()

    # uvicorn's timeout_keep_alive default (uvicorn/config.py), which vLLM and SGLang keep
    assert asyncio.run(keepalive()) == bench_client.KEEPALIVE_S < 5.0


def test_error_chunk_and_http_error(tmp_path):
    with pytest.raises(BenchError) as e:
        completion_record(0.0, [(0.1, {"error": {"message": "boom"}})])
    assert e.value.kind == "http"
    assert CompletionsProtocol(model="m").body([1, 2], 3)["model"] == "m"


def test_sse_payloads_split_across_reads():
    out, rest = sse_payloads(b'data: {"a": 1}\n\ndata: {"b"')
    assert out == ['{"a": 1}'] and rest == b'data: {"b"'
    out, rest = sse_payloads(rest + b': 2}\r\n\r\n: ping\n\ndata: [DONE]\n\n')
    assert out == ['{"b": 2}', "[DONE]"] and rest == b""


def test_vllm_startup_budget_scales_with_load():
    from tasks.backends.vllm import MAX_LOAD_FACTOR, startup_budget_s

    assert startup_budget_s(240, load_1m=1.0, cpus=2) == (240.0, pytest.approx("startup_s 240 s x 1.0 for "
                                                                             "load average 1.0 on 2 CPUs"))
    s, why = startup_budget_s(240, load_1m=6.0, cpus=2)
    assert s == 720.0 and "x 3.0" in why and "load average 6.0" in why
    assert startup_budget_s(240, load_1m=100.0, cpus=2)[0] == 240 * MAX_LOAD_FACTOR


def test_vllm_trial_gets_the_stretched_budget_and_says_so(monkeypatch):
    from tasks.backends import get_backend, lifecycle
    from tasks.types import Timeouts, TrialResult, TrialSpec

    seen = {}

    def fake_run(backend, spec, profile, workdir):
        seen["startup_s"] = spec.timeouts.startup_s
        return TrialResult(status="failed", failure_class="startup_timeout",
                           failure_kind="transient", failure_signature="server not healthy after 480 s")

    monkeypatch.setattr(lifecycle, "run_server_trial", fake_run)
    monkeypatch.setattr("os.getloadavg", lambda: (4.0 * (__import__("os").cpu_count() or 1), 0.0, 0.0))
    spec = TrialSpec(sweep="s", trial_number=0, params={}, argv=["x"], env={}, backend="vllm",
                     timeouts=Timeouts(startup_s=120))
    res = get_backend("vllm").run_trial(spec, None, None)
    assert seen["startup_s"] == 480.0
    assert res.failure_kind == "transient" and "budget 480 s" in res.failure_signature
    assert "for load average" in res.failure_signature


def test_summary_metrics_names_every_key_summarize_returns():
    from tasks.backends import get_backend
    from tasks.bench_client import SUMMARY_METRICS

    rec = RequestRecord(t_send=0.0, chunk_times=[0.1, 0.2, 0.3], chunk_tokens=[1, 2, 3], completion_tokens=3, t_done=0.3)
    assert set(summarize([rec], 1.0)) == SUMMARY_METRICS
    assert all(SUMMARY_METRICS <= get_backend(kind).bench_metrics for kind in ("sglang", "vllm"))
