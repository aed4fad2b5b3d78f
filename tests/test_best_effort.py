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


def test_a_read_only_store_stops_a_store_write_but_not_a_publishing_step(tmp_path, caplog):
    import sqlite3

    db = tmp_path / "ro.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)

    def write():
        ro.execute("INSERT INTO t VALUES (1)")

    with pytest.raises(sqlite3.OperationalError, match="readonly"), \
            best_effort("record a failure rule", store_write=True):
        write()
    caplog.set_level(logging.DEBUG, logger="servesweep")
    with best_effort("write the plots"):
        write()
    assert any("write the plots" in r.getMessage() for r in caplog.records)
    with best_effort("record a failure rule", store_write=True):
        raise ValueError("unknown class")  # not the store's failure: logged, the sweep goes on
    ro.close()
