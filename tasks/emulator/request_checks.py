"""Request validation of the emulated server, with SGLang 0.5.23's own messages.

Two layers, as in SGLang:

* :func:`contract_error`: the JSON schema gate of ``/generate``
  (srt/entrypoints/api_contract.py ``generate_contract_error`` -> 400 ``{"error": "<text>"}``
  before anything runs), here the type checks of the fields the emulator reads, with the
  schema decoder's texts (``invalid type: string "x", expected i64``).
* :func:`sampling_value_error`, :data:`NO_PROMPT` and :func:`value_error`: the tokenizer
  manager's ValueErrors (400 ``{"error": {"message"}}``; when streaming, one error event):
  ``Either text, input_ids or input_embeds should be provided.``, the range checks of
  ``SamplingParams.verify`` (srt/sampling/sampling_params.py: ``temperature``, ``top_p``,
  ``max_new_tokens must be at least 0, got N.``, ...), ``input_ids cannot be empty.``
  (srt/managers/io_struct.py ``normalize_batch_and_parse``), ``The input (N tokens) is longer
  than the model's context length (M tokens).`` (srt/managers/tokenizer_manager.py
  ``_validate_one_request``), and a request whose prompt + output can never fit the KV pool.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _type_name(v: Any) -> str:
    """The schema decoder's name of a JSON value (``string "x"``, ``integer `3```, ...)."""
    if isinstance(v, str):
        return f"string {json.dumps(v)}"
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, dict):
        return "map"
    if isinstance(v, list):
        return "sequence"
    return "null" if v is None else type(v).__name__


#: ``SamplingParams`` fields of SGLang 0.5.23's schema (sglang/api/v1/api_types.py), by JSON type.
_F64 = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_I64 = ("max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval", "sampling_seed", "beam_width")
_BOOL = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_STR = ("json_schema", "regex", "ebnf", "structural_tag")
#: every field, in the schema's order (the order its ``unknown field`` message lists them)
SAMPLING_FIELDS = ("max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                   "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
                   "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                   "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
                   "custom_params", "beam_width", "watermark", "choice")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _string_or_list(v: Any) -> str | None:
    if isinstance(v, str) or v is None:
        return None
    if not isinstance(v, list):
        return f"invalid type: {_type_name(v)}, expected a value or an array of values for StringOrList"
    for x in v:
        if not isinstance(x, str):
            return f"invalid type: {_type_name(x)}, expected a string"
    return None


def _sampling_error(sp: Any) -> str | None:
    if not isinstance(sp, dict):
        return f"invalid type: {_type_name(sp)}, expected struct SamplingParams"
    for k, v in sp.items():
        if k not in SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
            return f"unknown field `{k}`, expected one of {listed}"
        if v is None:
            continue
        if k in _F64 and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"invalid type: {_type_name(v)}, expected f64"
        if k in _I64 and not _is_int(v):
            return f"invalid type: {_type_name(v)}, expected i64"
        if k in _BOOL and not isinstance(v, bool):
            return f"invalid type: {_type_name(v)}, expected a boolean"
        if k in _STR and not isinstance(v, str):
            return f"invalid type: {_type_name(v)}, expected a string"
        if k in ("stop", "stop_regex"):
            bad = _string_or_list(v)
            if bad:
                return bad
        if k == "logit_bias" and not isinstance(v, dict):
            return f"invalid type: {_type_name(v)}, expected a map"
    return None


def contract_error(body: dict) -> str | None:
    """The schema violation of a ``/generate`` body, or None: the checks of SGLang 0.5.23's
    generated decoder (``GenerateRequest.from_json_value``) on the fields the emulator reads
    (``text``, ``input_ids``, ``sampling_params`` and its fields, ``stream``, ``rid``), with its
    texts (``invalid type: string "x", expected i64``; ``unknown field `foo`, expected one of ...``).
    tests/test_contract_clients.py compares these texts with SGLang's own decoder."""
    if "text" in body:
        bad = _string_or_list(body["text"])
        if bad:
            return bad
    ids = body.get("input_ids")
    if ids is not None:
        if not isinstance(ids, list):
            return f"invalid type: {_type_name(ids)}, expected a value or an array of values for TokenIdsOrList"
        nested = bool(ids) and isinstance(ids[0], list)
        for row in ids if nested else [ids]:
            if not isinstance(row, list):
                return f"invalid type: {_type_name(row)}, expected a sequence"
            for x in row:
                if not _is_int(x):
                    return f"invalid type: {_type_name(x)}, expected i64"
    sp = body.get("sampling_params")
    if sp is not None:
        if not isinstance(sp, (dict, list)):
            return f"invalid type: {_type_name(sp)}, expected a value or an array of values for SamplingParamsOrList"
        for one in sp if isinstance(sp, list) else [sp]:
            bad = _sampling_error(one)
            if bad:
                return bad
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        return f"invalid type: {_type_name(body['stream'])}, expected a boolean"
    if "rid" in body:
        return _string_or_list(body["rid"])
    return None


def sampling_value_error(sp: dict) -> str | None:
    """SGLang's ``SamplingParams.verify`` message for a well-typed but out-of-range value, or
    None (srt/sampling/sampling_params.py; defaults as its dataclass: temperature 1, top_p 1,
    top_k -1 = all, min_p 0, penalties 0 / 0 / 1, min_new_tokens 0)."""
    def get(k: str, default: Any) -> Any:
        v = sp.get(k)
        return default if v is None else v

    t, top_p, min_p, top_k = get("temperature", 1.0), get("top_p", 1.0), get("min_p", 0.0), get("top_k", -1)
    if not math.isfinite(t) or t < 0.0:
        return f"temperature must be a non-negative finite number, got {t}."
    if not 0.0 < top_p <= 1.0:
        return f"top_p must be in (0, 1], got {top_p}."
    if not 0.0 <= min_p <= 1.0:
        return f"min_p must be in [0, 1], got {min_p}."
    if top_k != -1 and top_k < 1:
        return f"top_k must be -1 (disable) or at least 1, got {top_k}."
    for k in ("frequency_penalty", "presence_penalty"):
        if not -2.0 <= get(k, 0.0) <= 2.0:
            return f"{k} must be in [-2, 2], got {get(k, 0.0)}."
    rp = get("repetition_penalty", 1.0)
    if not 0.0 < rp <= 2.0:
        return f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {rp}."
    mx, mn = sp.get("max_new_tokens"), get("min_new_tokens", 0)
    if mn < 0:
        return f"min_new_tokens must be in [0, max_new_tokens], got {mn}."
    if mx is not None:
        if mx < 0:
            return f"max_new_tokens must be at least 0, got {mx}."
        if not mn <= mx:
            return f"min_new_tokens must be in [0, max_new_tokens({mx})], got {mn}."
    return None


#: io_struct.py ``GenerateReqInput._validate_inputs``
NO_PROMPT = "Either text, input_ids or input_embeds should be provided."


def value_error(ids: list[int], max_new: int, engine: Any) -> str | None:
    """SGLang's ValueError message for a well-typed request it refuses, or None.

    Args:
        ids: prompt token ids.
        max_new: ``max_new_tokens`` (or ``max_tokens``).
        engine: the server's :class:`tasks.emulator.engine.ServingEngine` (context length, KV pool).
    """
    if max_new < 0:
        return f"max_new_tokens must be at least 0, got {max_new}."
    if not ids:
        return "input_ids cannot be empty."
    if len(ids) >= engine.context_len:
        return f"The input ({len(ids)} tokens) is longer than the model's context length ({engine.context_len} tokens)."
    cap = engine.config.max_total_tokens
    if len(ids) + max(1, max_new) > cap:
        return (f"Requested token count ({len(ids)} input + {max_new} new) exceeds the KV cache pool "
                f"({cap} tokens): the request can never be scheduled.")
    return None


def openai_error(message: str, code: int = 400, err_type: str = "BadRequestError") -> dict:
    """SGLang's ``ErrorResponse`` body (srt/entrypoints/openai/protocol.py): the OpenAI routes'
    errors (serving_base.py ``create_error_response``: type ``BadRequestError``) and a body that
    fails to parse (http_server.py's RequestValidationError handler: type ``Bad Request``)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}
