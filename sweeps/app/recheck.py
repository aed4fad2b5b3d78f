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
  used to work shows up as *newly failing*. The baseline canary is the recheck study's
  baseline (user attr ``is_baseline``): its summary's baseline is that canary's new run.

Dead ends learned on the current fingerprint are not re-run (the environment did not
change; they are listed as ``not re-run``). Outcomes:

- ``fixed``: the dead end now runs (and runs the path it names);
- ``still failing``: same class; ``still failing (new class)``: fails differently;
- ``still ok`` / ``newly failing``: the canaries;
- ``inconclusive``: an infrastructure error or interruption (re-run the command).

The recheck study (same Optuna storage) is named ``<source>-recheck-<fingerprint hash[:8]>``
(or ``study_name=``), so running the same command again resumes it; each trial keeps its
dead end in the user attr ``recheck``. It runs through the sweep loop
(:class:`sweeps.app.sweep.Driver` with a :class:`RecheckSearcher`: its runner, retries, MLflow child runs, circuit breaker;
only the proposals and the report differ): failures on the new stack are
learned as rules for the new fingerprint as in any sweep. The report (markdown) goes to
``findings/<recheck study>.md``, is printed, and is logged to the MLflow parent run with
tags ``recheck.fixed``, ``recheck.still_failing``, ``recheck.newly_failing``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial, TrialState

from sweeps.app.lifecycle import execute
from sweeps.app.sweep import Driver
from sweeps.config.spec import SweepSpec
from sweeps.errors import Interrupted, SweepError
from sweeps.publish.outputs import Publisher, best_effort
from sweeps.publish.recheck_report import (  # noqa: F401 - re-exported: the recheck's public names
    A_DISTS,
    A_RECHECK,
    FIXED,
    INCONCLUSIVE,
    NEW_CLASS,
    NEWLY_FAILING,
    NOT_RERUN,
    PENDING,
    SOURCE_ATTR,
    STILL_DEGRADED,
    STILL_FAILING,
    STILL_OK,
    DeadEnd,
    Outcome,
    _counts,
    outcomes,
    report_markdown,
)
from sweeps.rules.store import RuleStore
from sweeps.run.preflight import emulator_profile
from sweeps.search.searcher import Searcher
from sweeps.store import records as trial_records

log = logging.getLogger("servesweep")

__all__ = ["DeadEnd", "Outcome", "RecheckDriver", "RecheckSearcher", "collect_dead_ends", "current_fingerprint", "outcomes",
           "recheck", "recheck_study_name", "report_markdown", "run_recheck"]

def recheck_study_name(source: str, fingerprint: dict[str, Any]) -> str:
    """``<source>-recheck-<first 8 hex of the fingerprint hash>`` (:func:`sweeps.rules.store.fingerprint_hash`)."""
    from sweeps.rules.store import fingerprint_hash

    return f"{source}-recheck-{fingerprint_hash(fingerprint)[:8]}"


def current_fingerprint(spec: SweepSpec) -> dict[str, str]:
    """The fingerprint of the node the recheck will run on.

    An emulated backend (one with a profile): the profile's (``backend.emulator.fingerprint``
    overrides the node's), computed here. Real nodes: a GPU-less Ray task on the cluster (starts/joins Ray).

    Raises:
        SweepError: the fingerprint has none of the keys rules are keyed by.
    """
    from sweeps.rules.store import fingerprint_hash

    profile = emulator_profile(spec)
    if profile is not None:  # an emulated node: its declared stack, computed here
        from tasks.backends import get_backend

        fp = get_backend(spec.backend.kind).fingerprint(profile, None)
    else:
        import ray

        from sweeps.run.cluster import start_ray
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


def collect_dead_ends(source_study: optuna.Study, rules: RuleStore, objective: Any = None) -> list[DeadEnd]:
    """The distinct dead ends and canaries of ``source_study`` (see the module docstring).

    Args:
        source_study: the earlier sweep's study.
        rules: a :class:`sweeps.rules.store.RuleStore` (the table the sweep learned into).
        objective: what "best" means for the best canary (default decode_tok_s, maximize).
    Returns:
        Dead ends (kind ``rule`` then ``degraded``) then canaries; one per distinct
        (kind, class, knobs); rules with the same class and knobs on several fingerprints
        are merged (``rule_ids``).
    """
    from sweeps.rules.store import fingerprint_hash

    name = source_study.study_name
    trials: dict[int, FrozenTrial] = {t.number: t for t in source_study.get_trials(deepcopy=False)}
    recs = {r.number: r for r in trial_records.load_records(source_study)}
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
        if r.status == "ok" and not trial_records.counts_for_level(r) and r.duplicate_of is None and r.skipped_by_rule is None:
            level = r.params.get("allreduce")
            try:
                fph = fingerprint_hash(r.fingerprint) if r.fingerprint else None
            except ValueError:
                fph = None
            add(DeadEnd("degraded", trial_records.DEGRADED, {"allreduce": level}, dict(r.params), r.number, [], fph,
                        label=f"allreduce={level}"))
    record_list = list(recs.values())
    base = next((r for r in sorted(record_list, key=lambda r: r.number) if r.is_baseline and r.status == "ok"), None)
    best, values = _confirmed_best(source_study, record_list, objective)
    spec_best = trial_records.best_record([r for r in record_list if r.params.get("speculative") not in (None, "none")],
                                          objective)
    for label, r in (("baseline", base), ("best", best), ("best speculative", spec_best)):
        if r is None:
            continue
        if any(d.kind == "canary" and d.params == r.params for d in out.values()):
            continue
        try:
            fph = fingerprint_hash(r.fingerprint) if r.fingerprint else None
        except ValueError:
            fph = None
        add(DeadEnd("canary", None, dict(r.params), dict(r.params), r.number, [], fph,
                    source_value=values.get(r.number, r.value), label=label))
    order = {"rule": 0, "degraded": 1, "canary": 2}
    return sorted(out.values(), key=lambda d: (order[d.kind], d.source_trial))


def _confirmed_best(source_study: optuna.Study, records: list[trial_records.TrialRecord], objective: Any
                    ) -> tuple[trial_records.TrialRecord | None, dict[int, float]]:
    """(the source's best: its confirmed winner where its confirmation named one, else the best
    single measurement; trial -> confirmed mean for every re-measured trial): the canary is the
    config the source recommended, at the value it reported (:mod:`sweeps.publish.summary`)."""
    conf = source_study.user_attrs.get("confirmation") or {}
    values = {int(e["trial"]): float(e["mean"]) for e in conf.get("entries", [])
              if e.get("n") and isinstance(e.get("mean"), int | float)}
    win = conf.get("winner")
    from sweeps.search.confirm import config_record

    best = config_record(records, conf, win)
    return best or trial_records.best_record(records, objective), values


def planned_launches(spec: SweepSpec) -> int | None:
    """How many launches ``sweep=recheck source=<name>`` makes: the source's dead ends and
    canaries not learned on the current fingerprint (None when that cannot be told before setup:
    no source, an unknown study, a fingerprint that needs the node)."""
    if not spec.source:
        return None
    try:
        from sweeps.rules.store import RuleStore, fingerprint_hash

        if emulator_profile(spec) is None:
            return None  # the fingerprint needs a Ray task on the node: counted once set up
        src = optuna.load_study(study_name=str(spec.source), storage=spec.optuna_storage)
        ends = collect_dead_ends(src, RuleStore(spec.rules_db), spec.objective_set.primary)
        here = fingerprint_hash(current_fingerprint(spec))
        return sum(d.fingerprint_hash != here for d in ends)
    except Exception as e:  # noqa: BLE001 - an estimate only: the recheck itself reports the real error
        log.debug("recheck launches not counted before setup: %s", e)
        return None


class RecheckPublisher(Publisher):
    """Publishes a recheck: the recheck report instead of the findings document, and the
    outcome counts as parent-run tags. ``driver`` gives the dead ends not re-run."""

    def __init__(self, spec: SweepSpec, study_name: str, driver: RecheckDriver, **kw: Any):
        super().__init__(spec, study_name, **kw)
        self.driver = driver

    def not_rerun(self) -> list[DeadEnd]:
        """The dead ends learned on this environment (listed, not re-run)."""
        return self.driver.not_rerun

    def write_findings(self, study: optuna.Study, recs: list[trial_records.TrialRecord], fingerprint: dict[str, str],
                       rules: Any) -> None:
        """The recheck report (markdown) at the findings path."""
        with best_effort("write the recheck report"):
            self.spec.findings_path.parent.mkdir(parents=True, exist_ok=True)
            self.spec.findings_path.write_text(report_markdown(self.study_name, str(self.spec.source), fingerprint,
                                                               outcomes(study, self.not_rerun())))

    def log_parent_artifacts(self, study: optuna.Study) -> None:
        """Outcome counts as ``recheck.*`` parent tags, then the report and plots."""
        counts = _counts(outcomes(study, self.not_rerun()))
        self.tracker.set_parent_tags({"recheck.source": self.spec.source,
                                      **{f"recheck.{k.replace(' ', '_').replace('(', '').replace(')', '')}": v
                                         for k, v in counts.items()}})
        self.write_findings(study, [], self.driver.fingerprint, None)
        super().log_parent_artifacts(study)


class RecheckSearcher(Searcher):
    """Proposes a fixed list of configs (the source's dead ends and canaries) once each.

    :meth:`prepare` loads the source study (``spec.source``), collects its dead ends
    (:func:`collect_dead_ends`) and enqueues those not learned on the current fingerprint
    (``skip_if_exists``: a resumed recheck does not repeat them). :meth:`ask` returns only
    enqueued trials (with the source trial's distributions); there are no gates, untried
    draws or probes (``gated = False``). Telling Optuna and learning rules for the new
    fingerprint are the searcher's as in any sweep.

    Attributes:
        dead_ends: what this recheck re-runs.  not_rerun: dead ends learned on this environment.
    """

    gated = False

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.dead_ends: list[DeadEnd] = []
        self.not_rerun: list[DeadEnd] = []

    def prepare(self) -> None:
        """Enqueue the source's dead ends not learned on this fingerprint (see the class docstring)."""
        from sweeps.rules.store import fingerprint_hash

        source = str(self.spec.source)
        src = _load_source(self.spec, source)
        self.study.set_user_attr(SOURCE_ATTR, source)
        here = fingerprint_hash(self.fingerprint) if self.fingerprint else None
        all_ends = collect_dead_ends(src, self.rules, self.objectives)
        self.not_rerun = [d for d in all_ends if here is not None and d.fingerprint_hash == here]
        self.dead_ends = [d for d in all_ends if d not in self.not_rerun]
        dists = {t.number: t.distributions for t in src.get_trials(deepcopy=False)}
        space: dict[str, Any] = {}  # every knob's distribution, for a canary only the confirmation measured
        for ds in dists.values():
            for k, v in ds.items():
                space.setdefault(k, v)
        for d in self.dead_ends:
            own = dists.get(d.source_trial) or {k: space[k] for k in d.params if k in space}
            # the baseline canary is the recheck study's baseline: the summary (console, MLflow
            # parent) and each trial's speedup_vs_baseline measure against it, as the report does
            base = {trial_records.A_BASELINE: True} if d.kind == "canary" and d.label == "baseline" else {}
            self.study.enqueue_trial(
                d.params, user_attrs={A_RECHECK: asdict(d), **base,
                                      A_DISTS: {k: distribution_to_json(v) for k, v in own.items()}},
                skip_if_exists=True)
        log.info("recheck of %s on %s: %d dead end(s)/canaries to re-run, %d learned on this environment (not re-run)",
                 source, self.study_name, len(self.dead_ends), len(self.not_rerun))

    def ask(self) -> tuple[optuna.trial.Trial, dict[str, Any]] | None:
        """The next enqueued dead end (asked with its source trial's distributions); None when done."""
        waiting = sorted(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)), key=lambda t: t.number)
        if not waiting:
            return None
        dists = {k: json_to_distribution(v) for k, v in (waiting[0].user_attrs.get(A_DISTS) or {}).items()}
        trial = self.study.ask(fixed_distributions=dists)
        return trial, dict(trial.params)


class RecheckDriver(Driver):
    """The sweep loop with a :class:`RecheckSearcher` and a :class:`RecheckPublisher`:
    re-runs a fixed list of configs (the source's dead ends) once each; everything after a
    launch (retries, telling Optuna, learning rules for the new fingerprint, MLflow) is the loop's.
    """

    def make_publisher(self) -> Publisher:
        """A :class:`RecheckPublisher` (the report instead of the findings document)."""
        return RecheckPublisher(self.spec, self.study_name, self, track=self.track, quiet=self.quiet)

    def make_searcher(self, study: optuna.Study, rules: RuleStore, implicated: dict[str, list[str]],
                      fingerprint: dict[str, str]) -> Searcher:
        """A :class:`RecheckSearcher` over the recheck study."""
        return RecheckSearcher(self.spec, self.study_name, study, rules, implicated, fingerprint)

    def _recheck_searcher(self) -> RecheckSearcher | None:
        return self.searcher if isinstance(self.searcher, RecheckSearcher) else None

    @property
    def dead_ends(self) -> list[DeadEnd]:
        """The dead ends and canaries this recheck re-runs ([] before setup)."""
        rs = self._recheck_searcher()
        return rs.dead_ends if rs is not None else []

    @property
    def not_rerun(self) -> list[DeadEnd]:
        """The dead ends learned on this environment, listed but not re-run ([] before setup)."""
        rs = self._recheck_searcher()
        return rs.not_rerun if rs is not None else []

    def outcomes(self) -> list[Outcome]:
        """Outcome of every dead end of this recheck (not re-run ones included)."""
        return outcomes(self.study, self.not_rerun)


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

    Raises:
        The kinds of :mod:`sweeps.errors` (see :func:`recheck`); Interrupted after Ctrl-C (the
        report of what was re-checked is printed first; the same command resumes).
    """
    drv = recheck(spec)
    outs = drv.outcomes()
    print(report_markdown(drv.study_name, str(spec.source), drv.fingerprint, outs))
    print(f"report: {drv.spec.findings_path}")
    if drv.interrupted:
        raise Interrupted("")
    obj = spec.objective_set.primary
    best = obj.best([o for o in outs if o.value is not None], lambda o: o.value)
    return best.value if best else None
