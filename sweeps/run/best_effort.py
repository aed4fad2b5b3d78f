"""Best-effort steps: publishing and bookkeeping that must never stop a sweep.

:func:`best_effort` runs a step and logs its failure; only a store that stayed locked past its retry
budget or an MLflow store found broken stop the sweep (they are raised).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from sweeps.store.retry import StoreWriteError
from sweeps.store.tracking import MlflowStoreBroken

log = logging.getLogger("servesweep")


@contextlib.contextmanager
def best_effort(what: str, level: int = logging.ERROR, *, store_write: bool = False) -> Iterator[None]:
    """Run a publishing step; a failure is logged (``could not <what>``) at ``level``, never
    raised, except a store that stayed locked past the retry budget (:class:`StoreWriteError`)
    or a broken MLflow store (:class:`MlflowStoreBroken`): the sweep stops on those.
    ``store_write``: the step writes the sweep's own store (a failure rule, a retired rule), so
    a full or read-only store is raised too (:func:`sweeps.run.graceful.store_failures` stops
    the sweep with exit 2, as for any other store write) instead of logged at each trial.

    An ``ImportError`` is a broken install or a bug, never a routine failure: it is logged at
    ERROR with its traceback whatever ``level`` says, so confirmation, findings or plots are
    never skipped without a word.
    """
    try:
        yield
    except ImportError:
        log.exception("could not %s: a module failed to import (broken install?)", what)
    except (StoreWriteError, MlflowStoreBroken):
        raise
    except Exception as e:  # noqa: BLE001 - publishing never stops the sweep
        if store_write:
            from sweeps.run.graceful import store_cause  # graceful imports the stores: not at module load

            if store_cause(e) is not None:
                raise
        log.log(level, "could not %s: %s", what, e)
