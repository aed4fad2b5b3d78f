"""Readiness = health green AND one real generation served.

A server's health endpoint can answer 200 before the server can generate (a scheduler
still warming up, a first request that compiles kernels, a front end that returns one
503 right after startup). The lifecycle therefore sends one tiny real generation after
health is green, retrying HTTP 5xx and connection errors with exponential backoff until
the startup deadline; the time it takes is the trial's ``warmup_s`` (not hidden in
``bench_s``). A 4xx answer means the server is up and parsing requests (the probe request
itself may not suit a given engine version): ready, and the benchmark's own requests
surface any real rejection with its message.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

#: a generation request ``(path, JSON body)`` (a backend's ``Backend.ready_request``), or None
Request = tuple[str, Mapping[str, Any]] | None


class NotServing(RuntimeError):
    """The server never served a generation within the deadline (last status or error in the message)."""


def _transient(e: BaseException) -> bool:
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code >= 500
    return isinstance(e, httpx.TransportError)


def first_generation(base_url: str, engine: Request, deadline_s: float, request_timeout_s: float = 30.0) -> float:
    """Serve one real 1-token generation, retrying 5xx / connection errors with backoff
    (0.1 s doubling to 2 s) until ``deadline_s`` seconds have passed.

    Args:
        engine: the backend's ``ready_request``: ``(path, body)`` of a 1-token greedy generation
            (e.g. SGLang's native ``/generate``, vLLM's ``/v1/completions``); None: ready once
            healthy (returns 0.0).
    Returns:
        the seconds it took (the trial's ``warmup_s``).
    Raises:
        NotServing: still failing (5xx, connection errors) at the deadline.
    """
    if engine is None:
        return 0.0
    path, body = engine
    t0 = time.monotonic()
    with httpx.Client() as client:
        def once() -> None:
            left = max(0.5, deadline_s - (time.monotonic() - t0))
            r = client.post(base_url + path, json=body, timeout=min(request_timeout_s, left))
            r.raise_for_status()

        try:
            for attempt in Retrying(retry=retry_if_exception(_transient), stop=stop_after_delay(max(0.0, deadline_s)),
                                    wait=wait_exponential(multiplier=0.1, max=2.0), reraise=True):
                with attempt:
                    once()
        except httpx.HTTPStatusError as e:
            if e.response.status_code < 500:
                return time.monotonic() - t0
            raise NotServing(f"health was green but {path} answered HTTP {e.response.status_code} "
                             f"({e.response.text[:200]}) for {time.monotonic() - t0:.1f} s") from None
        except httpx.TransportError as e:
            raise NotServing(f"health was green but {path} failed ({type(e).__name__}: {e}) "
                             f"for {time.monotonic() - t0:.1f} s") from None
    return time.monotonic() - t0


def is_http_5xx(e: BaseException) -> bool:
    """True for a benchmark error that is a server-side HTTP error (``HTTP 5xx`` in its message)."""
    return getattr(e, "kind", None) == "http" and re.search(r"\bHTTP 5\d\d\b", str(e)) is not None


def ensure_serving(base_url: str, engine: Request, deadline_s: float) -> float:
    """:func:`first_generation` for the lifecycle: the warm-up seconds, or a startup failure.

    Raises:
        tasks.server.LifecycleError: ``startup_timeout`` (phase ``startup``) when no generation
            was served within ``deadline_s``.
    """
    from tasks.server import LifecycleError

    try:
        return first_generation(base_url, engine, deadline_s)
    except NotServing as e:
        raise LifecycleError(str(e), "startup", "startup_timeout") from None
