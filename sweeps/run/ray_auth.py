"""Joining a team's Ray cluster: token-auth problems explained, and the code shipped to nodes.

Token authentication (Ray 2.60, measured against ``ray start`` on loopback): a cluster
started with ``RAY_AUTH_MODE=token`` rejects a driver that lacks the variable or the token;
``ray.init(address=...)`` retries for ~20 s, then raises ``ConnectionError("Failed to connect
to Ray cluster at ...")`` whose cause chain holds ``ray.exceptions.AuthenticationError``
("InvalidAuthToken: Authentication token is missing or incorrect"). With the variable but no
token anywhere it raises ``AuthenticationError`` ("... enabled but no authentication token was
found") at once. :func:`explain_init_error` turns either into one message naming
``RAY_AUTH_MODE`` and the fix.

Code shipping: :func:`code_runtime_env` is the Ray ``runtime_env`` that uploads the repo
(``working_dir``) to every node, so a GPU node needs Python, Ray and the engine, not a
servesweep checkout. Ray zips the directory honouring ``.gitignore`` (and ``.rayignore``)
plus ``excludes``, caps the package at 512 MiB (``GCS_STORAGE_MAX_SIZE``, the gRPC message
limit), warns on files > 10 MiB, and caches it per content hash on each node. Our repo with
the venvs and local stores excluded is ~0.5 MiB zipped (measured by tests/test_team.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Never shipped: venvs, local stores, caches, what only the driver or developers use (the
#: failure corpus's labelled logs are scored by benchmarks and read by the driver's knowledge
#: checks; a trial's classifier needs the signature table, never the corpus).
#: Patterns follow .gitignore syntax, relative to the working_dir (Ray's ``excludes``).
CODE_EXCLUDES = [
    ".git", ".venv", ".contract-venv", ".vllm-venv", "*.lock", "mlflow/", "outputs/", "multirun/", "findings/",
    "benchmarks/", "tests/", "docs/", "tasks/failure_corpus/*/", "**/__pycache__", "*.egg-info", ".hypothesis",
    ".pytest_cache", ".ruff_cache", ".mypy_cache",
]

#: What ``tasks/`` imports on a node beyond Ray itself (Ray's own ``[default]`` extra brings
#: aiohttp and psutil; the rest must be installed on each node or shipped with ``pip``).
TRIAL_REQUIREMENTS = ["psutil>=5.9", "httpx>=0.27", "aiohttp>=3.9", "pyyaml>=6", "numpy>=1.26", "nvidia-ml-py>=12"]

_AUTH_MARKERS = ("InvalidAuthToken", "Unauthenticated", "authentication token", "Token authentication")


def _auth_cause(exc: BaseException) -> BaseException | None:
    """The first authentication error in ``exc``'s cause/context chain (or None)."""
    try:
        from ray.exceptions import AuthenticationError
    except ImportError:  # an older Ray has no token authentication
        AuthenticationError = ()  # noqa: N806
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if (AuthenticationError and isinstance(e, AuthenticationError)) or any(m in str(e) for m in _AUTH_MARKERS):
            return e
        e = e.__cause__ or e.__context__
    return None


def auth_fix(address: str | None) -> str:
    """What to do about a token-auth mismatch with the cluster at ``address``."""
    mode = os.environ.get("RAY_AUTH_MODE")
    have = [n for n in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH") if os.environ.get(n)]
    default = Path.home() / ".ray" / "auth_token"
    where = ", ".join(have) or (f"{default}" if default.exists() else "none found")
    return (f"Ray at ray.address={address!r} requires token authentication (RAY_AUTH_MODE=token) and rejected "
            f"this driver (RAY_AUTH_MODE={mode or 'unset'}; token: {where}). Fix: export RAY_AUTH_MODE=token on the "
            f"driver (and on every node), and give it the cluster's token: RAY_AUTH_TOKEN=<token>, "
            f"RAY_AUTH_TOKEN_PATH=<file>, or ~/.ray/auth_token (`ray get-auth-token` on the head prints it)")


def explain_init_error(exc: BaseException, address: str | None) -> str | None:
    """The message (naming ``RAY_AUTH_MODE`` and the fix) when ``exc``, raised by
    ``ray.init``, comes from token authentication; None otherwise. A lower layer than
    :mod:`sweeps.run.cluster`, which raises it as ``RayUnavailable``."""
    if _auth_cause(exc) is None:
        return None
    return auth_fix(address)


def is_auth_warning(line: str) -> bool:
    """True for one of the log lines Ray's C++ core writes to stderr while a cluster rejects the
    driver's token, e.g. ``[... W ... gcs_client.cc:...] ... InvalidAuthToken ...`` (about ten
    in ``ray.init``'s ~20 s of retries, measured with Ray 2.60)."""
    return any(m in line for m in _AUTH_MARKERS)


class AuthWarnings:
    """What :func:`auth_warnings_filtered` saw: ``count`` auth warnings dropped, ``printed`` the fix line."""

    def __init__(self) -> None:
        self.count = 0
        self.printed = False


@contextlib.contextmanager
def auth_warnings_filtered(address: str | None) -> Iterator[AuthWarnings]:
    """Filter this process's stderr (file descriptor 2, where Ray's C++ core logs) for the block:
    at the first token-auth warning (:func:`is_auth_warning`) print the fix (:func:`auth_fix`) once,
    as one line, and drop every auth warning after it; every other line passes unchanged.

    Only for joining a cluster (``ray.init(address=...)`` starts no process that would inherit
    the pipe). Yields an :class:`AuthWarnings`.
    """
    seen = AuthWarnings()
    saved = os.dup(2)
    rfd, wfd = os.pipe()
    os.dup2(wfd, 2)
    os.close(wfd)

    def pump() -> None:
        with os.fdopen(rfd, "rb") as pipe, contextlib.suppress(OSError):
            for raw in iter(pipe.readline, b""):
                if is_auth_warning(raw.decode(errors="replace")):
                    seen.count += 1
                    if not seen.printed:
                        seen.printed = True
                        os.write(saved, f"servesweep: {auth_fix(address)}\n".encode())
                    continue
                os.write(saved, raw)

    t = threading.Thread(target=pump, name="ray-auth-filter", daemon=True)
    t.start()
    try:
        yield seen
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the pump reads EOF and ends
        t.join(timeout=5.0)
        if not t.is_alive():  # else a process that inherited the pipe still writes: the pump keeps ``saved``
            os.close(saved)


def code_runtime_env(root: Path | None = None, pip: list[str] | None = None,
                     excludes: list[str] | None = None) -> dict:
    """The ``runtime_env`` that ships servesweep's code (and optionally its trial-side
    dependencies) to every node.

    Args:
        root: the repo to ship (default: this checkout).
        pip: requirements Ray installs in a per-job virtualenv on each node (needs a package
            index on the nodes; first use per node takes minutes). None: the nodes already have
            :data:`TRIAL_REQUIREMENTS`.
        excludes: extra .gitignore-style patterns (added to :data:`CODE_EXCLUDES`).
    Returns:
        ``{"working_dir": str, "excludes": [...], ["pip": [...]]}``; merge ``env_vars`` into it.
    Raises:
        ValueError: ``root`` has no ``tasks/`` package (nothing to ship).
    """
    root = Path(root or REPO_ROOT).resolve()
    if not (root / "tasks" / "__init__.py").is_file():
        raise ValueError(f"{root} has no tasks/ package: not a servesweep checkout")
    env: dict = {"working_dir": str(root), "excludes": [*CODE_EXCLUDES, *(excludes or [])]}
    if pip:
        env["pip"] = list(pip)
    return env
