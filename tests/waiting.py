"""Waiting in tests without hand-rolled sleep loops.

``wait_for`` polls until a condition holds (or fails naming it); ``holds_for`` checks that
a condition stays true for a while, the honest way to make a negative assertion about
something asynchronous (a process that must not appear, a file that must not be written).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.1, what: str | Callable[[], str] = "") -> T:
    """Poll ``predicate`` every ``interval`` s until it returns a truthy value; return it.

    Raises:
        AssertionError: still falsy after ``timeout`` s (the message names ``what``; a
            callable ``what`` is evaluated then, e.g. to show a log tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            msg = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {msg or predicate!r}")
        time.sleep(interval)


def holds_for(predicate: Callable[[], object], duration: float, interval: float = 0.05, what: str = "") -> None:
    """Assert ``predicate`` stays truthy for ``duration`` s, checked every ``interval`` s.

    Raises:
        AssertionError: the predicate was falsy at some check.
    """
    deadline = time.monotonic() + duration
    while True:
        assert predicate(), f"condition broke: {what or predicate!r}"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)
