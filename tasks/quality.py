"""Measurement quality of one trial: the worst stream gap and the spread across repeats.

A median hides a freeze: one request that stalled 60 s mid-stream (a SIGSTOPped server, a
swapping host) leaves the median ITL untouched. :func:`quality_metrics` adds
``itl_ms_max`` (the largest gap between two chunks of any measured request, ms) and
``decode_tok_s_cv`` (coefficient of variation of the per-request decode rate across
repeats); :func:`unstable_reason` says when a measurement is not to be trusted. The lifecycle
tags such a trial ``unstable`` (perf tag); the driver re-measures it once and keeps a
still-unstable trial out of the winner.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

#: repeats whose decode rates spread more than this (stdev / mean) disagree
MAX_REPEAT_CV = 0.10
#: a gap is a freeze when it is this many times the median ITL ...
GAP_FACTOR = 50.0
#: ... and longer than this (ms): a 50x gap of a 1 ms ITL is jitter, not a freeze
GAP_MIN_MS = 1000.0
UNSTABLE = "unstable"


def quality_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``itl_ms_max`` and (>= 2 requests) ``decode_tok_s_cv`` of measured request records
    (``chunk_times`` in s, ``decode_tok_s`` in tok/s, as :meth:`tasks.backends.sglang.client.RequestRecord.to_dict`)."""
    gaps = [b - a for r in records for a, b in zip(r.get("chunk_times") or [], (r.get("chunk_times") or [])[1:])]
    out: dict[str, float] = {}
    if gaps:
        out["itl_ms_max"] = max(gaps) * 1e3
    rates = [float(r["decode_tok_s"]) for r in records if r.get("decode_tok_s") == r.get("decode_tok_s")
             and r.get("decode_tok_s") is not None]
    if len(rates) >= 2 and statistics.mean(rates) > 0:
        out["decode_tok_s_cv"] = statistics.stdev(rates) / statistics.mean(rates)
    return out


def unstable_reason(metrics: Mapping[str, float], max_cv: float = MAX_REPEAT_CV) -> str | None:
    """Why a trial's measurement is not trustworthy (repeats disagree, or a freeze), or None."""
    cv = metrics.get("decode_tok_s_cv")
    if cv is not None and cv > max_cv:
        return f"repeats disagree: decode_tok_s cv {cv:.2f} > {max_cv:.2f}"
    gap, p50 = metrics.get("itl_ms_max"), metrics.get("itl_ms_p50")
    if gap is not None and p50 and gap > GAP_FACTOR * p50 and gap > GAP_MIN_MS:
        return f"a stream froze: {gap:.0f} ms gap vs median ITL {p50:.1f} ms"
    return None


def tag_quality(metrics: dict[str, float], records: Sequence[Mapping[str, Any]], perf_tags: list[str],
                judge: bool = True, max_cv: float = MAX_REPEAT_CV) -> str | None:
    """Add :func:`quality_metrics` to ``metrics`` and the ``unstable`` tag to ``perf_tags``
    (in place) when :func:`unstable_reason` finds one; returns the reason.

    ``judge=False`` records the metrics only: concurrent streams or a load search legitimately
    differ per request (batching, queueing), so only sequential repeats are judged.
    """
    metrics.update(quality_metrics(records))
    why = unstable_reason(metrics, max_cv) if judge else None
    if why and UNSTABLE not in perf_tags:
        perf_tags.append(UNSTABLE)
    return why
