"""sweeps.run.best_effort.best_effort: a publishing step's failure is logged, never raised, and never silent."""

from __future__ import annotations

import logging

import pytest

from sweeps.run.best_effort import best_effort
from sweeps.store.retry import StoreWriteError


def test_a_broken_import_is_logged_at_error_with_its_traceback(caplog):
    caplog.set_level(logging.DEBUG, logger="servesweep")
    with best_effort("write the plots", level=logging.DEBUG):
        import sweeps.publish.no_such_module  # noqa: F401
    (rec,) = [r for r in caplog.records if "write the plots" in r.getMessage()]
    assert rec.levelno == logging.ERROR and rec.exc_info and "import" in rec.getMessage()


def test_a_routine_failure_is_logged_at_the_given_level_and_the_step_goes_on(caplog):
    caplog.set_level(logging.DEBUG, logger="servesweep")
    with best_effort("sync MLflow", level=logging.WARNING):
        raise OSError("connection refused")
    (rec,) = [r for r in caplog.records if "sync MLflow" in r.getMessage()]
    assert rec.levelno == logging.WARNING and "connection refused" in rec.getMessage()


def test_a_store_locked_past_its_budget_stops_the_sweep():
    with pytest.raises(StoreWriteError), best_effort("record a trial"):
        raise StoreWriteError("record a trial", 120.0, "database is locked")
