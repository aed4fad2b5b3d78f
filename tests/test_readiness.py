"""tasks.readiness: one real generation after green health, 5xx retried within the deadline."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiohttp import web

from tasks.backends import get_backend
from tasks.readiness import NotServing, first_generation, is_http_5xx
from tasks.server import reserve_ports


@pytest.fixture
def server():
    """A tiny server whose /generate answers 503 ``state['fail']`` times, then 200 (or 400 on /v1)."""
    state = {"fail": 2, "calls": 0}

    async def gen(req):
        state["calls"] += 1
        if state["calls"] <= state["fail"]:
            return web.Response(status=503)
        return web.Response(status=400) if req.path.startswith("/v1") else web.json_response({"text": "x"})

    loop = asyncio.new_event_loop()
    with reserve_ports(1) as ports:
        port = ports[0]
    app = web.Application()
    app.router.add_post("/generate", gen)
    app.router.add_post("/v1/completions", gen)
    runner = web.AppRunner(app)

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.3)
    yield f"http://127.0.0.1:{port}", state
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


def test_503s_are_retried_until_a_generation_is_served(server):
    url, state = server
    warm = first_generation(url, get_backend("sglang").ready_request, deadline_s=10)
    assert state["calls"] == 3 and 0 < warm < 5


def test_a_4xx_means_up_and_parsing(server):
    url, state = server
    state["fail"] = 0
    assert first_generation(url, get_backend("vllm").ready_request, deadline_s=5) < 5 and state["calls"] == 1


def test_never_serving_within_the_deadline_is_an_error(server):
    url, state = server
    state["fail"] = 10**6
    with pytest.raises(NotServing, match="HTTP 503"):
        first_generation(url, get_backend("sglang").ready_request, deadline_s=1.0)


def test_http_5xx_recognised_in_bench_errors():
    from tasks.backends.sglang.client import BenchError

    assert is_http_5xx(BenchError("/generate returned HTTP 503: busy", "http"))
    assert not is_http_5xx(BenchError("/generate returned HTTP 400: bad", "http"))
    assert not is_http_5xx(BenchError("stream stalled", "stall"))
