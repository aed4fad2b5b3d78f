"""The interfaces the search floor runs against (typed Protocols; the app supplies the parts).

* :class:`SweepPublisher`: what :class:`sweeps.search.loop.SweepLoop` publishes through
  (:class:`sweeps.publish.outputs.Publisher` is the app's; this floor never imports it).
* :class:`ConfirmHost`: what the winner confirmation (:func:`sweeps.search.confirm.confirm_top`)
  runs over: a set-up sweep's study, spec and executor.

The searcher (:class:`sweeps.search.searcher.Searcher`) and the runner
(:class:`sweeps.run.runner.Runner`) are concrete classes meant to be subclassed or composed.
"""

from __future__ import annotations

from typing import Any, Protocol

import optuna

from sweeps.config.spec import SweepSpec
from sweeps.rules.store import RuleStore
from sweeps.run.executor import Executor
from sweeps.run.progress import Progress
from sweeps.store import records
from tasks.types import TrialResult, TrialSpec

__all__ = ["ConfirmHost", "SweepPublisher"]


class SweepPublisher(Protocol):
    """What the loop publishes through (:class:`sweeps.publish.outputs.Publisher` is the app's)."""

    progress: Progress

    @property
    def tracker(self) -> Any:
        """The MLflow tracker (None while MLflow is down)."""
        ...

    def open_tracker(self, study: optuna.Study) -> None:
        """Open the MLflow experiment and the study's parent run."""
        ...

    def close_failed(self) -> None:
        """Setup failed: close an open parent run as FAILED."""
        ...

    def save_files(self, number: int, params: dict[str, Any], tspec: TrialSpec, res: TrialResult,
                   suffix: str = "") -> None:
        """Write a launch's server log and files (``suffix`` names a probe or an attempt)."""
        ...

    def trial_done(self, number: int, params: dict[str, Any], res: TrialResult, metrics: dict[str, float],
                   retired: list[str] | None = None, requestion: bool = False) -> None:
        """A trial finished (its terminal line); ``retired``: the rules/entries its passed
        re-question probe retired (``rule 3``, an entry id); ``requestion``: a re-question probe
        (not a launch of the budget)."""
        ...

    def refresh(self, study: optuna.Study, running: int, t_start: float) -> None:
        """The periodic status line."""
        ...

    def flush(self, study: optuna.Study, fingerprint: dict[str, str], rules: RuleStore) -> None:
        """Sync finished trials to MLflow and refresh the findings document."""
        ...

    def write_findings(self, study: optuna.Study, recs: list[records.TrialRecord], fingerprint: dict[str, str],
                       rules: RuleStore | None) -> None:
        """Update the findings document."""
        ...

    def summary(self, recs: list[records.TrialRecord], best: records.TrialRecord | None, base: float | None,
                stop_reason: str | None, confirmation: dict[str, Any]) -> None:
        """The closing summary."""
        ...

    def final(self, study: optuna.Study, recs: list[records.TrialRecord], best: records.TrialRecord | None,
              base: float | None, stop_reason: str | None, interrupted: bool) -> None:
        """The last MLflow update."""
        ...



class ConfirmHost(Protocol):
    """What a confirmation runs over: a set-up sweep (:class:`sweeps.search.loop.SweepLoop`).

    Its executor is the sweep's (the same slots, the same Ray); ``interrupted`` is read
    between launches (Ctrl-C stops the confirmation).
    """

    @property
    def spec(self) -> SweepSpec: ...

    @property
    def study(self) -> optuna.Study: ...

    @property
    def study_name(self) -> str: ...

    @property
    def profile(self) -> dict[str, Any] | None: ...

    @property
    def backend(self) -> dict[str, Any]: ...

    @property
    def executor(self) -> Executor: ...

    @property
    def interrupted(self) -> bool: ...
