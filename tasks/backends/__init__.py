"""Backends: how one engine turns a knob set into a launch, validates it, serves and is measured.

One module per backend (``tasks/backends/<kind>.py``, ``kind`` = ``backend.kind`` of
``conf/backend/*.yaml``), each defining ``BACKEND``: an instance of
:class:`tasks.backends.base.Backend`. Adding a backend = one module here + one
``conf/backend/<name>.yaml``; nothing else asks which backend it is.

Stdlib only at import time (``tasks.sglang_cli`` runs inside the contract venv and imports
the flag table from this package).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.backends.base import Backend

_DEFINES_BACKEND = re.compile(r"^BACKEND\s*[:=]", re.MULTILINE)


@cache
def available_backends() -> tuple[str, ...]:
    """The backend kinds this package provides, sorted (e.g. ``("emulated", "instant", "sglang")``).

    A backend is a module of this package that defines ``BACKEND`` at top level; helpers
    (``base``, ``lifecycle``, ``flagtable``, ...) do not. Found by reading the sources, so
    listing never imports a backend (a broken one fails only when it is asked for).
    """
    here = Path(__file__).resolve().parent
    kinds = []
    for m in pkgutil.iter_modules([str(here)]):
        if m.ispkg or m.name.startswith("_"):
            continue
        src = (here / f"{m.name}.py").read_text(encoding="utf-8", errors="replace")
        if _DEFINES_BACKEND.search(src):
            kinds.append(m.name)
    return tuple(sorted(kinds))


def check_kind(kind: str) -> str:
    """``kind`` itself when it is a backend kind (a pydantic ``AfterValidator`` for ``backend.kind``).

    Raises:
        ValueError: ``kind`` is not one of :func:`available_backends` (names them).
    """
    if kind not in available_backends():
        raise ValueError(f"unknown backend kind {kind!r}; available: {', '.join(available_backends())}")
    return kind


def get_backend(kind: str) -> Backend:
    """The backend for ``backend.kind`` (imports ``tasks.backends.<kind>``; its ``BACKEND``).

    Raises:
        ValueError: ``kind`` is not one of :func:`available_backends` (the message names
            ``backend.kind`` and the available kinds).
    """
    if kind not in available_backends():
        raise ValueError(f"backend.kind={kind!r} is not a backend; available: {', '.join(available_backends())} "
                         f"(one module per backend in tasks/backends/)")
    return importlib.import_module(f"tasks.backends.{kind}").BACKEND
