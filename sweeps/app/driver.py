"""servesweep's entry points: ``run`` (a sweep or a recheck) and ``dry_run``.

``run(cfg)`` is the whole job (``run_sweep.py`` only composes the config and exits with the code):

1. validate the config into a :class:`~sweeps.config.spec.SweepSpec` (every error before Ray);
2. print the GPU-hour estimate; a recheck goes to :func:`sweeps.app.recheck.run_recheck`;
3. run a :class:`~sweeps.app.sweep.Driver` through :func:`~sweeps.app.lifecycle.execute`: open the
   study (resumable by name; a changed search space is refused), MLflow, the rules and the
   node fingerprint; recover stale trials; enqueue the seeds; keep the executor's slots
   busy, answering gated proposals without GPU time; confirm the winner; summarise.

Nothing here exits the process: errors are the kinds of :mod:`sweeps.errors`, which the entry
point (``run_sweep.py``) turns into the exit code of its table; a sweep that measured nothing
raises :class:`~sweeps.errors.NothingMeasured` (:mod:`sweeps.publish.outcome`). The parts live in
:mod:`sweeps.store.study`, :mod:`sweeps.search.gates`, :mod:`sweeps.run.executor`,
:mod:`sweeps.publish.outputs` and :mod:`sweeps.search.loop`; their public names are re-exported here.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeps.app.lifecycle import execute
from sweeps.app.sweep import Driver
from sweeps.config.objective import ObjectiveSet
from sweeps.config.space import seed_configs
from sweeps.config.spec import ConfigError, SweepSpec, backend_dict, load_spec
from sweeps.errors import EXIT_INTERRUPTED, Interrupted, NothingMeasured, SweepError
from sweeps.publish.outcome import sweep_outcome
from sweeps.run.preflight import emulator_profile
from sweeps.run.stores import new_study_name
from sweeps.search.loop import InFlight
from sweeps.store.records import TrialRecord, load_records, value_of
from sweeps.store.study import SPACE_ATTR, make_sampler, open_study, space_signature

__all__ = ["EXIT_INTERRUPTED", "SPACE_ATTR", "Driver", "InFlight", "SweepError", "dry_run", "emulator_profile",
           "execute", "make_sampler", "objective_value", "open_study", "run", "space_signature"]

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
    engine = be.label

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


def task_overrides() -> list[str]:
    """This run's command-line overrides (Hydra's ``overrides.task``), secrets masked; [] when the
    driver runs outside Hydra (a script, a test)."""
    from hydra.core.hydra_config import HydraConfig

    from sweeps.app.hydra_outputs import masked_override

    if not HydraConfig.initialized():
        return []
    return [masked_override(str(o)) for o in HydraConfig.get().overrides.task]


def _redact_hydra_files() -> None:
    """Mask secrets in this run's ``.hydra/*.yaml`` (:mod:`sweeps.app.hydra_outputs`); nothing when
    the driver runs outside Hydra (a script, a test)."""
    from hydra.core.hydra_config import HydraConfig

    from sweeps.app.hydra_outputs import redact_run_dir

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    if hc.output_subdir is None:
        return
    try:
        redact_run_dir(Path(hc.runtime.output_dir) / hc.output_subdir)
    except OSError as e:
        log.warning("could not mask secrets in %s: %s", hc.runtime.output_dir, e)


def run(cfg: Any, driver_cls: type[Driver] = Driver) -> float | tuple[float | None, ...] | None:
    """Run the sweep described by the composed Hydra config; returns the objective's value.

    Returns:
        The best config's value of the sweep's objective (``sweep.objective``, e.g. decode tok/s,
        or TTFT p99 in ms when that is the objective), as ranked in the study; for a
        multi-objective study (``sweep.objective`` a list) the tuple of the best config's values,
        one per objective in the order given (None for a metric it lacks), ranked by the first.
        A recheck returns its best re-measured value (or None); a dry run returns None.
        This is what a Hydra sweeper or a script optimises.
    Raises:
        The kinds of :mod:`sweeps.errors`, which the entry point turns into its exit code:
        ConfigurationError (2: a config error, nothing started; also a study held by another live
        driver, MLflow denying EDIT, a half-created store), NothingMeasured (3: the sweep ran and no
        config ranks; its message is the one-line reason), SweepError (1: a sweep-level error),
        Interrupted (130: Ctrl-C, state saved; the same command resumes).
    """
    from sweeps.app import logs

    logs.setup()  # handled library errors go to the driver log file, never the console
    _redact_hydra_files()
    try:
        spec = load_spec(cfg)
    except ConfigError as e:
        raise ConfigError(f"invalid configuration, nothing was started:\n{e}") from None
    if spec.dry_run:
        if dry_run(spec):
            raise ConfigError("dry_run: the engine's parser rejected launch commands (marked REJECTED above); "
                              "nothing was launched")
        return None
    if spec.new_study and not spec.study_name:  # the study actually run names its findings document too
        spec = spec.model_copy(update={"study_name": new_study_name(spec.sweep.name)})
    from sweeps.app.estimate import estimate_gpu_hours

    launches = None
    if spec.sweep.mode == "recheck":  # its launches are the source's dead ends, not the budget
        from sweeps.app.recheck import planned_launches

        launches = planned_launches(spec)
    print(estimate_gpu_hours(spec, launches=launches)[1], flush=True)
    try:
        if spec.sweep.mode == "recheck":
            from sweeps.app.recheck import run_recheck

            return run_recheck(spec)
        drv = driver_cls(spec, spec.study)
        drv.run_overrides = task_overrides()
        drv = execute(drv)
    except KeyboardInterrupt:  # a second Ctrl-C
        raise Interrupted("aborted; trials still running are recovered (failed, re-queued) by the next run of the "
                          "same command") from None
    except optuna.exceptions.StorageInternalError as e:
        from sweeps.store.retry import brief

        log.debug("the Optuna storage failed", exc_info=True)
        raise SweepError(f"the Optuna storage {spec.optuna_storage} failed ({brief(e)}); finished trials are kept "
                         f"there. Fix the store and run the same command again to resume.") from None
    if drv.interrupted:
        raise Interrupted("")
    b = spec.sweep.budget.trials
    if b is not None and drv.launched_before >= b and spec.sweep.mode == "search":
        # a finished study run again: the summary above is the earlier run's, and overrides that
        # shape the search (the space, the sampler, the approaches) changed nothing
        print(f"note: study {drv.study_name!r} had already spent its trial budget ({b} launched) in an "
              f"earlier run: no search trial was launched this time, so overrides of the search (space, "
              f"sampler, approaches) changed nothing. new_study=true starts a fresh study with them; a higher "
              f"sweep.budget.trials continues this one.", file=sys.stderr, flush=True)
    outcome = sweep_outcome(load_records(drv.study), spec, drv.study_name, drv.stop_reason)
    if outcome.failed:
        raise NothingMeasured(outcome.line)
    return objective_value(drv.finished_best, spec.objective_set)


def objective_value(best: TrialRecord | None, objectives: ObjectiveSet) -> float | tuple[float | None, ...] | None:
    """``best``'s value of the objective (:func:`run`'s return): a float, a tuple of one value per
    objective for a multi-objective study, or None without a best config."""
    if best is None:
        return None
    if objectives.multi:
        return tuple(o.value(best.metrics) for o in objectives.objectives)
    return value_of(best, objectives.primary)
