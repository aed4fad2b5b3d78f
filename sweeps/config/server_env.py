"""Forwarding the driver's shell variables that matter to the servers.

``backend.env`` is the documented way to set a server's environment. A user who instead
exports e.g. ``NCCL_ALGO=Ring`` in the driver's shell expects it to reach the servers; it
does locally (the in-process worker inherits the shell) but not on a pre-started Ray
cluster, whose workers have their own environment. So the driver forwards the variables
with a relevant prefix (:data:`PREFIXES`) explicitly, through the trial's env (the same
path locally and on a cluster), and logs their names once. ``backend.env`` wins over the
shell. Never forwarded: ``CUDA_VISIBLE_DEVICES`` (Ray assigns GPUs per task) and names
that look like secrets (tokens, keys, passwords: they would be stored with the launch
command), which are named in a warning instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from tasks.redact import is_secret_name

log = logging.getLogger("servesweep")

#: engine, NCCL, CUDA, Hugging Face and PyTorch settings users export to tune a server
PREFIXES = ("NCCL_", "CUDA_", "SGLANG_", "VLLM_", "HF_", "TORCH_")
NEVER = frozenset({"CUDA_VISIBLE_DEVICES"})


def shell_env(environ: Mapping[str, str], configured: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """``(forwarded, withheld)``: the relevant shell variables not set in ``backend.env``
    (``configured``) and not secret, and the names of secret-looking ones withheld."""
    fwd, withheld = {}, []
    for k, v in sorted(environ.items()):
        if not k.startswith(PREFIXES) or k in NEVER or k in configured:
            continue
        if is_secret_name(k):  # the word list that masks logs, so nothing masked there is forwarded
            withheld.append(k)
        else:
            fwd[k] = v
    return fwd, withheld


def with_shell_env(backend: dict[str, Any], environ: Mapping[str, str] | None = None,
                   knob_vars: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``backend`` (a ``backend_dict``) with the forwarded shell variables added under its
    ``env`` (``backend.env`` keys win); logs the forwarded names and warns about withheld ones.

    Args:
        knob_vars: ``{variable: knob}`` a searched knob sets (``sweeps.config.spec.knob_env_vars``):
            never forwarded, so that a level leaving one unset (``nccl_algo=default``) runs unset and
            is credited with what it ran; a warning names them."""
    env = dict(backend.get("env") or {})
    environ = os.environ if environ is None else environ
    knob_vars = dict(knob_vars or {})
    shadowed = sorted(k for k in environ if k in knob_vars and k not in env and k.startswith(PREFIXES))
    if shadowed:
        log.warning("not forwarded to the servers: %s, set by the searched knob(s) %s; unset them in the shell "
                    "(each level sets or leaves them unset itself)", ", ".join(shadowed),
                    ", ".join(sorted({knob_vars[k] for k in shadowed})))
    fwd, withheld = shell_env({k: v for k, v in environ.items() if k not in knob_vars}, env)
    if fwd:
        log.info("forwarding to the servers from the driver's shell: %s (set them in backend.env to make "
                 "them part of the sweep config)", ", ".join(fwd))
    if withheld:
        log.warning("not forwarded to the servers (look like secrets): %s; set them in the nodes' environment "
                    "(or backend.env) if the servers need them", ", ".join(withheld))
    return {**backend, "env": {**fwd, **env}}
