"""The driver's loop without Ray: trials run in this process, one at a time.

:class:`InProcessDriver` is :class:`sweeps.driver.Driver` with Ray replaced by an inline
executor: ``_trial_task.remote(...)`` runs :func:`tasks.trial.run_trial` at once and
``ray.wait``/``ray.get`` hand back its result. Everything else is the driver's own code:
seeds, constraint skips, failure rules, duplicate answering, degraded-level skips,
transient/infra retries, constraint-aware TPE, budget and circuit breaker. With the
``instant`` backend a 60-trial sweep takes seconds, so the benchmark
(``benchmarks/sweep_efficiency.py``) and the sampler-learning test use it to measure the
driver's strategy itself. The real sweep with one trial in flight (8 GPUs / TP=8) submits
in the same order, so the sequence of asks and tells is the same.

MLflow and the findings document are off by default (``track=False``, ``findings=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweeps.config import SweepSpec
from sweeps.driver import Driver

__all__ = ["InProcessDriver", "run_in_process"]


@dataclass(eq=False)
class _Ref:
    """A finished inline 'task': its result or the exception it raised."""

    value: Any = None
    error: BaseException | None = None


class _InlineTask:
    """Stands in for a Ray remote function: ``.remote(*args)`` runs ``fn`` now."""

    def __init__(self, fn: Callable[..., Any], hook: Callable[[tuple], BaseException | None] | None = None):
        self.fn = fn
        self.hook = hook

    def remote(self, *args: Any) -> _Ref:
        if self.hook is not None:
            err = self.hook(args)
            if err is not None:
                return _Ref(error=err)
        try:
            return _Ref(value=self.fn(*args))
        except Exception as e:  # noqa: BLE001 - surfaces through get(), like a Ray task error
            return _Ref(error=e)


class _InlineRay:
    """The three Ray calls the driver makes, for already-finished :class:`_Ref` objects."""

    @staticmethod
    def wait(refs: list[_Ref], num_returns: int = 1, timeout: float | None = None) -> tuple[list[_Ref], list[_Ref]]:
        return list(refs[:num_returns]), list(refs[num_returns:])

    @staticmethod
    def get(ref: _Ref, timeout: float | None = None) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value

    @staticmethod
    def cancel(ref: _Ref, force: bool = False) -> None:
        return None


class InProcessDriver(Driver):
    """:class:`~sweeps.driver.Driver` running trials inline (no Ray), one at a time.

    Args:
        spec: validated sweep spec (``backend.kind`` ``instant`` is the useful one;
            ``emulated`` works too, launching real server processes).
        study_name: Optuna study name (default ``spec.study``).
        track: log to MLflow like the real driver (default off: the benchmark does not need it).
        findings: update the findings document after every trial (default off).
        task_hook: called with each trial task's args ``(TrialSpec, profile, workdir)``
            before it runs; an exception it returns is raised from ``ray.get`` as a Ray
            task error would be (tests inject infrastructure failures with it).
    """

    def __init__(self, spec: SweepSpec, study_name: str | None = None, *, track: bool = False,
                 findings: bool = False, task_hook: Callable[[tuple], BaseException | None] | None = None):
        super().__init__(spec, study_name)
        self._track = track
        self._findings = findings
        self._task_hook = task_hook
        self.progress.event = lambda line: None  # type: ignore[method-assign]  # quiet
        self.progress.refresh = lambda *a, **k: None  # type: ignore[method-assign]

    def _open_tracker(self) -> None:
        if self._track:
            super()._open_tracker()
        else:
            self.tracker = None

    def _start_ray(self) -> None:
        from tasks.trial import node_fingerprint, run_trial

        self.ray = _InlineRay()
        self.max_inflight = 1
        self._trial_task = _InlineTask(run_trial, self._task_hook)
        self._fp_task = _InlineTask(node_fingerprint)

    def _write_findings(self, recs: list) -> None:
        if self._findings:
            super()._write_findings(recs)

    def finish(self) -> Any:
        """The driver's finish, then release the study lock (several drivers may run in one process)."""
        try:
            return super().finish()
        finally:
            fd = getattr(self, "_lock_fd", None)
            if fd is not None:
                import os

                os.close(fd)
                self._lock_fd = None


def run_in_process(spec: SweepSpec, study_name: str | None = None, **kw: Any) -> InProcessDriver:
    """Set up, loop and finish an :class:`InProcessDriver`; returns it (``.study``, ``.stop_reason``).

    The closing summary is printed as by the real driver.
    """
    drv = InProcessDriver(spec, study_name, **kw)
    drv.setup()
    drv.loop()
    drv.finish()
    return drv
