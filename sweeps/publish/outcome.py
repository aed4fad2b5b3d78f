"""What a finished sweep produced, in one word and one line.

:func:`sweep_outcome` reads a study's records (:func:`sweeps.store.records.load_records`) and says
whether the sweep has a result:

* ``measured``: at least one config ranks (an ok trial with the objective's value, on the path
  it names, meeting the objective's constraints) and the baseline was measured;
* ``no_baseline``: configs rank, but the baseline did not measure: speedups vs the baseline are
  missing (the one line says why and what to do);
* ``nothing_measured``: no config ranks. The one line names the failure classes (launched
  trials, then proposals answered without GPU time) and the next step for the most common one.

The word is the MLflow parent's ``sweep_outcome`` tag (``interrupted`` for a stopped sweep);
``nothing_measured`` also makes the parent FAILED and the command's exit code 3
(:data:`sweeps.errors.EXIT_NOTHING_MEASURED`). A recheck sweep (``sweep.mode=recheck``) re-runs known
dead ends on purpose: failures are its result, never ``nothing_measured``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sweeps.search.coverage import STOP_KNOBS
from sweeps.store import records

MEASURED = "measured"
NO_BASELINE = "no_baseline"
NOTHING_MEASURED = "nothing_measured"
INTERRUPTED = "interrupted"

#: the next step for the failure classes a whole sweep most often dies of (class ids of
#: ../shared/data/failure_classes.md); ``{...}`` fields are filled from the sweep's spec
_NEXT_BY_CLASS = {
    "startup_timeout": "no server became ready within backend.timeouts.startup_s={startup_s:g} s: raise it if the "
                       "engine needs longer to load, else read the server logs",
    "health_check_failed": "the servers never answered their health check: read the server logs, then raise "
                           "backend.timeouts.startup_s={startup_s:g} s if they were still loading",
    "bench_stall": "the servers stopped streaming mid-benchmark while staying up: check the node (a stuck GPU, "
                   "NCCL, host memory) and the server logs; raise backend.timeouts.bench_s={bench_s:g} s only if "
                   "the benchmark is simply that long",
    "collective_hang_or_timeout": "a collective hung: check the node's NCCL setup (NCCL_DEBUG=INFO in backend.env) "
                                  "and the server logs",
    "cli_arg_error": "the engine rejected the launch command: check backend.extra_args and backend.launcher "
                     "(dry_run=true renders and checks every command)",
    "early_exit": "the servers exited before the benchmark finished: read the server logs",
    "server_crash": "the servers crashed after becoming ready: read the server logs",
}
_NEXT_BY_KIND = {
    "deterministic": "every config fails on this software stack: read the dead ends in {findings}, then widen "
                     "sweep.params or change sweep.baseline",
    "infra": "the node failed, not the configs: check it (Ray workers, GPUs, ports) and run the same command again",
    "transient": "read the server logs, fix the cause and run the same command again",
}
_NEXT_SKIPPED = ("every proposal was answered without a launch: the known dead ends are in {findings}; after an "
                 "engine upgrade re-check them (sweep=recheck source={sweep}), or widen sweep.params")
#: a budget that stopped the sweep before its first launch: the answer is that budget, not the
#: proposals answered on the way (a wall-time budget spent on startup and preflight)
_NEXT_BUDGET = "{reason} before any launch: raise {knob}"
_BUDGET_STOPS = ("wall-time budget", "GPU-hour budget")
_NEXT_INTERRUPTED = "run the same command again: it resumes the study and launches the re-queued config(s) first"
_NEXT_UNRANKED = ("no measured config counts: relax sweep.objective_constraints, or check why the measurements "
                  "were set aside (the findings: {findings})")


@dataclass(frozen=True)
class SweepOutcome:
    """``kind`` (:data:`MEASURED`, :data:`NO_BASELINE`, :data:`NOTHING_MEASURED`) and ``line``, the
    one-line reason (None for ``measured``)."""

    kind: str
    line: str | None = None

    @property
    def failed(self) -> bool:
        """True when the sweep has no result (exit 3, MLflow parent FAILED)."""
        return self.kind == NOTHING_MEASURED


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in c.most_common())


def _next_step(cls: str | None, kind: str | None, spec: Any) -> str:
    t = spec.backend.timeouts
    fields = {"startup_s": t.startup_s, "bench_s": t.bench_s, "findings": spec.findings_path,
              "sweep": spec.sweep.name}
    text = _NEXT_BY_CLASS.get(cls or "") or _NEXT_BY_KIND.get(kind or "", _NEXT_BY_KIND["transient"])
    return text.format(**fields)


def _unmeasured(r: records.TrialRecord, objective: Any) -> str:
    """Why an ok trial does not rank: the reason word of :func:`nothing_line`."""
    if records.value_of(r, objective) is None:
        return "no objective value (ended at its probe)"
    if not records.counts_for_level(r):
        return records.DEGRADED
    if "unstable" in r.perf_tags:
        return "unstable"
    return "violated " + ", ".join(r.violated or [str(c) for c in objective.primary.constraints])


def nothing_line(recs: list[records.TrialRecord], spec: Any, study_name: str, stop_reason: str | None = None) -> str:
    """The one line for a sweep in which no config ranks: what the launched trials failed of,
    what the proposals answered without GPU time were, and the next step (``stop_reason``: why
    the sweep loop stopped, :meth:`sweeps.search.loop.SweepLoop.budget_left`'s words; a wall-time
    or GPU-hour budget that stopped it before any launch is the next step)."""
    obj = spec.objective_set
    logs = spec.store_dir / "trials" / study_name
    launched = [r for r in recs if r.launched and r.status != "interrupted"]
    failed = [r for r in launched if r.status != "ok"]
    unranked = [r for r in launched if r.status == "ok"]
    answered = [r for r in recs if not r.launched and r.status in ("skipped", "infeasible")]
    stopped = [r for r in recs if r.status == "interrupted"]
    parts: list[str] = []
    if failed:
        base = " (the baseline too)" if any(r.is_baseline for r in failed) else ""
        parts.append(f"{len(failed)} of {len(launched)} launched trial(s) failed{base}: "
                     f"{_counts(Counter(r.failure_class or r.status for r in failed))}")
    if unranked:
        parts.append(f"{len(unranked)} measured but set aside: {_counts(Counter(_unmeasured(r, obj) for r in unranked))}")
    if not launched:
        parts.append(f"no trial finished: {len(stopped)} interrupted when the sweep stopped, its config re-queued"
                     if stopped else "no trial was launched")
    if answered:
        why = Counter((f"known dead end {r.failure_class}" if r.skipped_by_rule else
                       "duplicate" if r.duplicate_of is not None else r.failure_class or r.status) for r in answered)
        parts.append(f"{len(answered)} proposal(s) answered without GPU time: {_counts(why)}")
    if failed:
        top_cls, _ = Counter(r.failure_class for r in failed).most_common(1)[0]
        kind = next((r.failure_kind for r in failed if r.failure_class == top_cls), None)
        step = _next_step(top_cls, kind, spec) + f" ({logs})"
    elif unranked:
        step = _NEXT_UNRANKED.format(findings=spec.findings_path)
    elif not launched and stopped:
        step = _NEXT_INTERRUPTED
    elif not launched and stop_reason and (budget := next((b for b in _BUDGET_STOPS if b in stop_reason), None)):
        step = _NEXT_BUDGET.format(reason=stop_reason, knob=STOP_KNOBS[budget])
    else:
        step = _NEXT_SKIPPED.format(findings=spec.findings_path, sweep=spec.sweep.name)
    return f"nothing was measured: {'; '.join(parts)}. Next: {step}."


def baseline_line(recs: list[records.TrialRecord], spec: Any) -> str:
    """The one line for a sweep whose configs rank but whose baseline did not measure."""
    base = [r for r in recs if r.is_baseline]
    if not base:
        why = "no baseline trial ran"
    else:
        b = base[-1]
        why = f"the baseline (trial {b.number}) {b.status}" + (f": {b.failure_class}" if b.failure_class else "")
    return (f"speedups vs the baseline are missing: {why}; the results below are absolute "
            f"{spec.objective_set.primary.name} only. Next: fix the baseline's failure (sweep.baseline; its "
            f"server log is under {spec.store_dir / 'trials'}), then run a new study (new_study=true) to measure it.")


def sweep_outcome(recs: list[records.TrialRecord], spec: Any, study_name: str,
                  stop_reason: str | None = None) -> SweepOutcome:
    """The outcome of a finished sweep from its records (see the module doc).

    Args:
        recs: every trial of the study.  spec: the :class:`~sweeps.config.spec.SweepSpec`.
        study_name: the study (where its trials' server logs are).
        stop_reason: why the sweep loop stopped (None: not known), for :func:`nothing_line`.
    """
    if spec.sweep.mode != "search":
        return SweepOutcome(MEASURED)
    if records.best_record(recs, spec.objective_set) is None:
        return SweepOutcome(NOTHING_MEASURED, nothing_line(recs, spec, study_name, stop_reason))
    if records.baseline_value(recs, spec.objective_set) is None:
        return SweepOutcome(NO_BASELINE, baseline_line(recs, spec))
    return SweepOutcome(MEASURED)
