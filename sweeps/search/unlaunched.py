"""Enqueued trials a sweep stopped before launching: told, and queued again on resume.

A sweep enqueues more than it may launch (the baseline, seeds, one trial per level, the
untried configs of :mod:`sweeps.search.untried`). When it stops at its budget, those never
popped would stay WAITING in the study, where nothing but a resume reads them: a study that
looks unfinished to Optuna's dashboards and to ``study.trials`` readers.

:func:`close_unlaunched` tells each of them FAIL (never PRUNED: TPE reads a PRUNED trial as
a measured bad value, while these were never measured) with ``status`` ``not_launched`` and the
stop reason. :func:`requeue_unlaunched`, at the next run's set-up, enqueues their configs
again (keeping their enqueue attrs, e.g. ``is_baseline``), so a resumed sweep with a larger
budget runs what the stopped one had queued, as it did when they stayed WAITING.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeps.store.records import A_STATUS, NOT_LAUNCHED, config_key

log = logging.getLogger("servesweep")

#: user attr: why a ``not_launched`` trial was not launched (the sweep's stop reason)
A_NOT_LAUNCHED_REASON = "not_launched_reason"


def _queued_config(t: FrozenTrial) -> dict:
    return dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})


def close_unlaunched(study: optuna.Study, reason: str) -> int:
    """Tell every WAITING trial of ``study`` FAIL, ``status`` ``not_launched``, with ``reason``.

    Returns:
        How many were told.
    """
    storage = study._storage  # Optuna's tell() refuses a WAITING trial: the storage's compare-and-set
    n = 0
    for t in storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,)):
        try:
            storage.set_trial_user_attr(t._trial_id, A_STATUS, NOT_LAUNCHED)
            storage.set_trial_user_attr(t._trial_id, A_NOT_LAUNCHED_REASON, reason)
            if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                n += 1
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process took it meanwhile
    if n:
        log.info("%d enqueued trial(s) not launched (%s): told FAIL, status %s; the same command queues them "
                 "again", n, reason, NOT_LAUNCHED)
    return n


def requeue_unlaunched(study: optuna.Study) -> int:
    """Enqueue again the config of every ``not_launched`` trial that no later trial took up.

    Returns:
        How many configs were enqueued.
    """
    trials = study.get_trials(deepcopy=False)
    later: dict[str, int] = {}
    for t in trials:
        later[config_key(_queued_config(t))] = t.number  # the last trial of each config
    n = 0
    for t in trials:
        if t.state != TrialState.FAIL or t.user_attrs.get(A_STATUS) != NOT_LAUNCHED:
            continue
        cfg = _queued_config(t)
        if not cfg or later.get(config_key(cfg)) != t.number:
            continue
        attrs = dict(t.user_attrs.get("enqueue_attrs") or {})
        study.enqueue_trial(cfg, user_attrs={**attrs, "enqueue_attrs": attrs})
        n += 1
    return n
