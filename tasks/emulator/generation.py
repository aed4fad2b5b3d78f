"""One generation of a request (a prompt × one of its ``n`` samples) as the HTTP routes track
it, and the request errors they share (``tasks.emulator.http_api``, ``tasks.emulator.openai_routes``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class BadRequest(ValueError):
    """A request SGLang refuses with a ValueError (400; the message is SGLang's)."""


@dataclass
class Sub:
    """One generation of a request (one prompt × one of its ``n`` samples) and its output so far.

    Attributes:
        ids: prompt token ids. max_new: ``max_new_tokens`` (0 = prefill only, no output token).
        stop: stop strings (the output is cut before the first match, as SGLang's ``no_stop_trim=False``).
        sample: index among the prompt's ``n`` samples (changes the output tokens).
        out / text: output token ids and their text; finish: SGLang's ``finish_reason`` once done.
    """

    ids: list[int]
    max_new: int
    stop: list[str] = field(default_factory=list)
    sample: int = 0
    prompt_text: str | None = None
    out: list[int] = field(default_factory=list)
    text: str = ""
    finish: dict | None = None
    vct: int = 0
    t_first: float | None = None


def stop_list(v: Any) -> list[str]:
    """``stop`` (None, a string or a list of strings) -> list of non-empty strings."""
    if v is None:
        return []
    return [s for s in ([v] if isinstance(v, str) else list(v)) if s]


def find_stop(text: str, stops: list[str], start: int) -> tuple[int, str] | None:
    """The first (position, stop string) in ``text`` at or after ``start``, or None."""
    hits = [(i, s) for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None
