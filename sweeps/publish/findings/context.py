"""What the findings section shows besides the records: the sweep's environment, space,
rules and confirmation, gathered once per write (from a SweepSpec, or by hand in tests)."""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps.config.objective import Objective
from sweeps.publish.findings.measure import objective_of

log = logging.getLogger("servesweep.findings")


@dataclass
class Context:
    """Everything besides the records that the section shows.

    Attributes:
        study: study name.  sweep: sweep config name.  description: sweep description.
        node: ``{"name", "gpus", "gpu_name", "interconnect", "compute_capability"}``.
        model: ``{"name", "path", "draft_path"}``.  backend: backend kind.
        fingerprint: environment fingerprint (GPU arch, driver, CUDA, NCCL, torch, SGLang, FlashInfer).
        objective: the :class:`~sweeps.config.objective.Objective` the sweep ranks by (a metric
            name is taken as that metric, maximised).  baseline_config: the declared baseline params.
        space: the :class:`~sweeps.config.space.SearchSpace` (None: no untried analysis).
        rules: failure rules known for this environment (``sweeps.rules.store.Rule``).
        mapping: failure class -> implicated knobs (``conf/failure_knobs.yaml``).
        confirmation: the winner confirmation (``sweeps.search.confirm``), or None.
        now: timestamp shown as "updated" (ISO-8601).
        backend_cfg: the ``backend`` config (what the deployable command is rendered with).
        emulated: True when the numbers are the emulated node's (``Backend.emulated``).
        plots_dir: where the report writes this study's plots (``<store>/reports/<study>``), or None.
        findings_path: the document's path (plots are linked relative to it), or None.
    """

    study: str
    sweep: str = ""
    description: str = ""
    node: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    backend: str = ""
    fingerprint: dict[str, str] = field(default_factory=dict)
    objective: Objective = field(default_factory=Objective)
    baseline_config: dict[str, Any] = field(default_factory=dict)
    space: Any = None
    rules: list[Any] = field(default_factory=list)
    mapping: dict[str, list[str]] = field(default_factory=dict)
    confirmation: dict[str, Any] | None = None
    now: str = ""
    backend_cfg: dict[str, Any] = field(default_factory=dict)
    emulated: bool = False
    plots_dir: Path | None = None
    findings_path: Path | None = None
    objectives: Any = None  # the sweep's ObjectiveSet (several objectives: the Pareto front)
    #: ``sweep.approaches`` as ``{"knob", "min_share", ...}`` (None: the sweep names no approaches)
    approaches: dict[str, Any] | None = None
    serving: dict[str, Any] | None = None  # the serving check of the winner (sweeps.search.serving_check)
    #: ``sweep.budget.trials`` (what an approach quota is owed by; None: no trial budget)
    trial_budget: int | None = None
    #: the command-line overrides of the study's latest run (secrets masked), repeated by the
    #: next-step commands (:data:`sweeps.store.study.OVERRIDES_ATTR`)
    overrides: list[str] = field(default_factory=list)
    #: why the sweep's last loop stopped (study user attr ``stop_reason``; None while it runs)
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.objective, str):
            self.objective = Objective(self.objective)

    def where(self) -> str:
        """`` (emulated 8× RTX PRO 6000 node)`` when the numbers are the emulated node's, else ''."""
        return f" (emulated {self.node_label()})" if self.emulated else ""

    def node_label(self) -> str:
        """``8×RTX PRO 6000 Blackwell node`` (the node config's GPU count and name)."""
        gpu = str(self.node.get("gpu_name", "GPU")).replace("NVIDIA ", "").replace(" Server Edition", "")
        return f"{self.node.get('gpus', '?')}×{gpu} node"

    def deploy_command(self, params: Mapping[str, Any], recorded: str) -> tuple[str, str]:
        """(the command to deploy ``params`` on the target node with the real engine, what it is).

        The backend's ``deploy_command`` (the render the dry run validates, with the real
        engine's launcher); ``recorded`` (the trial's launch command) with a note when the
        backend cannot render it (unknown backend, a knob the engine version lacks).
        """
        try:
            from tasks.backends import get_backend

            cmd = get_backend(self.backend).deploy_command(params, self.node, self.model, self.backend_cfg)
            return cmd, f"the real engine on `{self.node.get('name', 'the target node')}`"
        except Exception as e:  # noqa: BLE001 - fallback: the recorded launch command, marked as such
            log.info("findings: no deployable command (%s); showing the recorded launch command", e)
            return (recorded or "(launch command not recorded)",
                    f"FALLBACK: the recorded launch command; no deployable render: {e}")


def fp_hash(fp: Mapping[str, Any]) -> str:
    """The first 12 hex digits of the fingerprint's hash ('' when it cannot be hashed)."""
    try:
        from sweeps.rules.store import fingerprint_hash

        return fingerprint_hash(fp)[:12]
    except (ValueError, ImportError):
        return ""


def _rules_for(spec: Any, study_name: str, fp: Mapping[str, str], rules: Any) -> tuple[list[Any], dict[str, list[str]]]:
    """(rules that apply to this environment, model and study; failure class -> knobs)."""
    rule_list: list[Any] = []
    mapping: dict[str, list[str]] = {}
    if rules is None:
        return rule_list, mapping
    try:
        mapping = dict(rules.mapping)
        if fp:
            rule_list = [r for r in rules.list(fingerprint=fp)
                         if getattr(r, "retired_at", None) is None
                         and (r.model is None or r.model == spec.model.name)
                         and (r.scope_sweep is None or r.scope_sweep == study_name)]
    except Exception as e:  # noqa: BLE001 - rules are context, not essential
        log.warning("findings: could not read failure rules (%s)", e)
    return rule_list, mapping


def context_from_spec(spec: Any, study_name: str, fingerprint: Mapping[str, str] | None, rules: Any,
                      confirmation: Mapping[str, Any] | None = None, objective: Objective | None = None) -> Context:
    """Build the :class:`Context` from a :class:`~sweeps.config.spec.SweepSpec` and a RuleStore (or None).

    ``objective`` defaults to the spec's primary objective (:func:`~sweeps.publish.findings.measure.objective_of`)."""
    fp = dict(fingerprint or {})
    rule_list, mapping = _rules_for(spec, study_name, fp, rules)
    return Context(
        study=study_name, sweep=spec.sweep.name, description=spec.sweep.description,
        node=spec.node.model_dump(), model=spec.model.model_dump(), backend=spec.backend.kind,
        fingerprint=fp, objective=objective or objective_of(spec), baseline_config=dict(spec.sweep.baseline),
        space=_cached_space(spec), rules=rule_list, mapping=mapping,
        confirmation=dict(confirmation) if confirmation else None,
        now=_dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
        backend_cfg=spec.backend.model_dump(), emulated=_emulated(spec.backend.kind),
        plots_dir=Path(spec.store_dir) / "reports" / study_name, findings_path=Path(spec.findings_path),
        objectives=getattr(spec, "objective_set", None),
        approaches=spec.sweep.approaches.model_dump() if getattr(spec.sweep, "approaches", None) else None,
        trial_budget=spec.sweep.budget.trials,
    )


def _emulated(kind: str) -> bool:
    try:
        from tasks.backends import get_backend

        return get_backend(kind).emulated
    except ValueError:
        return False


# Building a SearchSpace costs more than a findings write on large spaces; one per space.
_SPACES: dict[str, Any] = {}


def _cached_space(spec: Any) -> Any:
    key = json.dumps({"p": spec.sweep.params, "c": spec.sweep.constraints}, sort_keys=True, default=str)
    if key not in _SPACES:
        _SPACES[key] = spec.space
    return _SPACES[key]
