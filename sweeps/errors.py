"""How a sweep ends: the project's exception kinds and the one table from exception to exit code.

This module is the ground floor of :mod:`sweeps`: it imports nothing of the package, and every
floor above may raise its kinds. Code raises; only an entry point (``run_sweep.py``, the
``main`` of a CLI module) turns an exception into an exit code, through :func:`exit_code`,
so a script reading the exit status and the README's table (``README.md``, "Exit codes") agree.

The kinds, most specific first (:data:`EXIT_CODES` is checked in this order):

* :class:`Interrupted` (and a second Ctrl-C, ``KeyboardInterrupt``): 130, the shell's code for
  SIGINT (128 + 2). The study is saved; the same command resumes.
* :class:`NothingMeasured`: 3. The sweep ran, but no config was measured (every launch failed,
  stalled or timed out, or every proposal was answered without a launch). Its MLflow parent run
  is FAILED; the summary says why in one line.
* :class:`ConfigurationError`: 2. The configuration is wrong or refused (a field, a study held by
  another driver, MLflow denying EDIT, a half-created, full or unwritable store): fix it and run
  again.
* :class:`SweepError`: 1. A sweep-level problem (unreachable Ray, a changed search space, the
  study lease lost).

A class may be several kinds (e.g. ``StudyInUse(ConfigurationError, SweepError)``): the first
row of :data:`EXIT_CODES` it matches decides.
"""

from __future__ import annotations

__all__ = ["EXIT_CODES", "EXIT_CONFIG", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOTHING_MEASURED", "EXIT_OK",
           "ConfigurationError", "Interrupted", "NothingMeasured", "SweepError", "exit_code"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_NOTHING_MEASURED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C'd command


class SweepError(RuntimeError):
    """A sweep-level problem (unreachable Ray, changed space, lost lease, ...): exit 1."""


class ConfigurationError(Exception):
    """A configuration error or refusal, found before (or instead of) measuring: exit 2.
    ``str(err)`` names the field or the refusing party and the fix."""


class NothingMeasured(SweepError):
    """The sweep ran to its end but measured no config: exit 3. ``str(err)`` is the one-line reason
    (the failure classes and the next step)."""


class Interrupted(SweepError):
    """Stopped by Ctrl-C or SIGTERM, state saved (the same command resumes): exit 130.
    ``str(err)`` may be empty (the stop was already reported)."""


#: (exception kind, exit code, meaning): the one table. Checked in order: the first kind an
#: exception is an instance of decides. Exit 0 is a sweep that measured at least one config.
EXIT_CODES: tuple[tuple[type[BaseException], int, str], ...] = (
    (Interrupted, EXIT_INTERRUPTED, "interrupted (Ctrl-C, SIGTERM); state saved, the same command resumes"),
    (KeyboardInterrupt, EXIT_INTERRUPTED, "aborted by a second Ctrl-C; running trials are recovered on resume"),
    (NothingMeasured, EXIT_NOTHING_MEASURED, "the sweep ran but measured no config (the summary says why)"),
    (ConfigurationError, EXIT_CONFIG, "configuration error or refusal; fix the named field or party"),
    (SweepError, EXIT_ERROR, "sweep-level error (Ray, store, changed space, lease lost)"),
)


def exit_code(e: BaseException) -> int | None:
    """The exit code of ``e`` per :data:`EXIT_CODES`, or None when ``e`` is none of the project's
    kinds (an unexpected error: the entry point lets it through, with its traceback)."""
    return next((code for kind, code, _ in EXIT_CODES if isinstance(e, kind)), None)
