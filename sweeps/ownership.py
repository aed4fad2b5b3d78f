"""Who may write a study, and the set-up steps that must succeed before anything is created.

:class:`StudyHold` is a driver's claim on its study: the file lock of
:func:`sweeps.study.lock_study` (one store dir; SQLite's only guard before) plus the
:class:`sweeps.lease.StudyLease` in the study's own storage (any machine), renewed by a
keeper thread. :func:`prepare` is the part of ``Driver.setup`` that runs before the study,
the rules or an MLflow run exist: the hold, MLflow's permission (before Ray starts) and
the executor (Ray: reachable, token auth, trial slots). A failure there leaves nothing behind but the released
lease row.

:data:`REFUSALS` are the set-up refusals that are configuration errors (exit 2): another
live driver holds the study (:class:`~sweeps.lease.LeaseHeld`, naming host, pid and since
when), MLflow denies EDIT (:class:`~sweeps.mlflow_access.MlflowDenied`) or ``tracking.uri``
is no MLflow server (:class:`~sweeps.mlflow_access.NotMlflow`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, NoReturn

from sweeps import study as S
from sweeps.config import SweepSpec
from sweeps.engine_check import check_on_nodes
from sweeps.lease import LeaseHeld, LeaseKeeper, StudyLease, guarded
from sweeps.mlflow_access import MlflowDenied, check_access

__all__ = ["REFUSALS", "StudyHold", "abandon", "guarded", "hold_study", "prepare"]

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
    fd = S.lock_study(spec, study_name)
    lease = StudyLease(spec.optuna_storage, study_name)
    try:
        lease.acquire()
        return StudyHold(fd, lease, lease.keep_alive())
    except BaseException:
        lease.engine.dispose()
        os.close(fd)
        raise


def prepare(drv: Any) -> None:
    """``Driver.setup``'s first steps, before anything is created: ``drv.hold`` (lock + lease),
    ``drv.executor`` (``drv.make_executor()``: Ray started or joined, slots known) and, when
    the driver tracks, MLflow's permission on the experiment.

    Raises:
        SweepError, LeaseHeld (see :func:`hold_study`); MlflowDenied (401/403, NotMlflow); RayUnavailable.
    """
    drv.hold = hold_study(drv.spec, drv.study_name)
    if drv.track:  # before Ray starts: a refusal is a configuration error, answered at once
        check_access(drv.spec.mlflow_uri, drv.spec.sweep.name)
    drv.executor = drv.make_executor()
    drv.progress.slots = drv.executor.slots
    if getattr(drv.executor, "ray", None) is not None:
        check_on_nodes(drv.spec, drv.executor.ray)  # the engine and GPU checks, on each GPU node


def abandon(drv: Any, reason: str) -> NoReturn:
    """The lease was lost: another driver may own the study now. Cancel the running trials
    without writing anything (their results are the new holder's to re-run) and stop.

    Raises:
        SweepError: always (exit 1), naming ``reason``.
    """
    n = len(drv.inflight)
    for ref in list(drv.inflight):
        try:
            drv.executor.cancel(ref)
        except Exception as e:  # noqa: BLE001 - stopping anyway
            log.warning("could not cancel a trial task: %s", e)
    drv.inflight.clear()
    raise S.SweepError(f"{reason}; this driver stopped without writing its {n} running trial(s) (the driver that "
                       f"holds the study now re-runs them). Run the same command to resume once that driver is done.")
