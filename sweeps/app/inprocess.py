"""The driver's loop without Ray: trials run in this process, one at a time.

:class:`InProcessDriver` is :class:`sweeps.app.sweep.Driver` with the
:class:`~sweeps.run.executor.InProcessExecutor`: every trial runs :func:`tasks.trial.run_trial`
inline. Everything else is the driver's own code: seeds, constraint skips, failure rules,
duplicate answering, degraded-level skips, transient/infra retries, constraint-aware TPE,
budget and circuit breaker. With the ``instant`` backend a 60-trial sweep takes seconds,
so the benchmark (``benchmarks/sweep_efficiency.py``) and the sampler-learning test use it
to measure the driver's strategy itself. The real sweep with one trial in flight (8 GPUs /
TP=8) submits in the same order, so the sequence of asks and tells is the same.

MLflow and the findings document are off by default (``track=False``, ``findings=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sweeps.app.sweep import Driver
from sweeps.config.spec import SweepSpec
from sweeps.run.executor import Executor, InProcessExecutor

__all__ = ["InProcessDriver", "run_in_process"]


class InProcessDriver(Driver):
    """:class:`~sweeps.app.sweep.Driver` running trials inline (no Ray), one at a time.

    Args:
        spec: validated sweep spec (``backend.kind`` ``instant`` is the useful one;
            ``emulated`` works too, launching real server processes).
        study_name: Optuna study name (default ``spec.study``).
        track: log to MLflow like the real driver (default off: the benchmark does not need it).
        findings: update the findings document after every trial (default off).
        task_hook: called with each trial task's args ``(TrialSpec, profile, workdir)``
            before it runs; an exception it returns is raised from the executor's
            ``result`` as a Ray task error would be (tests inject infrastructure failures with it).
    """

    quiet = True

    def __init__(self, spec: SweepSpec, study_name: str | None = None, *, track: bool = False,
                 findings: bool = False, task_hook: Callable[[tuple], BaseException | None] | None = None):
        self.track, self.findings, self._task_hook = track, findings, task_hook
        super().__init__(spec, study_name)

    def make_executor(self) -> Executor:
        """Trials inline, with the optional ``task_hook``."""
        return InProcessExecutor(str(self.spec.store_dir / "work"), self._task_hook)

    def finish(self) -> Any:
        """The driver's finish, then release the study lock (several drivers may run in one process)."""
        try:
            return super().finish()
        finally:
            self.release()


def run_in_process(spec: SweepSpec, study_name: str | None = None, **kw: Any) -> InProcessDriver:
    """Set up, loop and finish an :class:`InProcessDriver`; returns it (``.study``, ``.stop_reason``).

    The closing summary is printed as by the real driver.
    """
    drv = InProcessDriver(spec, study_name, **kw)
    drv.setup()
    drv.loop()
    drv.finish()
    return drv
