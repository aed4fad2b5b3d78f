"""The Optuna study of a sweep: open (resumable, space-checked), sampler, lock, seeds,
stale-trial recovery, and the one mapping from a trial's outcome to what Optuna is told.

Optuna is the source of truth: every outcome the driver learns ends in :func:`tell`
with the :class:`Verdict` of :func:`verdict_for`, so the sampler, the records and the
findings all read the same state.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from sweeps.config.objective import ObjectiveSet
from sweeps.config.space import SearchSpace, seed_configs
from sweeps.config.spec import SweepSpec
from sweeps.errors import ConfigurationError, SweepError
from sweeps.store import records
from sweeps.store import sqlite as sqlite_tuning
from sweeps.store.lease import write_unless_finished
from sweeps.store.retry import StoreWriteError, retrying
from tasks.load_search import censored_upper
from tasks.outcome import Status

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

log = logging.getLogger("servesweep")
SPACE_ATTR = "space_signature"
#: study user attr: what the study measures (see :func:`study_identity`)
IDENTITY_ATTR = "identity"
#: the command-line overrides of the study's latest run (secrets masked): what the findings' next-step
#: commands repeat, so that a command runs as pasted against the same store and settings
OVERRIDES_ATTR = "run_overrides"
#: Optuna constraint name; > 0 = infeasible (TPE ranks such trials among the worst).
FEASIBLE = "feasible"


#: Param fields that change how the search reads its results, never which configs the space holds
#: or how they are sampled: a study resumes across them (``ordered``: :class:`sweeps.config.space.ParamSpec`).
SEARCH_ONLY_FIELDS = frozenset({"ordered"})


def space_signature(spec: SweepSpec) -> str:
    """Hash (16 hex) of the search space (params + constraints) that a resumed study must match
    (the fields of :data:`SEARCH_ONLY_FIELDS` left out)."""
    params = {name: {k: v for k, v in raw.items() if k not in SEARCH_ONLY_FIELDS} if isinstance(raw, Mapping) else raw
              for name, raw in spec.sweep.params.items()}
    body = json.dumps({"params": params, "constraints": spec.sweep.constraints}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def study_identity(spec: SweepSpec) -> dict[str, str]:
    """What a study's results are measurements of: ``backend``, ``node``, ``model``,
    ``engine_version`` (the backend's, e.g. SGLang 0.5.23) and ``objective`` (names,
    directions and constraints). A resumed study must match it."""
    from tasks.backends import get_backend

    objs = spec.objective_set
    objective = ", ".join(f"{o.name} {o.direction}" + "".join(f" [{c}]" for c in o.constraints)
                          for o in objs.objectives)
    return {"backend": spec.backend.kind, "node": spec.node.name, "model": spec.model.name,
            "engine_version": get_backend(spec.backend.kind).engine_version(spec.backend.model_dump()),
            "objective": objective}


def check_identity(study: optuna.Study, spec: SweepSpec) -> None:
    """Record the study's identity, or refuse to resume it with another one.

    A study created before identities were recorded adopts the current one, and so does a
    study whose only change is its objective while no trial of it was ranked (COMPLETE) yet.

    Raises:
        SweepError: names every field that differs and the way out (a new study).
    """
    now = study_identity(spec)
    old = study.user_attrs.get(IDENTITY_ATTR)
    stored = [d.name.lower() for d in study.directions]  # fixed when Optuna created the study
    diff = [] if stored == spec.objective_set.directions else \
        [f"direction: {stored} != {spec.objective_set.directions}"]
    if old is None and not diff:
        study.set_user_attr(IDENTITY_ATTR, now)
        return
    changed = [k for k, v in now.items() if old is not None and old.get(k) != v]
    if changed == ["objective"] and not diff and not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        # nothing was ranked by the old objective (e.g. a misspelled metric stopped the first
        # trial): the study takes the new one instead of being blocked for good
        log.warning("study %r: objective %r -> %r (no trial was ranked by the old one)", study.study_name,
                    old.get("objective"), now["objective"])
        study.set_user_attr(IDENTITY_ATTR, now)
        return
    diff += [f"{k}: {old.get(k)!r} != {now[k]!r}" for k in changed]
    if diff:
        raise SweepError(
            f"study {study.study_name!r} holds results of a different setup ({'; '.join(diff)}; study != now). "
            f"Resuming it would mix its results with these. Run the original setup to resume it, or start a "
            f"new study: new_study=true (or study_name=<new name>).")


def make_sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, grouped for conditional params, constant liar for trials in
    flight) or random, seeded from the sweep config."""
    s = spec.sweep.sampler
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    return optuna.samplers.TPESampler(
        seed=s.seed, n_startup_trials=s.n_startup_trials, multivariate=True, group=True, constant_liar=True,
    )


class RetryingStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose every write (a trial's creation, params, attributes, state,
    the study's attributes) rides out lock/busy errors for the store's retry budget
    (:func:`sweeps.store.retry.retrying`, :data:`sweeps.store.retry.RETRY_S`), whoever calls it:
    a record, a probe's attribute, ``ask``, ``enqueue_trial``, ``tell``.

    Raises:
        StoreWriteError: a write still locked when the budget is spent.
    """

    def _write(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(super(), name)
        return retrying(lambda: fn(*args, **kwargs), f"optuna {name.strip('_').replace('_', ' ')}")

    def create_new_study(self, *a: Any, **k: Any) -> Any:  # noqa: D102 - see the class
        return self._write("create_new_study", *a, **k)

    def delete_study(self, *a: Any, **k: Any) -> Any:  # noqa: D102
        return self._write("delete_study", *a, **k)

    def set_study_user_attr(self, *a: Any, **k: Any) -> Any:  # noqa: D102
        return self._write("set_study_user_attr", *a, **k)

    def set_study_system_attr(self, *a: Any, **k: Any) -> Any:  # noqa: D102
        return self._write("set_study_system_attr", *a, **k)

    # Optuna's cache (``_CachedStorage``) calls these two private ones, the public ones call them too
    def _create_new_trial(self, *a: Any, **k: Any) -> Any:
        return self._write("_create_new_trial", *a, **k)

    def _set_trial_param(self, *a: Any, **k: Any) -> Any:
        return self._write("_set_trial_param", *a, **k)

    def set_trial_state_values(self, *a: Any, **k: Any) -> Any:  # noqa: D102
        return self._write("set_trial_state_values", *a, **k)

    def set_trial_intermediate_value(self, *a: Any, **k: Any) -> Any:  # noqa: D102
        return self._write("set_trial_intermediate_value", *a, **k)

    def set_trial_user_attr(self, *a: Any, **k: Any) -> Any:  # noqa: D102
        return self._write("set_trial_user_attr", *a, **k)

    def set_trial_system_attr(self, *a: Any, **k: Any) -> Any:  # noqa: D102
        return self._write("set_trial_system_attr", *a, **k)


class StorageUnreachable(ConfigurationError, SweepError):
    """``tracking.optuna_storage`` cannot be opened at start (a database server that refuses or
    does not answer, a wrong URL); exit code 2, nothing started."""

def _unreachable(url: str, e: BaseException) -> StorageUnreachable:
    """The one-line stop for a storage database that cannot be connected to (password hidden)."""
    from sqlalchemy.engine import make_url

    shown = make_url(url).render_as_string(hide_password=True)
    cause = str(getattr(e, "orig", None) or e).strip().splitlines()[0][:200]
    return StorageUnreachable(f"cannot connect to tracking.optuna_storage {shown} ({cause}). Start the database "
                              f"or fix the URL, then run the same command again; nothing was started.")


def optuna_storage(spec: SweepSpec, url: str | None = None) -> RetryingStorage:
    """The Optuna RDB storage of ``spec.optuna_storage`` (or ``url``; schema created on first
    use), every write retried on lock/busy errors (:class:`RetryingStorage`); a SQLite file's
    directory is created, as the rules and MLflow stores create theirs.

    Raises:
        StorageUnreachable: a database server's URL that cannot be connected to.
    """
    import sqlalchemy.exc

    url = url or spec.optuna_storage
    path = sqlite_tuning.sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        return RetryingStorage(url, engine_kwargs={"connect_args": {"timeout": sqlite_tuning.BUSY_TIMEOUT_MS / 1000}})
    try:
        return RetryingStorage(url, engine_kwargs={})
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as e:
        raise _unreachable(url, e) from None


def open_study(spec: SweepSpec, name: str | None = None) -> optuna.Study:
    """Create or resume the study ``name`` (default ``spec.study``) in the RDB storage.

    Raises:
        SweepError: the existing study was created with a different search space, or
            with another backend, node, model, engine version or objective (:func:`check_identity`).
        StorageUnreachable: the storage's database cannot be connected to (its URL shown
            without the password).
    """
    import sqlalchemy.exc

    name = name or spec.study
    objs = spec.objective_set
    try:
        study = optuna.create_study(study_name=name, storage=optuna_storage(spec), sampler=make_sampler(spec),
                                    directions=objs.directions, load_if_exists=True)
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as e:
        if sqlite_tuning.sqlite_path(spec.optuna_storage) is not None:
            raise  # a SQLite file's errors are the store's (full, read-only, corrupt): their own stop
        raise _unreachable(spec.optuna_storage, e) from None
    sig = space_signature(spec)
    old = study.user_attrs.get(SPACE_ATTR)
    if old is None:
        study.set_user_attr(SPACE_ATTR, sig)
        study.set_user_attr("sweep", spec.sweep.name)
        study.set_user_attr("node", spec.node.name)
        study.set_user_attr("model", spec.model.name)
        study.set_user_attr("backend", spec.backend.kind)
    elif old != sig:
        raise SweepError(
            f"study {name!r} exists with a different search space (signature {old} != {sig}). "
            f"Resume it with its original sweep config, or start a new study: new_study=true "
            f"(or study_name=<new name>)."
        )
    check_identity(study, spec)
    return study


class StudyInUse(ConfigurationError, SweepError):
    """Another live driver holds the study on this store (exit 2, like a lease held elsewhere)."""


def lock_study(spec: SweepSpec, study_name: str) -> int:
    """One driver per study on this store: a second one would fail the first's running
    trials as stale. The lock (flock on ``<store>/locks/<study>.lock``) dies with the process.

    Returns:
        the lock's file descriptor (close it to release the lock).
    Raises:
        StudyInUse: another live driver holds the study.
    """
    d = spec.store_dir / "locks"
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / f"{study_name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StudyInUse(f"study {study_name!r} is being run by another driver (pid {holder}); wait for it, "
                         f"or run a separate study with study_name=<name>") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def enqueue_seeds(study: optuna.Study, spec: SweepSpec, space: SearchSpace,
                  known_dead: Callable[[Mapping[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Enqueue the baseline (tagged ``is_baseline``), the seed trials and one trial per
    level of the seeded knobs; ``skip_if_exists`` makes a resumed sweep enqueue nothing twice.

    Args:
        known_dead: True for a config the node's knowledge already names a dead end (a shipped
            entry or a learned rule on its fingerprint). Such a seed, other than the baseline, is
            not enqueued: launching it would only confirm the knowledge, and the re-question
            probe (:mod:`sweeps.search.probes`) asks whether it still holds for a probe's price.
    Returns:
        The seeds left out as known dead ends.
    """
    sw = spec.sweep
    if sw.mode != "search":
        return []
    dropped: list[dict[str, Any]] = []
    for i, cfg in enumerate(seed_configs(space, sw.baseline, sw.seed_trials, sw.seed_each_level_of)):
        if i > 0 and known_dead is not None and known_dead(cfg):
            dropped.append(cfg)
            continue
        attrs = {records.A_BASELINE: True} if i == 0 else {}
        study.enqueue_trial(cfg, user_attrs={**attrs, "enqueue_attrs": attrs}, skip_if_exists=True)
    return dropped


def requeue(study: optuna.Study, params: Mapping[str, Any], user_attrs: Mapping[str, Any]) -> None:
    """Enqueue a config again (an interrupted trial), keeping its enqueue attrs (e.g. ``is_baseline``)."""
    attrs = dict(user_attrs.get("enqueue_attrs") or {})
    study.enqueue_trial(dict(params), user_attrs={**attrs, "enqueue_attrs": attrs, records.A_REQUEUED: True})


class _StoredTrial:
    """A trial written through the storage by id (a stale RUNNING trial has no live Trial object)."""

    def __init__(self, storage: Any, trial_id: int):
        self.storage, self.trial_id = storage, trial_id

    def set_user_attr(self, key: str, value: Any) -> None:
        self.storage.set_trial_user_attr(self.trial_id, key, value)


def stale_config(t: FrozenTrial) -> dict[str, Any]:
    """The config a RUNNING trial of a killed driver stood for: its params once the whole
    config was drawn (``config_key`` is set right after), else the queued ``fixed_params`` of a
    trial taken from the queue before it took them; {} for a sampler draw killed half-way
    (nothing of it ran)."""
    if records.A_CONFIG_KEY in t.user_attrs:
        return dict(t.params)
    return dict(t.system_attrs.get("fixed_params") or {})


def recover_stale(study: optuna.Study, failure_class: str = "node_lost",
                  signature: str = "driver stopped while the trial was running") -> int:
    """Fail RUNNING trials (infra: ``failure_class``, default ``node_lost`` for those a killed
    driver left) and re-enqueue the config each stood for (:func:`stale_config`; none for a
    draw killed half-way).

    Returns:
        how many trials were recovered.
    Raises:
        StoreWriteError: the store stayed locked for the retry budget.
    """
    from sweeps.store.record_io import write_outcome

    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        stored = _StoredTrial(study._storage, t._trial_id)
        facts = {records.A_STATUS: Status.INTERRUPTED, records.A_FAILURE_CLASS: failure_class, records.A_FAILURE_KIND: "infra",
                 records.A_SIGNATURE: signature}
        # the whole record: a record the killed driver wrote just before its tell must not outlive this
        if not write_unless_finished(write_outcome, stored, facts, f"trial {t.number}", what=f"recovering trial {t.number}"):
            continue  # its driver finished it meanwhile (it had lost the lease): nothing to recover
        tell(study, t.number, verdict_for(Status.INTERRUPTED))
        params = stale_config(t)
        if params:
            attrs = dict(t.user_attrs.get("enqueue_attrs") or {})
            study.enqueue_trial(params, user_attrs={**attrs, "enqueue_attrs": attrs, records.A_REQUEUED: True})
        log.warning("trial %d was running when the driver stopped: marked failed (%s) and re-queued", t.number,
                    failure_class)
        n += 1
    return n


# ---------------------------------------------------------------------------------------
# outcome -> what Optuna is told
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """What Optuna is told about a trial.

    Attributes:
        state: COMPLETE (measured), PRUNED (the sampler learns from it) or FAIL (ignored).
        values: objective values for COMPLETE (one per objective).
        constraint: the ``feasible`` constraint value (> 0 infeasible), None = not set.
    """

    state: TrialState
    values: tuple[float, ...] | None = None
    constraint: float | None = None


INFEASIBLE = Verdict(TrialState.PRUNED, constraint=1.0)
UNINFORMATIVE = Verdict(TrialState.PRUNED, constraint=0.0)
IGNORED = Verdict(TrialState.FAIL)


DEFAULT_OBJECTIVES = ObjectiveSet.from_config("decode_tok_s")


def verdict_for(status: str, *, failure_kind: str | None = None, metrics: Mapping[str, float] | None = None,
                objectives: ObjectiveSet = DEFAULT_OBJECTIVES, degraded: bool = False,
                source: FrozenTrial | None = None) -> Verdict:
    """The one place that maps a trial's outcome to an Optuna state, values and constraint.

    Args:
        status: ``ok`` (measured), ``failed`` (the config's fault when ``failure_kind`` is
            deterministic; a transient failure is told FAIL: not a dead end), ``skipped`` (answered without GPU time: a violated
            constraint, a failure rule, a degraded level), ``duplicate`` (of ``source``; a
            still-running source is None), or anything else (infra errors, interruptions:
            not the config's fault).
        metrics: the trial's metrics (``ok``).  objectives: what Optuna is told (one value each).
        degraded: the server silently ran another path than the config names.
    Returns:
        COMPLETE with the values of finite measured objectives on the path named (its
        constraint value is the objective constraints' violation: > 0 = never best), or with a
        censored objective's upper bound and constraint 1 (only bounded: never best); PRUNED
        + infeasible for what the sampler must avoid; FAIL (teach nothing) otherwise.
    """
    if status == Status.OK:
        vals = objectives.values(metrics or {})
        if vals is None:
            return _censored(objectives, metrics or {})
        return INFEASIBLE if degraded else Verdict(TrialState.COMPLETE, tuple(vals),
                                                   float(objectives.violation(metrics or {})))
    if status == Status.FAILED:
        # a transient failure teaches nothing about the config: it stays proposable, never a dead end
        return INFEASIBLE if failure_kind == "deterministic" else IGNORED
    if status == Status.SKIPPED:
        return INFEASIBLE
    if status == "duplicate":
        if source is None:
            return UNINFORMATIVE  # the original is still running: let the sampler move on
        if source.state == TrialState.COMPLETE and source.values:
            # a copy of a constraint-violating trial violates too; otherwise the copy sets none
            c = max((source.constraints or {}).values(), default=0.0)
            return Verdict(TrialState.COMPLETE, tuple(source.values), c if c > 0 else None)
        if source.state == TrialState.PRUNED:
            return INFEASIBLE
        return UNINFORMATIVE
    return IGNORED


def _censored(objectives: ObjectiveSet, metrics: Mapping[str, float]) -> Verdict:
    """A single objective known only as a bound (:func:`tasks.load_search.censored_upper`):
    COMPLETE with its upper bound, infeasible so it never becomes Optuna's best (the bound is
    true; the sampler learns the config is no better); IGNORED otherwise."""
    up = censored_upper(metrics, objectives.primary.name) if not objectives.multi else None
    return IGNORED if up is None else Verdict(TrialState.COMPLETE, (up,), 1.0)


def tell(study: optuna.Study, trial: Trial | int, verdict: Verdict) -> None:
    """Tell ``study`` the ``verdict`` for ``trial`` (a live Trial or a trial number).

    A lock/busy error is retried (:func:`sweeps.store.retry.retrying`); any other tell problem
    is logged, never raised: the sweep goes on.

    Raises:
        StoreWriteError: the store stayed locked for the whole retry budget.
    """
    what = f"telling trial {getattr(trial, 'number', trial)}"

    def once() -> None:  # guarded: a trial finished by another driver (lease taken over) is skipped
        if verdict.constraint is not None and isinstance(trial, Trial) and \
                not write_unless_finished(trial.set_constraint, FEASIBLE, verdict.constraint, what=what):
            return
        if verdict.state == TrialState.COMPLETE:
            vals = list(verdict.values or ())
            write_unless_finished(study.tell, trial, values=vals[0] if len(vals) == 1 else vals, what=what)
        else:
            write_unless_finished(study.tell, trial, state=verdict.state, what=what)

    try:
        retrying(once, f"tell trial {getattr(trial, 'number', trial)}")
    except StoreWriteError:
        raise
    except Exception as e:  # noqa: BLE001 - a tell problem is logged, never crashes the sweep
        log.error("study.tell failed for trial %s: %s", getattr(trial, "number", trial), e)
