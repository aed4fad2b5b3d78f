"""Backends: how one engine turns a knob set into a launch, validates it, serves and is measured.

One module per backend (``tasks/backends/<kind>.py``, or a package ``tasks/backends/<kind>/``
whose ``backend.py`` holds it; ``kind`` = ``backend.kind`` of ``conf/backend/*.yaml``), each
defining ``BACKEND``: an instance of
:class:`tasks.backends.base.Backend`. Adding a backend = one module here + one
``conf/backend/<name>.yaml``; nothing else asks which backend it is (what the driver needs to
know, it reads from the ``Backend``'s declarations).

A backend may also live outside the repository: every directory of this package's
``__path__`` is searched, and :data:`PATH_ENV` (directories separated by ``os.pathsep``) is
appended to it, so ``SERVESWEEP_BACKEND_PATH=/opt/mybackends`` with ``/opt/mybackends/foo.py``
(importable as ``tasks.backends.foo``) and ``hydra.searchpath=[file:///opt/myconf]`` with
``/opt/myconf/backend/foo.yaml`` add ``backend=foo`` without touching the repository.

Stdlib only at import time (``tasks.backends.sglang.cli`` runs inside the contract venv and imports
the flag table from this package).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.backends.base import Backend

_DEFINES_BACKEND = re.compile(r"^BACKEND\s*[:=]", re.MULTILINE)
#: environment variable naming extra directories of backend modules (``os.pathsep``-separated)
PATH_ENV = "SERVESWEEP_BACKEND_PATH"


def _search_path() -> tuple[str, ...]:
    """This package's ``__path__`` with the :data:`PATH_ENV` directories appended to it (so a
    backend module found there imports as ``tasks.backends.<kind>``)."""
    for d in os.environ.get(PATH_ENV, "").split(os.pathsep):
        if d and str(Path(d).resolve()) not in __path__:
            __path__.append(str(Path(d).resolve()))
    return tuple(__path__)


def available_backends() -> tuple[str, ...]:
    """The backend kinds this package provides, sorted (e.g. ``("emulated", "instant", "sglang")``).

    A backend is a module of this package (any directory of its ``__path__``, see the module
    docstring) that defines ``BACKEND`` at top level; helpers (``base``, ``lifecycle``,
    ``flagtable``, ...) do not. Found by reading the sources, so listing never imports a
    backend (a broken one fails only when it is asked for); cached per search path.
    """
    return _scan(_search_path())


@cache
def _scan(dirs: tuple[str, ...]) -> tuple[str, ...]:
    kinds = set()
    for d in dirs:
        for m in pkgutil.iter_modules([d]):
            if m.name.startswith("_"):
                continue
            path = _backend_source(Path(d), m.name, m.ispkg)
            if path.is_file() and _DEFINES_BACKEND.search(path.read_text(encoding="utf-8", errors="replace")):
                kinds.add(m.name)
    return tuple(sorted(kinds))


def _backend_source(here: Path, name: str, is_pkg: bool) -> Path:
    """The file that would define ``BACKEND`` for ``name``: ``<name>.py``, or ``<name>/backend.py``."""
    return here / name / "backend.py" if is_pkg else here / f"{name}.py"


def _backend_module(kind: str) -> str:
    """The importable module that defines ``BACKEND`` for ``kind`` (the first directory of the
    search path that has it wins, as in Python's own import)."""
    for d in _search_path():
        if (Path(d) / kind / "backend.py").is_file():
            return f"tasks.backends.{kind}.backend"
        if (Path(d) / f"{kind}.py").is_file():
            return f"tasks.backends.{kind}"
    return f"tasks.backends.{kind}"


def check_kind(kind: str) -> str:
    """``kind`` itself when it is a backend kind (a pydantic ``AfterValidator`` for ``backend.kind``).

    Raises:
        ValueError: ``kind`` is not one of :func:`available_backends` (names them).
    """
    if kind not in available_backends():
        raise ValueError(f"unknown backend kind {kind!r}; available: {', '.join(available_backends())}")
    return kind


def get_backend(kind: str) -> Backend:
    """The backend for ``backend.kind`` (imports ``tasks.backends.<kind>`` or
    ``tasks.backends.<kind>.backend``; its ``BACKEND``).

    Raises:
        ValueError: ``kind`` is not one of :func:`available_backends` (the message names
            ``backend.kind`` and the available kinds).
    """
    if kind not in available_backends():
        raise ValueError(f"backend.kind={kind!r} is not a backend; available: {', '.join(available_backends())} "
                         f"(one module per backend in tasks/backends/)")
    return importlib.import_module(_backend_module(kind)).BACKEND


def emulated_engines() -> frozenset[str]:
    """The engines an emulated backend speaks (``Backend.engine`` of every ``Backend.emulated``
    one, e.g. ``{"sglang"}``): the flags and API the emulator's model takes, so the launches of
    any backend of such an engine can be priced by it.

    Raises:
        ImportError: a backend module is broken (they are all imported).
    """
    return frozenset(be.engine for be in map(get_backend, available_backends()) if be.emulated)


def engines() -> tuple[str, ...]:
    """Every engine a backend speaks (``Backend.engine``), sorted (e.g. ``("sglang", "vllm")``)."""
    return tuple(sorted({get_backend(k).engine for k in available_backends()}))


def engine_fingerprint_keys() -> tuple[str, ...]:
    """The fingerprint fields carrying an engine's version (``Backend.fingerprint_key`` of every
    backend that declares one), sorted (e.g. ``("sglang", "vllm")``)."""
    return tuple(sorted({k for k in (get_backend(b).fingerprint_key for b in available_backends()) if k}))
