"""What a sweep optimises: one metric (or several), a direction, and constraints on others.

Every place that ranks, compares or reports trials asks an :class:`Objective` (records'
value, the baseline value, speedup, confirmation candidates, progress, the summary, the
findings and plots), so the metric Optuna is told is the one the sweep ranks by.

A sweep config declares either one objective::

    objective: decode_tok_s          # any metric a trial logs
    direction: maximize              # or minimize
    objective_constraints: ["ttft_ms_p99 <= 2000"]

or several (an Optuna multi-objective study)::

    objective: [output_tok_s, decode_tok_s]
    direction: [maximize, maximize]
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

Direction = Literal["maximize", "minimize"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
}
_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")

T = TypeVar("T")
#: metrics the driver adds to a trial after its benchmark (the ratio to the baseline's value)
DRIVER_METRICS = frozenset({"speedup_vs_baseline"})


@dataclass(frozen=True)
class MetricConstraint:
    """``metric op bound`` on a trial's metrics, e.g. ``ttft_ms_p99 <= 2000``.

    A trial whose metric is missing or non-finite violates the constraint.
    """

    metric: str
    op: str
    bound: float

    @classmethod
    def parse(cls, text: str) -> MetricConstraint:
        """Parse ``"<metric> <op> <number>"`` (op one of ``<= < >= >``).

        Raises:
            ValueError: the text is not of that form (names the expected form).
        """
        m = _CONSTRAINT_RE.match(text)
        if not m:
            raise ValueError(f"{text!r} is not '<metric> <=|<|>=|> <number>' (e.g. 'ttft_ms_p99 <= 2000')")
        return cls(m.group(1), m.group(2), float(m.group(3)))

    def holds(self, metrics: Mapping[str, float]) -> bool:
        v = metrics.get(self.metric)
        return v is not None and math.isfinite(v) and _OPS[self.op](v, self.bound)

    def violation(self, metrics: Mapping[str, float]) -> float:
        """How far the constraint is violated (0 when it holds; Optuna's constraint value)."""
        v = metrics.get(self.metric)
        if v is None or not math.isfinite(v):
            return 1.0
        gap = v - self.bound if self.op in ("<=", "<") else self.bound - v
        if self.holds(metrics):
            return 0.0
        return max(gap, 1e-9)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"


@dataclass(frozen=True)
class Objective:
    """One metric to optimise.

    Attributes:
        name: the metric key in a trial's metrics (e.g. ``decode_tok_s`` in tok/s,
            ``ttft_ms_p99`` in ms).
        direction: ``maximize`` or ``minimize``.
        constraints: constraints on other metrics; a trial violating one is feasible
            for nobody: never the best, told to Optuna with a positive constraint value.
    """

    name: str = "decode_tok_s"
    direction: Direction = "maximize"
    constraints: tuple[MetricConstraint, ...] = field(default_factory=tuple)

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def value(self, metrics: Mapping[str, float]) -> float | None:
        """The objective's value in ``metrics``, or None when missing or non-finite."""
        v = metrics.get(self.name)
        if v is None:
            return None
        try:
            v = float(v)
        except (TypeError, ValueError):
            return None
        return v if math.isfinite(v) else None

    def feasible(self, metrics: Mapping[str, float]) -> bool:
        """True when every constraint holds."""
        return all(c.holds(metrics) for c in self.constraints)

    def violation(self, metrics: Mapping[str, float]) -> float:
        """Sum of constraint violations (0 = feasible)."""
        return sum(c.violation(metrics) for c in self.constraints)

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` is strictly better than ``b``."""
        return a > b if self.maximize else a < b

    def sort_key(self, v: float) -> float:
        """Key that sorts best first with ``sorted(..., key=...)``."""
        return -v if self.maximize else v

    def best(self, items: Iterable[T], value: Callable[[T], float | None]) -> T | None:
        """The item with the best value (None values skipped); None when there is none."""
        scored = [(v, it) for it in items if (v := value(it)) is not None]
        if not scored:
            return None
        return min(scored, key=lambda p: self.sort_key(p[0]))[1]

    def ranked(self, items: Iterable[T], value: Callable[[T], float | None]) -> list[T]:
        """Items with a value, best first."""
        scored = [(v, it) for it in items if (v := value(it)) is not None]
        return [it for _, it in sorted(scored, key=lambda p: self.sort_key(p[0]))]

    def ratio(self, value: float, reference: float) -> float:
        """How many times better ``value`` is than ``reference`` (>1 = better), e.g. the
        speedup vs the baseline: ``value/reference`` when maximising, ``reference/value``
        when minimising (a latency halved is a 2x improvement)."""
        if self.maximize:
            return value / reference
        return reference / value

    @property
    def label(self) -> str:
        arrow = "max" if self.maximize else "min"
        return f"{self.name} ({arrow})"


@dataclass(frozen=True)
class ObjectiveSet:
    """The objectives of a sweep: one (single-objective study) or several (Optuna
    multi-objective study, ``directions=[...]``). ``primary`` is the first: what a
    single number (best, speedup, confirmation) refers to."""

    objectives: tuple[Objective, ...]

    def __post_init__(self) -> None:
        if not self.objectives:
            raise ValueError("at least one objective is needed")

    @property
    def primary(self) -> Objective:
        return self.objectives[0]

    @property
    def multi(self) -> bool:
        return len(self.objectives) > 1

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.objectives]

    def values(self, metrics: Mapping[str, float]) -> list[float] | None:
        """The values to tell Optuna, or None when any is missing."""
        vals = [o.value(metrics) for o in self.objectives]
        return None if any(v is None for v in vals) else [float(v) for v in vals]  # type: ignore[arg-type]

    def feasible(self, metrics: Mapping[str, float]) -> bool:
        return all(o.feasible(metrics) for o in self.objectives)

    def violation(self, metrics: Mapping[str, float]) -> float:
        return sum(o.violation(metrics) for o in self.objectives)

    @classmethod
    def from_config(cls, names: str | Sequence[str], directions: str | Sequence[str] = "maximize",
                    constraints: Sequence[str] = ()) -> ObjectiveSet:
        """Build from a sweep config's ``objective`` / ``direction`` / ``objective_constraints``.

        Constraints attach to the primary objective.

        Raises:
            ValueError: a direction is not maximize/minimize, the lists differ in length,
                or a constraint does not parse (messages name the field).
        """
        ns = [names] if isinstance(names, str) else list(names)
        ds = [directions] * len(ns) if isinstance(directions, str) else list(directions)
        if len(ds) != len(ns):
            raise ValueError(f"sweep.direction has {len(ds)} entries for {len(ns)} objectives; give one per objective")
        for d in ds:
            if d not in ("maximize", "minimize"):
                raise ValueError(f"sweep.direction: {d!r} is not maximize or minimize")
        cons = tuple(MetricConstraint.parse(c) for c in constraints)
        objs = [Objective(n, d, cons if i == 0 else ()) for i, (n, d) in enumerate(zip(ns, ds))]  # type: ignore[arg-type]
        return cls(tuple(objs))


def check_objective_names(v: str | list[str]) -> str | list[str]:
    """Validate ``sweep.objective``: a metric name (letters, digits, ``_``) or a non-empty list.

    Raises:
        ValueError: an empty or malformed name.
    """
    names = [v] if isinstance(v, str) else v
    if not names or not all(n and n.replace("_", "").isalnum() for n in names):
        raise ValueError("name a metric a trial logs (e.g. decode_tok_s, output_tok_s, ttft_ms_p50), or a list")
    return v


def check_directions(v: str | list[str]) -> str | list[str]:
    """Validate ``sweep.direction``: ``maximize``/``minimize``, or a list of them.

    Raises:
        ValueError: another word.
    """
    for d in [v] if isinstance(v, str) else v:
        if d not in ("maximize", "minimize"):
            raise ValueError(f"{d!r} is not maximize or minimize")
    return v


def check_constraints(v: list[str]) -> list[str]:
    """Validate ``sweep.objective_constraints`` (each parses as a :class:`MetricConstraint`).

    Raises:
        ValueError: names the constraint that does not parse and the expected form.
    """
    for c in v:
        MetricConstraint.parse(c)
    return v


def metric_text(name: str, v: float | None) -> str:
    """``87.6 tok/s`` for ``decode_tok_s`` (the batch-1 decode rate), ``2406.1 output tok/s``
    for another throughput (``output_tok_s``: all streams together), ``82.0 ttft_ms_p50`` for
    any other metric."""
    val = float("nan") if v is None else v
    if name == "decode_tok_s":
        return f"{val:.1f} tok/s"
    if name.endswith("_tok_s"):
        return f"{val:.1f} {name.removesuffix('_tok_s').replace('_', ' ')} tok/s"
    return f"{val:.1f} {name}"
