"""The emulated server's HTTP API (SGLang 0.5.23's routes, aiohttp handlers).

``HttpApi(server).app()`` builds the application; the handlers read the state of the
``tasks.emulator.server.EmulatedServer`` they serve (readiness, launch, prediction, tokenizer,
the token generator). Routes: /health, /health_generate, /generate (one prompt or a batch),
the OpenAI routes /v1/completions and /v1/chat/completions (``tasks.emulator.openai_routes``),
/server_info = /get_server_info, /get_model_info, /v1/models, /flush_cache, /metrics (with
``--enable-metrics``; ``tasks.emulator.metrics``), and the emulator-only /emulator/requests (the
batching scheduler's requests and state).

Request bodies: SGLang (FastAPI on uvicorn) sets no body-size limit; :data:`CLIENT_MAX_SIZE`
replaces aiohttp's 1 MiB default with 1 GiB, far above any valid request (a full 262,144-token
context as JSON ids is ~2 MB) while one request still cannot exhaust the host's memory.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from aiohttp import web

from tasks.emulator.generation import BadRequest, Sub, find_stop, stop_list
from tasks.emulator.metrics import ServerMetrics
from tasks.emulator.openai_routes import OpenAIRoutes
from tasks.emulator.request_checks import NO_PROMPT, contract_error, openai_error, sampling_value_error, value_error

CLIENT_MAX_SIZE = 1 << 30
#: SGLang's ``SamplingParams.max_new_tokens`` default (srt/sampling/sampling_params.py).
DEFAULT_MAX_NEW_TOKENS = 128
_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class HttpApi:
    """SGLang's HTTP routes over one ``EmulatedServer``."""

    def __init__(self, server: Any) -> None:
        # ``server`` is a tasks.emulator.server.EmulatedServer (not imported: that module
        # imports this one).
        self.s = server
        self.metrics = ServerMetrics()

    def app(self) -> web.Application:
        """The aiohttp application with every route."""
        oai = OpenAIRoutes(self)
        app = web.Application(client_max_size=CLIENT_MAX_SIZE)
        r = app.router
        r.add_get("/health", self.h_health)
        r.add_get("/health_generate", self.h_health_generate)
        r.add_post("/generate", self.h_generate)
        r.add_post("/v1/completions", oai.h_completions)
        r.add_post("/v1/chat/completions", oai.h_chat)
        r.add_get("/server_info", self.h_server_info)
        r.add_get("/get_server_info", self.h_server_info)
        r.add_get("/get_model_info", self.h_model_info)
        r.add_get("/v1/models", self.h_models)
        r.add_post("/flush_cache", self.h_flush)
        if self.s.launch.args.get("enable_metrics"):
            r.add_get("/metrics", self.h_metrics)
        r.add_get("/emulator/requests", self.h_emulator_requests)
        return app

    # ---------------------------------------------------------------- shared helpers
    @property
    def model_name(self) -> str:
        """``--served-model-name`` or the model path."""
        return self.s.launch.args.get("served_model_name") or self.s.launch.model_path

    @property
    def tokenizer_path(self) -> str:
        """The directory of the tokenizer the server uses (absolute)."""
        return str(self.s.tok.path if self.s.tok is not None else self.s.load_tokenizer().path)

    def not_ready(self) -> web.Response | None:
        """503 before ready, and the ``http_503_once`` fault's one 503 right after; else None."""
        if not self.s.ready:
            return web.json_response({"error": "server not ready"}, status=503)
        if self.s.fault == "http_503_once" and not getattr(self.s, "sent_503", False):
            self.s.sent_503 = True
            return web.json_response({"error": "emulated fault http_503_once"}, status=503)
        return None

    async def json_body(self, request: web.Request) -> Any:
        """The parsed JSON body.

        Raises:
            web.HTTPBadRequest: not JSON, as FastAPI's RequestValidationError through SGLang's
                handler (400, ``ErrorResponse`` of type ``Bad Request``).
        """
        try:
            return await request.json()
        except ValueError as e:
            raise web.HTTPBadRequest(text=json.dumps(openai_error(f"JSON decode error: {e}", err_type="Bad Request")),
                                     content_type="application/json") from None

    async def encode(self, text: str) -> list[int]:
        """Tokenize (a long text off the event loop, so other streams keep their pace)."""
        tok = self.s.tok
        if len(text) < 4096:
            return tok.encode(text)
        return await asyncio.to_thread(tok.encode, text)

    def check_sub(self, sub: Sub, sp: dict) -> None:
        """SGLang's checks of one generation (sampling ranges, prompt, context, KV pool).

        Raises:
            BadRequest: SGLang's message.
        """
        bad = sampling_value_error({**sp, "max_new_tokens": sub.max_new})
        bad = bad or value_error(sub.ids, sub.max_new, self.s.engine())
        if bad is not None:
            raise BadRequest(bad)

    async def run(self, sub: Sub, t_recv: float) -> AsyncIterator[str]:
        """Generate ``sub`` through the batching scheduler; yields the text added per chunk (a
        stop string ends it early, which aborts the rest in the scheduler)."""
        tok = self.s.tok
        longest = max((len(x) for x in sub.stop), default=0)
        self.metrics.started(len(sub.ids))
        t0 = time.monotonic()
        try:
            async with aclosing(self.s.generate(sub.ids, max(1, sub.max_new), bench=True, received=t_recv,
                                                sample=sub.sample)) as gen:
                async for new, vct, done in gen:
                    if sub.t_first is None:
                        sub.t_first = time.monotonic()
                    sub.vct = vct
                    new = new if sub.max_new > 0 else []  # max_new_tokens 0: the prefill, no token
                    start = len(sub.text)
                    sub.out.extend(new)
                    sub.text += tok.decode(new)
                    hit = find_stop(sub.text, sub.stop, max(0, start - longest + 1)) if sub.stop else None
                    if hit is not None:
                        sub.text = sub.text[:hit[0]]
                        sub.finish = {"type": "stop", "matched": hit[1]}
                        yield sub.text[start:]
                        return
                    if done:
                        sub.finish = {"type": "length", "length": len(sub.out)}
                    yield sub.text[start:]
        finally:
            self.metrics.finished(len(sub.out), t_recv, sub.t_first, time.monotonic(), t0)

    async def run_all(self, subs: list[Sub], t_recv: float) -> AsyncIterator[tuple[int, str]]:
        """:meth:`run` of every sub concurrently; yields (sub index, text delta) as they come."""
        if len(subs) == 1:
            async with aclosing(self.run(subs[0], t_recv)) as g:
                async for d in g:
                    yield 0, d
            return
        q: asyncio.Queue = asyncio.Queue()
        end = object()

        async def pump(i: int, sub: Sub) -> None:
            try:
                async with aclosing(self.run(sub, t_recv)) as g:
                    async for d in g:
                        await q.put((i, d))
                await q.put((i, end))
            except Exception as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                await q.put((i, e))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(subs)]
        try:
            left = len(tasks)
            while left:
                i, d = await q.get()
                if d is end:
                    left -= 1
                elif isinstance(d, BaseException):
                    raise d
                else:
                    yield i, d
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def sse(self, request: web.Request) -> web.StreamResponse:
        """A prepared ``text/event-stream`` response."""
        resp = web.StreamResponse(headers=_SSE)
        await resp.prepare(request)
        return resp

    # ---------------------------------------------------------------- routes
    async def h_health(self, request: web.Request) -> web.Response:
        """200 once ready, 503 before."""
        return web.Response(status=200 if self.s.ready else 503)

    async def h_health_generate(self, request: web.Request) -> web.Response:
        """Generate one token (503 before ready)."""
        if not self.s.ready:
            return web.Response(status=503)
        async for _ in self.s.generate([1], 1, bench=False):
            pass
        return web.Response(status=200)

    async def _generate_subs(self, body: dict) -> tuple[list[Sub], list[dict], bool]:
        """``/generate`` body -> (generations, their sampling params, batched?) as SGLang's
        ``GenerateReqInput.normalize_batch_and_parse``: ``text`` or ``input_ids``, one or a
        list; ``sampling_params`` one for all or one per prompt; ``n`` samples per prompt.

        Raises:
            BadRequest: no prompt, a sampling-params list of the wrong length, or a SGLang check.
        """
        text, ids = body.get("text"), body.get("input_ids")
        if text is None and ids is None:
            raise BadRequest(NO_PROMPT)
        if ids is not None:
            batched = bool(ids) and isinstance(ids[0], list)
            prompts = [list(p) for p in ids] if batched else [list(ids)]
            texts: list[str | None] = [None] * len(prompts)
        else:
            batched = isinstance(text, list)
            texts = list(text) if batched else [text]
            prompts = [await self.encode(t) for t in texts]
        sp_in = body.get("sampling_params") or {}
        if isinstance(sp_in, list):
            if len(sp_in) != len(prompts):
                raise BadRequest(f"The number of sampling_params ({len(sp_in)}) does not match the batch size "
                                 f"({len(prompts)}).")
            sps = sp_in
        else:
            sps = [sp_in] * len(prompts)
        subs, sub_sps = [], []
        for p, t, sp in zip(prompts, texts, sps):
            n = int(sp.get("n") or 1)
            batched = batched or n > 1
            mx = sp.get("max_new_tokens")
            for j in range(max(1, n)):
                sub = Sub(p, DEFAULT_MAX_NEW_TOKENS if mx is None else int(mx), stop_list(sp.get("stop")), j, t)
                self.check_sub(sub, sp)
                subs.append(sub)
                sub_sps.append(sp)
        return subs, sub_sps, batched

    def _gen_result(self, sub: Sub, rid: str, t0: float) -> dict:
        spec = self.s.launch.speculative
        return {"text": sub.text, "output_ids": list(sub.out),
                "meta_info": {"id": rid, "prompt_tokens": len(sub.ids), "completion_tokens": len(sub.out),
                              "cached_tokens": 0, "spec_verify_ct": sub.vct if spec else len(sub.out),
                              "finish_reason": sub.finish, "e2e_latency": time.monotonic() - t0}}

    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native ``/generate``: ``text`` or ``input_ids`` (one prompt or a list: then a
        list of results, or, streaming, chunks with an ``index``), ``sampling_params``
        (``max_new_tokens``, ``n``, ``stop``, ...), ``stream``."""
        t_recv = time.monotonic()
        early = self.not_ready()
        if early is not None:
            return early
        body = await self.json_body(request)
        if not isinstance(body, dict):
            return web.json_response(openai_error("Input should be an object", err_type="Bad Request"), status=400)
        bad = contract_error(body)
        if bad is not None:
            return web.json_response({"error": bad}, status=400)
        stream = bool(body.get("stream"))
        try:
            subs, _sps, batched = await self._generate_subs(body)
        except BadRequest as e:
            return await self._value_error_response(request, str(e), stream)
        base = body.get("rid")
        rids = (list(base) if isinstance(base, list) else
                [f"{base}_{i}" if batched else base for i in range(len(subs))] if base else
                [f"{self.s.req_counter + 1 + i:032x}" for i in range(len(subs))])
        t0 = time.monotonic()
        if stream:
            resp = await self.sse(request)
            async with aclosing(self.run_all(subs, t_recv)) as gen:
                async for i, _delta in gen:
                    out = self._gen_result(subs[i], rids[i], t0)
                    if batched:
                        out["index"] = i
                    await resp.write(f"data: {json.dumps(out)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        async with aclosing(self.run_all(subs, t_recv)) as gen:
            async for _ in gen:
                pass
        results = [self._gen_result(s, r, t0) for s, r in zip(subs, rids)]
        return web.json_response(results if batched else results[0])

    async def _value_error_response(self, request: web.Request, message: str, stream: bool) -> web.StreamResponse:
        """SGLang's answer to a request its tokenizer manager rejects (a ValueError): 400
        ``{"error": {"message"}}``, or, when streaming, 200 with one error event and ``[DONE]``
        (srt/entrypoints/http_server.py ``serve_generate_request``, ``_create_error_response``)."""
        if not stream:
            return web.json_response({"error": {"message": message}}, status=400)
        resp = await self.sse(request)
        err = {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
        await resp.write(f"data: {json.dumps(err)}\n\n".encode() + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def h_server_info(self, request: web.Request) -> web.Response:
        """``/server_info``: server args, internal states, version and the emulator block."""
        args = {k: v for k, v in self.s.launch.args.items()}
        args["speculative_num_steps"] = self.s.pred.spec.get("num_steps", args.get("speculative_num_steps"))
        args["speculative_eagle_topk"] = self.s.pred.spec.get("eagle_topk", args.get("speculative_eagle_topk"))
        args["speculative_num_draft_tokens"] = self.s.pred.spec.get("num_draft_tokens",
                                                                  args.get("speculative_num_draft_tokens"))
        info: dict[str, Any] = dict(args)
        info["tokenizer_path"] = self.tokenizer_path
        info["internal_states"] = [{"avg_spec_accept_length": float(self.s.last_tau),
                                    "last_gen_throughput": float(self.s.last_rate)}]
        info["version"] = str(self.s.profile["emulator"]["sglang_version"])
        info["emulator"] = {"fingerprint": self.s.profile["emulator"]["fingerprint"],
                            "allreduce_path": self.s.pred.allreduce_path,
                            "max_total_num_tokens": self.s.pred.memory_gib.get("kv_tokens")}
        return web.json_response(info)

    async def h_model_info(self, request: web.Request) -> web.Response:
        """``/get_model_info``; ``tokenizer_path`` is the directory to pass as a client's ``--tokenizer``."""
        return web.json_response({"model_path": self.s.launch.model_path, "tokenizer_path": self.tokenizer_path,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default", "has_image_understanding": False,
                                  "has_audio_understanding": False, "model_type": "kimi_k25",
                                  "architectures": [self.s.profile["model"]["emulator"].get("architecture")]})

    async def h_models(self, request: web.Request) -> web.Response:
        """OpenAI ``/v1/models`` (SGLang's ``ModelCard`` fields, plus ``tokenizer_path``)."""
        eng = self.s.engine() if self.s.ready else None
        card = {"id": self.model_name, "object": "model", "created": int(self.s.t_start), "owned_by": "sglang",
                "root": self.s.launch.model_path, "parent": None,
                "max_model_len": eng.context_len if eng is not None else None,
                "tokenizer_path": self.tokenizer_path}
        return web.json_response({"object": "list", "data": [card]})

    async def h_metrics(self, request: web.Request) -> web.Response:
        """Prometheus text (``--enable-metrics``), in SGLang's metric names."""
        eng = self.s.engine() if self.s.ready else None
        text = self.metrics.render(eng, self.model_name, self.s.last_rate)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def h_emulator_requests(self, request: web.Request) -> web.Response:
        """Emulator-only: every request the batching scheduler got, in order (arrival in the
        scheduler, s since the engine started; lengths; state; first token / end, s), when the
        HTTP handler received it and handed its first chunk to the connection (s, same clock),
        and its config, so a test can replay the same arrivals through the offline simulation."""
        eng = self.s.engine() if self.s.ready else None
        if eng is None:
            return web.json_response({"error": "server not ready"}, status=503)
        eng.sch.advance(eng.now_s())
        reqs = [{"arrival_s": r.arrival, "prompt_len": r.prompt, "output_len": r.out, "state": r.state,
                 "emitted": r.emitted, "first_s": None if r.first_s != r.first_s else r.first_s,
                 "finish_s": None if r.finish_s != r.finish_s else r.finish_s,
                 "received_s": eng.arrivals[i], "first_sent_s": eng.first_sent.get(i)}
                for i, r in enumerate(eng.sch.reqs)]
        c = eng.config
        return web.json_response({"now_s": eng.now_s(), "requests": reqs, "running": len(eng.sch.running),
                                  "prefilling": len(eng.sch.prefilling), "waiting": len(eng.sch.waiting),
                                  "kv_used": eng.sch.kv_used,
                                  "config": {"max_running_requests": c.max_running_requests,
                                             "max_total_tokens": c.max_total_tokens,
                                             "chunked_prefill_size": c.chunked_prefill_size,
                                             "mixed_chunk": c.mixed_chunk}})

    async def h_flush(self, request: web.Request) -> web.Response:
        """``/flush_cache`` (nothing is cached)."""
        return web.Response(text="Cache flushed.\n")
