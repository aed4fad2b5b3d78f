"""The emulated server's HTTP API (SGLang's routes, aiohttp handlers).

``HttpApi(server).app()`` builds the application; the handlers read the state of the
``tasks.emulator.server.EmulatedServer`` they serve (readiness, launch, prediction, the
token generator). Routes: /health, /health_generate, /generate, /v1/completions,
/server_info = /get_server_info, /get_model_info, /v1/models, /flush_cache, and the
emulator-only /emulator/requests (the batching scheduler's requests and state).
"""

from __future__ import annotations

import json
import time
import zlib
from contextlib import aclosing
from typing import Any

from aiohttp import web

from tasks.emulator.request_checks import contract_error, openai_error, value_error


def text_to_ids(text: str, vocab: int) -> list[int]:
    """Whitespace 'tokenizer': one id per word (CRC32 mod vocab); at least one token."""
    words = text.split() or [""]
    return [zlib.crc32(w.encode()) % vocab for w in words]


def ids_to_text(ids: list[int]) -> str:
    """Token ids -> text (`` w<id>`` per token)."""
    return "".join(f" w{i}" for i in ids)


class HttpApi:
    """SGLang's HTTP routes over one ``EmulatedServer``."""

    def __init__(self, server: Any) -> None:
        # ``server`` is a tasks.emulator.server.EmulatedServer (not imported: that module
        # imports this one).
        self.s = server

    def app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application()
        r = app.router
        r.add_get("/health", self.h_health)
        r.add_get("/health_generate", self.h_health_generate)
        r.add_post("/generate", self.h_generate)
        r.add_post("/v1/completions", self.h_completions)
        r.add_get("/server_info", self.h_server_info)
        r.add_get("/get_server_info", self.h_server_info)
        r.add_get("/get_model_info", self.h_model_info)
        r.add_get("/v1/models", self.h_models)
        r.add_post("/flush_cache", self.h_flush)
        r.add_get("/emulator/requests", self.h_emulator_requests)
        return app

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

    def _input_ids(self, body: dict) -> list[int]:
        ids = body.get("input_ids")
        if ids is None:
            ids = text_to_ids(str(body.get("text", "")), self.s.vocab)
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            ids = ids[0]
        return [int(i) for i in ids]

    async def _json_body(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except Exception:
            raise web.HTTPBadRequest(text=json.dumps({"error": "invalid JSON body"}),
                                     content_type="application/json") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text=json.dumps({"error": "JSON object expected"}), content_type="application/json")
        return body

    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native ``/generate`` (``input_ids`` or ``text``; stream or not)."""
        t_recv = time.monotonic()
        if not self.s.ready:
            return web.json_response({"error": "server not ready"}, status=503)
        if self.s.fault == "http_503_once" and not getattr(self.s, "sent_503", False):  # right after green health
            self.s.sent_503 = True
            return web.json_response({"error": "emulated fault http_503_once"}, status=503)
        body = await self._json_body(request)
        bad = contract_error(body)
        if bad is not None:
            return web.json_response({"error": bad}, status=400)
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        ids = self._input_ids(body)
        bad = value_error(ids, max_new, self.s.engine())
        if bad is not None:
            return await self._value_error_response(request, bad, bool(body.get("stream")))
        rid = body.get("rid") or f"{self.s.req_counter + 1:032x}"
        t0 = time.monotonic()
        out_ids: list[int] = []

        def chunk(verify_ct: int, done: bool) -> dict:
            return {"text": ids_to_text(out_ids), "output_ids": list(out_ids),
                    "meta_info": {"id": rid, "prompt_tokens": len(ids), "completion_tokens": len(out_ids),
                                  "cached_tokens": 0, "spec_verify_ct": verify_ct if self.s.launch.speculative
                                  else len(out_ids),
                                  "finish_reason": {"type": "length", "length": len(out_ids)} if done else None,
                                  "e2e_latency": time.monotonic() - t0}}

        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            async with aclosing(self.s.generate(ids, max_new, bench=True, received=t_recv)) as gen:
                async for new, vct, done in gen:
                    out_ids.extend(new)
                    await resp.write(f"data: {json.dumps(chunk(vct, done))}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        last = (0, False)
        async for new, vct, done in self.s.generate(ids, max_new, bench=True, received=t_recv):
            out_ids.extend(new)
            last = (vct, done)
        return web.json_response(chunk(*last))

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI ``/v1/completions`` (stream or not, with ``usage``)."""
        t_recv = time.monotonic()
        if not self.s.ready:
            return web.json_response({"error": "server not ready"}, status=503)
        body = await self._json_body(request)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            ids = [int(i) for i in prompt]
        else:
            ids = text_to_ids(prompt if isinstance(prompt, str) else " ".join(map(str, prompt)), self.s.vocab)
        if not isinstance(body.get("max_tokens", 16), int) or isinstance(body.get("max_tokens"), bool):
            return web.json_response(openai_error("max_tokens must be an integer"), status=400)
        max_new = int(body.get("max_tokens", 16))
        bad = value_error(ids, max_new, self.s.engine())
        if bad is not None:
            return web.json_response(openai_error(bad), status=400)
        model = body.get("model") or self.s.launch.args.get("served_model_name") or self.s.launch.model_path
        cid = f"cmpl-{self.s.req_counter + 1:024x}"
        created = int(time.time())
        n_out = 0

        def usage() -> dict:
            return {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out}

        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            async with aclosing(self.s.generate(ids, max_new, bench=True, received=t_recv)) as gen:
                async for new, _vct, done in gen:
                    n_out += len(new)
                    c = {"id": cid, "object": "text_completion", "created": created, "model": model,
                         "choices": [{"index": 0, "text": ids_to_text(new), "logprobs": None,
                                      "finish_reason": "length" if done else None}]}
                    if done:
                        c["usage"] = usage()
                    await resp.write(f"data: {json.dumps(c)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        toks: list[int] = []
        async for new, _vct, _done in self.s.generate(ids, max_new, bench=True, received=t_recv):
            toks.extend(new)
            n_out = len(toks)
        return web.json_response({"id": cid, "object": "text_completion", "created": created, "model": model,
                                  "choices": [{"index": 0, "text": ids_to_text(toks), "logprobs": None,
                                               "finish_reason": "length"}], "usage": usage()})

    async def _value_error_response(self, request: web.Request, message: str, stream: bool) -> web.StreamResponse:
        """SGLang's answer to a request its tokenizer manager rejects (a ValueError): 400
        ``{"error": {"message"}}``, or, when streaming, 200 with one error event and ``[DONE]``
        (srt/entrypoints/http_server.py ``serve_generate_request``, ``_create_error_response``)."""
        if not stream:
            return web.json_response({"error": {"message": message}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
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
        info["internal_states"] = [{"avg_spec_accept_length": float(self.s.last_tau),
                                    "last_gen_throughput": float(self.s.last_rate)}]
        info["version"] = str(self.s.profile["emulator"]["sglang_version"])
        info["emulator"] = {"fingerprint": self.s.profile["emulator"]["fingerprint"],
                            "allreduce_path": self.s.pred.allreduce_path,
                            "max_total_num_tokens": self.s.pred.memory_gib.get("kv_tokens")}
        return web.json_response(info)

    async def h_model_info(self, request: web.Request) -> web.Response:
        """``/get_model_info``."""
        return web.json_response({"model_path": self.s.launch.model_path,
                                  "tokenizer_path": self.s.launch.args.get("tokenizer_path") or self.s.launch.model_path,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default", "has_image_understanding": False,
                                  "has_audio_understanding": False, "model_type": "kimi_k25",
                                  "architectures": [self.s.profile["model"]["emulator"].get("architecture")]})

    async def h_models(self, request: web.Request) -> web.Response:
        """OpenAI ``/v1/models``."""
        name = self.s.launch.args.get("served_model_name") or self.s.launch.model_path
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "sglang"}]})

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
