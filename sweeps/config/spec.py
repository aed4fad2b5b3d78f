"""Typed, validated sweep configuration (the edge between Hydra and the driver).

``load_spec(cfg)`` turns the composed Hydra config into a :class:`SweepSpec`. Every
problem is reported at once, as ``ConfigError`` lines naming the dotted field and the
fix, before Ray starts or any GPU time is spent.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from omegaconf import DictConfig, OmegaConf
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sweeps.config.bench import BenchConfig
from sweeps.config.objective import (
    DRIVER_METRICS,
    ObjectiveSet,
    check_constraints,
    check_directions,
    check_objective_names,
)
from sweeps.config.profile import profile_problems
from sweeps.config.space import SearchSpace, SpaceError, any_feasible, is_number, parse_space
from sweeps.errors import ConfigurationError
from tasks.backends import available_backends, check_kind, get_backend
from tasks.backends.base import KnobError
from tasks.trial_load import DERIVED_KEYS
from tasks.types import BenchSpec, Timeouts

REPO_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ConfigurationError, ValueError):
    """Invalid configuration. ``str(err)`` lists one ``field: problem (fix)`` per line."""


def _types(ann: Any) -> set[Any]:
    """The plain types an annotation admits (``int | None`` -> {int, NoneType}; Annotated unwrapped)."""
    args = get_args(ann)
    if not args:
        return {ann}
    if get_origin(ann) is Annotated:
        return _types(args[0])
    if get_origin(ann) in (Union, UnionType):
        return set().union(*(_types(a) for a in args))
    return {get_origin(ann)}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _number_not_bool(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 for an int field: sweep.budget.trials=true would run one trial
        if isinstance(v, bool) and info.field_name is not None:
            types = _types(cls.model_fields[info.field_name].annotation)
            if bool not in types and types & {int, float}:
                raise ValueError(f"{str(v).lower()} is not a number; give a number")
        return v


class NodeConfig(_Model):
    """A node type (conf/node/*.yaml). ``device: cpu`` marks a CPU-only node (real vLLM on CPU):
    preflight skips its NVML/GPU checks, and ``gpus`` is then its number of trial slots."""

    name: str
    device: Literal["gpu", "cpu"] = "gpu"
    gpus: int = Field(ge=1, le=64)
    gpu_name: str
    compute_capability: str
    memory_gib: float = Field(gt=0)
    interconnect: str
    nvlink: bool
    accelerator_type: str | None = None
    #: $ per GPU-hour, for ``cost_usd_per_mtok`` (null: no cost metric)
    gpu_hour_usd: float | None = Field(default=None, gt=0)
    emulator: dict[str, Any] = Field(default_factory=dict)


class ModelConfig(_Model):
    """Target model and optional EAGLE-3 draft (conf/model/*.yaml)."""

    name: str
    path: str
    draft_path: str | None = None
    moe: bool = False
    trust_remote_code: bool = False
    emulator: dict[str, Any] = Field(default_factory=dict)


class TimeoutsConfig(_Model):
    startup_s: float = Field(default=900.0, gt=0)
    health_request_s: float = Field(default=5.0, gt=0)
    bench_s: float = Field(default=600.0, gt=0)
    term_grace_s: float = Field(default=10.0, ge=0)
    gpu_release_s: float = Field(default=30.0, ge=0)


class BackendConfig(_Model):
    """How trials are launched (conf/backend/*.yaml).

    ``launcher`` is the argv prefix; the token ``{python}`` is replaced on the node by
    the Ray worker's interpreter. ``kind`` names a backend module of :mod:`tasks.backends`.
    The engine version is the backend's own field, ``Backend.version_key`` (``sglang_version``,
    ``vllm_version``, ...), defaulted to ``Backend.default_version``; it is the one field not
    declared here (``extra="allow"`` admits it, :meth:`_engine_version` refuses any other).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: Annotated[str, AfterValidator(check_kind)]  # one of tasks.backends.available_backends()
    launcher: list[str] = Field(min_length=1)
    tp_size: int | None = Field(default=None, ge=1)
    python: str | None = None
    container_name: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    emulator: dict[str, Any] = Field(default_factory=dict)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    retries_transient: int = Field(default=1, ge=0, le=5)


    @model_validator(mode="before")
    @classmethod
    def _engine_version(cls, data: Any) -> Any:
        """Default the backend's version field (``Backend.version_key``) and refuse any other
        undeclared field, naming it and the backend's version field.

        Raises:
            ValueError: an undeclared field, or a version that is not text.
        """
        if not isinstance(data, Mapping) or data.get("kind") not in available_backends():
            return data  # check_kind reports the kind
        be = get_backend(str(data["kind"]))
        out = dict(data)
        key = be.version_key
        extra = sorted(k for k in out if k not in cls.model_fields and k != key)
        if extra:
            own = f"its engine version is backend.{key}" if key else "it takes no engine version"
            raise ValueError(f"backend.{', backend.'.join(extra)}: not a field of backend={be.kind} ({own})")
        if key:
            v = out.get(key)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"backend.{key}: give the version as text, e.g. {be.default_version!r} (got {v!r})")
            out[key] = v or be.default_version
        return out


class BudgetConfig(_Model):
    """When the sweep stops: whichever limit is hit first (null = no limit)."""

    trials: int | None = Field(default=30, ge=1)
    wall_time_s: float | None = Field(default=None, gt=0)
    gpu_hours: float | None = Field(default=None, gt=0)
    max_asks: int = Field(default=1000, ge=1)
    max_consecutive_skips: int = Field(default=100, ge=1)


class SamplerConfig(_Model):
    name: Literal["tpe", "random"] = "tpe"
    seed: int | None = 0
    n_startup_trials: int = Field(default=10, ge=0)


class CircuitBreakerConfig(_Model):
    """Stop when most recent trials fail for infrastructure or unknown reasons."""

    window: int = Field(default=6, ge=2)
    max_bad_fraction: float = Field(default=0.67, gt=0, le=1)


class ConfirmConfig(_Model):
    """Winner confirmation (sweeps/search/confirm.py, statistics in sweeps/search/decision.py):
    re-launch the top ``top_k`` configs and the baseline ``repeats`` times each, then race
    them: one more repeat of the leader and of each contender not yet separated from it (Welch
    interval at ``confidence``) nor equivalent within ``margin`` (TOST), while it could change
    the pick and ``max_repeats`` could decide it (``futility``), until decided or each config
    has ``max_repeats`` launches. Greedy output tokens must equal the baseline's.
    ``top_k: 0`` turns it off. Repeats accumulate in the study: a rerun launches only what
    larger ``repeats`` / ``max_repeats`` ask for.

    Defaults: 3 configs x 5 repeats (5 repeats give a 95 % interval of about +-1.2 sd at 1-2 %
    noise); ``race: false`` stops at ``repeats``; ``max_repeats`` null = 2 x ``repeats``; ``margin`` 0.01 (1 %: below the emulated
    node's 1.5 % run-to-run noise, tasks/emulator/profile.py, and DESIGN's 1-3 % on real nodes)."""

    top_k: int = Field(default=3, ge=0, le=20)
    repeats: int = Field(default=5, ge=2, le=50)
    #: false: exactly ``repeats`` launches per config, no race (e.g. where each launch is a whole rate search)
    race: bool = True
    #: launches per config at most, the race included (null: 2 x repeats); >= repeats
    max_repeats: int | None = Field(default=None, ge=2, le=99)
    #: relative equivalence margin of the race (0.01 = 1 % of the leader's mean)
    margin: float = Field(default=0.01, gt=0, lt=0.5)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    #: configs one step simpler than the race's pick that the race may add and launch, measured
    #: in the sweep or not (sweeps/search/confirm.py ``descend``; 0 = off): on a plateau of
    #: equivalent configs the pick walks to the member nearest the baseline whichever member
    #: the sweep measured best. Each costs ``repeats`` to ``max_repeats`` launches.
    descend: int = Field(default=0, ge=0, le=20)
    #: stop racing a contender the repeat budget cannot decide: projected to ``max_repeats`` with
    #: its mean and spread so far, it would be neither separated nor equivalent (stochastic
    #: curtailment). At 1.5 % noise and a 1 % margin, plateau members are such contenders; on the
    #: campaign it cut the race from 34-59 to 28-45 launches per seed with the same decision
    #: (benchmarks/decision_stability.py, 5 seeds). false: race every undecided config to the budget.
    futility: bool = True

    @model_validator(mode="after")
    def _budget_covers_repeats(self) -> ConfirmConfig:
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(f"sweep.confirm.max_repeats={self.max_repeats} is below sweep.confirm.repeats="
                             f"{self.repeats}; raise max_repeats to at least {self.repeats} (or null: 2 x repeats)")
        return self

    @property
    def repeat_budget(self) -> int:
        """Launches per config at most (``repeats`` without a race, else ``max_repeats``, default
        2 x ``repeats``; < 100: the confirmation's trial numbers give each repeat two digits,
        sweeps/search/confirm.py)."""
        if not self.race:
            return self.repeats
        return self.max_repeats if self.max_repeats is not None else min(99, 2 * self.repeats)


class ApproachesConfig(_Model):
    """The approaches a sweep exists to compare: each level of one categorical knob is an
    approach (the campaign: ``speculative`` none vs eagle3), and the sampler gives each at
    least ``min_share`` of the sweep's trial budget by its end: the sampler exploits freely while
    the launches left exceed what the approaches are still owed (:mod:`sweeps.search.coverage`).

    ``min_share`` x the number of levels must not exceed 1. The default 0.3 is the campaign's
    goal (issue 22: >= 30 % of its launches for EAGLE-3). Opt-in: the quota of an approach is
    released once the evidence answers the comparison (``release_below``, ``release_after``),
    so a node where it clearly loses does not pay for the rest of its quota."""

    knob: str = Field(min_length=1)
    min_share: float = Field(default=0.3, gt=0, le=1)
    #: an approach's quota is released once its best measurement lies more than this fraction
    #: below another approach's best (null, the default: never released). 0.10 is several times the
    #: difference of two single measurements at the 1-3 % run-to-run noise (DESIGN; the
    #: emulated node: 1.5 %, tasks/emulator/profile.py): sd of a difference 2.1-4.2 %.
    release_below: float | None = Field(default=None, gt=0, lt=1)
    #: ... and it has at least this many ok launches. 1: a single measurement that far below is
    #: already separated from noise (the difference's sd above)
    release_after: int = Field(default=1, ge=1)
    #: approaches whose bests lie within this fraction of the leading approach's best are still
    #: in the race, and are compared on equal footing: the best config of each is launched with
    #: the shared knobs of the other's best (:meth:`sweeps.search.coverage.Coverage.crosses`).
    #: 0.10 is the release margin's scale: several times the sd of a difference of two single
    #: measurements (2.1-4.2 %, above). Null: never.
    compare_within: float | None = Field(default=0.10, gt=0, lt=1)


class SweepConfig(_Model):
    """One sweep (conf/sweep/*.yaml): the study, its space, objective, baseline and budget."""

    name: str = Field(min_length=1)
    description: str = ""
    #: any metric a trial logs (or a list: multi-objective); ``direction``: one, or one per objective
    objective: Annotated[str | list[str], AfterValidator(check_objective_names)] = "decode_tok_s"
    direction: Annotated[str | list[str], AfterValidator(check_directions)] = "maximize"
    #: constraints on other metrics, e.g. ``["ttft_ms_p99 <= 2000"]``: a trial violating one is never best
    objective_constraints: Annotated[list[str], AfterValidator(check_constraints)] = Field(default_factory=list)
    params: dict[str, Any]
    constraints: list[dict[str, Any]] = Field(default_factory=list)
    baseline: dict[str, Any]
    seed_trials: list[dict[str, Any]] = Field(default_factory=list)
    seed_each_level_of: list[str] = Field(default_factory=list)
    #: the approaches to cover fairly (None: the sampler alone decides)
    approaches: ApproachesConfig | None = None
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    circuit_breaker: CircuitBreakerConfig = Field(default_factory=CircuitBreakerConfig)
    confirm: ConfirmConfig = Field(default_factory=ConfirmConfig)
    #: a batch-1 decode sweep: load-check the winner and the baseline at the baseline's sustainable
    #: rate after the confirmation (sweeps/search/serving_check.py); the workload is
    #: ``conf/bench/<serving_check_bench>.yaml`` (it needs workload, slo and load_search)
    serving_check: bool = False
    serving_check_bench: str = Field(default="chat_goodput", min_length=1)
    findings_path: str | None = None
    mode: Literal["search", "recheck"] = "search"

    @field_validator("constraints", mode="before")
    @classmethod
    def _constraints_are_mappings(cls, v: Any) -> Any:
        for i, c in enumerate(v if isinstance(v, list) else []):
            if isinstance(c, str):
                raise ValueError(f"constraint {i} is the string {c!r}; a constraint is {{name: <name>, expr: "
                                 f"'{c}'}} (sweep.objective_constraints is the one that takes strings)")
        return v

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not all(c.isalnum() or c in "-_." for c in v):
            raise ValueError("use letters, digits, '-', '_' or '.' only")
        return v

    @model_validator(mode="after")
    def _directions_fit(self) -> SweepConfig:
        n = 1 if isinstance(self.objective, str) else len(self.objective)
        if not isinstance(self.direction, str) and len(self.direction) != n:
            raise ValueError(f"sweep.direction has {len(self.direction)} entries for {n} objective(s); "
                             f"give one per objective (or a single direction)")
        return self


class TrackingConfig(_Model):
    """Stores. Relative paths resolve against the repository root, never the cwd."""

    store_dir: str = "mlflow"
    uri: str | None = None
    artifact_location: str | None = None
    optuna_storage: str | None = None
    rules_db: str | None = None
    findings_dir: str | None = None  # None: findings/ for the default store, else <store_dir>/findings


class RayConfig(_Model):
    address: str | None = None
    num_gpus: int | None = Field(default=None, ge=0)
    num_cpus: int | None = Field(default=None, ge=1)
    object_store_memory_mb: int = Field(default=256, ge=64)
    resources: dict[str, float] = Field(default_factory=dict)
    max_in_flight: int | None = Field(default=None, ge=1)


class SweepSpec(_Model):
    """Everything the driver needs, validated. Built by :func:`load_spec`."""

    node: NodeConfig
    model: ModelConfig
    sweep: SweepConfig
    backend: BackendConfig
    bench: BenchConfig
    tracking: TrackingConfig
    ray: RayConfig
    dry_run: bool = False
    dry_run_sample: int | None = Field(default=None, ge=1)
    source: str | None = None
    study_name: str | None = None
    new_study: bool = False

    @field_validator("study_name", "source")
    @classmethod
    def _study_name_ok(cls, v: str | None) -> str | None:
        if v is not None and (not v or not all(c.isalnum() or c in "-_." for c in v)):
            raise ValueError("use letters, digits, '-', '_' or '.' only (it names files and MLflow filters)")
        if v is not None and v[0] in ".-":
            # a leading '.' names a hidden file or a parent directory ('..'); a leading '-' reads as an
            # option to the tools that take the name (python -m sweeps.report NAME)
            raise ValueError(f"{v!r} starts with {v[0]!r}; start it with a letter, a digit or '_'")
        return v

    @model_validator(mode="after")
    def _tp_fits(self) -> SweepSpec:
        tp = self.backend.tp_size or self.node.gpus
        if tp > self.node.gpus:
            raise ValueError(f"backend.tp_size={tp} exceeds node.gpus={self.node.gpus}; lower backend.tp_size")
        return self

    # ---- derived values -------------------------------------------------------------
    @property
    def gpus_per_trial(self) -> int:
        return self.backend.tp_size or self.node.gpus

    @property
    def space(self) -> SearchSpace:
        return parse_space(self.sweep.params, self.sweep.constraints)

    @property
    def study(self) -> str:
        return self.study_name or self.sweep.name

    @property
    def objective_set(self) -> ObjectiveSet:
        """What the sweep optimises (:class:`sweeps.config.objective.ObjectiveSet`; ``objective_constraints``
        on the primary, which ranks trials)."""
        sw = self.sweep
        return ObjectiveSet.from_config(sw.objective, sw.direction, sw.objective_constraints)

    def bench_spec(self) -> BenchSpec:
        return self.bench.to_spec()

    def timeouts(self) -> Timeouts:
        return Timeouts(**self.backend.timeouts.model_dump())

    def path(self, p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else (REPO_ROOT / q).resolve()

    @property
    def store_dir(self) -> Path:
        return self.path(self.tracking.store_dir)

    @property
    def mlflow_uri(self) -> str:
        return self.tracking.uri or f"sqlite:///{self.store_dir / 'mlflow.db'}"

    @property
    def artifact_location(self) -> str:
        """A new experiment's artifact root: through the server (``mlflow-artifacts:/<sweep>``) for an HTTP URI."""
        http = (self.tracking.uri or "").startswith(("http://", "https://"))
        return self.tracking.artifact_location or (f"mlflow-artifacts:/{self.sweep.name}" if http
                                                   else (self.store_dir / "artifacts").as_uri())

    @property
    def optuna_storage(self) -> str:
        return self.tracking.optuna_storage or f"sqlite:///{self.store_dir / 'optuna.db'}"

    @property
    def rules_db(self) -> str:
        return self.tracking.rules_db or f"sqlite:///{self.store_dir / 'servesweep.db'}"

    @property
    def findings_path(self) -> Path:
        if self.sweep.findings_path:
            return self.path(self.sweep.findings_path)
        t = self.tracking  # per store, never per run: two stores with one study name keep two documents
        default = self.path(t.store_dir) == self.path(TrackingConfig().store_dir)  # however it is spelled
        d = t.findings_dir or ("findings" if default else str(self.store_dir / "findings"))
        return self.path(d) / f"{self.study}.md"



def _loc(err: Mapping[str, Any]) -> str:
    return ".".join(str(x) for x in err["loc"]) or "<root>"


def load_spec(cfg: DictConfig | Mapping[str, Any]) -> SweepSpec:
    """Validate a composed config into a :class:`SweepSpec`.

    Checks types and ranges (pydantic), the search space (types, bounds, empty choices, ``when``,
    constraints), knob names, the baseline and seeds (rendered through the knob registry), that
    a feasible config exists (sampled), and the emulated node's ``backend.emulator.*`` values.

    Raises:
        ConfigError: one line per problem, each naming the dotted field and the fix.
    """
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    if not isinstance(container, dict):
        raise ConfigError(f"the sweep config must be a mapping, not {type(container).__name__}")
    raw = {str(k): v for k, v in container.items() if k != "hydra"}
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as e:
        lines = [f"{_loc(x)}: {x['msg']}" + (f" (got {x['input']!r})" if x["type"] != "missing"
                                             and not isinstance(x.get("input"), (dict, list)) else "")
                 for x in e.errors()]
        raise ConfigError("\n".join(lines)) from None
    problems: list[str] = []
    try:
        space = spec.space
    except SpaceError as e:
        raise ConfigError(f"sweep.{e}") from None
    known = get_backend(spec.backend.kind).known_knobs
    unknown = [n for n in space.names if n not in known]
    for n in unknown:
        problems.append(f"sweep.params.{n}: unknown knob; known knobs: {sorted(known)}")
    if unknown and (fit := [k for k in available_backends() if set(space.names) <= get_backend(k).known_knobs]):
        problems.append(f"backend.kind: sweep {spec.sweep.name!r} sets {spec.backend.kind!r}'s unknown knobs; it is "
                        f"written for backend={' or backend='.join(fit)}")
    if spec.sweep.mode == "search" and not unknown:
        named = [("sweep.baseline", spec.sweep.baseline)] + [
            (f"sweep.seed_trials[{i}]", s) for i, s in enumerate(spec.sweep.seed_trials)
        ]
        for where, params in named:
            try:
                full = space.normalize(params)
                bad = space.violated(full)
                if bad:
                    problems.append(f"{where}: violates constraint(s) {bad}")
                render_trial(spec, full)
            except (SpaceError, KnobError) as e:
                problems.append(f"{where}: {e}")
        problems += _check_knob_levels(spec, space)
        for k in spec.sweep.seed_each_level_of:
            if k not in space.names:
                problems.append(f"sweep.seed_each_level_of: {k!r} is not a param of the space")
        problems += _approach_problems(spec, space)
        try:
            feasible = any_feasible(space)
        except SpaceError as e:
            problems.append(f"sweep.{e}")
            feasible = True
        if not feasible:
            problems.append(
                "sweep.constraints: no config in the space satisfies every constraint; relax a constraint or widen a range"
            )
    if spec.sweep.mode == "recheck" and not spec.source:
        problems.append("source: sweep=recheck needs source=<name of the sweep to re-check>")
    problems += _metric_problems(spec)
    problems += profile_problems(spec)
    if problems:
        raise ConfigError("\n".join(problems))
    return spec


def logged_metrics(spec: SweepSpec) -> frozenset[str]:
    """Every metric a trial of ``spec`` can log: the backend's for the sweep's bench
    (``Backend.metrics``), what the driver derives from them (``tasks.trial_load.DERIVED_KEYS``;
    ``cost_usd_per_mtok`` only with ``node.gpu_hour_usd``) and ``speedup_vs_baseline``."""
    derived = DERIVED_KEYS if spec.node.gpu_hour_usd else DERIVED_KEYS - {"cost_usd_per_mtok"}
    return get_backend(spec.backend.kind).metrics(spec.bench_spec()) | derived | DRIVER_METRICS


def _metric_problems(spec: SweepSpec) -> list[str]:
    """``sweep.objective`` / ``sweep.objective_constraints`` naming a metric no trial logs (a
    misspelling would rank nothing for the whole sweep): one line each, listing the metrics."""
    logged = logged_metrics(spec)
    objs = spec.objective_set.objectives
    named = [("sweep.objective", o.name) for o in objs]
    named += [("sweep.objective_constraints", c.metric) for o in objs for c in o.constraints]
    out = []
    for where, name in named:
        if name in logged:
            continue
        hint = " (set node.gpu_hour_usd for cost_usd_per_mtok)" if name == "cost_usd_per_mtok" else ""
        out.append(f"{where}: {name!r} is not a metric this sweep's trials log{hint}; backend={spec.backend.kind} "
                   f"with this bench logs {sorted(logged)}")
    return out


def _approach_problems(spec: SweepSpec, space: SearchSpace) -> list[str]:
    """``sweep.approaches`` must name an always-active knob with finite levels whose shares fit."""
    ap = spec.sweep.approaches
    if ap is None:
        return []
    where = "sweep.approaches.knob"
    p = next((q for q in space.params if q.name == ap.knob), None)
    if p is None:
        return [f"{where}: {ap.knob!r} is not a param of the space (one of {space.names})"]
    if p.when:
        return [f"{where}: {ap.knob!r} is active only under {dict(p.when)}; name a knob every config sets"]
    try:
        n = len(p.levels())
    except SpaceError:
        return [f"{where}: {ap.knob!r} is a continuous float; name a categorical or int knob"]
    if ap.min_share * n > 1 + 1e-9:
        return [f"sweep.approaches.min_share: {ap.min_share} x {n} levels of {ap.knob!r} exceeds 1; "
                f"use at most {1 / n:.3g}"]
    return []


def _check_knob_levels(spec: SweepSpec, space: SearchSpace) -> list[str]:
    """Every level of every knob must be renderable and of the type the engine parses: numeric
    knobs hold whole numbers (ints) or numbers (floats); each categorical level renders with
    the baseline's other values. A bad level is refused here instead of costing a launch."""
    be = get_backend(spec.backend.kind)
    ints, floats = be.int_knobs, be.float_knobs
    out: list[str] = []
    try:
        base = space.normalize(spec.sweep.baseline)
    except SpaceError:
        base = {}
    for p in space.params:
        where = f"sweep.params.{p.name}"
        if p.name in ints:
            if p.type == "float":
                out.append(f"{where}: {be.label} parses {p.name} as an int; use type: int")
            elif p.type == "categorical" and not all(is_number(v) and isinstance(v, int) for v in p.choices):
                out.append(f"{where}.choices: {p.name} takes whole numbers only (got {list(p.choices)})")
        if p.name in floats and p.type == "categorical" and not all(is_number(v) for v in p.choices):
            out.append(f"{where}.choices: {p.name} takes numbers only (got {list(p.choices)})")
        if p.type == "categorical" and base:
            for level in p.choices:
                try:
                    render_trial(spec, {**base, p.name: level})
                except KnobError as e:
                    out.append(f"{where}.choices: level {level!r}: {e}")
    return out + _env_overlaps(spec)


def knob_env_vars(spec: SweepSpec) -> dict[str, str]:
    """``{environment variable: knob}`` for the variables a searched knob sets: the rendered
    environment of the knob's levels (the baseline's other values) differs in them. Empty when the
    baseline does not render (the config's own checks name that)."""
    space = spec.space
    try:
        base = space.normalize(spec.sweep.baseline)
    except SpaceError:
        return {}
    out: dict[str, str] = {}
    for p in space.params:
        if p.type != "categorical":
            continue
        try:
            envs = [render_trial(spec, {**base, p.name: level})[1] for level in p.choices]
        except KnobError:
            continue
        for var in set().union(*envs):
            if len({e.get(var) for e in envs}) > 1:
                out.setdefault(var, p.name)
    return out


def _env_overlaps(spec: SweepSpec) -> list[str]:
    """``backend.env`` variables a searched knob also sets (:func:`knob_env_vars`). A level that
    leaves the variable unset (``nccl_algo=default``) would run with ``backend.env``'s value and its
    result be credited to that level."""
    knobs = knob_env_vars(spec) if spec.backend.env else {}
    choices = {p.name: list(p.choices) for p in spec.space.params if p.type == "categorical"}
    return [f"backend.env.{var}: the searched knob sweep.params.{knobs[var]} sets {var} too (levels "
            f"{choices[knobs[var]]}); a level that leaves it unset would run with {var}={value!r} "
            f"and its result be credited to that level. Remove {var} from backend.env, or search its values with the knob"
            for var, value in sorted(spec.backend.env.items()) if var in knobs]


def render_trial(spec: SweepSpec, params: Mapping[str, Any]) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """``(argv, env, expected)`` for ``params`` from the sweep's backend (``Backend.render``).

    Raises:
        tasks.backends.base.KnobError: the backend cannot render a knob or level (names it).
    """
    be = get_backend(spec.backend.kind)
    argv, env, expected = be.render(params, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    return list(argv), dict(env), dict(expected)


def backend_dict(spec: SweepSpec) -> dict[str, Any]:
    """The backend config as a plain dict (for ``Backend.render``);
    ``{python}`` is resolved on the node."""
    return spec.backend.model_dump()
