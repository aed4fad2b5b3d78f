"""``python -m sweeps.report <sweep>``: rebuild the findings document and the plots from storage
alone (no Ray), then re-log them to the MLflow parent run. The plots are
:mod:`sweeps.publish.plots`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import optuna

from sweeps.errors import EXIT_CONFIG, ConfigurationError, exit_code
from sweeps.publish.plots import write_plots
from sweeps.store import records as trial_records


def spec_for_study(study_name: str, store_dir: str | None, overrides: list[str], storage: str | None = None) -> Any:
    """Compose the sweep config the study was run with (its ``sweep``/``node``/``model``/
    ``backend`` user attrs pick the Hydra groups) plus ``overrides``, read from ``storage`` (any
    Optuna URL), else ``tracking.optuna_storage=`` in ``overrides``, else ``<store_dir>/optuna.db``.

    Raises:
        ConfigurationError: no storage, an unreadable one, no such study, or a search space
            that differs from the config (``python -m sweeps.report`` exits 2 with the message).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sweeps.config.spec import REPO_ROOT, load_spec

    store = Path(store_dir).resolve() if store_dir else REPO_ROOT / "mlflow"
    pre = "tracking.optuna_storage="
    storage = storage or next((o[len(pre):] for o in overrides if o.startswith(pre)), f"sqlite:///{store / 'optuna.db'}")
    overrides = [o for o in overrides if not o.startswith(pre)]
    if storage == f"sqlite:///{store / 'optuna.db'}" and not (store / "optuna.db").exists():
        raise ConfigurationError(f"no Optuna storage at {store / 'optuna.db'}; pass --store-dir or --storage URL")
    try:
        summaries = optuna.get_all_study_summaries(storage)
    except Exception as e:  # noqa: BLE001
        raise ConfigurationError(f"cannot read {storage}: {e}") from None
    match = next((s for s in summaries if s.study_name == study_name), None)
    if match is None:
        names = sorted(s.study_name for s in summaries)
        raise ConfigurationError(f"no study {study_name!r} in {storage}; studies: {names}")
    attrs = match.user_attrs
    groups = [f"{g}={attrs[g]}" for g in ("sweep", "node", "model", "backend") if attrs.get(g)]
    conf_dir = REPO_ROOT / "conf"
    groups = [g for g in groups if (conf_dir / g.split("=")[0] / f"{g.split('=')[1]}.yaml").exists()]
    from sweeps.search.coverage import TRIAL_BUDGET_ATTR

    budget = "sweep.budget.trials="
    if TRIAL_BUDGET_ATTR in attrs and not any(o.startswith(budget) for o in overrides):
        # the budget the study last ran under (the quota and the findings' counts are owed by it),
        # not the sweep YAML's default
        groups.append(f"{budget}{'null' if attrs[TRIAL_BUDGET_ATTR] is None else int(attrs[TRIAL_BUDGET_ATTR])}")
    ov = [*groups, f"tracking.store_dir={store}", f"study_name={study_name}", f"{pre}{storage}", *overrides]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose("config", overrides=ov)
    finally:
        GlobalHydra.instance().clear()
    spec = load_spec(cfg)
    from sweeps.store.study import SPACE_ATTR, space_signature

    if attrs.get(SPACE_ATTR) and attrs[SPACE_ATTR] != space_signature(spec):
        raise ConfigurationError(f"study {study_name!r} was run with another search space than "
                                 f"conf/sweep/{attrs.get('sweep')}.yaml; pass the same sweep.* overrides as the sweep")
    return spec


def rebuild(spec: Any, study_name: str, log_to_mlflow: bool = True) -> tuple[Path, list[Path]]:
    """Rewrite the findings document and the plots from storage; re-log them to the MLflow
    parent run when it exists. Returns ``(findings path, plot paths)``."""
    from sweeps.publish.findings import objective_of, update_findings
    from sweeps.rules.store import RuleStore

    study = optuna.load_study(study_name=study_name, storage=spec.optuna_storage)
    recs = trial_records.load_records(study)
    obj = objective_of(spec)
    fp = next((r.fingerprint for r in reversed(recs) if r.fingerprint and "error" not in r.fingerprint), {})
    rules = RuleStore(spec.rules_db)
    try:
        doc = update_findings(spec, study, recs, fp, rules, objective=obj)
    finally:
        rules.close()
    allreduce = spec.space.param("allreduce")
    levels = list(allreduce.levels()) if allreduce is not None else None
    plots = write_plots(study, spec.store_dir / "reports" / study_name, levels, objective=obj, records=recs)
    parent = study.user_attrs.get("mlflow_parent_run_id")
    if log_to_mlflow and parent:
        from mlflow.tracking import MlflowClient

        from sweeps.store.tracking import retry

        c = MlflowClient(tracking_uri=spec.mlflow_uri)
        try:
            retry(lambda: c.log_artifact(parent, str(doc)), "log findings")
            for p in plots:
                retry(lambda p=p: c.log_artifact(parent, str(p), "plots"), "log plot")
            from sweeps.publish.parent_run import relog  # summary, skip counts, the confirmed winner

            relog(spec, study, study_name, parent)
        except Exception as e:  # noqa: BLE001
            print(f"servesweep report: could not log to MLflow ({e}); files are on disk", file=sys.stderr)
    return doc, plots


def main(argv: list[str] | None = None) -> int:
    """``python -m sweeps.report <study> [--store-dir DIR] [--storage URL] [--no-mlflow] [overrides...]``;
    returns 0, or 2 when the study cannot be read or its config not rebuilt (the message says why)."""
    ap = argparse.ArgumentParser(prog="python -m sweeps.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("study", help="the sweep's study name (default study name = sweep name)")
    ap.add_argument("--store-dir", default=None, help="tracking store dir (default <repo>/mlflow)")
    ap.add_argument("--storage", default=None, help="Optuna storage URL (default <store-dir>/optuna.db)")
    ap.add_argument("--no-mlflow", action="store_true", help="do not re-log to the MLflow parent run")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. tracking.findings_dir=/tmp/f")
    a = ap.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        spec = spec_for_study(a.study, a.store_dir, a.overrides, a.storage)
    except ConfigurationError as e:
        print(f"servesweep report: {e}", file=sys.stderr)
        return exit_code(e) or EXIT_CONFIG
    doc, plots = rebuild(spec, a.study, log_to_mlflow=not a.no_mlflow)
    print(f"findings: {doc}")
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
