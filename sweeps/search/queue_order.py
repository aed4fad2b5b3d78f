"""Which waiting (enqueued) trial runs next: the baseline and re-queued trials first.

Optuna pops WAITING trials in enqueue order, so a trial re-queued after an interruption
(Ctrl-C, a killed driver) would run after every seed enqueued before it; with a small
budget the baseline might never be measured, and no trial would get a speedup. The
driver asks :func:`pop_priority` before ``study.ask()``: a waiting baseline first, then
other re-queued trials (``requeued`` user attr), each in trial-number order.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from sweeps.store import records


def _rank(t: optuna.trial.FrozenTrial) -> tuple[int, int] | None:
    if t.user_attrs.get(records.A_BASELINE):
        return (0, t.number)
    if t.user_attrs.get(records.A_REQUEUED):
        return (1, t.number)
    return None


def pop_priority(study: optuna.Study) -> optuna.trial.Trial | None:
    """Claim the first priority WAITING trial (baseline, then re-queued) and return it as a
    live Trial (its params are the enqueued ones); None when there is none.

    Claiming uses the storage's compare-and-set (``set_trial_state_values`` returns False
    when another process took the trial), the same as Optuna's own queue pop.
    """
    storage = study._storage  # Optuna has no public "pop this waiting trial"; ask() does the same
    waiting = storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,))
    for _, t in sorted((r, t) for t in waiting if (r := _rank(t)) is not None):
        try:
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        study._thread_local.cached_all_trials = None
        return optuna.trial.Trial(study, t._trial_id)
    return None
