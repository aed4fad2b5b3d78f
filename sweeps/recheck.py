"""Recheck sweep: re-run each dead end of an earlier sweep once on the current stack.

    python run_sweep.py sweep=recheck source=<sweep (study) name> [backend=... node=...]

Failure rules are keyed by the environment fingerprint (GPU arch, driver, CUDA, NCCL, torch,
SGLang, FlashInfer): after an upgrade they no longer apply. A recheck reads the *source*
study and the rules table and re-runs, once each, on the current fingerprint:

- every distinct dead end of the source: each failure rule with evidence from the source
  (or that skipped one of its trials), keyed by (class, implicated knobs), re-run with the
  full config of the source trial that failed (or was skipped); and each allreduce level
  the source saw silently replaced (``allreduce_path_degraded``);
- two canaries: the source's baseline and best configs, so a regression of a config that
  used to work shows up as *newly failing*.

Dead ends learned on the current fingerprint are not re-run (the environment did not
change; they are listed as ``not re-run``). Outcomes:

- ``fixed``: the dead end now runs (and runs the path it names);
- ``still failing``: same class; ``still failing (new class)``: fails differently;
- ``still ok`` / ``newly failing``: the canaries;
- ``inconclusive``: an infrastructure error or interruption (re-run the command).

The recheck study (same Optuna storage) is named ``<source>-recheck-<fingerprint hash[:8]>``
(or ``study_name=``), so running the same command again resumes it; each trial keeps its
dead end in the user attr ``recheck``. It runs through :class:`sweeps.driver.Driver`
(Ray tasks, retries, MLflow child runs, circuit breaker): failures on the new stack are
learned as rules for the new fingerprint as in any sweep. The report (markdown) goes to
``findings/<recheck study>.md``, is printed, and is logged to the MLflow parent run with
tags ``recheck.fixed``, ``recheck.still_failing``, ``recheck.newly_failing``.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial, TrialState

from sweeps import records as R
from sweeps.config import SweepSpec
from sweeps.driver import EXIT_INTERRUPTED, Driver, SweepError, emulator_profile, execute

log = logging.getLogger("servesweep")

#: user attr of each recheck trial: the dead end (or canary) it re-runs, see :class:`DeadEnd`.
A_RECHECK = "recheck"
A_DISTS = "recheck_distributions"
SOURCE_ATTR = "recheck_source"

FIXED = "fixed"
STILL_FAILING = "still failing"
NEW_CLASS = "still failing (new class)"
STILL_OK = "still ok"
NEWLY_FAILING = "newly failing"
NOT_RERUN = "not re-run (same environment)"
INCONCLUSIVE = "inconclusive"
PENDING = "pending"

__all__ = ["DeadEnd", "Outcome", "RecheckDriver", "collect_dead_ends", "current_fingerprint", "outcomes",
           "recheck", "recheck_study_name", "report_markdown", "run_recheck"]


@dataclass
class DeadEnd:
    """One thing a recheck re-runs.

    Attributes:
        kind: ``rule`` (a failure rule), ``degraded`` (an allreduce level silently
            replaced) or ``canary`` (the source's baseline / best config).
        failure_class: the class it failed with (``allreduce_path_degraded`` for degraded,
            None for canaries).
        knobs: implicated knob values (a rule's ``knobs``; ``{"allreduce": level}``;
            the full config for canaries).
        params: the full config re-run (from the source trial).
        source_trial: the source trial number the config comes from.
        rule_ids: rules merged into this dead end (same class and knobs, any fingerprint).
        fingerprint_hash: environment the dead end was observed on.
        source_value: the canary's objective in the source (tok/s), else None.
        label: short description for the report.
    """

    kind: str
    failure_class: str | None
    knobs: dict[str, Any]
    params: dict[str, Any]
    source_trial: int
    rule_ids: list[int] = field(default_factory=list)
    fingerprint_hash: str | None = None
    source_value: float | None = None
    label: str = ""

    @property
    def key(self) -> str:
        """Distinctness key: (kind, class, implicated knobs)."""
        return json.dumps([self.kind if self.kind != "canary" else f"canary:{self.label}", self.failure_class,
                           self.knobs], sort_keys=True, default=str)


@dataclass
class Outcome:
    """A dead end and what the recheck saw (``outcome`` is one of the module constants)."""

    dead_end: DeadEnd
    outcome: str
    trial: int | None = None
    status: str | None = None
    failure_class: str | None = None
    value: float | None = None


def recheck_study_name(source: str, fingerprint: dict[str, Any]) -> str:
    """``<source>-recheck-<first 8 hex of the fingerprint hash>`` (:func:`sweeps.rules.fingerprint_hash`)."""
    from sweeps.rules import fingerprint_hash

    return f"{source}-recheck-{fingerprint_hash(fingerprint)[:8]}"


def current_fingerprint(spec: SweepSpec) -> dict[str, str]:
    """The fingerprint of the node the recheck will run on.

    Emulated/instant: the profile's (``backend.emulator.fingerprint`` overrides the node's),
    computed here. Real nodes: a GPU-less Ray task on the cluster (starts/joins Ray).

    Raises:
        SweepError: the fingerprint has none of the keys rules are keyed by.
    """
    from sweeps.rules import fingerprint_hash

    if spec.backend.kind in ("emulated", "instant"):
        from tasks.trial import node_fingerprint

        fp = node_fingerprint(spec.backend.kind, emulator_profile(spec))
    else:
        import ray

        from sweeps.cluster import start_ray
        from tasks.remote import fingerprint_task

        start_ray(spec)
        fp = ray.get(fingerprint_task(spec).remote(spec.backend.kind, None), timeout=120)
    try:
        fingerprint_hash(fp)
    except ValueError as e:
        raise SweepError(f"cannot recheck: the node's fingerprint is unusable ({e})") from None
    return fp


def _load_source(spec: SweepSpec, source: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=source, storage=spec.optuna_storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage=spec.optuna_storage)]
        raise SweepError(f"source={source!r}: no such study in {spec.optuna_storage}; studies there: "
                         f"{', '.join(sorted(names)) or '(none)'}") from None


def collect_dead_ends(source_study: optuna.Study, rules: Any) -> list[DeadEnd]:
    """The distinct dead ends and canaries of ``source_study`` (see the module docstring).

    Args:
        source_study: the earlier sweep's study.
        rules: a :class:`sweeps.rules.RuleStore` (the table the sweep learned into).
    Returns:
        Dead ends (kind ``rule`` then ``degraded``) then canaries; one per distinct
        (kind, class, knobs); rules with the same class and knobs on several fingerprints
        are merged (``rule_ids``).
    """
    from sweeps.rules import fingerprint_hash

    name = source_study.study_name
    trials: dict[int, FrozenTrial] = {t.number: t for t in source_study.get_trials(deepcopy=False)}
    recs = {r.number: r for r in R.load_records(source_study)}
    out: dict[str, DeadEnd] = {}

    def add(d: DeadEnd) -> None:
        if d.key in out:
            for rid in d.rule_ids:
                if rid not in out[d.key].rule_ids:
                    out[d.key].rule_ids.append(rid)
        else:
            out[d.key] = d

    rule_list = list(rules.all_dead_ends(sweep=name))
    skipped_ids = {int(r.skipped_by_rule) for r in recs.values()
                   if r.skipped_by_rule and str(r.skipped_by_rule).isdigit()}
    known = {r.id for r in rule_list}
    rule_list += [x for x in (rules.get(i) for i in sorted(skipped_ids - known)) if x is not None]
    for rule in rule_list:
        nums = [int(e["trial_number"]) for e in rule.evidence if e.get("sweep") == name and "trial_number" in e]
        nums += [r.number for r in recs.values() if r.skipped_by_rule == str(rule.id)]
        nums = [n for n in nums if n in trials and trials[n].params]
        if not nums:
            log.warning("rule %d: no trial of %s holds its config; not re-checked", rule.id, name)
            continue
        n = min(nums)
        add(DeadEnd("rule", rule.failure_class, dict(rule.knobs), dict(trials[n].params), n, [rule.id],
                    rule.fingerprint_hash, label=", ".join(f"{k}={v}" for k, v in rule.knobs.items())))
    for r in sorted(recs.values(), key=lambda r: r.number):
        if r.status == "ok" and not R.counts_for_level(r) and r.duplicate_of is None and r.skipped_by_rule is None:
            level = r.params.get("allreduce")
            try:
                fph = fingerprint_hash(r.fingerprint) if r.fingerprint else None
            except ValueError:
                fph = None
            add(DeadEnd("degraded", R.DEGRADED, {"allreduce": level}, dict(r.params), r.number, [], fph,
                        label=f"allreduce={level}"))
    record_list = list(recs.values())
    base = next((r for r in sorted(record_list, key=lambda r: r.number) if r.is_baseline and r.status == "ok"), None)
    best = R.best_record(record_list)
    for label, r in (("baseline", base), ("best", best)):
        if r is None:
            continue
        if any(d.kind == "canary" and d.params == r.params for d in out.values()):
            continue
        try:
            fph = fingerprint_hash(r.fingerprint) if r.fingerprint else None
        except ValueError:
            fph = None
        add(DeadEnd("canary", None, dict(r.params), dict(r.params), r.number, [], fph, source_value=r.value,
                    label=label))
    order = {"rule": 0, "degraded": 1, "canary": 2}
    return sorted(out.values(), key=lambda d: (order[d.kind], d.source_trial))


class RecheckDriver(Driver):
    """The sweep driver re-running a fixed list of configs (the source's dead ends) once each.

    ``setup()`` additionally loads the source study (``spec.source``), collects its dead
    ends (:func:`collect_dead_ends`) and enqueues those not learned on the current
    fingerprint (``skip_if_exists``: a resumed recheck does not repeat them). The loop
    asks only enqueued trials (with the source trial's distributions) and launches them
    without rule/duplicate checks; everything after a launch (retries, telling Optuna,
    learning rules for the new fingerprint, MLflow) is the Driver's.
    """

    dead_ends: list[DeadEnd]
    not_rerun: list[DeadEnd]

    def setup(self) -> None:
        super().setup()
        from sweeps.rules import fingerprint_hash

        source = str(self.spec.source)
        src = _load_source(self.spec, source)
        self.study.set_user_attr(SOURCE_ATTR, source)
        here = fingerprint_hash(self.fingerprint) if self.fingerprint else None
        all_ends = collect_dead_ends(src, self.rules)
        self.not_rerun = [d for d in all_ends if here is not None and d.fingerprint_hash == here]
        self.dead_ends = [d for d in all_ends if d not in self.not_rerun]
        dists = {t.number: t.distributions for t in src.get_trials(deepcopy=False)}
        for d in self.dead_ends:
            self.study.enqueue_trial(
                d.params, user_attrs={A_RECHECK: asdict(d),
                                      A_DISTS: {k: distribution_to_json(v) for k, v in dists[d.source_trial].items()}},
                skip_if_exists=True)
        log.info("recheck of %s on %s: %d dead end(s)/canaries to re-run, %d learned on this environment (not re-run)",
                 source, self.study_name, len(self.dead_ends), len(self.not_rerun))

    def _propose(self) -> bool:
        waiting = sorted(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)), key=lambda t: t.number)
        if not waiting:
            return False
        self.asks += 1
        dists = {k: json_to_distribution(v) for k, v in (waiting[0].user_attrs.get(A_DISTS) or {}).items()}
        trial = self.study.ask(fixed_distributions=dists)
        params = dict(trial.params)
        trial.set_user_attr(R.A_CONFIG_KEY, R.config_key(params))
        self.consecutive_skips = 0
        self._launch(trial, params)
        return True

    # ---- report -------------------------------------------------------------------------
    def outcomes(self) -> list[Outcome]:
        """Outcome of every dead end of this recheck (not re-run ones included)."""
        return outcomes(self.study, getattr(self, "not_rerun", []))

    def _write_findings(self, recs: list[R.TrialRecord]) -> None:
        try:
            self.spec.findings_path.parent.mkdir(parents=True, exist_ok=True)
            self.spec.findings_path.write_text(report_markdown(self.study_name, str(self.spec.source), self.fingerprint,
                                                               self.outcomes()))
        except Exception as e:  # noqa: BLE001 - a report problem never stops the recheck
            log.error("could not write the recheck report: %s", e)

    def _log_parent_artifacts(self) -> None:
        if self.tracker is not None and self.tracker.parent_run_id:
            counts = _counts(self.outcomes())
            self.tracker.set_parent_tags({"recheck.source": self.spec.source,
                                          **{f"recheck.{k.replace(' ', '_').replace('(', '').replace(')', '')}": v
                                             for k, v in counts.items()}})
        self._write_findings([])
        super()._log_parent_artifacts()


def outcomes(study: optuna.Study, not_rerun: list[DeadEnd] | None = None) -> list[Outcome]:
    """Classify each recheck trial of ``study`` against the dead end it re-ran.

    A dead end re-run twice (a resumed recheck after an interruption) takes its last
    conclusive trial.
    """
    res: dict[str, Outcome] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        raw = t.user_attrs.get(A_RECHECK)
        if not raw:
            continue
        d = DeadEnd(**raw)
        r = R.record_from_trial(t)
        if t.state in (TrialState.WAITING, TrialState.RUNNING):
            o = Outcome(d, PENDING, t.number)
        elif r.status in ("infra_error", "interrupted") or r.status not in ("ok", "failed"):
            o = Outcome(d, INCONCLUSIVE, t.number, r.status, r.failure_class)
        elif d.kind == "canary":
            o = Outcome(d, STILL_OK if r.status == "ok" else NEWLY_FAILING, t.number, r.status, r.failure_class, r.value)
        elif r.status == "ok" and R.counts_for_level(r):
            o = Outcome(d, FIXED, t.number, r.status, None, r.value)
        elif r.status == "ok":  # ran, but the allreduce level was silently replaced
            o = Outcome(d, STILL_FAILING if d.failure_class == R.DEGRADED else NEW_CLASS, t.number, r.status,
                        R.DEGRADED, r.value)
        else:
            o = Outcome(d, STILL_FAILING if r.failure_class == d.failure_class else NEW_CLASS, t.number, r.status,
                        r.failure_class)
        prev = res.get(d.key)
        if prev is None or prev.outcome in (PENDING, INCONCLUSIVE) or o.outcome not in (PENDING, INCONCLUSIVE):
            res[d.key] = o
    for d in not_rerun or []:
        res.setdefault(d.key, Outcome(d, NOT_RERUN))
    return list(res.values())


def _counts(outs: list[Outcome]) -> dict[str, int]:
    c: dict[str, int] = {}
    for o in outs:
        c[o.outcome] = c.get(o.outcome, 0) + 1
    return c


def report_markdown(study_name: str, source: str, fingerprint: dict[str, Any], outs: list[Outcome]) -> str:
    """The recheck report: environment, counts, one row per dead end."""
    fp = ", ".join(f"{k}={v}" for k, v in sorted(fingerprint.items())) or "(unknown)"
    counts = _counts(outs)
    lines = [f"# Recheck of `{source}` ({study_name})", "", f"Environment now: {fp}", "",
             "Outcomes: " + (", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "(none)"), "",
             "| dead end | class before | source trial | outcome | now | recheck trial |",
             "|---|---|---:|---|---|---:|"]
    for o in outs:
        d = o.dead_end
        what = f"{d.kind}: {d.label}" if d.kind != "canary" else f"canary ({d.label})"
        before = d.failure_class or (f"ok {d.source_value:.1f} tok/s" if d.source_value else "ok")
        if o.status == "ok":
            now = f"ok {o.value:.1f} tok/s" if o.value is not None else "ok"
            if o.failure_class:
                now += f" [{o.failure_class}]"
        else:
            now = o.failure_class or o.status or "-"
        lines.append(f"| {what} | {before} | {d.source_trial} | {o.outcome} | {now} | "
                     f"{'' if o.trial is None else o.trial} |")
    lines.append("")
    return "\n".join(lines)


def recheck(spec: SweepSpec, driver_cls: type[RecheckDriver] = RecheckDriver, **driver_kw: Any) -> RecheckDriver:
    """Set up and run a recheck sweep; returns the finished driver (``.outcomes()``, ``.study``).

    The study is named :func:`recheck_study_name` unless ``spec.study_name`` is set.

    Raises:
        SweepError: no ``source``, an unknown source study, an unusable fingerprint, or
            any sweep-level error of the driver.
    """
    if not spec.source:
        raise SweepError("sweep=recheck needs source=<name of the sweep to re-check>")
    name = spec.study_name or recheck_study_name(spec.source, current_fingerprint(spec))
    spec = spec.model_copy(update={"study_name": name})
    return execute(driver_cls(spec, name, **driver_kw))


def run_recheck(spec: SweepSpec) -> float | None:
    """``python run_sweep.py sweep=recheck source=<name>``: re-run the source's dead ends.

    Prints the recheck report (also written to ``findings/<recheck study>.md`` and logged
    to MLflow). Returns the best objective (tok/s) measured in the recheck, or None.
    Exits 1 on a sweep-level error, 130 after Ctrl-C (the same command resumes).
    """
    try:
        drv = recheck(spec)
    except SweepError as e:
        print(f"servesweep: {e}", file=sys.stderr)
        sys.exit(1)
    outs = drv.outcomes()
    print(report_markdown(drv.study_name, str(spec.source), drv.fingerprint, outs))
    print(f"report: {drv.spec.findings_path}")
    if drv.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    vals = [o.value for o in outs if o.value is not None]
    return max(vals) if vals else None
