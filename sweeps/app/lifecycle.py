"""A driver's whole lifecycle with graceful Ctrl-C / SIGTERM (:func:`execute`)."""

from __future__ import annotations

import signal
import sys
from typing import Any

from sweeps.app.sweep import Driver
from sweeps.run.engine_check import check_here
from sweeps.run.graceful import store_failures
from sweeps.search.unlaunched import close_unlaunched, requeue_unlaunched


def execute(drv: Driver) -> Driver:
    """Run a driver's whole lifecycle: setup, the loop, graceful Ctrl-C (first SIGINT stops
    proposing and tears running trials down; a second one aborts), finish. A search's enqueued
    trials left unlaunched at its stop are told ``not_launched`` and queued again by the next
    run (:mod:`sweeps.search.unlaunched`). Returns ``drv``
    with ``drv.finished_best`` set; the study's lock and lease are released in every case.
    Raises what setup raises (SweepError, LeaseHeld, RayUnavailable, MlflowDenied...)."""
    prev = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        if drv.interrupted:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        print(f"\nservesweep: stopping on {name} (Ctrl-C again to abort); tearing down running trials...",
              file=sys.stderr)
        drv.interrupted = name

    prev_term = signal.getsignal(signal.SIGTERM)
    try:
        try:
            check_here(drv.spec)  # a real engine that cannot run here: exit 2 before any store is touched
            with store_failures(drv):  # a read-only or full store already at setup: the same clean stop
                drv.setup()
        except BaseException:
            drv.publisher.close_failed()
            raise
        # SIGTERM (timeout, SLURM, docker stop) stops as gracefully as Ctrl-C
        signal.signal(signal.SIGINT, on_sigint)
        signal.signal(signal.SIGTERM, on_sigint)
        with store_failures(drv):  # disk full / read-only store: stop with the path and cause
            if drv.spec.sweep.mode == "search":
                requeue_unlaunched(drv.study)  # what the last run had queued but not launched
            drv.loop()
        if drv.interrupted:
            drv.interrupt()  # its re-queued trials stay WAITING: the same command runs them first
        elif drv.spec.sweep.mode == "search":
            with store_failures(drv):
                close_unlaunched(drv.study, drv.stop_reason or "the sweep ended")
        drv.finished_best = drv.finish()
    finally:
        signal.signal(signal.SIGINT, prev)
        signal.signal(signal.SIGTERM, prev_term)
        drv.release()  # the lock and the study lease, also after Ctrl-C or an error
    return drv
