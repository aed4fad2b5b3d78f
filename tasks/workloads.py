"""Benchmark workloads: who sends what, when. Validated specs -> a deterministic request list.

A workload has a number of requests, lengths (fixed, a seeded distribution, or the rows
of a dataset/trace file) and an arrival process:

* ``closed``: a closed loop of ``concurrency`` clients (bench_serving's
  ``--max-concurrency`` with ``--request-rate inf``): all requests are ready at t=0 and at
  most ``concurrency`` are in flight.
* ``poisson``: open loop at ``rate_req_s`` (exponential gaps, seeded; the first request at
  t=0, as sglang/benchmark/serving.py:1092-1129 ``get_request`` sends them; ``inf`` = all at once).
* ``trace``: the file's own timestamps (ms, relative to its first row) times ``slowdown``,
  as serving.py's ``get_request`` / datasets/mooncake.py:50-76 replay them.

Files (JSON lines): ``jsonl``: ``{"prompt_len": int, "output_len": int}`` or
``{"prompt_ids": [...], "output_len": int}`` (``input_ids`` also accepted);
``mooncake``: Mooncake's trace format ``{"timestamp": ms, "input_length": int,
"output_length": int, "hash_ids": [...]}`` (kvcache-ai/Mooncake, FAST25-release/README.md).
A file's rows are used in order, cycled when the workload asks for more (not with ``trace``
arrivals). Relative paths resolve against the repository root.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

ROOT = Path(__file__).resolve().parent.parent


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fixed(_Spec):
    """Every request the same length."""

    kind: Literal["fixed"] = "fixed"
    value: PositiveInt


class Uniform(_Spec):
    """Integer lengths uniform on [low, high]."""

    kind: Literal["uniform"]
    low: PositiveInt
    high: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) > high ({self.high})")
        return self


class LogNormal(_Spec):
    """Lognormal lengths with this mean and standard deviation (of the lengths themselves),
    rounded and clipped to [low, high]."""

    kind: Literal["lognormal"]
    mean: float = Field(gt=0)
    sd: float = Field(ge=0)
    low: PositiveInt = 1
    high: PositiveInt | None = None


Length = Annotated[Fixed | Uniform | LogNormal, Field(discriminator="kind")]


class Closed(_Spec):
    kind: Literal["closed"]
    concurrency: PositiveInt


class Poisson(_Spec):
    kind: Literal["poisson"]
    rate_req_s: float = Field(gt=0)  # inf allowed: all at t=0


class Trace(_Spec):
    kind: Literal["trace"]
    slowdown: float = Field(default=1.0, gt=0, allow_inf_nan=False)


Arrival = Annotated[Closed | Poisson | Trace, Field(discriminator="kind")]


class Dataset(_Spec):
    format: Literal["jsonl", "mooncake"]
    path: str


class Workload(_Spec):
    """One load level's traffic (see the module docstring)."""

    num_requests: PositiveInt
    arrival: Arrival
    prompt_len: Length | None = None
    output_len: Length | None = None
    dataset: Dataset | None = None
    seed: int = 0

    @field_validator("prompt_len", "output_len", mode="before")
    @classmethod
    def _int_is_fixed(cls, v: object) -> object:
        return {"kind": "fixed", "value": v} if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _one_source(self) -> Workload:
        if self.dataset is None and (self.prompt_len is None or self.output_len is None):
            raise ValueError("give prompt_len and output_len, or a dataset")
        if self.dataset is not None and self.prompt_len is not None:
            raise ValueError("prompt_len comes from the dataset: give one or the other")
        if isinstance(self.arrival, Trace) and (self.dataset is None or self.dataset.format != "mooncake"):
            raise ValueError("arrival.kind=trace needs a mooncake dataset (its timestamps)")
        return self

    def at_rate(self, rate_req_s: float) -> Workload:
        """The same traffic offered at ``rate_req_s``: Poisson arrivals at that rate, or for
        ``trace`` arrivals the trace's timeline compressed/stretched to that mean rate.

        Raises:
            ValueError: rate <= 0, or a closed-loop workload (it has no rate).
        """
        if not rate_req_s > 0:
            raise ValueError(f"rate_req_s must be > 0, got {rate_req_s}")
        if isinstance(self.arrival, Closed):
            raise ValueError("a closed-loop workload has no request rate (use at_concurrency)")
        if isinstance(self.arrival, Trace):
            native = trace_rate_req_s(self)
            return self.model_copy(update={"arrival": Trace(kind="trace", slowdown=native / rate_req_s)})
        return self.model_copy(update={"arrival": Poisson(kind="poisson", rate_req_s=rate_req_s)})

    def at_concurrency(self, concurrency: int) -> Workload:
        """The same lengths sent by a closed loop of ``concurrency`` clients."""
        return self.model_copy(update={"arrival": Closed(kind="closed", concurrency=concurrency)})


def parse_workload(data: object, where: str = "workload") -> Workload:
    """Validate a workload mapping (e.g. from ``conf/bench/*.yaml``).

    Raises:
        ValueError: naming every bad field by its dotted path under ``where``.
    """
    try:
        return Workload.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in (where, *err["loc"]) if not str(p).startswith("function-"))
            lines.append(f"{loc}: {err['msg']}")
        raise ValueError("invalid workload:\n  " + "\n  ".join(lines)) from None


class PlannedRequest(NamedTuple):
    """One request to send: offset from the level's start (s), prompt and output tokens."""

    arrival_s: float
    prompt_len: int
    output_len: int


class RequestPlan(NamedTuple):
    """The requests of one level, and the client's in-flight cap (closed loop) or None."""

    requests: tuple[PlannedRequest, ...]
    max_concurrency: int | None


class Row(NamedTuple):
    prompt_len: int
    output_len: int | None
    timestamp_ms: float | None


def _row(obj: dict, fmt: str, where: str) -> Row:
    if fmt == "mooncake":
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise ValueError(f"{where}: a Mooncake trace row needs {key!r}")
        return Row(int(obj["input_length"]), int(obj["output_length"]), float(obj["timestamp"]))
    ids = obj.get("prompt_ids", obj.get("input_ids"))
    plen = len(ids) if isinstance(ids, list) else obj.get("prompt_len")
    if not isinstance(plen, int) or plen < 1:
        raise ValueError(f"{where}: needs prompt_len (int >= 1) or prompt_ids (a list)")
    out = obj.get("output_len")
    if out is not None and (not isinstance(out, int) or out < 1):
        raise ValueError(f"{where}: output_len must be an int >= 1")
    return Row(plen, out, None)


@lru_cache(maxsize=16)
def _load_rows(path: Path, fmt: str, mtime_ns: int) -> tuple[Row, ...]:
    rows = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: a row must be a JSON object")
            row = _row(obj, fmt, f"{path}:{n}")
            if row.prompt_len < 1 or (row.output_len is not None and row.output_len < 1):
                raise ValueError(f"{path}:{n}: lengths must be >= 1")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return tuple(rows)


def load_rows(ds: Dataset) -> tuple[Row, ...]:
    """The rows of a dataset/trace file (cached while the file is unchanged).

    Raises:
        ValueError: missing file, a bad row (names file:line and the field).
    """
    path = Path(ds.path) if Path(ds.path).is_absolute() else ROOT / ds.path
    if not path.is_file():
        raise ValueError(f"dataset.path: {path} does not exist")
    return _load_rows(path, ds.format, path.stat().st_mtime_ns)


def trace_rate_req_s(w: Workload) -> float:
    """Mean request rate of the trace rows the workload replays (rows - 1) / span."""
    rows = load_rows(w.dataset)[: w.num_requests]
    ts = sorted(r.timestamp_ms for r in rows)
    span_s = (ts[-1] - ts[0]) / 1000.0
    if len(ts) < 2 or span_s <= 0:
        raise ValueError(f"{w.dataset.path}: the trace's first {len(ts)} rows span no time: it has no rate")
    return (len(ts) - 1) / span_s


def _draw(spec: Length, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(spec, Fixed):
        return np.full(n, spec.value, dtype=np.int64)
    if isinstance(spec, Uniform):
        return rng.integers(spec.low, spec.high, size=n, endpoint=True)
    sigma2 = math.log1p((spec.sd / spec.mean) ** 2)
    x = rng.lognormal(math.log(spec.mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
    return np.clip(np.rint(x), spec.low, spec.high if spec.high is not None else None).astype(np.int64)


def _arrivals(w: Workload, rows: tuple[Row, ...] | None) -> np.ndarray:
    n = w.num_requests
    a = w.arrival
    if isinstance(a, Closed) or (isinstance(a, Poisson) and math.isinf(a.rate_req_s)):
        return np.zeros(n)
    if isinstance(a, Poisson):
        gaps = np.random.default_rng((w.seed, 1)).exponential(1.0 / a.rate_req_s, size=n - 1)
        return np.concatenate([[0.0], np.cumsum(gaps)])
    ts = np.array([r.timestamp_ms for r in rows])
    return (ts - ts.min()) / 1000.0 * a.slowdown


def build_requests(w: Workload) -> RequestPlan:
    """The workload as a deterministic list of requests, sorted by arrival (stable).

    Raises:
        ValueError: bad dataset rows; ``trace`` arrivals with fewer rows than
            ``num_requests``; JSONL rows without output_len and no ``output_len`` spec.
    """
    n = w.num_requests
    rows = None
    rng = np.random.default_rng((w.seed, 0))
    if w.dataset is not None:
        allrows = load_rows(w.dataset)
        if isinstance(w.arrival, Trace) and len(allrows) < n:
            raise ValueError(f"num_requests: {n} > the {len(allrows)} rows of {w.dataset.path} (trace arrivals)")
        rows = tuple(allrows[i % len(allrows)] for i in range(n))
        if isinstance(w.arrival, Trace):
            rows = tuple(sorted(rows, key=lambda r: r.timestamp_ms))
        prompts = np.array([r.prompt_len for r in rows], dtype=np.int64)
        if w.output_len is not None:
            outs = _draw(w.output_len, n, rng)
        elif any(r.output_len is None for r in rows):
            raise ValueError(f"output_len: {w.dataset.path} has rows without output_len; give an output_len spec")
        else:
            outs = np.array([r.output_len for r in rows], dtype=np.int64)
    else:
        prompts = _draw(w.prompt_len, n, rng)
        outs = _draw(w.output_len, n, rng)
    t = _arrivals(w, rows)
    reqs = tuple(PlannedRequest(float(t[i]), int(prompts[i]), int(outs[i])) for i in range(n))
    plan = tuple(sorted(reqs, key=lambda r: r.arrival_s))
    return RequestPlan(plan, w.arrival.concurrency if isinstance(w.arrival, Closed) else None)
