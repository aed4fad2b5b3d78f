"""The search space: YAML parameter specs -> Optuna distributions, conditions, constraints.

A sweep config declares its space as data::

    params:
      allreduce: {type: categorical, choices: [nccl, custom]}
      cuda_graph_max_bs: {type: int, low: 16, high: 512, log: true}
      eagle_num_steps: {type: int, low: 1, high: 5, when: {speculative: eagle3}}
    constraints:
      - {name: draft_tokens_fit, expr: "eagle_num_draft_tokens <= eagle_topk * eagle_num_steps + 1",
         when: {speculative: eagle3}}

``when`` maps a parent param to the value (or list of values) that activates the
child; conditional params are sampled in declaration order, so parents come first.
Constraint expressions are arithmetic/comparison/boolean expressions over param
names, evaluated by a small AST walker (no ``eval``).
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

PARAM_TYPES = ("categorical", "int", "float")


def is_number(x: object) -> TypeGuard[int | float]:
    """A numeric setting value: an int or float, never a bool (a bool is a switch, though Python
    counts it an int)."""
    return isinstance(x, int | float) and not isinstance(x, bool)


class SpaceError(ValueError):
    """An invalid search-space declaration; the message names the dotted field and the fix."""


@dataclass(frozen=True)
class ParamSpec:
    """One searchable knob.

    Attributes:
        name: knob name (a key of ``tasks.backends.sglang.knobs.KNOWN_KNOBS``).
        type: ``categorical`` | ``int`` | ``float``.
        choices: categorical levels (non-empty).
        low, high: inclusive bounds for int/float.
        log: sample on a log scale (int/float, ``low > 0``).
        step: grid step for int/float (not with ``log``).
        when: activation condition ``{parent: value | [values]}``; None = always active.
        ordered: the levels are ordered quantities (a categorical of graph batch sizes or top-k
            widths, its numeric choices listed ascending): the search reads an untried level from
            its tried neighbours (:class:`sweeps.search.untried.LevelModel`). Always true for
            int and float params; false for a categorical unless declared.
    """

    name: str
    type: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    when: Mapping[str, tuple[Any, ...]] | None = None
    ordered: bool = False

    @property
    def is_ordered(self) -> bool:
        """An int or float param, or a categorical declared ``ordered``."""
        return self.type in ("int", "float") or self.ordered

    def active(self, params: Mapping[str, Any]) -> bool:
        """True when every ``when`` parent currently holds one of its activating values."""
        if not self.when:
            return True
        return all(params.get(k) in vals for k, vals in self.when.items())

    def bounds(self) -> tuple[float, float]:
        """``(low, high)`` of an int/float param (both set: :func:`parse_space` requires them).

        Raises:
            SpaceError: a categorical param, or bounds missing.
        """
        if self.low is None or self.high is None:
            raise SpaceError(f"params.{self.name}: an {self.type} param needs low and high")
        return self.low, self.high

    def levels(self) -> list[Any]:
        """All values of a finite param (categorical or stepped/int); raises for a continuous float."""
        if self.type == "categorical":
            return list(self.choices)
        low, high = self.bounds()
        if self.type == "int":
            # Optuna's IntDistribution(log=True) samples every integer in [low, high] (log only
            # shapes the density), so enumeration, feasibility and seeding see every integer too.
            return list(range(int(low), int(high) + 1, int(self.step or 1)))
        if self.step:  # floats, whatever the bounds' type: Optuna suggests floats (0.0, never 0)
            n = int(round((high - low) / self.step))
            return [float(round(low + i * self.step, 10)) for i in range(n + 1)]
        raise SpaceError(f"params.{self.name}: a continuous float has no finite levels")


@dataclass(frozen=True)
class Constraint:
    """A validity rule over sampled params; a violating config is infeasible (not launched)."""

    name: str
    expr: str
    when: Mapping[str, tuple[Any, ...]] | None = None
    _tree: ast.Expression = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def holds(self, params: Mapping[str, Any]) -> bool:
        """Evaluate the constraint; a constraint whose ``when`` is inactive holds trivially."""
        if self.when and not all(params.get(k) in v for k, v in self.when.items()):
            return True
        try:
            return bool(_eval(self._tree.body, params, self.name))
        except SpaceError:
            raise
        except (ArithmeticError, TypeError, ValueError) as e:
            raise SpaceError(f"constraints: {self.name!r} ({self.expr}) cannot be evaluated for {dict(params)}: "
                             f"{type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class SearchSpace:
    """Ordered params plus constraints."""

    params: tuple[ParamSpec, ...]
    constraints: tuple[Constraint, ...] = ()

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> ParamSpec | None:
        """The param called ``name``, or None when the space has none."""
        return next((p for p in self.params if p.name == name), None)

    def distributions(self) -> dict[str, BaseDistribution]:
        """Every param's Optuna distribution (conditional ones included)."""
        return {p.name: to_distribution(p) for p in self.params}

    def sample(self, trial: optuna.trial.Trial) -> dict[str, Any]:
        """Suggest every active param on ``trial`` in declaration order; returns the config."""
        out: dict[str, Any] = {}
        for p in self.params:
            if not p.active(out):
                continue
            d = to_distribution(p)
            if isinstance(d, CategoricalDistribution):
                out[p.name] = trial.suggest_categorical(p.name, d.choices)
            elif isinstance(d, IntDistribution):
                out[p.name] = trial.suggest_int(p.name, d.low, d.high, step=d.step, log=d.log)
            elif isinstance(d, FloatDistribution):
                out[p.name] = trial.suggest_float(p.name, d.low, d.high, step=d.step, log=d.log)
            else:
                raise SpaceError(f"params.{p.name}: no Optuna distribution for type {p.type!r}")
        return out

    def violated(self, params: Mapping[str, Any]) -> list[str]:
        """Names of constraints the config violates (empty = feasible)."""
        return [c.name for c in self.constraints if not c.holds(params)]

    def normalize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Drop inactive params and check every active value is in range.

        Raises:
            SpaceError: unknown param, missing active param, or out-of-range value.
        """
        unknown = set(params) - set(self.names)
        if unknown:
            raise SpaceError(f"unknown param(s) {sorted(unknown)}; the space has {self.names}")
        out: dict[str, Any] = {}
        for p in self.params:
            if not p.active(out):
                continue
            if p.name not in params:
                raise SpaceError(f"params.{p.name}: missing (active under {dict(p.when or {})})")
            v = params[p.name]
            d = to_distribution(p)
            try:
                ok = d._contains(d.to_internal_repr(v))
            except (ValueError, TypeError):
                ok = False
            if not ok:
                raise SpaceError(f"params.{p.name}={v!r} is outside its distribution {d}")
            out[p.name] = v
        return out

    def enumerate(self, limit: int = 1_000_000) -> Iterable[dict[str, Any]]:
        """Every feasible config of a finite space, in declaration order (grid)."""

        def rec(i: int, cur: dict[str, Any]) -> Iterator[dict[str, Any]]:
            if i == len(self.params):
                if not self.violated(cur):
                    yield dict(cur)
                return
            p = self.params[i]
            if not p.active(cur):
                yield from rec(i + 1, cur)
                return
            for v in p.levels():
                cur[p.name] = v
                yield from rec(i + 1, cur)
                del cur[p.name]

        for n, cfg in enumerate(rec(0, {})):
            if n >= limit:
                return
            yield cfg


def to_distribution(p: ParamSpec) -> BaseDistribution:
    """Map one :class:`ParamSpec` to an Optuna distribution.

    Raises:
        SpaceError: unsupported type or inconsistent bounds (message names ``params.<name>``).
    """
    where = f"params.{p.name}"
    if p.type == "categorical":
        if not p.choices:
            raise SpaceError(f"{where}.choices is empty: list at least one level")
        return CategoricalDistribution(list(p.choices))
    if p.type not in ("int", "float"):
        raise SpaceError(f"{where}.type={p.type!r}: use one of {list(PARAM_TYPES)}")
    if p.low is None or p.high is None:
        raise SpaceError(f"{where}: {p.type} params need both low and high")
    if p.low > p.high:
        raise SpaceError(f"{where}: low={p.low} > high={p.high}; swap them")
    if p.log and p.step:
        raise SpaceError(f"{where}: log and step are exclusive; drop one")
    if p.log and p.low <= 0:
        raise SpaceError(f"{where}: log scale needs low > 0 (got {p.low})")
    if p.type == "int":
        if int(p.low) != p.low or int(p.high) != p.high:
            raise SpaceError(f"{where}: int bounds must be whole numbers")
        return IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)


def _as_when(raw: Any, where: str, known: list[str]) -> dict[str, tuple[Any, ...]] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw:
        raise SpaceError(f"{where}.when must be a mapping {{parent_param: value or [values]}}")
    out = {}
    for k, v in raw.items():
        if k not in known:
            raise SpaceError(f"{where}.when refers to {k!r}, which is not declared before it; known: {known}")
        out[str(k)] = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return out


def _as_ordered(raw: Mapping[str, Any], typ: str, where: str) -> bool:
    """``ordered`` of a param: a bool; on a categorical, only over numeric choices listed ascending."""
    val = raw.get("ordered", False)
    if not isinstance(val, bool):
        raise SpaceError(f"{where}.ordered={val!r}: use true or false")
    if "ordered" in raw and not val and typ in ("int", "float"):
        raise SpaceError(f"{where}.ordered: false: {'an' if typ == 'int' else 'a'} {typ} param is always ordered; "
                         f"drop the field")
    if val and typ == "categorical":
        ch = list(raw.get("choices") or ())
        if not all(is_number(c) for c in ch):
            raise SpaceError(f"{where}.choices: {ch} are not all numbers, which this param's ordered: true "
                             f"needs (write 64, not '64'); drop ordered for a categorical of names")
        if ch != sorted(ch) or len(set(ch)) != len(ch):
            raise SpaceError(f"{where}.choices: {ch} are not in strictly ascending order, which this param's "
                             f"ordered: true needs; list each number once, smallest first, or drop ordered")
    return bool(val)


def parse_space(params: Mapping[str, Any], constraints: Iterable[Mapping[str, Any]] = ()) -> SearchSpace:
    """Build a :class:`SearchSpace` from the plain dicts of a sweep config.

    Raises:
        SpaceError: naming ``params.<name>.<field>`` or ``constraints[i].<field>``.
    """
    if not params:
        raise SpaceError("params is empty: declare at least one knob to search")
    specs: list[ParamSpec] = []
    for name, raw in params.items():
        where = f"params.{name}"
        if not isinstance(raw, Mapping):
            raise SpaceError(f"{where} must be a mapping with a 'type' field")
        extra = set(raw) - {"type", "choices", "low", "high", "log", "step", "when", "ordered"}
        if extra:
            raise SpaceError(f"{where}: unknown field(s) {sorted(extra)}")
        ch = raw.get("choices")
        if ch is not None and (isinstance(ch, str | bytes | Mapping) or not isinstance(ch, Iterable)):
            raise SpaceError(f"{where}.choices={ch!r}: list the levels, e.g. choices: [{ch!r}]")
        typ = raw.get("type")
        if typ is None:
            typ = "categorical" if "choices" in raw else None
        if typ not in PARAM_TYPES:
            raise SpaceError(f"{where}.type={typ!r}: use one of {list(PARAM_TYPES)}")
        spec = ParamSpec(
            name=str(name),
            type=typ,
            choices=tuple(raw.get("choices") or ()),
            low=raw.get("low"),
            high=raw.get("high"),
            log=bool(raw.get("log", False)),
            step=raw.get("step"),
            when=_as_when(raw.get("when"), where, [s.name for s in specs]),
            ordered=_as_ordered(raw, typ, where),
        )
        to_distribution(spec)  # validate now
        specs.append(spec)
    names = [s.name for s in specs]
    cons: list[Constraint] = []
    for i, raw in enumerate(constraints or ()):
        where = f"constraints[{i}]"
        expr = raw.get("expr")
        if not expr:
            raise SpaceError(f"{where}.expr is missing: e.g. 'a <= b * c + 1'")
        try:
            tree = ast.parse(str(expr), mode="eval")
        except SyntaxError as e:
            raise SpaceError(f"{where}.expr {expr!r} is not an expression: {e.msg}") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in names:
                raise SpaceError(f"{where}.expr uses {node.id!r}, which is not a param; params: {names}")
            if not isinstance(node, _ALLOWED_NODES):
                raise SpaceError(f"{where}.expr: {type(node).__name__} is not allowed in constraints")
        cons.append(
            Constraint(
                name=str(raw.get("name") or f"constraint_{i}"),
                expr=str(expr),
                when=_as_when(raw.get("when"), where, names),
                _tree=tree,
            )
        )
    return SearchSpace(tuple(specs), tuple(cons))


_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMP = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Name, ast.Load,
    ast.Constant, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd,
    *tuple(_BIN), *tuple(_CMP),
)


def _eval(node: ast.AST, env: Mapping[str, Any], name: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise SpaceError(f"constraint {name!r} needs param {node.id!r}, which is inactive; add a 'when'")
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_eval(node.left, env, name), _eval(node.right, env, name))
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, name)
        return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else +v)
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, env, name) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, name)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env, name)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    raise SpaceError(f"constraint {name!r}: unsupported expression {ast.dump(node)}")


def seed_configs(space: SearchSpace, baseline: Mapping[str, Any], seed_trials: Iterable[Mapping[str, Any]] = (),
                 seed_each_level_of: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The configs a sweep runs first, deduplicated, in order: the baseline (always first),
    the explicit seed trials, then one config per level of each ``seed_each_level_of`` knob
    (the baseline with that knob changed; conditional params switched on take their first
    level).

    Raises:
        SpaceError: a seed that is not a valid config of the space.
    """
    out = [space.normalize(baseline)] + [space.normalize(s) for s in seed_trials]
    for knob in seed_each_level_of:
        p = space.param(knob)
        if p is None:
            raise SpaceError(f"seed_each_level_of: {knob!r} is not a param of the space")
        for level in p.levels():
            cfg = {**baseline, knob: level}
            filled: dict[str, Any] = {}
            for q in space.params:
                if q.active(filled):
                    filled[q.name] = cfg[q.name] if q.name in cfg else q.levels()[0]
            out.append(space.normalize(filled))
    seen: set[str] = set()
    uniq = []
    for c in out:
        key = repr(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


def any_feasible(space: SearchSpace, samples: int = 2000) -> bool:
    """True if some config satisfies every constraint (enumeration, then random sampling)."""
    finite = all(p.type != "float" or p.step for p in space.params)
    if finite:
        for _ in space.enumerate(limit=1):
            return True
        return False
    rng = random.Random(0)
    for _ in range(samples):
        cfg: dict[str, Any] = {}
        for p in space.params:
            if not p.active(cfg):
                continue
            if p.type == "categorical":
                cfg[p.name] = rng.choice(p.choices)
            elif p.type == "int":
                low, high = p.bounds()
                cfg[p.name] = rng.randint(int(low), int(high))
            else:
                cfg[p.name] = rng.uniform(*p.bounds())
        if not space.violated(cfg):
            return True
    return False
