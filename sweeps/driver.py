"""servesweep's entry points: ``run`` (a sweep or a recheck) and ``dry_run``.

``run(cfg)`` is the whole job (``run_sweep.py`` only composes the config):

1. validate the config into a :class:`~sweeps.config.SweepSpec` (every error before Ray);
2. print the GPU-hour estimate; a recheck goes to :func:`sweeps.recheck.run_recheck`;
3. run a :class:`~sweeps.loop.Driver` through :func:`~sweeps.lifecycle.execute`: open the
   study (resumable by name; a changed search space is refused), MLflow, the rules and the
   node fingerprint; recover stale trials; enqueue the seeds; keep the executor's slots
   busy, answering gated proposals without GPU time; confirm the winner; summarise.

These are the only places that exit the process (2 = config error, 1 = sweep-level
error, 130 = interrupted). The parts live in :mod:`sweeps.study`, :mod:`sweeps.gates`,
:mod:`sweeps.executor`, :mod:`sweeps.publish` and :mod:`sweeps.loop`; their public names
are re-exported here.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeps.config import ConfigError, SweepSpec, backend_dict, load_spec
from sweeps.lifecycle import EXIT_INTERRUPTED, execute
from sweeps.loop import Driver, InFlight
from sweeps.ownership import REFUSALS
from sweeps.preflight import emulator_profile, sweep_errors
from sweeps.space import seed_configs
from sweeps.stores import new_study_name
from sweeps.study import SPACE_ATTR, SweepError, make_sampler, open_study, space_signature

__all__ = ["EXIT_INTERRUPTED", "SPACE_ATTR", "Driver", "InFlight", "SweepError", "dry_run", "emulator_profile",
           "execute", "make_sampler", "open_study", "run", "space_signature"]

log = logging.getLogger("servesweep")


def dry_run(spec: SweepSpec) -> int:
    """Render and validate launch commands without launching anything; prints them.

    Renders the baseline, the seed trials and ``dry_run_sample`` sampled feasible configs
    (default: the sweep's trial budget), and validates every argv in one batch with the engine's
    own parser (``Backend.validate``: SGLang in-process, ``backend.python`` or the contract venv;
    vLLM in ``backend.python``).

    Returns:
        0 when every command is valid, 2 when the engine's parser rejected any.
    """
    from tasks.backends import get_backend
    from tasks.trial import launch_command

    be = get_backend(spec.backend.kind)
    engine = {"sglang": "SGLang", "vllm": "vLLM"}.get(be.engine, be.engine)

    t0 = time.monotonic()
    space = spec.space
    sw = spec.sweep
    configs = seed_configs(space, sw.baseline, sw.seed_trials, sw.seed_each_level_of) if sw.mode == "search" else []
    n = spec.dry_run_sample or spec.sweep.budget.trials or 50
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=spec.sweep.sampler.seed), direction="maximize")
    target = len(configs) + n
    for _ in range(n * 20):
        if len(configs) >= target:
            break
        t = study.ask()
        cfg = space.sample(t)
        study.tell(t, state=TrialState.PRUNED)
        if not space.violated(cfg) and cfg not in configs:
            configs.append(cfg)
    rendered = []
    for cfg in configs:
        argv, env, _ = be.render(cfg, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
        rendered.append(([sys.executable if a == "{python}" else a for a in argv], env))
    checked: list[dict[str, Any]] | None = None
    if be.launches_server:
        checked = be.validate([a for a, _ in rendered], backend_dict(spec))
        if checked is None:
            print(f"warning: commands NOT validated: {engine}'s parser is not available here. Set "
                  f"backend.python=<interpreter that has {engine}>, or build its env (`make contract-env` for "
                  f"SGLang, `make vllm-env` for vLLM).", file=sys.stderr)
    bad = 0
    for i, (argv, env) in enumerate(rendered):
        status = "rendered"
        if checked is not None:
            ok = checked[i].get("ok")
            status = "valid" if ok else f"REJECTED by {engine}'s parser: {checked[i].get('error')}"
            bad += not ok
        print(f"[{status}] {launch_command(argv, env)}")
    what = f"validated with {engine}'s parser" if checked is not None else "not validated"
    print(f"{len(rendered)} launch commands rendered ({what}), {bad} rejected, in {time.monotonic() - t0:.1f} s; "
          f"nothing was launched (dry_run=true).")
    return 2 if bad else 0


def run(cfg: Any) -> float | None:
    """Run the sweep described by the composed Hydra config; returns the best objective.

    Exits the process with code 2 on a config error (nothing started; also a study held by
    another live driver, or MLflow denying EDIT on the experiment), 1 on a sweep-level
    error, 130 after Ctrl-C (state saved; the same command resumes).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = load_spec(cfg)
    except ConfigError as e:
        print(f"servesweep: invalid configuration, nothing was started:\n{e}", file=sys.stderr)
        sys.exit(2)
    if spec.dry_run:
        sys.exit(dry_run(spec))
    study_name = spec.study
    if spec.new_study and not spec.study_name:
        study_name = new_study_name(spec.sweep.name)
    from sweeps.estimate import estimate_gpu_hours

    print(estimate_gpu_hours(spec)[1], flush=True)
    if spec.sweep.mode == "recheck":
        from sweeps.recheck import run_recheck

        return run_recheck(spec)
    drv = Driver(spec, study_name)
    try:
        best = execute(drv).finished_best
    except REFUSALS as e:  # another live driver holds the study, MLflow denies EDIT: configuration errors
        print(f"servesweep: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("servesweep: aborted; trials still running are recovered (failed, re-queued) by the next run of the "
              "same command", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except sweep_errors() as e:
        print(f"servesweep: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 1))
    except optuna.exceptions.StorageInternalError as e:
        print(f"servesweep: the Optuna storage {spec.optuna_storage} failed ({e.__cause__ or e}); finished trials "
              f"are kept there. Fix the store and run the same command again to resume.", file=sys.stderr)
        sys.exit(1)
    if drv.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    return best.value if best else None
