"""Serving metrics of one load level, defined as SGLang 0.5.23's benchmark defines them.

Source: ``sglang/benchmark/serving.py`` and ``sglang/benchmark/goodput.py`` of SGLang 0.5.23
(line numbers below are of that release). Our code is written from those definitions:

* TTFT = arrival of the first chunk that carries output tokens - send time
  (serving.py:786-788, ``async_request_sglang_generate``).
* E2E latency = arrival of the stream's last line (``[DONE]``) - send time: ``latency`` is
  re-read before every line is parsed (serving.py:756) and stored at the end (serving.py:804).
  A record without ``end_s`` ends at its last chunk.
* TPOT = (E2E - TTFT) / (output_len - 1), only for output_len > 1 (serving.py:1171-1172).
* ITL per token: a later chunk carrying n new tokens after a gap g adds g / n, n times
  (``adjust_itl``, serving.py:790-797); the first chunk adds none, whatever it carries; a
  chunk with no new tokens adds none and does not restart the gap (the ``continue`` at
  serving.py:793 skips the timestamp update). SGLang's OpenAI-completions client
  (``sglang-oai``) records the raw chunk gap (serving.py:378-381) and ``calculate_metrics`` then
  splits each gap over the chunk's text retokenized (``itl / num_tokens``, ``num_tokens`` times,
  serving.py:1173-1181) whenever the server reports an acceptance length (serving.py:1153-1157,
  read from ``/server_info``'s ``avg_spec_accept_length`` for a backend named ``sglang*``,
  serving.py:1642-1662), and keeps the raw gaps otherwise. We always count each chunk's tokens,
  so every backend gets the per-token definition (vLLM can return token ids per chunk).
* ITL per chunk (``itl_chunk_ms_*``), vLLM 0.32's definition: every chunk after the first adds
  its raw gap to the previous one (``vllm/benchmarks/lib/endpoint_request_func.py:267-270``,
  pooled at ``vllm/benchmarks/serve.py:632``), here over the chunks that carry output tokens.
  Equal to the per-token ITL when each chunk carries one token.
* Throughputs divide by the benchmark's wall duration ``dur_s`` (serving.py:1551, 1665):
  completed / dur, sum of successful prompt_len / dur, sum of successful output_len / dur
  (serving.py:1272-1277; a failed request counts 0 output tokens, serving.py:1190).
* Statistics: ``np.mean``, ``np.median`` and ``np.percentile(values or 0, q)`` with NumPy's
  default (``method="linear"``) interpolation, in ms (serving.py:1279-1304); an empty list
  gives 0 as SGLang's ``or 0`` does.
* Goodput (goodput.py:24-53): a successful request is good when it meets every given SLO
  (``ttft``, ``tpot``, ``e2el`` in ms, ``<=``); its TPOT is 0 when output_len <= 1 (unlike the
  TPOT statistics, which skip it). ``goodput_req_s`` = good / dur; ``slo_attainment`` = good /
  all requests sent (failed ones included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tasks.stats import percentile as stats_percentile

STATS = ("mean", "p50", "p90", "p99")
GOODPUT_SLO_METRICS = ("ttft", "tpot", "e2el")  # as sglang/benchmark/goodput.py:12


@dataclass(frozen=True)
class RequestRecord:
    """What a client observed of one request. Times in seconds on one clock (any origin).

    Attributes:
        send_s: when the request was sent.
        chunk_times_s: arrival time of each streamed chunk that carried output text/tokens,
            in arrival order.
        chunk_tokens: new output tokens in each chunk (same length as ``chunk_times_s``).
        prompt_len: prompt tokens.
        output_len: completion tokens the server reported; ``None`` = sum of ``chunk_tokens``.
        end_s: when the stream ended (``[DONE]``); ``None`` = the last chunk's time.
        ok: the request succeeded (HTTP 200 and a complete stream).
        error: why it failed.
    """

    send_s: float
    chunk_times_s: Sequence[float]
    chunk_tokens: Sequence[int]
    prompt_len: int
    output_len: int | None = None
    end_s: float | None = None
    ok: bool = True
    error: str = ""

    def __post_init__(self) -> None:
        if len(self.chunk_times_s) != len(self.chunk_tokens):
            raise ValueError(
                f"chunk_times_s has {len(self.chunk_times_s)} entries but chunk_tokens has {len(self.chunk_tokens)}"
            )
        if self.ok and len(self.chunk_times_s) == 0:
            raise ValueError("a successful RequestRecord needs at least one chunk (ok=True, no chunks)")

    @classmethod
    def from_cumulative(
        cls, send_s: float, chunk_times_s: Sequence[float], cumulative_tokens: Sequence[int], prompt_len: int,
        end_s: float | None = None, ok: bool = True, error: str = "",
    ) -> RequestRecord:
        """From a stream that reports cumulative completion tokens per chunk (SGLang's
        ``meta_info.completion_tokens``): new tokens = differences, as serving.py:790-791."""
        cum = np.asarray(cumulative_tokens, dtype=np.int64)
        new = np.diff(cum, prepend=0) if cum.size else cum
        if (new < 0).any():
            raise ValueError("cumulative_tokens must not decrease")
        return cls(send_s=send_s, chunk_times_s=chunk_times_s, chunk_tokens=new, prompt_len=prompt_len,
                   output_len=int(cum[-1]) if cum.size else 0, end_s=end_s, ok=ok, error=error)

    @property
    def n_output(self) -> int:
        """Completion tokens (the server's count when given, else the chunks' sum)."""
        return int(self.output_len) if self.output_len is not None else int(np.sum(self.chunk_tokens))

    @property
    def ttft_s(self) -> float:
        """Send -> first chunk (s)."""
        return float(self.chunk_times_s[0]) - self.send_s

    @property
    def e2e_s(self) -> float:
        """Send -> end of stream (s)."""
        end = self.end_s if self.end_s is not None else float(self.chunk_times_s[-1])
        return end - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output_len - 1), ``None`` for a single-token response."""
        n = self.n_output
        return (self.e2e_s - self.ttft_s) / (n - 1) if n > 1 else None

    def itls_s(self) -> np.ndarray:
        """Per-token inter-token latencies (s), as ``adjust_itl`` (serving.py:790-797)."""
        t = np.asarray(self.chunk_times_s, dtype=float)
        n = np.asarray(self.chunk_tokens, dtype=np.int64)
        keep = n > 0
        keep[0] = True  # the first chunk is the TTFT anchor whatever it carries
        t, n = t[keep], n[keep]
        if len(t) < 2:
            return np.empty(0)
        return np.repeat(np.diff(t) / n[1:], n[1:])


    def chunk_itls_s(self) -> np.ndarray:
        """Per-chunk inter-token latencies (s): gaps between successive chunks carrying output
        tokens (vLLM's ITL, endpoint_request_func.py:267-270)."""
        t = np.asarray(self.chunk_times_s, dtype=float)
        n = np.asarray(self.chunk_tokens, dtype=np.int64)
        return np.diff(t[n > 0]) if len(t) else np.empty(0)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """SGLang's ``np.percentile(values or 0, q)`` (serving.py:1283): ``q`` in percent, 0 for no
    values, NumPy's default linear method -- the project's one quantile, :func:`tasks.stats.percentile`."""
    return stats_percentile(np.asarray(values, dtype=float).tolist(), q / 100.0, empty=0.0)


def _stats_ms(prefix: str, values_s: Sequence[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(values_s, dtype=float)
    a = a if a.size else np.zeros(1)  # SGLang's `values or 0`
    return {
        f"{prefix}_ms_mean": float(np.mean(a)) * 1e3,
        f"{prefix}_ms_p50": float(np.median(a)) * 1e3,
        f"{prefix}_ms_p90": percentile(a, 90) * 1e3,
        f"{prefix}_ms_p99": percentile(a, 99) * 1e3,
    }


def default_duration_s(records: Sequence[RequestRecord]) -> float:
    """First send -> last end over all requests: the benchmark's wall time when the caller
    has none (SGLang times from before the first send to after the last response)."""
    ends = [r.send_s + (r.e2e_s if r.ok else 0.0) for r in records]
    return max(ends) - min(r.send_s for r in records)


@dataclass(frozen=True)
class Goodput:
    """sglang/benchmark/goodput.py ``GoodputMetrics``: SLOs (ms), good req/s, attainment."""

    slos_ms: Mapping[str, float]
    goodput_req_s: float
    slo_attainment: float
    slo_attainment_by_metric: Mapping[str, float] = field(default_factory=dict)


def validate_slos(slos_ms: Mapping[str, float]) -> dict[str, float]:
    """Check goodput SLOs: keys among ``ttft``, ``tpot``, ``e2el``; values finite > 0 (ms).

    Raises:
        ValueError: an unknown key or a bad value (names it).
    """
    out: dict[str, float] = {}
    for k, v in slos_ms.items():
        if k not in GOODPUT_SLO_METRICS:
            raise ValueError(f"goodput SLO {k!r}: unknown metric (one of {', '.join(GOODPUT_SLO_METRICS)})")
        fv = float(v)
        if not math.isfinite(fv) or fv <= 0:
            raise ValueError(f"goodput SLO {k!r}: {v!r} is not a positive number of ms")
        out[k] = fv
    return out


def goodput(records: Sequence[RequestRecord], slos_ms: Mapping[str, float], duration_s: float) -> Goodput:
    """Requests meeting every SLO per second, as sglang/benchmark/goodput.py:24-53.

    Args:
        records: every request sent at this level (failed ones count in the attainment's
            denominator, never as good).
        slos_ms: e.g. ``{"ttft": 2000, "tpot": 50}``.
        duration_s: the level's wall duration (> 0).

    Raises:
        ValueError: bad SLOs, no records, or a non-positive duration.
    """
    slos = validate_slos(slos_ms)
    if not records:
        raise ValueError("goodput of no requests")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    good = 0
    met = dict.fromkeys(slos, 0)
    for r in records:
        if not r.ok:
            continue
        tpot = r.tpot_s or 0.0
        observed = {"ttft": r.ttft_s * 1e3, "tpot": tpot * 1e3, "e2el": r.e2e_s * 1e3}
        ok = [k for k, slo in slos.items() if observed[k] <= slo]
        for k in ok:
            met[k] += 1
        good += len(ok) == len(slos)
    n = len(records)
    return Goodput(slos, good / duration_s, good / n, {k: c / n for k, c in met.items()})


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float | None = None,
    slos_ms: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """All metrics of one load level (flat dict of floats, ready for MLflow).

    Keys: ``completed``, ``failed``, ``duration_s``, ``request_throughput_req_s``,
    ``input_throughput_tok_s``, ``output_throughput_tok_s``, ``total_throughput_tok_s``,
    ``{ttft,tpot,itl,itl_chunk,e2e_latency}_ms_{mean,p50,p90,p99}`` (``itl``: per token,
    ``itl_chunk``: per chunk, see the module docstring), and with ``slos_ms`` also
    ``goodput_req_s``, ``slo_attainment`` and ``slo_attainment_<metric>``.

    Args:
        records: every request sent at the level.
        duration_s: wall duration; ``None`` = :func:`default_duration_s`.
        slos_ms: goodput SLOs (see :func:`goodput`).

    Raises:
        ValueError: no records, non-positive duration, bad SLOs.
    """
    if not records:
        raise ValueError("summarize needs at least one request record")
    dur = default_duration_s(records) if duration_s is None else float(duration_s)
    if not dur > 0:
        raise ValueError(f"duration_s must be > 0, got {dur!r}")
    done = [r for r in records if r.ok]
    n_in = sum(r.prompt_len for r in done)
    n_out = sum(r.n_output for r in done)
    tpots = [t for t in (r.tpot_s for r in done) if t is not None]
    itls = np.concatenate([r.itls_s() for r in done]) if done else np.empty(0)
    chunk_itls = np.concatenate([r.chunk_itls_s() for r in done]) if done else np.empty(0)
    out: dict[str, float] = {
        "completed": float(len(done)),
        "failed": float(len(records) - len(done)),
        "duration_s": dur,
        "request_throughput_req_s": len(done) / dur,
        "input_throughput_tok_s": n_in / dur,
        "output_throughput_tok_s": n_out / dur,
        "total_throughput_tok_s": (n_in + n_out) / dur,
    }
    out |= _stats_ms("ttft", [r.ttft_s for r in done])
    out |= _stats_ms("tpot", tpots)
    out |= _stats_ms("itl", itls)
    out |= _stats_ms("itl_chunk", chunk_itls)
    out |= _stats_ms("e2e_latency", [r.e2e_s for r in done])
    if slos_ms:
        g = goodput(records, slos_ms, dur)
        out["goodput_req_s"] = g.goodput_req_s
        out["slo_attainment"] = g.slo_attainment
        out |= {f"slo_attainment_{k}": v for k, v in g.slo_attainment_by_metric.items()}
    return out
