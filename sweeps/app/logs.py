"""The driver's console and its log file: library errors the driver handles stay in the file.

``run_sweep.py`` runs under Hydra, whose job logging writes every record to the console
(stdout) and to the driver log file ``<hydra run dir>/run_sweep.log`` (a
``logging.FileHandler`` on the root logger). The store libraries (MLflow, alembic,
SQLAlchemy) log the errors the driver catches and handles, often with their stacks; MLflow
even writes them to stderr through its own handler. :func:`setup` routes those libraries'
records to the log file only, lets the driver's own DEBUG lines (a handled error's
details, ``exc_info``) reach the file only, and remembers the file's path, so a failure
ends with one line on the console and :func:`details` pointing at the whole story.
"""

from __future__ import annotations

import logging
from pathlib import Path

#: loggers of the store libraries whose records go to the driver log file only (urllib3: MLflow's
#: HTTP client warns once per retried request while a tracking server is down; the sweep says so
#: in one line of its own)
LIBRARIES = ("mlflow", "alembic", "sqlalchemy", "huey", "urllib3")
#: loggers MLflow gives their own stderr handler on import (mlflow.utils.logging_utils)
_OWN_HANDLERS = ("mlflow", "alembic", "sqlalchemy", "sqlalchemy.engine", "huey")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_log_file: Path | None = None


class _NotLibraries(logging.Filter):
    """Drops records of :data:`LIBRARIES` (a console handler's filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".", 1)[0] not in LIBRARIES


def setup() -> Path | None:
    """Configure the driver's logging (idempotent): INFO and up of the driver on the console,
    everything of the driver (DEBUG included) and the store libraries' records in the log
    file. Without a log file (no Hydra: a test, ``python -c``) it is ``logging.basicConfig``
    on stderr and the libraries keep their own handlers.

    Returns:
        the driver log file's path, or None.
    """
    global _log_file
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format=FORMAT)
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    if not files:
        _log_file = None
        return None
    for h in root.handlers:
        if isinstance(h, logging.FileHandler):
            h.setLevel(logging.DEBUG)
        elif not any(isinstance(f, _NotLibraries) for f in h.filters):
            h.setLevel(max(h.level, logging.INFO))
            h.addFilter(_NotLibraries())
    logging.getLogger("servesweep").setLevel(logging.DEBUG)
    try:  # MLflow configures its logger on import (own stderr handler, no propagation): import it first
        import mlflow.utils.logging_utils  # noqa: F401
    except ImportError:
        pass
    for name in _OWN_HANDLERS:
        lib = logging.getLogger(name)
        for h in list(lib.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                lib.removeHandler(h)
        lib.propagate = True
    _log_file = Path(files[0].baseFilename)
    return _log_file


def log_file() -> Path | None:
    """The driver log file set up by :func:`setup`, or None."""
    return _log_file


def details() -> str:
    """``" (details: <driver log file>)"`` to end a one-line error with, or ``""`` without a log file."""
    return f" (details: {_log_file})" if _log_file is not None else ""
