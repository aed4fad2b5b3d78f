"""Request validation of the emulated server, with SGLang 0.5.23's own messages.

Two layers, as in SGLang:

* :func:`contract_error`: the JSON schema gate of ``/generate``
  (srt/entrypoints/api_contract.py ``generate_contract_error`` -> 400 ``{"error": "<text>"}``
  before anything runs), here the type checks the emulator reads: ``input_ids`` a list of
  ints (or of lists), ``sampling_params`` an object, ``max_new_tokens`` an integer. The texts
  follow the schema decoder's (``invalid type: string "x", expected i64``).
* :func:`value_error`: the tokenizer manager's ValueErrors (400 ``{"error": {"message"}}``;
  when streaming, one error event): ``max_new_tokens must be at least 0, got N.``
  (srt/sampling/sampling_params.py ``verify``), ``input_ids cannot be empty.``
  (srt/managers/io_struct.py ``normalize_batch_and_parse``), ``The input (N tokens) is longer
  than the model's context length (M tokens).`` (srt/managers/tokenizer_manager.py
  ``_validate_one_request``), and a request whose prompt + output can never fit the KV pool.
"""

from __future__ import annotations

import json
from typing import Any


def _type_name(v: Any) -> str:
    if isinstance(v, str):
        return f"string {json.dumps(v)}"
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, dict):
        return "map"
    if isinstance(v, list):
        return "sequence"
    return "null" if v is None else type(v).__name__


def contract_error(body: dict) -> str | None:
    """The schema violation of a ``/generate`` body the emulator would misread, or None."""
    ids = body.get("input_ids")
    if ids is not None:
        flat = ids[0] if isinstance(ids, list) and ids and isinstance(ids[0], list) else ids
        if not isinstance(flat, list):
            return f"invalid type: {_type_name(ids)}, expected a value or an array of values for TokenIdsOrList"
        for x in flat:
            if not isinstance(x, int) or isinstance(x, bool):
                return f"invalid type: {_type_name(x)}, expected u32"
    sp = body.get("sampling_params")
    if sp is not None and not isinstance(sp, dict):
        return f"invalid type: {_type_name(sp)}, expected struct SamplingParams"
    mnt = (sp or {}).get("max_new_tokens")
    if mnt is not None and (not isinstance(mnt, int) or isinstance(mnt, bool)):
        return f"invalid type: {_type_name(mnt)}, expected i64"
    return None


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


def openai_error(message: str, code: int = 400) -> dict:
    """The OpenAI-compatible routes' error body (srt/entrypoints/openai/protocol.py ``ErrorResponse``)."""
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": code}
