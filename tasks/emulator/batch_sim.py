"""A whole workload through :class:`~tasks.emulator.scheduler.BatchScheduler` (instant mode).

Requests are sent open loop at their arrival offsets, or closed loop (at most
``max_concurrency`` in flight, the next sent when one ends); the result turns into the
per-request records :mod:`tasks.serving_metrics` consumes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tasks.emulator.scheduler import AcceptModel, BatchScheduler, SchedulerConfig, StepTime
from tasks.serving_metrics import RequestRecord, summarize


@dataclass
class SimResult:
    """Outcome of :func:`simulate`: the scheduler, and per input request its id and send time."""

    scheduler: BatchScheduler
    rids: list[int]
    send_s: list[float]

    def records(self) -> list[RequestRecord]:
        """One :class:`~tasks.serving_metrics.RequestRecord` per request, in input order."""
        out = []
        for rid, send in zip(self.rids, self.send_s):
            r = self.scheduler.reqs[rid]
            ts, ns = self.scheduler.chunks(rid)
            ok = r.state == "done"
            out.append(RequestRecord(send_s=send, chunk_times_s=ts, chunk_tokens=ns, prompt_len=r.prompt,
                                     output_len=r.emitted, end_s=r.finish_s if ok else None, ok=ok, error=r.error))
        return out

    @property
    def duration_s(self) -> float:
        """First send -> last request's end (the benchmark's wall time)."""
        ends = [r.finish_s for r in self.scheduler.reqs if not math.isnan(r.finish_s)]
        return max(ends) - min(self.send_s)


_ENDED = ("done", "aborted", "rejected")


def simulate(
    requests: Sequence[tuple[float, int, int]],
    config: SchedulerConfig,
    step_time_s: StepTime,
    *,
    max_concurrency: int | None = None,
    accept: AcceptModel | None = None,
    abort_after_s: Mapping[int, float] | None = None,
    submit_delay_s: float = 0.0,
) -> SimResult:
    """Serve a whole workload: ``requests`` = (arrival offset s, prompt_len, output_len) each.

    Args:
        requests: in any order; sent in arrival order (ties by index).
        config, step_time_s, accept: see :class:`BatchScheduler`.
        max_concurrency: closed loop: at most this many in flight; a request is sent at
            ``max(its arrival, when a slot freed)``, as bench_serving's FIFO semaphore does
            (sglang/benchmark/serving.py:1432-1439).
        abort_after_s: request index -> seconds after its send at which its client disconnects.
        submit_delay_s: send -> arrival in the scheduler (the server's HTTP/tokenizer time), s.

    Returns:
        :class:`SimResult` (in input order).

    Raises:
        ValueError: empty ``requests``, max_concurrency < 1, or a bad request
            (see :meth:`BatchScheduler.submit`).
    """
    if not requests:
        raise ValueError("simulate needs at least one request")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    sch = BatchScheduler(config, step_time_s, accept)
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    slots = [0.0] * (max_concurrency or len(requests))  # times at which a client slot is free
    rids, send = [0] * len(requests), [0.0] * len(requests)
    live: list[int] = []
    nxt = 0
    while True:
        for rid in [x for x in live if sch.reqs[x].state in _ENDED]:
            live.remove(rid)
            heapq.heappush(slots, sch.reqs[rid].finish_s)
        while nxt < len(order) and slots:
            i = order[nxt]
            t = max(float(requests[i][0]), heapq.heappop(slots))
            rids[i] = sch.submit(requests[i][1], requests[i][2], t + submit_delay_s)
            send[i] = t
            if abort_after_s and i in abort_after_s:
                sch.abort(rids[i], t + abort_after_s[i])
            live.append(rids[i])
            nxt += 1
        if not sch.busy and nxt >= len(order):
            break
        sch.advance(math.inf, stop_on_finish=nxt < len(order))
    return SimResult(sch, rids, send)


def level_metrics(
    requests: Sequence[tuple[float, int, int]],
    config: SchedulerConfig,
    step_time_s: StepTime,
    *,
    max_concurrency: int | None = None,
    accept: AcceptModel | None = None,
    slos_ms: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """One load level in instant mode: :func:`simulate` then
    :func:`tasks.serving_metrics.summarize` over the level's wall time (first send -> last end).
    Pass a :class:`tasks.workloads.RequestPlan`'s ``requests`` and ``max_concurrency``."""
    res = simulate(requests, config, step_time_s, max_concurrency=max_concurrency, accept=accept)
    return summarize(res.records(), res.duration_s, slos_ms=slos_ms)


def saturation_rate_req_s(
    requests: Sequence[tuple[float, int, int]],
    config: SchedulerConfig,
    step_time_s: StepTime,
    *,
    accept: AcceptModel | None = None,
) -> float:
    """Requests/s the batching model completes when every request arrives at once: its
    capacity for this mix, e.g. to set a load search's ``rate_hi`` (a little above it)."""
    res = simulate([(0.0, p, o) for _, p, o in requests], config, step_time_s, accept=accept)
    done = sum(r.state == "done" for r in res.scheduler.reqs)
    return done / res.duration_s
