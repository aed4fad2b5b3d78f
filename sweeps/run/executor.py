"""Where trials run: submit / wait / result / cancel, and the retry policy.

:class:`RayExecutor` runs each trial as a Ray task on the cluster (``tasks.remote``);
:class:`InProcessExecutor` runs it inline in this process at submit time (the ``instant``
backend makes a 60-trial sweep take seconds). The sweep loop, the recheck and the winner
confirmation all submit through one of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tasks.quality import UNSTABLE
from tasks.types import TrialResult, TrialSpec
from tasks.workdir import is_workdir_failure

log = logging.getLogger("servesweep")


class Executor(Protocol):
    """Runs trial tasks. Handles are opaque and hashable.

    Attributes:
        slots: how many trials may be in flight at once.
    """

    slots: int

    def submit(self, spec: TrialSpec, profile: dict[str, Any] | None) -> Any:
        """Start ``run_trial(spec, profile, workdir)``; returns a handle."""

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        """The handles (at most one) that finished within ``timeout`` s."""

    def result(self, handle: Any) -> TrialResult:
        """A finished task's result; raises what the task (or its node) raised."""

    def cancel(self, handle: Any) -> None:
        """Ask a running task to stop (its server is torn down); never raises."""

    def fingerprint(self, backend: str, profile: dict[str, Any] | None) -> dict[str, str]:
        """The environment fingerprint of a node that runs trials (raises on failure)."""


def infra_result(e: BaseException) -> TrialResult:
    """The result of a task that raised (node died, worker crashed): ``infra_error``/``node_lost``."""
    msg = str(e).splitlines()[0][:300] if str(e) else ""
    return TrialResult(status="infra_error", failure_class="node_lost", failure_kind="infra",
                       failure_signature=f"{type(e).__name__}: {msg}", phase="unknown")


def collect(executor: Executor, handle: Any) -> TrialResult:
    """``executor.result(handle)``, an exception becoming :func:`infra_result`.

    Raises:
        RayUnavailable: the driver's own raylet died (``ray.exceptions.LocalRayletDiedError``):
            no task can run any more, so every later launch would fail at once as infra and
            spend the budget; the sweep stops (exit 1) and the next run recovers the trial.
    """
    try:
        return executor.result(handle)
    except Exception as e:  # noqa: BLE001 - Ray infra failure (node died, worker crashed)
        if _local_raylet_died(e):
            from sweeps.run.cluster import RayUnavailable

            raise RayUnavailable(
                "this driver's Ray node died (its raylet is gone: LocalRayletDiedError), so no trial can run; the "
                "sweep stopped. Trials recorded so far are kept and the running ones are recovered by the next run: "
                "start Ray again if it was external (ray start / ray.address) and run the same command.") from None
        return infra_result(e)


def _local_raylet_died(e: BaseException) -> bool:
    try:
        from ray.exceptions import LocalRayletDiedError
    except ImportError:  # an executor without Ray
        return False
    return isinstance(e, LocalRayletDiedError)


def retry_reason(res: TrialResult, attempt: int, retries_transient: int) -> str | None:
    """The retry policy: why attempt ``attempt`` (1-based) of a trial runs again, or None.

    Infrastructure failures run again on a fresh task up to ``retries_transient + 1``
    times (not the config's fault); transient failures ``retries_transient`` times.
    """
    if is_workdir_failure(res):  # the node cannot write its work dir: a retry fails the same way at once
        return None
    if res.status == "ok" and UNSTABLE in res.perf_tags and attempt == 1:
        return "unstable measurement (repeats disagree or a stream froze); re-measuring once"
    if res.status == "infra_error" and attempt <= retries_transient + 1:
        return f"infrastructure failure ({res.failure_class}); retrying on a fresh task"
    if res.status == "failed" and res.failure_kind == "transient" and attempt <= retries_transient:
        return f"transient failure ({res.failure_class}); retrying once"
    return None


class RayExecutor:
    """Trials as Ray tasks (``num_gpus`` = TP per task, see :mod:`tasks.remote`).

    Args:
        ray: the ``ray`` module (or a stand-in with ``wait``/``get``/``cancel``).
        trial_task / fp_task: Ray remote functions of ``run_trial`` / ``node_fingerprint``.
        workdir: node-side directory for trial files.  slots: trials in flight.
    """

    def __init__(self, ray: Any, trial_task: Any, fp_task: Any, workdir: str, slots: int):
        self.ray, self.trial_task, self.fp_task, self.workdir, self.slots = ray, trial_task, fp_task, workdir, slots

    @classmethod
    def start(cls, spec: Any) -> RayExecutor:
        """Start or join Ray for ``spec`` and size the slots from the cluster's GPUs.

        Raises:
            RayUnavailable: Ray cannot be reached.  SweepError: no trial fits (message says why).
        """
        import ray

        from sweeps.errors import SweepError
        from sweeps.run.cluster import explain_no_slots, start_ray, trial_slots
        from tasks.remote import fingerprint_task, trial_task

        start_ray(spec)
        slots, per_node = trial_slots(spec)  # packed node by node, pinning respected
        if slots < 1:
            raise SweepError(explain_no_slots(spec))
        log.info("Ray: %d trial slot(s) over %d node(s) %s", slots, sum(1 for v in per_node.values() if v), per_node)
        return cls(ray, trial_task(spec), fingerprint_task(spec), str(spec.store_dir / "work"),
                   spec.ray.max_in_flight or slots)

    def submit(self, spec: TrialSpec, profile: dict[str, Any] | None) -> Any:
        return self.trial_task.remote(spec, profile, self.workdir)

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        ready, _ = self.ray.wait(list(handles), num_returns=1, timeout=timeout)
        return list(ready)

    def result(self, handle: Any) -> TrialResult:
        return self.ray.get(handle)

    def cancel(self, handle: Any) -> None:
        try:
            self.ray.cancel(handle, force=False)
        except Exception:  # noqa: BLE001 - already finished or gone
            pass

    def fingerprint(self, backend: str, profile: dict[str, Any] | None) -> dict[str, str]:
        return self.ray.get(self.fp_task.remote(backend, profile), timeout=120)


@dataclass(eq=False)
class _Done:
    """A finished inline task: its result or the exception it raised."""

    value: TrialResult | None = None
    error: BaseException | None = None


class InProcessExecutor:
    """Trials run inline at submit time, one at a time (``slots`` = 1).

    Args:
        workdir: where trial files go (None: the task's default).
        hook: called with each task's args ``(TrialSpec, profile, workdir)`` before it
            runs; an exception it returns is raised from :meth:`result`, as a Ray task
            error would be (tests inject infrastructure failures with it).
    """

    slots = 1

    def __init__(self, workdir: str | None = None,
                 hook: Callable[[tuple], BaseException | None] | None = None):
        self.workdir, self.hook = workdir, hook

    def submit(self, spec: TrialSpec, profile: dict[str, Any] | None) -> _Done:
        from tasks.trial import run_trial

        args = (spec, profile, self.workdir)
        err = self.hook(args) if self.hook is not None else None
        if err is not None:
            return _Done(error=err)
        try:
            return _Done(value=run_trial(*args))
        except Exception as e:  # noqa: BLE001 - surfaces through result(), like a Ray task error
            return _Done(error=e)

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        return list(handles[:1])

    def result(self, handle: _Done) -> TrialResult:
        if handle.error is not None:
            raise handle.error
        assert handle.value is not None
        return handle.value

    def cancel(self, handle: Any) -> None:
        return None

    def fingerprint(self, backend: str, profile: dict[str, Any] | None) -> dict[str, str]:
        from tasks.trial import node_fingerprint

        return node_fingerprint(backend, profile)
