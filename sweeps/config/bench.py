"""The ``bench`` section of a sweep config (conf/bench/*.yaml), validated into a
:class:`tasks.types.BenchSpec`.

Besides the fixed batch-1 / concurrency benchmark it carries an optional serving-under-load
``workload`` (validated by :func:`tasks.workloads.parse_workload`; errors name
``bench.workload.<field>``), an ``slo`` and a ``load_search`` (the in-trial search of
``max_rate_at_slo_req_s``, :func:`tasks.load_search.max_rate_at_slo`), and closed-loop
``concurrency_levels``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.types import BenchSpec, LoadSearchSpec, SloSpec
from tasks.workloads import build_requests, parse_workload


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SloConfig(_Model):
    """Per-level latency SLO, ms (p99 TTFT, p99 TPOT; ``e2e_ms``: optional per-request bound)."""

    ttft_ms_p99: float = Field(gt=0, allow_inf_nan=False)
    tpot_ms_p99: float = Field(gt=0, allow_inf_nan=False)
    e2e_ms: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class LoadSearchConfig(_Model):
    """Rate range (req/s) and budget of the in-trial load search (default 6 levels, to 5 %; at
    most 10 levels: each one is a full load level on the live server)."""

    rate_lo: float = Field(gt=0, allow_inf_nan=False)
    rate_hi: float = Field(gt=0, allow_inf_nan=False)
    max_levels: int = Field(default=6, ge=2, le=10)
    rel_tol: float = Field(default=0.05, gt=0, le=0.5)

    @model_validator(mode="after")
    def _ordered(self) -> LoadSearchConfig:
        if not self.rate_lo < self.rate_hi:
            raise ValueError(f"rate_lo ({self.rate_lo}) must be < rate_hi ({self.rate_hi})")
        return self


class BenchConfig(_Model):
    """The benchmark (conf/bench/*.yaml); see :class:`tasks.types.BenchSpec`."""

    input_len: int = Field(default=128, ge=1)
    output_len: int = Field(default=128, ge=2)
    warmup_requests: int = Field(default=1, ge=0)
    warmup_output_len: int = Field(default=16, ge=1)
    repeats: int = Field(default=3, ge=1)
    concurrency: int = Field(default=1, ge=1)
    request_timeout_s: float = Field(default=60.0, gt=0)
    seed: int = 0
    workload: dict[str, Any] | None = None
    slo: SloConfig | None = None
    load_search: LoadSearchConfig | None = None
    concurrency_levels: list[int] = Field(default_factory=list)
    max_repeat_cv: float = Field(default=0.10, gt=0, le=1)

    @field_validator("workload")
    @classmethod
    def _workload_ok(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        w = parse_workload(v, where="bench.workload")
        try:
            build_requests(w)
        except ValueError as e:
            raise ValueError(f"bench.workload: {e}") from None
        return w.model_dump()

    @field_validator("concurrency_levels")
    @classmethod
    def _levels_ok(cls, v: list[int]) -> list[int]:
        if any(not isinstance(c, int) or c < 1 for c in v):
            raise ValueError("every concurrency level must be an int >= 1")
        return sorted(set(v))

    @model_validator(mode="after")
    def _consistent(self) -> BenchConfig:
        if self.load_search is not None:
            if self.slo is None:
                raise ValueError("bench.load_search needs bench.slo (the SLO it searches against)")
            if self.workload is None:
                raise ValueError("bench.load_search needs bench.workload (the traffic it offers)")
            if self.workload["arrival"]["kind"] == "closed":
                raise ValueError("bench.load_search varies the request rate: bench.workload.arrival.kind "
                                 "must be poisson or trace, not closed")
        if self.concurrency_levels and self.workload is None:
            raise ValueError("bench.concurrency_levels needs bench.workload (the lengths each level sends)")
        return self

    def to_spec(self) -> BenchSpec:
        """The node-side :class:`tasks.types.BenchSpec` (no incumbent: the driver adds it)."""
        d = self.model_dump(exclude={"slo", "load_search", "concurrency_levels"})
        return BenchSpec(**d,
                         slo=SloSpec(**self.slo.model_dump()) if self.slo else None,
                         load_search=LoadSearchSpec(**self.load_search.model_dump()) if self.load_search else None,
                         concurrency_levels=tuple(self.concurrency_levels))

