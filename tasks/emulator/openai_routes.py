"""The emulated server's OpenAI routes, as SGLang 0.5.23 serves them.

``/v1/completions`` (srt/entrypoints/openai/serving_completions.py) and ``/v1/chat/completions``
(serving_chat.py, the prompt rendered with the tokenizer's chat template):

* ``prompt`` a string, a list of strings, a list of ids or a list of id lists; ``n`` choices
  per prompt (choice ``index`` = prompt × n + sample); ``stop`` strings (the text is cut before
  the match, ``finish_reason: "stop"``, ``matched_stop``); ``max_tokens`` (completions default
  16, chat 128 as SGLang's sampling default; 0 = prefill only); ``echo`` (completions: the
  prompt text before the output);
* ``logprobs`` (completions: an int; chat: ``logprobs: true`` + ``top_logprobs``): the emulator
  has no model, so every value is the placeholder 0.0, and the response says so in
  ``sglext.emulator_placeholder_logprobs: true``;
* streaming: one chunk per scheduler step per choice (chat: a first ``delta.role`` chunk per
  choice), a final chunk per choice with its ``finish_reason``; the usage comes in one more
  chunk with ``choices: []``, sent only when ``stream_options.include_usage`` is true (with
  ``continuous_usage_stats`` every chunk carries a running usage too), then ``[DONE]``;
* usage counts each prompt once (not once per choice), as SGLang's ``UsageProcessor``;
* errors: 400 ``ErrorResponse`` ``{"object": "error", "message", "type": "BadRequestError",
  "param", "code"}`` (serving_base.py ``create_error_response``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web

from tasks.emulator.generation import BadRequest, Sub, stop_list
from tasks.emulator.request_checks import openai_error

#: OpenAI's / SGLang's ``CompletionRequest.max_tokens`` default (protocol.py)
COMPLETIONS_MAX_TOKENS = 16
#: SGLang's sampling default when a chat request gives no max_tokens
CHAT_MAX_TOKENS = 128
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                  "repetition_penalty", "min_tokens")


def _bad(message: str) -> web.Response:
    return web.json_response(openai_error(message), status=400)


def _int_field(body: dict, key: str, default: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadRequest(f"{key} must be an integer, got {v!r}")
    return v


def _sampling(body: dict) -> dict:
    """The request's sampling fields in SGLang's names, type-checked as its pydantic model does."""
    sp = {}
    for k in _SAMPLING_KEYS:
        v = body.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadRequest(f"{k} must be a number, got {v!r}")
        sp["min_new_tokens" if k == "min_tokens" else k] = v
    return sp


class OpenAIRoutes:
    """``/v1/completions`` and ``/v1/chat/completions`` over a ``tasks.emulator.http_api.HttpApi``
    (its server, tokenizer, checks and generation; not imported: that module imports this one)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def _usage(self, subs: list[Sub], n: int) -> dict:
        prompt = sum(len(s.ids) for i, s in enumerate(subs) if i % n == 0)
        completion = sum(len(s.out) for s in subs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}

    async def _subs(self, prompts: list[list[int]], texts: list[str | None], n: int, max_new: int, stop: list[str],
                    sp: dict) -> list[Sub]:
        subs = []
        for p, t in zip(prompts, texts):
            for j in range(n):
                sub = Sub(p, max_new, stop, j, t)
                self.api.check_sub(sub, sp)
                subs.append(sub)
        return subs

    async def _run_to_end(self, subs: list[Sub], t_recv: float) -> None:
        """Generate every choice to its end (the non-streaming answer reads ``sub.text``/``sub.out``)."""
        async with aclosing(self.api.run_all(subs, t_recv)) as gen:
            async for _ in gen:
                pass

    async def _stream(self, request: web.Request, body: dict, subs: list[Sub], n: int, t_recv: float,
                      step: Callable[[int, Sub, str, list[int], bool], list[dict]],
                      envelope: Callable[[list[dict], dict | None], dict]) -> web.StreamResponse:
        """The SSE answer both routes share: per scheduler step of choice ``i``, ``step(i, sub, delta,
        new_ids, first)`` gives the choice objects to send (chat: a role chunk first), each wrapped by
        ``envelope(choices, usage)``; the running usage rides on the step's last chunk with
        ``stream_options.continuous_usage_stats``; with ``include_usage`` one more chunk with
        ``choices: []`` carries the total; then ``[DONE]``."""
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = include_usage and bool(opts.get("continuous_usage_stats"))
        resp = await self.api.sse(request)
        seen: set[int] = set()
        n_ids = [0] * len(subs)

        async def send(chunk: dict) -> None:
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        async with aclosing(self.api.run_all(subs, t_recv)) as gen:
            async for i, delta in gen:
                sub = subs[i]
                first = i not in seen
                seen.add(i)
                new_ids, n_ids[i] = sub.out[n_ids[i]:], len(sub.out)
                choices = step(i, sub, delta, new_ids, first)
                for k, choice in enumerate(choices):
                    last = k == len(choices) - 1
                    await send(envelope([choice], self._usage(subs, n) if continuous and last else None))
        if include_usage:
            await send(envelope([], self._usage(subs, n)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _parse_common(self, request: web.Request) -> tuple[dict, float] | web.Response:
        t_recv = time.monotonic()
        early = self.api.not_ready()
        if early is not None:
            return early
        body = await self.api.json_body(request)
        if not isinstance(body, dict):
            return web.json_response(openai_error("Input should be an object", err_type="Bad Request"), status=400)
        return body, t_recv

    # ---------------------------------------------------------------- completions
    async def _completion_prompts(self, prompt: Any) -> tuple[list[list[int]], list[str | None]]:
        if isinstance(prompt, str):
            return [await self.api.encode(prompt)], [prompt]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) for p in prompt):
                return [await self.api.encode(p) for p in prompt], list(prompt)
            if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
                return [list(prompt)], [None]
            if all(isinstance(p, list) and all(isinstance(x, int) for x in p) for p in prompt):
                return [list(p) for p in prompt], [None] * len(prompt)
        raise BadRequest("prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")

    def _completion_logprobs(self, sub: Sub, new_ids: list[int], top: int, offset: int) -> dict:
        tok = self.api.s.tok
        toks = [tok.decode([i]) for i in new_ids]
        offs, o = [], offset
        for t in toks:
            offs.append(o)
            o += len(t)
        return {"text_offset": offs, "token_logprobs": [0.0] * len(toks), "tokens": toks,
                "top_logprobs": [{t: 0.0} for t in toks] if top > 0 else None}

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI ``/v1/completions`` (see the module docstring)."""
        parsed = await self._parse_common(request)
        if isinstance(parsed, web.Response):
            return parsed
        body, t_recv = parsed
        try:
            max_new = _int_field(body, "max_tokens", COMPLETIONS_MAX_TOKENS)
            n = _int_field(body, "n", 1)
            logprobs = _int_field(body, "logprobs", None)
            if n < 1:
                raise BadRequest(f"n must be at least 1, got {n}.")
            sp = _sampling(body)
            prompts, texts = await self._completion_prompts(body.get("prompt"))
            subs = await self._subs(prompts, texts, n, max_new, stop_list(body.get("stop")), sp)
        except BadRequest as e:
            return _bad(str(e))
        echo = bool(body.get("echo"))
        model = body.get("model") or self.api.model_name
        cid = f"cmpl-{self.api.s.req_counter + 1:024x}"
        created = int(time.time())
        tok = self.api.s.tok

        def echo_text(sub: Sub) -> str:
            return sub.prompt_text if sub.prompt_text is not None else tok.decode(sub.ids)

        ext = {"sglext": {"emulator_placeholder_logprobs": True}} if logprobs is not None else {}
        if body.get("stream"):
            def step(i: int, sub: Sub, delta: str, new_ids: list[int], first: bool) -> list[dict]:
                if first and echo:
                    delta = echo_text(sub) + delta
                lp = (self._completion_logprobs(sub, new_ids, logprobs, len(sub.text) - len(delta))
                      if logprobs is not None else None)
                return [{"index": i, "text": delta, "logprobs": lp,
                         "finish_reason": sub.finish["type"] if sub.finish else None,
                         "matched_stop": (sub.finish or {}).get("matched")}]

            def envelope(choices: list[dict], usage: dict | None) -> dict:
                # the usage-only chunk has no choices, so no placeholder-logprobs block
                return {"id": cid, "object": "text_completion", "created": created, "model": model,
                        "choices": choices, "usage": usage, **(ext if choices else {})}

            return await self._stream(request, body, subs, n, t_recv, step, envelope)
        await self._run_to_end(subs, t_recv)
        choices = [{"index": i, "text": (echo_text(s) if echo else "") + s.text,
                    "logprobs": self._completion_logprobs(s, s.out, logprobs, 0) if logprobs is not None else None,
                    "finish_reason": s.finish["type"] if s.finish else None,
                    "matched_stop": (s.finish or {}).get("matched")} for i, s in enumerate(subs)]
        return web.json_response({"id": cid, "object": "text_completion", "created": created, "model": model,
                                  "choices": choices, "usage": self._usage(subs, n), **ext})

    # ---------------------------------------------------------------- chat
    def _chat_logprobs(self, new_ids: list[int], top: int) -> dict:
        tok = self.api.s.tok
        content = []
        for i in new_ids:
            t = tok.decode([i])
            alts = [{"token": t, "logprob": 0.0, "bytes": list(t.encode())}] if top > 0 else []
            content.append({"token": t, "logprob": 0.0, "bytes": list(t.encode()), "top_logprobs": alts})
        return {"content": content}

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        """OpenAI ``/v1/chat/completions`` (see the module docstring)."""
        parsed = await self._parse_common(request)
        if isinstance(parsed, web.Response):
            return parsed
        body, t_recv = parsed
        tok = self.api.s.tok
        try:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise BadRequest("messages must be a non-empty list of message objects")
            mx = body.get("max_completion_tokens")
            max_new = _int_field(body, "max_completion_tokens" if mx is not None else "max_tokens", CHAT_MAX_TOKENS)
            n = _int_field(body, "n", 1)
            if n < 1:
                raise BadRequest(f"n must be at least 1, got {n}.")
            want_lp = bool(body.get("logprobs"))
            top = _int_field(body, "top_logprobs", 0) or 0
            sp = _sampling(body)
            try:
                prompt = tok.chat_prompt(messages, add_generation_prompt=True)
            except Exception as e:  # noqa: BLE001 - jinja2's errors: the message is the answer
                raise BadRequest(f"The chat template could not render the messages: {e}") from None
            subs = await self._subs([await self.api.encode(prompt)], [prompt], n, max_new,
                                    stop_list(body.get("stop")), sp)
        except BadRequest as e:
            return _bad(str(e))
        model = body.get("model") or self.api.model_name
        cid = f"chatcmpl-{self.api.s.req_counter + 1:024x}"
        created = int(time.time())
        ext = {"sglext": {"emulator_placeholder_logprobs": True}} if want_lp else {}

        def step(i: int, sub: Sub, delta: str, new_ids: list[int], first: bool) -> list[dict]:
            role = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}] if first else []
            return role + [{"index": i, "delta": {"content": delta},
                            "logprobs": self._chat_logprobs(new_ids, top) if want_lp else None,
                            "finish_reason": sub.finish["type"] if sub.finish else None,
                            "matched_stop": (sub.finish or {}).get("matched")}]

        def envelope(choices: list[dict], usage: dict | None) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": choices, "usage": usage, **ext}

        if body.get("stream"):
            return await self._stream(request, body, subs, n, t_recv, step, envelope)
        await self._run_to_end(subs, t_recv)
        choices = [{"index": i, "message": {"role": "assistant", "content": s.text, "reasoning_content": None,
                                            "tool_calls": None},
                    "logprobs": self._chat_logprobs(s.out, top) if want_lp else None,
                    "finish_reason": s.finish["type"] if s.finish else None,
                    "matched_stop": (s.finish or {}).get("matched")} for i, s in enumerate(subs)]
        return web.json_response({"id": cid, "object": "chat.completion", "created": created, "model": model,
                                  "choices": choices, "usage": self._usage(subs, n), **ext})
