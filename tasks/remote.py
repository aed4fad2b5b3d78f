"""Ray remote wrappers of the node-side functions, with options from the sweep config.

Trial tasks hold ``num_gpus = TP`` logical GPUs and ``num_cpus=0`` (the default 1 would
cap a 2-core machine at 2 trials); ``max_calls=0`` keeps the worker between tasks (the
default recycles it after every GPU task: ~280 ms vs 14 ms); ``max_retries=0``: the
driver decides retries. Measured on our 2-core machines.
"""

from __future__ import annotations

from typing import Any

import ray


def _options(spec: Any, num_gpus: float) -> dict[str, Any]:
    opts: dict[str, Any] = dict(num_gpus=num_gpus, num_cpus=0, max_retries=0)
    res = dict(spec.ray.resources)
    if spec.node.accelerator_type:
        opts["accelerator_type"] = spec.node.accelerator_type
    if res:
        opts["resources"] = res
    return opts


def trial_task(spec: Any) -> Any:
    """``run_trial`` as a Ray remote function holding ``spec.gpus_per_trial`` GPUs."""
    from tasks.trial import run_trial

    return ray.remote(max_calls=0)(run_trial).options(**_options(spec, spec.gpus_per_trial))


def fingerprint_task(spec: Any) -> Any:
    """A GPU-less task that reports the node's environment fingerprint."""
    from tasks.trial import node_fingerprint

    return ray.remote(max_calls=0)(node_fingerprint).options(**_options(spec, 0))
