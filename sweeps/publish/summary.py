"""One set of numbers for a study: the summary the console, the findings document, the MLflow
parent run and the recheck all read.

:func:`build_summary` is the one constructor (pure: records, the stored confirmation and
serving check in, a :class:`StudySummary` out), so the baseline, the best single measurement,
the confirmed winner and every count are computed once and agree wherever they are printed:

* baseline: the confirmation's mean where it re-measured the baseline, else the sweep's median
  (:func:`sweeps.publish.findings.best.baseline_measured`);
* winner: the confirmation's winner at its confirmed mean (``confirmed``), else the best single
  measurement, labelled as such (``best_single`` is always the luckiest single run);
* counts: every finished proposal is exactly one of launched (a launch of the trial budget),
  a re-question probe (one probe-only launch of a known dead end: GPU time, but not a launch of
  the budget) or answered without GPU time (by reason,
  :func:`sweeps.publish.parent_run.skip_reason`); per failure class the launched trials and
  probes that hit it (a silently degraded allreduce path included) and the proposals skipped
  for it;
* GPU-hours: sweep launches (their probes included), confirmation launches and serving-check
  launches on one clock, labelled ``modelled`` (an emulated node: nothing real ran) or
  ``measured`` (a real node).

The confirmation result is read through the fields :func:`sweeps.search.confirm.confirm_top`
documents; ``tie_group`` (trial numbers), ``gpu_s`` and ``launches`` are used when present.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweeps.config.objective import Objective, metric_text
from sweeps.publish.findings.best import Measured, baseline_measured, best_of, measured
from sweeps.store import records as trial_records

__all__ = ["SERVING_ATTR", "SKIP_REASONS", "Counts", "GpuHours", "StudySummary", "build_summary", "skip_reason",
           "skipped", "summary_of_study"]

SERVING_ATTR = "serving_check"  # the study user attribute sweeps.search.serving_check writes
CONFIRMATION_ATTR = "confirmation"
SKIP_REASONS = ("rule", "duplicate", "degraded", "infeasible", "other")


def skip_reason(r: trial_records.TrialRecord) -> str:
    """Why a proposal was not launched: one of :data:`SKIP_REASONS`."""
    if r.duplicate_of is not None:
        return "duplicate"
    if r.status == "infeasible":
        return "infeasible"
    if r.skipped_by_rule:
        return "degraded" if str(r.skipped_by_rule).startswith("degraded:") else "rule"
    return "other"


def skipped(records: list[trial_records.TrialRecord]) -> list[trial_records.TrialRecord]:
    """Finished proposals that spent no GPU time (an enqueued trial the sweep stopped before
    launching was never proposed: not one of them)."""
    return [r for r in records if not r.launched and r.state not in ("RUNNING", "WAITING")
            and r.status != trial_records.NOT_LAUNCHED]


@dataclass(frozen=True)
class Counts:
    """What happened to the study's proposals.

    Attributes:
        proposals: finished proposals (``launched + probes + answered``).
        launched: launched trials of the trial budget (GPU time spent); ``ok``/``degraded``/``failed``/``infra``/
            ``interrupted`` of them (``degraded``: the server came up on another allreduce path than the
            config names, seen in its probe or its log, so it was not measured as that level; not in
            ``ok``. ``interrupted``: stopped with the sweep, which re-queued its config).
        probes: re-question probes (:attr:`sweeps.store.records.TrialRecord.requestion`): GPU
            time spent, not launches of the budget; ``probes_passed`` of them no longer
            reproduced their dead end, ``probes_unanswered`` said nothing about it (stopped, or
            failed for a node's or passing reason: :func:`sweeps.store.records.requestion_unanswered`).
        answered: proposals answered without GPU time; ``by_reason`` splits them (rule,
            duplicate, degraded, infeasible, other).
        by_class: failure class -> ``(launched trials and re-question probes that hit it, proposals skipped for it)``;
            ``allreduce_path_degraded`` counts launched trials whose server fell back to NCCL.
        confirm_launches: confirmation launches (the repeats); serving_launches: serving-check launches.
        confirm_failed: failure class -> confirmation launches that failed with it (a transient or
            infra one measured nothing and was launched again: ``sweeps.search.confirm.Evidence.counted``).
    """

    proposals: int = 0
    launched: int = 0
    probes: int = 0
    probes_passed: int = 0
    probes_unanswered: int = 0
    ok: int = 0
    degraded: int = 0
    failed: int = 0
    infra: int = 0
    interrupted: int = 0
    answered: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, tuple[int, int]] = field(default_factory=dict)
    confirm_launches: int = 0
    serving_launches: int = 0
    confirm_failed: dict[str, int] = field(default_factory=dict)

    @property
    def all_launches(self) -> int:
        """Every launch the study paid for: trials, re-question probes, confirmation repeats, serving checks."""
        return self.launched + self.probes + self.confirm_launches + self.serving_launches

    def probes_text(self) -> str:
        """``4 re-question probes (2 reproduced their dead end, 1 no longer did, 1 gave no answer: its
        rule stands)``; "" without any."""
        if not self.probes:
            return ""
        kept = self.probes - self.probes_passed - self.probes_unanswered
        stands = "its rule stands" if self.probes_unanswered == 1 else "their rules stand"
        silent = f", {self.probes_unanswered} gave no answer: {stands}" if self.probes_unanswered else ""
        return (f"{self.probes} re-question probe{'s' if self.probes != 1 else ''} ({kept} reproduced "
                f"{'its' if kept == 1 else 'their'} dead end, {self.probes_passed} no longer did{silent})")


@dataclass(frozen=True)
class GpuHours:
    """GPU-hours of every launch on one clock (GPU-seconds / 3600).

    Attributes:
        trials: the sweep's launches (probes included: a probe books on its trial).
        confirmations: the confirmation repeats (their stored ``gpu_s`` where the confirmation
            recorded it, else each repeat priced at its config's own sweep launch: ``priced``).
        serving: the serving-check launches (measured by their results).
        basis: ``modelled`` (emulated node, no real GPU) or ``measured`` (a real node).
        priced: True when some confirmation hours are priced, not recorded.
    """

    trials: float = 0.0
    confirmations: float = 0.0
    serving: float = 0.0
    basis: str = "measured"
    priced: bool = False

    @property
    def total(self) -> float:
        return self.trials + self.confirmations + self.serving

    def text(self) -> str:
        """``0.712 GPU-hours modelled (0.500 trials + 0.180 confirmations + 0.032 serving check)``."""
        parts = [f"{self.trials:.3f} trials", f"{self.confirmations:.3f} confirmations"
                 + (" (priced at each config's sweep launch)" if self.priced else "")]
        if self.serving:
            parts.append(f"{self.serving:.3f} serving check")
        what = "modelled: emulated node, no real GPU used" if self.basis == "modelled" else "measured on real GPUs"
        return f"{self.total:.3f} GPU-hours, {what} ({' + '.join(parts)})"


@dataclass(frozen=True)
class StudySummary:
    """The study's one set of numbers (see the module docstring). Values are in the objective's unit.

    Attributes:
        study: the study name.  objective: what it ranks by.
        baseline: the baseline (:class:`~sweeps.publish.findings.best.Measured`).
        best_single: the best single sweep measurement (trial, value), or ``(None, None)``.
        winner: the winner's trial (confirmed winner, else best single), or None.
        winner_value: the winner's value (confirmed mean where confirmed).
        speedup / speedup_ci: the winner against the baseline (> 1 better), CI or None.
        tie_group: trials the confirmation could not tell apart from the winner ([] when none).
        winner_note: the confirmation's sentence about the winner.
        winner_config / deploy_command: the winner's params and deployable command.
        counts / gpu: :class:`Counts`, :class:`GpuHours`.
        serving: the serving check (``sweeps.search.serving_check``), or None.
        confidence: the confirmation's interval level.
        approaches: for a sweep that compares approaches (``sweep.approaches``), per level of its
            knob in the space's order ``(knob, level, trial, value)``: the winner's confirmed value
            for the winner's approach, else the approach's best single measurement (trial and
            value None when it has none).
    """

    study: str
    objective: Objective
    baseline: Measured
    best_single: tuple[int | None, float | None]
    winner: int | None
    winner_value: Measured
    speedup: float | None
    speedup_ci: tuple[float, float] | None
    tie_group: list[int]
    winner_note: str
    winner_config: dict[str, Any]
    deploy_command: str
    counts: Counts
    gpu: GpuHours
    serving: dict[str, Any] | None
    confidence: float = 0.95
    node: str = ""
    approaches: list[tuple[str, Any, int | None, float | None]] = field(default_factory=list)

    @property
    def confirmed(self) -> bool:
        """True when the winner's value is a confirmation mean over fresh repeats."""
        return self.winner_value.confirmed

    # ---- texts ---------------------------------------------------------------------------
    def _v(self, v: float | None) -> str:
        return metric_text(self.objective.name, v) if v is not None else "-"

    def counts_text(self) -> str:
        """``30 proposals: 24 launched (21 ok, 1 on a degraded allreduce path, 2 failed, 0 infra), 6 answered
        without GPU time (...)``."""
        c = self.counts
        why = ", ".join(f"{v} {k}" for k, v in c.by_reason.items() if v)
        deg = f"{c.degraded} on a degraded allreduce path, " if c.degraded else ""
        stopped = f", {c.interrupted} interrupted and re-queued" if c.interrupted else ""
        return (f"{c.proposals} proposals: {c.launched} launched ({c.ok} ok, {deg}{c.failed} failed, {c.infra} infra{stopped}), "
                + (f"{c.probes_text()}, " if c.probes else "")
                + f"{c.answered} answered without GPU time" + (f" ({why})" if why else "")
                + f"; {c.confirm_launches} confirmation launches" + (
                    f" ({sum(c.confirm_failed.values())} failed: "
                    + ", ".join(f"{k} x{v}" for k, v in sorted(c.confirm_failed.items()))
                    + "; a repeat lost to a transient failure was launched again)" if c.confirm_failed else "")
                + (f", {c.serving_launches} serving-check launches" if c.serving_launches else "") + ".")

    def baseline_text(self) -> str:
        """``baseline: 82.1 tok/s (confirmed mean of 3 fresh runs, 95 % CI ...), trial 0``."""
        b = self.baseline
        if b.value is None:
            return "baseline: not measured"
        return f"baseline: {self.baseline_text_value()}" + (f", trial {b.trial}" if b.trial is not None else "")

    def baseline_text_value(self) -> str:
        return f"{self._v(self.baseline.value)} ({self.baseline.how()})"

    def winner_text(self) -> str:
        """The winner's line: trial, value, interval, speedup (and how it was measured)."""
        if self.winner is None:
            return "best: none"
        w = self.winner_value
        on = f"{self.node}: " if self.node else ""
        sp = ""
        if self.speedup is not None:
            sp = f", {self.speedup:.2f}x baseline"
            if self.speedup_ci is not None:
                sp += f" [{self.speedup_ci[0]:.2f}-{self.speedup_ci[1]:.2f}]"
        if w.confirmed:
            ci = f" [{self.confidence:.0%} CI {w.ci[0]:.1f}-{w.ci[1]:.1f}]" if w.ci else ""
            return f"best (confirmed over {w.n} repeats): trial {self.winner}, {on}{self._v(w.value)}{ci}{sp}"
        return f"best: trial {self.winner}, {on}{self._v(w.value)} (one measurement){sp}"

    def winner_config_text(self) -> str | None:
        """``winner config: cuda_graph_max_bs=128, speculative_algorithm=EAGLE3`` (the winner's
        params, so the headline names what to deploy, not only a trial number), or None."""
        if self.winner is None or not self.winner_config:
            return None
        return "winner config: " + ", ".join(f"{k}={v}" for k, v in self.winner_config.items())

    def approaches_text(self) -> str | None:
        """``approaches (speculative): none 90.4 tok/s (t7, the winner, confirmed mean), 1.10x
        baseline; eagle3 best 59.0 tok/s (t45, one run), 0.72x baseline: does not beat the
        baseline``: the sweep's question answered per approach, each value said to be a confirmed
        mean or one run, or None for a sweep without approaches."""
        if not self.approaches:
            return None
        base = self.baseline.value
        parts = []
        for _knob, level, trial, value in self.approaches:
            if trial is None or value is None:
                parts.append(f"{level} never measured")
                continue
            won = trial == self.winner
            # the winner's value is its confirmed mean when confirmed; every other one is one run
            how = "confirmed mean" if won and self.confirmed else "one run"
            text = f"{level} {'' if won else 'best '}{self._v(value)} (t{trial}{', the winner' if won else ''}, {how})"
            if base:
                ratio = self.objective.ratio(value, base)
                text += f", {ratio:.2f}x baseline" + ("" if ratio > 1 else ": does not beat the baseline")
            parts.append(text)
        return f"approaches ({self.approaches[0][0]}): " + "; ".join(parts)

    def tie_text(self) -> str | None:
        """``tie group: t13, t24 (not distinguishable ...)`` or None."""
        if len(self.tie_group) < 2:
            return None
        return ("tie group: " + ", ".join(f"t{t}" for t in self.tie_group)
                + f" (not distinguishable at the confirmation's repeats; t{self.winner} picked)")

    def best_single_text(self) -> str | None:
        """The best single measurement when it is not the reported winner's value."""
        t, v = self.best_single
        if t is None or v is None or (t == self.winner and not self.confirmed):
            return None
        if t == self.winner or not self.confirmed:
            why = ""
        elif t in self.tie_group:  # it held up: repeats could not tell it from the pick
            why = f" (in the tie group; the tie-break picked t{self.winner})"
        else:
            why = " (did not hold up under repeats)"
        return f"best single measurement: trial {t}, {self._v(v)}{why}"

    def serving_text(self) -> str | None:
        """The serving check's sentence (None when it did not run)."""
        s = self.serving
        if not s:
            return None
        if s.get("error"):
            return f"serving check: not run ({s['error']})"
        return f"serving check: {s.get('sentence', '')}"

    def lines(self) -> list[str]:
        """The console's headline lines (the same numbers as the findings and MLflow)."""
        out = [self.counts_text(), self.gpu.text() + ".", self.baseline_text(), self.winner_text()]
        out += [x for x in (self.winner_config_text(), self.approaches_text(), self.tie_text(),
                            self.best_single_text()) if x]
        if self.winner_note:
            out.append(self.winner_note)
        if (s := self.serving_text()) is not None:
            out.append(s)
        return out

    def markdown(self) -> str:
        """The MLflow parent's description (``mlflow.note.content``): winner, interval, tie group,
        serving check, deploy command, counts."""
        L = [f"## {self.study}", "", f"**{self.winner_text()}**", "", f"- {self.baseline_text()}"]
        L += [f"- {x}" for x in (self.winner_config_text(), self.approaches_text(), self.tie_text(),
                                 self.best_single_text(), self.serving_text()) if x]
        if self.winner_note:
            L.append(f"- {self.winner_note}")
        L += [f"- {self.counts_text()}", f"- {self.gpu.text()}"]
        if self.deploy_command:
            L += ["", "Deploy command:", "", "```bash", self.deploy_command, "```"]
        return "\n".join(L) + "\n"

    def parent_metrics(self) -> dict[str, float]:
        """The parent run's headline metrics: ``confirmed_<objective>`` (only when confirmed),
        ``best_<objective>`` (the reported winner's value, the same number), ``best_single_<objective>``,
        ``baseline_<objective>``, the speedup, the counts and the GPU-hours."""
        o = self.objective.name
        m: dict[str, float | None] = {
            f"best_{o}": self.winner_value.value, f"best_single_{o}": self.best_single[1],
            f"baseline_{o}": self.baseline.value, "best_speedup_vs_baseline": self.speedup,
            "proposals": self.counts.proposals, "trials_launched": self.counts.launched,
            "requestion_probes": self.counts.probes,
            "answered_without_gpu": self.counts.answered, "confirm_launches": self.counts.confirm_launches,
            "serving_check_launches": self.counts.serving_launches, "gpu_hours": self.gpu.total,
            "gpu_hours_trials": self.gpu.trials, "gpu_hours_confirmations": self.gpu.confirmations,
            "gpu_hours_serving_check": self.gpu.serving}
        if self.confirmed:
            m = {f"confirmed_{o}": self.winner_value.value, **m}
        return {k: float(v) for k, v in m.items() if isinstance(v, int | float) and math.isfinite(float(v))}

    def parent_tags(self) -> dict[str, str]:
        """Tags the parent carries from the summary: the winner, how it was measured, the tie
        group, the serving check's verdict, the GPU-hour basis."""
        t = {"winner_trial": "" if self.winner is None else str(self.winner),
             "winner_measured": "confirmed" if self.confirmed else "single measurement",
             "tie_group": ",".join(str(x) for x in self.tie_group), "gpu_hours_basis": self.gpu.basis}
        if self.serving and not self.serving.get("error"):
            t["serving_check"] = str(self.serving.get("verdict") or "")
        return t


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(float(v)) else None


def count_proposals(recs: Sequence[trial_records.TrialRecord], confirmation: Mapping[str, Any] | None = None,
                    serving: Mapping[str, Any] | None = None) -> Counts:
    """:class:`Counts` of ``recs`` (every finished proposal once) and the extra launches."""
    launched = [r for r in recs if r.budgeted]
    probes = [r for r in recs if r.launched and r.requestion]
    answered = skipped(list(recs))
    reasons = Counter(skip_reason(r) for r in answered)
    by_class: dict[str, list[int]] = {}
    for r in launched + probes:
        cls = r.failure_class if r.status in ("failed", "infra_error") else None
        if cls:
            by_class.setdefault(cls, [0, 0])[0] += 1
        if r.status == "ok" and not trial_records.counts_for_level(r):
            by_class.setdefault(trial_records.DEGRADED, [0, 0])[0] += 1
    for r in answered:
        if r.failure_class:
            by_class.setdefault(r.failure_class, [0, 0])[1] += 1
    return Counts(proposals=len(launched) + len(probes) + len(answered), launched=len(launched), probes=len(probes),
                  probes_passed=sum(trial_records.requestion_passed(r.status, r.probe) for r in probes),
                  probes_unanswered=sum(not trial_records.requestion_passed(r.status, r.probe)
                                        and trial_records.requestion_unanswered(r.status, r.failure_kind) for r in probes),
                  ok=sum(r.status == "ok" and trial_records.counts_for_level(r) for r in launched),
                  degraded=sum(r.status == "ok" and not trial_records.counts_for_level(r) for r in launched),
                  failed=sum(r.status == "failed" for r in launched),
                  infra=sum(r.status == "infra_error" for r in launched),
                  interrupted=sum(r.status == "interrupted" for r in launched),
                  answered=len(answered), by_reason={k: reasons[k] for k in sorted(reasons)},
                  by_class={k: (v[0], v[1]) for k, v in sorted(by_class.items(), key=lambda kv: -sum(kv[1]))},
                  confirm_launches=confirm_launches(confirmation), confirm_failed=confirm_failures(confirmation),
                  serving_launches=int((serving or {}).get("launches") or 0))


def confirm_failures(conf: Mapping[str, Any] | None) -> dict[str, int]:
    """Failure class -> confirmation launches of a stored confirmation that failed with it ({}
    when its launches were not recorded one by one)."""
    launches = (conf or {}).get("launches")
    out: dict[str, int] = {}
    for x in launches if isinstance(launches, list) else []:
        if x.get("status") != "ok":
            k = str(x.get("failure") or x.get("status"))
            out[k] = out.get(k, 0) + 1
    return out


def confirm_launches(conf: Mapping[str, Any] | None) -> int:
    """Confirmation launches of a stored confirmation: its ``launches`` when recorded, else per
    entry its ok repeats plus its failed ones (``repeats - n`` when a repeat failed)."""
    conf = conf or {}
    if isinstance(conf.get("launches"), int):
        return int(conf["launches"])
    if isinstance(conf.get("launches"), list):  # one record per launch, accumulated over rounds
        return len(conf["launches"])
    reps = int(conf.get("repeats") or 0)
    return sum(max(int(e.get("n") or 0), reps if e.get("failures") else int(e.get("n") or 0))
               for e in conf.get("entries", []))


def _confirm_gpu_s(conf: Mapping[str, Any] | None, recs: Sequence[trial_records.TrialRecord]) -> tuple[float, bool]:
    """(GPU-seconds of the confirmation launches, priced?): the launches' recorded ``gpu_s``
    (a ``launches`` list) or an entry's, else each launch priced at its config's own sweep
    launch's GPU-seconds (probe excluded)."""
    by_num = {r.number: r for r in recs}
    total, priced = 0.0, False
    launches = (conf or {}).get("launches")
    if isinstance(launches, list) and launches and all(_finite(x.get("gpu_s")) is not None for x in launches):
        return sum(float(x["gpu_s"]) for x in launches), False
    if isinstance(launches, list):  # priced per launch at its config's own sweep launch
        for x in launches:
            r = by_num.get(int(x.get("trial", -1)))
            if _finite(x.get("gpu_s")) is not None:  # recorded (every launch of a config only the race measured)
                total += float(x["gpu_s"])
            elif r is not None:
                total += max(float(r.timings.get("gpu_s") or 0.0) - float((r.probe or {}).get("gpu_s") or 0.0), 0.0)
                priced = True
        return total, priced
    reps = int((conf or {}).get("repeats") or 0)
    for e in (conf or {}).get("entries", []):
        if _finite(e.get("gpu_s")) is not None:
            total += float(e["gpu_s"])
            continue
        r = by_num.get(int(e.get("trial", -1)))
        if r is None:
            continue
        per = float(r.timings.get("gpu_s") or 0.0) - float((r.probe or {}).get("gpu_s") or 0.0)
        n = max(int(e.get("n") or 0), reps if e.get("failures") else int(e.get("n") or 0))
        total += max(per, 0.0) * n
        priced = priced or n > 0
    return total, priced


def build_summary(study: str, objective: Objective, recs: Sequence[trial_records.TrialRecord],
                  confirmation: Mapping[str, Any] | None = None, serving: Mapping[str, Any] | None = None, *,
                  deploy: Callable[[Mapping[str, Any]], str | None] | None = None, emulated: bool = False,
                  node: str = "", approaches: tuple[str, Sequence[Any]] | None = None) -> StudySummary:
    """The study's :class:`StudySummary` (pure).

    Args:
        study: study name.  objective: the primary objective.
        recs: every trial (:func:`sweeps.store.records.load_records`).
        confirmation: the stored confirmation (study user attr ``confirmation``), or None.
        serving: the stored serving check (study user attr :data:`SERVING_ATTR`), or None.
        deploy: params -> the deployable command (None: the winner's recorded launch command).
        emulated: the numbers are an emulated node's (GPU-hours ``modelled``).
        node: where the numbers come from, e.g. ``emulated 8×RTX PRO 6000``.
        approaches: ``(knob, its levels)`` of a sweep that compares approaches, else None.
    """
    recs = list(recs)
    conf = dict(confirmation or {}) or None
    obj = objective
    base = baseline_measured(recs, conf, obj)
    single = trial_records.best_record(recs, obj)
    best_single = (single.number, trial_records.value_of(single, obj)) if single is not None else (None, None)
    winner = best_of(recs, conf, obj)
    entry: Mapping[str, Any] | None = None
    if conf and conf.get("winner") is not None:
        from sweeps.search.confirm import config_record

        winner = config_record(list(recs), conf, conf["winner"]) or winner
        entry = next((e for e in conf.get("entries", []) if e.get("trial") == conf["winner"]), None)
    wv = measured(winner, conf, obj) if winner is not None else Measured(None)
    speedup: float | None = None
    sp_ci: tuple[float, float] | None = None
    if entry is not None and _finite(entry.get("speedup_mean")) is not None:
        speedup = float(entry["speedup_mean"])
        ci = entry.get("speedup_ci") or [None, None]
        if _finite(ci[0]) is not None and _finite(ci[1]) is not None:
            sp_ci = (max(0.0, float(ci[0])), float(ci[1]))
    elif wv.value is not None and base.value:
        speedup = obj.ratio(wv.value, base.value)
    ties = [int(t) for t in ((conf or {}).get("tie_group") or [])]
    trial_s = sum(float(r.timings.get("gpu_s") or 0.0) for r in recs)
    conf_s, priced = _confirm_gpu_s(conf, recs)
    serv_s = float((serving or {}).get("gpu_s") or 0.0)
    gpu = GpuHours(trial_s / 3600, conf_s / 3600, serv_s / 3600, "modelled" if emulated else "measured", priced)
    cmd = ""
    if winner is not None:
        cmd = (deploy(winner.params) if deploy else None) or winner.launch_command or ""
    per_approach: list[tuple[str, Any, int | None, float | None]] = []
    if approaches is not None:
        knob, levels = approaches
        for level, ranked in trial_records.ranked_by_level(recs, knob, levels, obj).items():
            if winner is not None and winner.params.get(knob) == level:
                per_approach.append((knob, level, winner.number, wv.value))
            elif ranked:
                per_approach.append((knob, level, ranked[0].number, trial_records.value_of(ranked[0], obj)))
            else:
                per_approach.append((knob, level, None, None))
    return StudySummary(study=study, objective=obj, baseline=base, best_single=best_single,
                        winner=winner.number if winner is not None else None, winner_value=wv, speedup=speedup,
                        speedup_ci=sp_ci, tie_group=ties, winner_note=str((conf or {}).get("winner_note") or ""),
                        winner_config=dict(winner.params) if winner is not None else {}, deploy_command=cmd,
                        counts=count_proposals(recs, conf, serving), gpu=gpu,
                        serving=dict(serving) if serving else None,
                        confidence=float((conf or {}).get("confidence") or 0.95), node=node,
                        approaches=per_approach)


def summary_of_study(spec: Any, study: Any, recs: Sequence[trial_records.TrialRecord] | None = None) -> StudySummary:
    """:func:`build_summary` of an Optuna ``study`` of ``spec`` (its stored confirmation and
    serving check, its deploy command on the target node)."""
    from sweeps.publish.deploy import deploy_command_for, is_emulated, node_label

    recs = list(recs) if recs is not None else trial_records.load_records(study)
    attrs = study.user_attrs
    return build_summary(study.study_name, spec.objective_set.primary, recs, attrs.get(CONFIRMATION_ATTR),
                         attrs.get(SERVING_ATTR), deploy=lambda p: deploy_command_for(spec, p),
                         emulated=is_emulated(spec), node=node_label(spec), approaches=approach_levels(spec))


def approach_levels(spec: Any) -> tuple[str, list[Any]] | None:
    """``(knob, its levels in the space's order)`` of a sweep that compares approaches
    (``sweep.approaches``), else None: what :func:`build_summary` answers per approach."""
    ap = getattr(spec.sweep, "approaches", None)
    param = spec.space.param(ap.knob) if ap is not None else None
    return (param.name, list(param.levels())) if param is not None else None
