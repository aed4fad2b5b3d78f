"""Who may write a study, and the set-up steps that must succeed before anything is created.

:class:`StudyHold` is a driver's claim on its study: the file lock of
:func:`sweeps.store.study.lock_study` (one store dir; SQLite's only guard before) plus the
:class:`sweeps.store.lease.StudyLease` in the study's own storage (any machine), renewed by a
keeper thread. :func:`hold_study` then :func:`prepare` are the part of ``Driver.setup`` that
runs before the study, the rules or an MLflow run exist: the hold, MLflow's permission
(before Ray starts) and the executor (Ray: reachable, token auth, trial slots). A failure
there leaves nothing behind but the released lease row.

:data:`REFUSALS` are the set-up refusals that are configuration errors (exit 2): another
live driver holds the study (:class:`~sweeps.store.lease.LeaseHeld`, naming host, pid and since
when), MLflow denies EDIT (:class:`~sweeps.store.mlflow_access.MlflowDenied`) or ``tracking.uri``
is no MLflow server (:class:`~sweeps.store.mlflow_access.NotMlflow`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, NoReturn

from sweeps.config.spec import SweepSpec
from sweeps.errors import SweepError
from sweeps.run.engine_check import check_on_nodes
from sweeps.run.executor import Executor
from sweeps.run.runner import Runner
from sweeps.store import study as study_store
from sweeps.store.lease import LeaseHeld, LeaseKeeper, StudyLease, write_unless_finished
from sweeps.store.mlflow_access import MlflowDenied, check_access

__all__ = ["REFUSALS", "StudyHold", "abandon", "write_unless_finished", "hold_study", "prepare"]

log = logging.getLogger("servesweep")
REFUSALS: tuple[type[BaseException], ...] = (LeaseHeld, MlflowDenied)


class StudyHold:
    """A driver's file lock (fd) and lease on one study; :meth:`release` frees both."""

    def __init__(self, lock_fd: int, lease: StudyLease, keeper: LeaseKeeper):
        self.lock_fd, self.lease, self.keeper = lock_fd, lease, keeper

    def lost(self) -> str | None:
        """Why the lease was lost (taken over by another driver, or not renewable for its TTL), else None."""
        return (self.keeper.reason or "the study lease was lost") if self.keeper.lost.is_set() else None

    def release(self) -> None:
        """Stop renewing, delete the lease row (if still ours), close the lock. Idempotent."""
        try:
            self.lease.release()
        except Exception as e:  # noqa: BLE001 - the row expires by itself (ttl); the lock must still go
            log.warning("could not release the lease of study %r (%s); it expires in %.0f s",
                        self.lease.study, e, self.lease.ttl_s)
        finally:
            self.lease.engine.dispose()
            if self.lock_fd >= 0:
                os.close(self.lock_fd)
                self.lock_fd = -1


def hold_study(spec: SweepSpec, study_name: str) -> StudyHold:
    """Take the study's file lock, then its lease, and start renewing it.

    Raises:
        SweepError: another driver of this store dir holds the file lock.
        LeaseHeld: a live driver anywhere holds the lease (host, pid, since when).
    """
    fd = study_store.lock_study(spec, study_name)
    lease = StudyLease(spec.optuna_storage, study_name)
    try:
        lease.acquire()
        return StudyHold(fd, lease, lease.keep_alive())
    except BaseException:
        lease.engine.dispose()
        os.close(fd)
        raise


def prepare(spec: SweepSpec, track: bool, make_executor: Callable[[], Executor]) -> Executor:
    """``Driver.setup``'s steps after the study's hold (:func:`hold_study`) and before anything
    is created: MLflow's permission on the experiment when the sweep tracks (before Ray starts:
    a refusal is a configuration error, answered at once), then the executor
    (``make_executor()``: Ray started or joined, slots known) and, on Ray, the engine and GPU
    checks on each GPU node.

    Raises:
        MlflowDenied (401/403, NotMlflow); RayUnavailable; SweepError (no trial slot, engine check).
    """
    if track:
        check_access(spec.mlflow_uri, spec.sweep.name)
    executor = make_executor()
    ray = getattr(executor, "ray", None)
    if ray is not None:
        check_on_nodes(spec, ray)  # the engine and GPU checks, on each GPU node
    return executor


def abandon(runner: Runner[Any], reason: str) -> NoReturn:
    """The lease was lost: another driver may own the study now. Cancel the running trials
    without writing anything (their results are the new holder's to re-run) and stop.

    Raises:
        SweepError: always (exit 1), naming ``reason``.
    """
    n = runner.cancel_all()
    runner.drop_all()
    raise SweepError(f"{reason}; this driver stopped without writing its {n} running trial(s) (the driver that "
                     f"holds the study now re-runs them). Run the same command to resume once that driver is done.")
