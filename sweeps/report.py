"""Plots of a study, and ``python -m sweeps.report <sweep>``: rebuild the findings document
and the plots from storage alone (no Ray), then re-log them to the MLflow parent run.

Every plot shows the sweep's objective (its name and unit on the axis; "best" is the
objective's best, lowest for a latency). Plots (PNG via matplotlib, Agg backend; plus
Optuna's interactive HTML where it exists):

* ``optimization_history.png`` — objective per trial, best so far, the baseline, failures.
* ``param_importances.png`` — each knob's share of the variance (ANOVA main effects, sequential R²) over the launched trials
  (:mod:`sweeps.importance`: sees categorical effects; skips and duplicates excluded).
* ``toks_by_allreduce_speculation.png`` — the objective of every ok trial by allreduce
  backend, coloured by speculation; levels that failed are labelled with their failure class.
* ``failures_by_class.png`` — launched failures and skips without GPU time, per class.
* ``eagle_draft_acceptance.png`` — EAGLE draft tokens vs acceptance length vs the objective.
* ``optimization_history.html``, ``param_importances.html`` — plotly figures (Optuna's history; the
  importances above)
  (plotly.js loaded from its CDN to keep the artifacts small).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

import sweeps.findings.measure as M
from sweeps import records as R
from sweeps.importance import importances_figure, importances_plotly
from sweeps.objective import Objective
from sweeps.report_load import write_load_plots

log = logging.getLogger("servesweep.report")
SPEC_COLORS = {"none": "#1f77b4", "eagle3": "#d62728"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _ok(recs: Sequence[R.TrialRecord], obj: Objective) -> list[R.TrialRecord]:
    """Ok, non-duplicate trials with a value of the objective."""
    return [r for r in recs if M.value_of(r, obj) is not None and r.duplicate_of is None]


def _best_so_far(good: Sequence[R.TrialRecord], obj: Objective) -> tuple[list[int], list[float]]:
    xs: list[int] = []
    ys: list[float] = []
    for r in sorted(good, key=lambda r: r.number):
        v = M.value_of(r, obj)
        if not ys or obj.better(v, ys[-1]):
            ys.append(v)
        else:
            ys.append(ys[-1])
        xs.append(r.number)
    return xs, ys


def history_figure(recs: Sequence[R.TrialRecord], obj: Objective | None = None) -> Any:
    """The objective (default decode_tok_s) per trial by speculation, best so far, the
    baseline, degraded trials and failures (red crosses at the bottom)."""
    obj = obj or Objective()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ok = _ok(recs, obj)
    good = [r for r in ok if R.counts_for_level(r)]
    deg = [r for r in ok if not R.counts_for_level(r)]
    for spec in sorted({r.params.get("speculative", "none") for r in good}):
        rs = [r for r in good if r.params.get("speculative", "none") == spec]
        ax.scatter([r.number for r in rs], [M.value_of(r, obj) for r in rs], s=22, label=f"ok ({spec})",
                   color=SPEC_COLORS.get(str(spec)))
    if deg:
        ax.scatter([r.number for r in deg], [M.value_of(r, obj) for r in deg], marker="^", s=30, color="grey",
                   label=f"{R.DEGRADED} (not credited)")
    xs, ys = _best_so_far(good, obj)
    if xs:
        ax.step(xs, ys, where="post", color="black", lw=1.2, label="best so far")
    base = M.baseline_value(recs, obj)
    if base:
        ax.axhline(base, ls="--", color="green", lw=1, label=f"baseline {base:.1f}")
    failed = [r for r in recs if r.status in ("failed", "infra_error") and r.duplicate_of is None]
    if failed:
        y0 = min([M.value_of(r, obj) for r in ok] or [0.0]) * 0.95 if ok else 0.0
        ax.scatter([r.number for r in failed], [y0] * len(failed), marker="x", color="red", s=25,
                   label=f"failed ({len(failed)})")
    ax.set_xlabel("trial")
    ax.set_ylabel("decode tok/s (batch 1)" if obj.name == M.DECODE else M.axis(obj))
    ax.set_title(f"optimization history: {obj.label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def _level_label(rs: Sequence[R.TrialRecord]) -> str | None:
    """Why an allreduce level has no credited result (None when it has one)."""
    if any(r.status == "ok" and R.counts_for_level(r) for r in rs):
        return None
    if any(r.status == "ok" for r in rs):
        return "falls back to NCCL"
    c = Counter(r.failure_class for r in rs if r.failure_class)
    return c.most_common(1)[0][0] if c else "untried"


def by_allreduce_figure(recs: Sequence[R.TrialRecord], space_levels: list[Any] | None = None,
                        obj: Objective | None = None) -> Any:
    """The objective of every ok trial by allreduce level (bar: the level's best), one bar
    per speculation mode; levels without a credited result labelled with why."""
    obj = obj or Objective()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    levels = list(space_levels or [])
    levels += [lv for lv in dict.fromkeys(r.params.get("allreduce") for r in recs) if lv is not None and lv not in levels]
    levels = levels or ["(none)"]
    specs = sorted({str(r.params.get("speculative", "none")) for r in recs} | {"none"})
    width = 0.8 / max(len(specs), 1)
    ok = _ok(recs, obj)
    top = max([M.value_of(r, obj) for r in ok] or [1.0])
    for j, spec in enumerate(specs):
        for i, lv in enumerate(levels):
            rs = [r for r in ok if r.params.get("allreduce") == lv and str(r.params.get("speculative", "none")) == spec]
            x = i - 0.4 + width * (j + 0.5)
            good = [M.value_of(r, obj) for r in rs if R.counts_for_level(r)]
            deg = [M.value_of(r, obj) for r in rs if not R.counts_for_level(r)]
            if good:
                ax.bar(x, M.best_value(good, obj), width=width * 0.9, color=SPEC_COLORS.get(spec, None), alpha=0.35)
                ax.scatter([x] * len(good), good, color=SPEC_COLORS.get(spec, None), s=14, zorder=3)
            if deg:
                ax.scatter([x] * len(deg), deg, marker="^", color="grey", s=22, zorder=3)
    for i, lv in enumerate(levels):
        label = _level_label([r for r in recs if r.params.get("allreduce") == lv and r.duplicate_of is None])
        if label:
            ax.text(i, top * 0.5, label, rotation=90, ha="center", va="center", fontsize=7, color="firebrick")
    ax.set_xticks(range(len(levels)))
    ax.set_xticklabels([str(v) for v in levels])
    handles = [plt.Rectangle((0, 0), 1, 1, color=SPEC_COLORS.get(s, "C0"), alpha=0.5) for s in specs]
    ax.legend(handles, [f"speculative={s}" for s in specs], fontsize=8)
    ax.set_ylabel(f"{M.axis(obj)} (best bar, every trial dot)")
    ax.set_title(f"{M.wording(obj)} by allreduce backend and speculation")
    ax.grid(axis="y", alpha=0.3)
    return fig


def failures_figure(recs: Sequence[R.TrialRecord]) -> Any:
    """Launched failures (GPU time spent) and skips by a known dead end, per failure class."""
    plt = _plt()
    launched: Counter = Counter()
    skipped: Counter = Counter()
    for r in recs:
        if r.duplicate_of is not None:
            continue
        if r.status in ("failed", "infra_error", "interrupted"):
            launched[r.failure_class or r.status] += 1
        elif r.status == "skipped" and r.failure_class:
            skipped[r.failure_class] += 1
        elif r.status == "ok" and not R.counts_for_level(r):
            launched[R.DEGRADED] += 1
    classes = sorted(set(launched) | set(skipped), key=lambda c: launched[c] + skipped[c])
    fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(classes), 1) + 1.5))
    if classes:
        ax.barh(classes, [launched[c] for c in classes], color="firebrick", label="launched (GPU time spent)")
        ax.barh(classes, [skipped[c] for c in classes], left=[launched[c] for c in classes], color="lightgrey",
                label="skipped by a known dead end (no GPU time)")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no failures", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("trials")
    ax.set_title("failures by class")
    return fig


def eagle_figure(recs: Sequence[R.TrialRecord], obj: Objective | None = None) -> Any:
    """EAGLE-3 trials: draft tokens vs acceptance length (coloured by the objective), and
    acceptance length vs the objective with the baseline."""
    obj = obj or Objective()
    plt = _plt()
    rs = [r for r in _ok(recs, obj) if r.params.get("speculative") == "eagle3"
          and r.params.get("eagle_num_draft_tokens") is not None]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    if rs:
        d = [r.params["eagle_num_draft_tokens"] for r in rs]
        acc = [r.metrics.get("accept_length", float("nan")) for r in rs]
        val = [M.value_of(r, obj) for r in rs]
        sc = a1.scatter(d, acc, c=val, cmap="viridis", s=40)
        fig.colorbar(sc, ax=a1, label=M.axis(obj))
        a2.scatter(acc, val, c=d, cmap="plasma", s=40)
        for r, x, y in zip(rs, acc, val):
            a2.annotate(f"{r.params.get('eagle_num_steps')}/{r.params.get('eagle_topk')}/{r.params['eagle_num_draft_tokens']}",
                        (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        base = M.baseline_value(recs, obj)
        if base:
            a2.axhline(base, ls="--", color="green", lw=1, label=f"baseline {base:.1f}")
            a2.legend(fontsize=8)
    else:
        for a in (a1, a2):
            a.text(0.5, 0.5, "no successful EAGLE-3 trials", ha="center", va="center", transform=a.transAxes)
    a1.set_xlabel("EAGLE draft tokens")
    a1.set_ylabel("acceptance length (tokens / verify)")
    a2.set_xlabel("acceptance length")
    a2.set_ylabel(M.axis(obj))
    a2.set_title("labels: steps/topk/draft tokens", fontsize=8)
    fig.suptitle(f"EAGLE-3 draft length vs acceptance length vs {M.wording(obj)}")
    return fig


def _optuna_html(study: optuna.Study, out: Path, recs: Sequence[R.TrialRecord] = (),
                 obj: Objective | None = None) -> list[Path]:
    paths: list[Path] = []
    figs = [("optimization_history.html", lambda: optuna.visualization.plot_optimization_history(study)),
            ("param_importances.html", lambda: importances_plotly(recs, obj))]
    for name, make in figs:
        try:
            fig = make()
            p = out / name
            fig.write_html(str(p), include_plotlyjs="cdn")
            paths.append(p)
        except Exception as e:  # noqa: BLE001 - plotly missing or too few trials
            log.info("%s unavailable: %s", name, e)
    return paths


def study_objective(study: optuna.Study) -> Objective:
    """The study's objective as Optuna knows it: its metric name (when the driver set one)
    and direction; decode_tok_s maximised without a name."""
    names = study.metric_names
    if names:
        return Objective(names[0], "minimize" if study.directions[0] == optuna.study.StudyDirection.MINIMIZE
                         else "maximize")
    return Objective()


def write_plots(study: optuna.Study, out_dir: Path, allreduce_levels: list[Any] | None = None, *,
                objective: Objective | None = None, records: Sequence[R.TrialRecord] | None = None) -> list[Path]:
    """Write the study's plots into ``out_dir`` (created) and return their paths.

    Args:
        study: the Optuna study (importances and Optuna's HTML figures; the records too
            unless ``records`` is given).
        out_dir: directory for the PNG and HTML files.
        allreduce_levels: every allreduce level of the space (so untried ones show up);
            default: the levels seen in the trials.
        objective: what the plots show and rank by (default :func:`study_objective`).
        records: the study's records when the caller has them (saves a storage read).
    Returns:
        The written files: 4–5 PNGs (importances need ≥ 2 completed trials) plus Optuna's
        HTML figures where they can be built.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recs = list(records) if records is not None else R.load_records(study)
    obj = objective or study_objective(study)
    if allreduce_levels is None:
        allreduce_levels = next((list(d.choices) for t in study.get_trials(deepcopy=False)
                                 if (d := t.distributions.get("allreduce")) is not None), None)
    paths = [_save(history_figure(recs, obj), out_dir / "optimization_history.png")]
    imp = importances_figure(recs, obj)
    if imp is not None:
        paths.append(_save(imp, out_dir / "param_importances.png"))
    paths.append(_save(by_allreduce_figure(recs, allreduce_levels, obj), out_dir / "toks_by_allreduce_speculation.png"))
    paths.append(_save(failures_figure(recs), out_dir / "failures_by_class.png"))
    paths.append(_save(eagle_figure(recs, obj), out_dir / "eagle_draft_acceptance.png"))
    paths += write_load_plots(study, recs, out_dir)  # serving under load: curves, Pareto front, break-even
    paths += _optuna_html(study, out_dir, recs, obj)
    return paths


# ---------------------------------------------------------------------------------------
# CLI: rebuild from storage
# ---------------------------------------------------------------------------------------
def spec_for_study(study_name: str, store_dir: str | None, overrides: list[str], storage: str | None = None) -> Any:
    """Compose the sweep config the study was run with (its ``sweep``/``node``/``model``/
    ``backend`` user attrs pick the Hydra groups) plus ``overrides``, read from ``storage`` (any
    Optuna URL), else ``tracking.optuna_storage=`` in ``overrides``, else ``<store_dir>/optuna.db``.

    Raises:
        SystemExit(2): the study does not exist or its search space differs from the config.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sweeps.config import REPO_ROOT, load_spec

    store = Path(store_dir).resolve() if store_dir else REPO_ROOT / "mlflow"
    pre = "tracking.optuna_storage="
    storage = storage or next((o[len(pre):] for o in overrides if o.startswith(pre)), f"sqlite:///{store / 'optuna.db'}")
    overrides = [o for o in overrides if not o.startswith(pre)]
    if storage == f"sqlite:///{store / 'optuna.db'}" and not (store / "optuna.db").exists():
        sys.exit(f"servesweep report: no Optuna storage at {store / 'optuna.db'}; pass --store-dir or --storage URL")
    try:
        summaries = optuna.get_all_study_summaries(storage)
    except Exception as e:  # noqa: BLE001
        sys.exit(f"servesweep report: cannot read {storage}: {e}")
    match = next((s for s in summaries if s.study_name == study_name), None)
    if match is None:
        names = sorted(s.study_name for s in summaries)
        sys.exit(f"servesweep report: no study {study_name!r} in {storage}; studies: {names}")
    attrs = match.user_attrs
    groups = [f"{g}={attrs[g]}" for g in ("sweep", "node", "model", "backend") if attrs.get(g)]
    conf_dir = REPO_ROOT / "conf"
    groups = [g for g in groups if (conf_dir / g.split("=")[0] / f"{g.split('=')[1]}.yaml").exists()]
    ov = [*groups, f"tracking.store_dir={store}", f"study_name={study_name}", f"{pre}{storage}", *overrides]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose("config", overrides=ov)
    finally:
        GlobalHydra.instance().clear()
    spec = load_spec(cfg)
    from sweeps.study import SPACE_ATTR, space_signature

    if attrs.get(SPACE_ATTR) and attrs[SPACE_ATTR] != space_signature(spec):
        sys.exit(f"servesweep report: study {study_name!r} was run with another search space than "
                 f"conf/sweep/{attrs.get('sweep')}.yaml; pass the same sweep.* overrides as the sweep")
    return spec


def rebuild(spec: Any, study_name: str, log_to_mlflow: bool = True) -> tuple[Path, list[Path]]:
    """Rewrite the findings document and the plots from storage; re-log them to the MLflow
    parent run when it exists. Returns ``(findings path, plot paths)``."""
    from sweeps.findings import objective_of, update_findings
    from sweeps.rules import RuleStore

    study = optuna.load_study(study_name=study_name, storage=spec.optuna_storage)
    recs = R.load_records(study)
    obj = objective_of(spec)
    fp = next((r.fingerprint for r in reversed(recs) if r.fingerprint and "error" not in r.fingerprint), {})
    rules = RuleStore(spec.rules_db)
    try:
        doc = update_findings(spec, study, recs, fp, rules, objective=obj)
    finally:
        rules.close()
    levels = next((list(p.levels()) for p in spec.space.params if p.name == "allreduce"), None)
    plots = write_plots(study, spec.store_dir / "reports" / study_name, levels, objective=obj, records=recs)
    parent = study.user_attrs.get("mlflow_parent_run_id")
    if log_to_mlflow and parent:
        from mlflow.tracking import MlflowClient

        from sweeps.tracking import retry

        c = MlflowClient(tracking_uri=spec.mlflow_uri)
        try:
            retry(lambda: c.log_artifact(parent, str(doc)), "log findings")
            for p in plots:
                retry(lambda p=p: c.log_artifact(parent, str(p), "plots"), "log plot")
            from sweeps.parent_run import relog  # summary, skip counts, the confirmed winner

            relog(spec, study, study_name, parent)
        except Exception as e:  # noqa: BLE001
            print(f"servesweep report: could not log to MLflow ({e}); files are on disk", file=sys.stderr)
    return doc, plots


def main(argv: list[str] | None = None) -> int:
    """``python -m sweeps.report <study> [--store-dir DIR] [--storage URL] [--no-mlflow] [overrides...]``."""
    ap = argparse.ArgumentParser(prog="python -m sweeps.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("study", help="the sweep's study name (default study name = sweep name)")
    ap.add_argument("--store-dir", default=None, help="tracking store dir (default <repo>/mlflow)")
    ap.add_argument("--storage", default=None, help="Optuna storage URL (default <store-dir>/optuna.db)")
    ap.add_argument("--no-mlflow", action="store_true", help="do not re-log to the MLflow parent run")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. tracking.findings_dir=/tmp/f")
    a = ap.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = spec_for_study(a.study, a.store_dir, a.overrides, a.storage)
    doc, plots = rebuild(spec, a.study, log_to_mlflow=not a.no_mlflow)
    print(f"findings: {doc}")
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
