"""Trials in flight: submit through an executor, wait, collect, retry per the policy.

A :class:`Runner` owns one :class:`~sweeps.run.executor.Executor` and the launches running on
it. It knows nothing about what a launch is for: the caller hands it a spec, the key of the
launch's profile (its noise seed, :func:`sweeps.run.preflight.launch_profile`) and an item
of its own (the sweep loop's :class:`InFlight`, a confirmation's config index), and gets the
item back with the result. The sweep loop, the recheck and the winner confirmation all
launch through a runner; the retry policy (:func:`sweeps.run.executor.retry_reason`) is the
runner's, so every launch -- full, probe or confirmation -- is retried the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import optuna

from sweeps.run.executor import Executor, collect, retry_reason
from sweeps.run.preflight import launch_profile
from tasks.types import TrialResult, TrialSpec

log = logging.getLogger("servesweep")

#: what a runner's caller keeps per launch (returned with the launch's result)
T = TypeVar("T")


@dataclass
class InFlight:
    """A submitted trial of the sweep loop: its Optuna trial, config, rendered spec and attempt (1-based)."""

    trial: optuna.trial.Trial
    params: dict[str, Any]
    spec: TrialSpec
    attempt: int
    t_submit: float = field(default_factory=time.monotonic)


class Runner(Generic[T]):
    """The launches in flight on one executor, each with the caller's item.

    Args:
        executor: where trials run (Ray tasks or inline).
        profile: the emulator profile (None for a real engine); each launch gets its own
            copy with a noise seed derived from its key (:func:`~sweeps.run.preflight.launch_profile`).
        retries_transient: ``backend.retries_transient`` (see :meth:`retry_reason`).

    Attributes:
        inflight: executor handle -> the caller's item, for every launch not yet taken.
    """

    def __init__(self, executor: Executor, profile: dict[str, Any] | None, retries_transient: int):
        self.executor = executor
        self.profile = profile
        self.retries_transient = retries_transient
        self.inflight: dict[Hashable, T] = {}

    @property
    def slots(self) -> int:
        """Launches the executor runs at once."""
        return self.executor.slots

    def has_room(self) -> bool:
        """True while fewer than :attr:`slots` launches are in flight."""
        return len(self.inflight) < self.slots

    def submit(self, spec: TrialSpec, profile_key: str, item: T) -> Hashable:
        """Start ``spec`` with the profile of ``profile_key``; ``item`` comes back from :meth:`take`."""
        handle: Hashable = self.executor.submit(spec, launch_profile(self.profile, profile_key))
        self.inflight[handle] = item
        return handle

    def wait(self, timeout: float) -> list[Hashable]:
        """Handles (at most one) that finished within ``timeout`` s; [] when nothing is in flight."""
        if not self.inflight:
            return []
        return self.executor.wait(list(self.inflight), timeout=timeout)

    def take(self, handle: Hashable) -> tuple[T, TrialResult]:
        """A finished launch's item and result (an exception of the task becomes ``infra_error``).

        Raises:
            KeyError: ``handle`` is not in flight here.
        """
        item = self.inflight.pop(handle)
        return item, collect(self.executor, handle)

    def retry_reason(self, res: TrialResult, attempt: int) -> str | None:
        """Why attempt ``attempt`` (1-based) runs again (:func:`~sweeps.run.executor.retry_reason`), or None."""
        return retry_reason(res, attempt, self.retries_transient)

    def cancel_all(self, grace_s: float = 0.0) -> int:
        """Ask every launch in flight to stop (their servers are torn down); they stay in
        :attr:`inflight` until taken or dropped. Returns how many were asked.

        Args:
            grace_s: first wait up to this long (s) for launches that are finishing anyway, and
                do not cancel those. A cancel that crosses a task's own completion crashes the
                Ray driver ("Check failed: it != submissible_tasks_.end()", a race in Ray's
                NormalTaskSubmitter, ray-project/ray#54798), which turns a clean stop's exit
                code into 1; a launch failing with the same cause as the driver (a full disk
                under both) finishes within this grace.
        """
        pending = list(self.inflight)
        deadline = time.monotonic() + grace_s
        while pending and (left := deadline - time.monotonic()) > 0:
            for handle in self.executor.wait(pending, timeout=left):
                pending.remove(handle)
        for handle in pending:
            try:
                self.executor.cancel(handle)
            except Exception as e:  # noqa: BLE001 - stopping anyway
                log.warning("could not cancel a trial task: %s", e)
        return len(pending)

    def drop_all(self) -> list[T]:
        """Forget every launch in flight without collecting it; returns their items."""
        items = list(self.inflight.values())
        self.inflight.clear()
        return items

    def drain(self, deadline: float) -> Iterator[tuple[T, TrialResult | None]]:
        """After :meth:`cancel_all`: each launch's item with its result as it finishes, until
        ``deadline`` (``time.monotonic()`` s); then the rest with None (never heard back)."""
        while self.inflight and time.monotonic() < deadline:
            for handle in self.executor.wait(list(self.inflight), timeout=1.0):
                yield self.take(handle)
        for handle in list(self.inflight):
            yield self.inflight.pop(handle), None
