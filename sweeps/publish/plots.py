"""Plots of a study (written by :func:`write_plots`; rebuilt from storage by ``python -m sweeps.report``).

Every plot shows the sweep's objective (its name and unit on the axis; "best" is the
objective's best, lowest for a latency). Plots (PNG via matplotlib, Agg backend; plus
Optuna's interactive HTML where it exists):
* ``optimization_history.png`` — objective per trial, best so far, the baseline, failures.
* ``param_importances.png`` — each knob's share of the variance (ANOVA main effects, sequential R²) over the launched trials
  (:mod:`sweeps.publish.importance`: sees categorical effects; skips and duplicates excluded).
* ``toks_by_allreduce_speculation.png`` — the objective of every ok trial by allreduce
  backend, coloured by speculation; levels that failed are labelled with their failure class.
* ``failures_by_class.png`` — launched failures and skips without GPU time, per class.
* ``eagle_draft_acceptance.png`` — EAGLE draft tokens vs acceptance length vs the objective.
* ``optimization_history.html``, ``param_importances.html`` — plotly figures (Optuna's history; the
  importances above)
  (plotly.js loaded from its CDN to keep the artifacts small).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

import sweeps.publish.findings.measure as measure
from sweeps.config.objective import Objective
from sweeps.publish.importance import importances_figure, importances_plotly
from sweeps.publish.plots_load import write_load_plots
from sweeps.store import records as trial_records

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


def _ok(recs: Sequence[trial_records.TrialRecord], obj: Objective) -> list[trial_records.TrialRecord]:
    """Ok, non-duplicate trials with a value of the objective."""
    return [r for r in recs if measure.value_of(r, obj) is not None and r.duplicate_of is None]


def _best_so_far(good: Sequence[trial_records.TrialRecord], obj: Objective) -> tuple[list[int], list[float]]:
    xs: list[int] = []
    ys: list[float] = []
    for r in sorted(good, key=lambda r: r.number):
        v = measure.value_of(r, obj)
        if not ys or obj.better(v, ys[-1]):
            ys.append(v)
        else:
            ys.append(ys[-1])
        xs.append(r.number)
    return xs, ys


def confirmed_winner(study: optuna.Study) -> tuple[int, float, float, float] | None:
    """``(trial, mean, ci_low, ci_high)`` of the stored confirmation's winner
    (:data:`sweeps.search.confirm.ATTR`), or None without one (or a mean that is not a number)."""
    from sweeps.search.confirm import ATTR

    conf = study.user_attrs.get(ATTR) or {}
    win = conf.get("winner")
    e = next((e for e in conf.get("entries", []) if e.get("trial") == win), None) if win is not None else None
    try:
        return (int(win), float(e["mean"]), float(e.get("ci_low") or e["mean"]),
                float(e.get("ci_high") or e["mean"])) if e and e.get("mean") is not None else None
    except (TypeError, ValueError, KeyError):
        return None


def history_figure(recs: Sequence[trial_records.TrialRecord], obj: Objective | None = None,
                   confirmed: tuple[int, float, float, float] | None = None) -> Any:
    """The objective (default decode_tok_s) per trial by speculation, best so far, the
    baseline, degraded trials and failures (red crosses at the bottom).

    ``confirmed``: the confirmed winner ``(trial, mean, ci_low, ci_high)`` (:func:`confirmed_winner`).
    The best-so-far line is each trial's single measurement; with a confirmation it ends at the
    confirmed mean (a star with its interval), never at a single measurement that repeats did not
    reproduce; without one it is labelled unconfirmed."""
    obj = obj or Objective()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ok = _ok(recs, obj)
    good = [r for r in ok if trial_records.counts_for_level(r)]
    deg = [r for r in ok if not trial_records.counts_for_level(r)]
    for spec in sorted({r.params.get("speculative", "none") for r in good}):
        rs = [r for r in good if r.params.get("speculative", "none") == spec]
        ax.scatter([r.number for r in rs], [measure.value_of(r, obj) for r in rs], s=22, label=f"ok ({spec})",
                   color=SPEC_COLORS.get(str(spec)))
    if deg:
        ax.scatter([r.number for r in deg], [measure.value_of(r, obj) for r in deg], marker="^", s=30, color="grey",
                   label=f"{trial_records.DEGRADED} (not credited)")
    xs, ys = _best_so_far(good, obj)
    if xs:
        ax.step(xs, ys, where="post", color="black", lw=1.2,
                label="best single measurement so far" if confirmed else "best so far (unconfirmed)")
        if confirmed:
            num, mean, lo, hi = confirmed
            end = xs[-1] + 1
            ax.plot([xs[-1], end], [ys[-1], mean], color="black", lw=1.2, ls=":")
            ax.errorbar([end], [mean], yerr=[[max(mean - lo, 0.0)], [max(hi - mean, 0.0)]], fmt="*", ms=11,
                        color="gold", mec="black", ecolor="black", capsize=3,
                        label=f"confirmed winner t{num}: {mean:.4g} [{lo:.4g}, {hi:.4g}]")
    base = measure.baseline_value(recs, obj)
    if base:
        ax.axhline(base, ls="--", color="green", lw=1, label=f"baseline {base:.1f}")
    failed = [r for r in recs if r.status in ("failed", "infra_error") and r.duplicate_of is None]
    if failed:
        y0 = min([measure.value_of(r, obj) for r in ok] or [0.0]) * 0.95 if ok else 0.0
        ax.scatter([r.number for r in failed], [y0] * len(failed), marker="x", color="red", s=25,
                   label=f"failed ({len(failed)})")
    ax.set_xlabel("trial")
    ax.set_ylabel("decode tok/s (batch 1)" if obj.name == measure.DECODE else measure.axis(obj))
    ax.set_title(f"optimization history: {obj.label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def _level_label(rs: Sequence[trial_records.TrialRecord]) -> str | None:
    """Why an allreduce level has no credited result (None when it has one)."""
    if any(r.status == "ok" and trial_records.counts_for_level(r) for r in rs):
        return None
    if any(r.status == "ok" for r in rs):
        return "falls back to NCCL"
    c = Counter(r.failure_class for r in rs if r.failure_class)
    return c.most_common(1)[0][0] if c else "untried"


def by_allreduce_figure(recs: Sequence[trial_records.TrialRecord], space_levels: list[Any] | None = None,
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
    top = max([measure.value_of(r, obj) for r in ok] or [1.0])
    for j, spec in enumerate(specs):
        for i, lv in enumerate(levels):
            rs = [r for r in ok if r.params.get("allreduce") == lv and str(r.params.get("speculative", "none")) == spec]
            x = i - 0.4 + width * (j + 0.5)
            good = [measure.value_of(r, obj) for r in rs if trial_records.counts_for_level(r)]
            deg = [measure.value_of(r, obj) for r in rs if not trial_records.counts_for_level(r)]
            if good:
                ax.bar(x, measure.best_value(good, obj), width=width * 0.9, color=SPEC_COLORS.get(spec, None), alpha=0.35)
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
    ax.set_ylabel(f"{measure.axis(obj)} (best bar, every trial dot)")
    ax.set_title(f"{measure.wording(obj)} by allreduce backend and speculation")
    ax.grid(axis="y", alpha=0.3)
    return fig


def failures_figure(recs: Sequence[trial_records.TrialRecord]) -> Any:
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
        elif r.status == "ok" and not trial_records.counts_for_level(r):
            launched[trial_records.DEGRADED] += 1
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


def eagle_figure(recs: Sequence[trial_records.TrialRecord], obj: Objective | None = None) -> Any:
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
        val = [measure.value_of(r, obj) for r in rs]
        sc = a1.scatter(d, acc, c=val, cmap="viridis", s=40)
        fig.colorbar(sc, ax=a1, label=measure.axis(obj))
        a2.scatter(acc, val, c=d, cmap="plasma", s=40)
        for r, x, y in zip(rs, acc, val):
            a2.annotate(f"{r.params.get('eagle_num_steps')}/{r.params.get('eagle_topk')}/{r.params['eagle_num_draft_tokens']}",
                        (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        base = measure.baseline_value(recs, obj)
        if base:
            a2.axhline(base, ls="--", color="green", lw=1, label=f"baseline {base:.1f}")
            a2.legend(fontsize=8)
    else:
        for a in (a1, a2):
            a.text(0.5, 0.5, "no successful EAGLE-3 trials", ha="center", va="center", transform=a.transAxes)
    a1.set_xlabel("EAGLE draft tokens")
    a1.set_ylabel("acceptance length (tokens / verify)")
    a2.set_xlabel("acceptance length")
    a2.set_ylabel(measure.axis(obj))
    a2.set_title("labels: steps/topk/draft tokens", fontsize=8)
    fig.suptitle(f"EAGLE-3 draft length vs acceptance length vs {measure.wording(obj)}")
    return fig


def _optuna_html(study: optuna.Study, out: Path, recs: Sequence[trial_records.TrialRecord] = (),
                 obj: Objective | None = None) -> list[Path]:
    paths: list[Path] = []
    figs = [("param_importances.html", lambda: importances_plotly(recs, obj))]
    # Optuna's history warns "There are no complete trials." on the console and draws an empty figure
    if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        figs.insert(0, ("optimization_history.html", lambda: _optuna_history(study)))
    else:
        log.info("optimization_history.html unavailable: no complete trial")
    for name, make in figs:
        try:
            fig = make()
            p = out / name
            fig.write_html(str(p), include_plotlyjs="cdn")
            paths.append(p)
        except Exception as e:  # noqa: BLE001 - plotly missing or too few trials
            log.info("%s unavailable: %s", name, e)
    return paths


def _optuna_history(study: optuna.Study) -> Any:
    """Optuna's history figure; a multi-objective study is drawn on its first objective
    (Optuna refuses one without ``target``) and the Pareto front has its own plot."""
    if len(study.directions) == 1:
        return optuna.visualization.plot_optimization_history(study)
    name = (study.metric_names or ["objective 0"])[0]
    return optuna.visualization.plot_optimization_history(study, target=lambda t: t.values[0], target_name=name)


def study_objective(study: optuna.Study) -> Objective:
    """The study's objective as Optuna knows it: its metric name (when the driver set one)
    and direction; decode_tok_s maximised without a name."""
    names = study.metric_names
    if names:
        return Objective(names[0], "minimize" if study.directions[0] == optuna.study.StudyDirection.MINIMIZE
                         else "maximize")
    return Objective()


def write_plots(study: optuna.Study, out_dir: Path, allreduce_levels: list[Any] | None = None, *,
                objective: Objective | None = None, records: Sequence[trial_records.TrialRecord] | None = None) -> list[Path]:
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
    recs = list(records) if records is not None else trial_records.load_records(study)
    obj = objective or study_objective(study)
    if allreduce_levels is None:
        allreduce_levels = next((list(d.choices) for t in study.get_trials(deepcopy=False)
                                 if (d := t.distributions.get("allreduce")) is not None), None)
    paths = [_save(history_figure(recs, obj, confirmed_winner(study)), out_dir / "optimization_history.png")]
    imp = importances_figure(recs, obj)
    if imp is not None:
        paths.append(_save(imp, out_dir / "param_importances.png"))
    paths.append(_save(by_allreduce_figure(recs, allreduce_levels, obj), out_dir / "toks_by_allreduce_speculation.png"))
    paths.append(_save(failures_figure(recs), out_dir / "failures_by_class.png"))
    paths.append(_save(eagle_figure(recs, obj), out_dir / "eagle_draft_acceptance.png"))
    paths += write_load_plots(study, recs, out_dir)  # serving under load: curves, Pareto front, break-even
    paths += _optuna_html(study, out_dir, recs, obj)
    return paths
