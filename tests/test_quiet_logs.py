"""Quiet failure paths: errors of the store libraries that the driver handles, and the driver's
own DEBUG details, reach the driver log file only; the console keeps the driver's lines."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from sweeps.app import logs


@pytest.fixture
def hydra_like_logging(tmp_path):
    """The root logger as Hydra's job logging leaves it: a console handler and a FileHandler."""
    root = logging.getLogger()
    names = ("servesweep", *logs._OWN_HANDLERS)
    saved = (root.handlers[:], root.level, {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate,
                                                logging.getLogger(n).level) for n in names})
    console = logging.StreamHandler(io.StringIO())  # the console (Hydra's is stdout)
    file = logging.FileHandler(tmp_path / "run_sweep.log")
    root.handlers = [console, file]
    root.setLevel(logging.INFO)
    try:
        yield tmp_path / "run_sweep.log", console.stream
    finally:
        file.close()
        root.handlers, lvl, libs = saved[0], saved[1], saved[2]
        root.setLevel(lvl)
        for n, (hs, prop, level) in libs.items():
            lg = logging.getLogger(n)
            lg.handlers, lg.propagate = hs, prop
            lg.setLevel(level)
        logs._log_file = None


def test_handled_library_errors_go_to_the_log_file_not_the_console(hydra_like_logging):
    log_path, console = hydra_like_logging
    path = logs.setup()
    assert path == log_path
    assert logs.setup() == path  # idempotent: no second filter, no duplicate lines
    logging.getLogger("mlflow.store.db.utils").error("Traceback (most recent call last): sqlalchemy stack")
    logging.getLogger("sqlalchemy.engine.Engine").warning("[SQL: INSERT INTO runs ...]")
    logging.getLogger("servesweep").debug("store failure (disk is full): stopping the sweep")
    logging.getLogger("servesweep").warning("trial 3: retrying")
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.flush()
    err = console.getvalue()
    assert "Traceback" not in err and "[SQL" not in err and "stopping the sweep" not in err, err
    assert err.count("trial 3: retrying") == 1
    text = path.read_text()
    for line in ("sqlalchemy stack", "[SQL: INSERT INTO runs", "disk is full", "trial 3: retrying"):
        assert text.count(line) == 1, (line, text)
    assert logs.details() == f" (details: {path})"


def test_without_a_log_file_nothing_is_hidden():
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [logging.StreamHandler(sys.stderr)]
    try:
        assert logs.setup() is None and logs.details() == ""
        assert not any(isinstance(f, logs._NotLibraries) for f in root.handlers[0].filters)
    finally:
        root.handlers = saved
