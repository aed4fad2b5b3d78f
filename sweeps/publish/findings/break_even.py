"""How far speculative decoding is from paying: the break-even acceptance length.

One EAGLE verify cycle yields ``τ`` tokens on average (the measured acceptance length,
``accept_length``). With the speculative config's decode rate ``r_s`` (tok/s) a cycle takes

    cycle = τ × 1000 / r_s  ms        (equivalently ITL per token × τ, bench_serving's ITL)

and plain decoding at the baseline's rate ``r_b`` spends ``t_b = 1000 / r_b`` ms per token.
Speculation pays when it yields more tokens per ms: ``τ / cycle > 1 / t_b``, so the
acceptance length that breaks even with this cycle cost is

    τ* = cycle / t_b

(assuming the cycle cost does not grow with τ: the draft and verify work per cycle is set
by the draft shape, not by how many drafted tokens are accepted). With ``topk = 1`` a
cycle can accept at most ``num_steps + 1`` tokens; a τ* above that cannot be reached by
that shape whatever the draft model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeps.config.objective import Objective
from sweeps.publish.findings.best import baseline_measured
from sweeps.publish.findings.text import fmt
from sweeps.store import records

DECODE = Objective("decode_tok_s")
MAX_SHAPES = 12  # draft shapes listed (best first)
FORMULA = ("Break-even acceptance τ* = cycle time ÷ the baseline's time per token. The cycle time (ms per "
           "verify cycle) is acceptance length × 1000 / the config's decode tok/s (equivalently ITL per token × "
           "acceptance length); the baseline's time per token is 1000 / the baseline's decode tok/s. EAGLE pays "
           "only when the measured acceptance length exceeds τ*.")


@dataclass(frozen=True)
class BreakEven:
    """One speculative trial's break-even numbers.

    Attributes:
        trial: trial number.  shape: ``steps/topk/draft tokens``.
        accept: measured acceptance length (tokens per verify cycle).
        cycle_ms: measured time per verify cycle (ms).  base_ms: baseline time per token (ms).
        needed: the break-even acceptance length τ* = cycle_ms / base_ms.
        max_accept: the most one cycle can accept with this shape (None when unknown).
    """

    trial: int
    shape: str
    accept: float
    cycle_ms: float
    base_ms: float
    needed: float
    max_accept: float | None

    def text(self) -> str:
        """``EAGLE-3 3/1/4 (t12): acceptance 2.90 measured, 4.82 needed to break even (cycle 54.0 ms vs 11.2 ms/token)``."""
        reach = (f"; unreachable with this shape (at most {fmt(self.max_accept, 0)} per cycle)"
                 if self.max_accept is not None and self.needed > self.max_accept else "")
        gap = "pays" if self.accept > self.needed else f"{fmt(self.needed / self.accept, 2)}× short"
        return (f"EAGLE-3 {self.shape} (t{self.trial}): acceptance {fmt(self.accept, 2)} measured, "
                f"{fmt(self.needed, 2)} needed to break even (cycle {fmt(self.cycle_ms)} ms vs "
                f"{fmt(self.base_ms)} ms/token) — {gap}{reach}")


def _shape(p: Mapping[str, Any]) -> str:
    return f"{p.get('eagle_num_steps', '?')}/{p.get('eagle_topk', '?')}/{p.get('eagle_num_draft_tokens', '?')}"


def _max_accept(p: Mapping[str, Any]) -> float | None:
    steps, topk = p.get("eagle_num_steps"), p.get("eagle_topk")
    return float(steps) + 1.0 if isinstance(steps, int) and topk == 1 else None


def baseline_ms_per_token(recs: Sequence[records.TrialRecord], conf: Mapping[str, Any] | None,
                          objective: Objective) -> float | None:
    """The baseline's time per token (ms) = 1000 / its decode tok/s: the confirmed mean when
    confirmation re-measured decode tok/s, else the sweep's measurement; None without one."""
    rate = baseline_measured(recs, conf if objective.name == DECODE.name else None, DECODE).value
    return 1000.0 / rate if rate else None


def break_even(r: records.TrialRecord, base_ms: float) -> BreakEven | None:
    """The break-even numbers of an ok speculative trial (None without decode tok/s or an
    acceptance length)."""
    rate, tau = r.metrics.get("decode_tok_s"), r.metrics.get("accept_length")
    if not rate or not tau or r.status != "ok":
        return None
    cycle = tau * 1000.0 / rate
    return BreakEven(r.number, _shape(r.params), tau, cycle, base_ms, cycle / base_ms, _max_accept(r.params))


def grid_summary(rows: Sequence[BreakEven]) -> str:
    """One line over every draft shape that ran: the acceptance EAGLE-3 needs (τ* range, the
    shape that needs least), the acceptance measured, and how many shapes pay.

    Args:
        rows: one :class:`BreakEven` per draft shape (non-empty)."""
    least = min(rows, key=lambda b: b.needed)
    pays = [b for b in rows if b.accept > b.needed]
    steps = sorted({b.shape.split("/")[0] for b in rows})
    verdict = (f"{len(pays)} of them pay ({', '.join(b.shape for b in pays)})" if pays
               else "none pays: every shape would need a higher acceptance than measured")
    return (f"**Over the explored draft grid** ({len(rows)} draft shape(s), steps {', '.join(steps)}): EAGLE-3 would "
            f"need an acceptance length of {fmt(least.needed, 2)} (shape {least.shape}, the least) to "
            f"{fmt(max(b.needed for b in rows), 2)} per verify cycle; measured {fmt(min(b.accept for b in rows), 2)}"
            f"–{fmt(max(b.accept for b in rows), 2)}; {verdict}.")


def break_even_section(recs: Sequence[records.TrialRecord], conf: Mapping[str, Any] | None, objective: Objective) -> list[str]:
    """The "Speculative decoding: break-even acceptance" section: the formula and, per draft
    shape that ran, its best trial's measured vs needed acceptance (empty without one)."""
    spec = [r for r in recs if r.status == "ok" and r.duplicate_of is None and records.counts_for_level(r)
            and r.params.get("speculative") not in (None, "none")]
    base_ms = baseline_ms_per_token(recs, conf, objective)
    if not spec or not base_ms:
        return []
    by_shape: dict[str, BreakEven] = {}
    for r in spec:
        b = break_even(r, base_ms)
        if b and (b.shape not in by_shape or b.needed / b.accept < by_shape[b.shape].needed / by_shape[b.shape].accept):
            by_shape[b.shape] = b
    if not by_shape:
        return []
    rows = sorted(by_shape.values(), key=lambda b: b.needed / b.accept)
    L = ["### Speculative decoding: break-even acceptance", "", FORMULA, ""]
    L += [grid_summary(rows), ""]
    L += [f"- {b.text()}" for b in rows[:MAX_SHAPES]]
    if len(rows) > MAX_SHAPES:
        L.append(f"- (+{len(rows) - MAX_SHAPES} more draft shapes)")
    return L + [""]
