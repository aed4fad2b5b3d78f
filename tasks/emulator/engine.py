"""The emulated server's batching engine: a :class:`~tasks.emulator.scheduler.BatchScheduler`
driven in real time.

Every request the HTTP API accepts is submitted here; its tokens reach the client at the
scheduler's step ends (absolute deadlines on the monotonic clock), so a stream's ITL is the
step time of the batch it is decoding in, TTFT = HTTP overhead + queueing + prefill, and
``--max-running-requests``, the KV pool (``min(--max-total-tokens, the memory model's
pool)``), ``--chunked-prefill-size`` and ``--enable-mixed-chunk`` shape the batches. The
clock is advanced lazily: each stream advances the scheduler to "now" when it wakes, then
sleeps until its next chunk (or the end of the step in progress).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tasks.emulator.eagle import accepted_from_uniform
from tasks.emulator.launch import LaunchConfig
from tasks.emulator.prediction import Prediction
from tasks.emulator.scheduler import AcceptModel, BatchScheduler, SchedulerConfig
from tasks.emulator.steptime import StepModel

# [S] SGLang 0.5.x default when --max-running-requests is unset and the pool is large
# (model_runner: min(max(max_total_tokens / context_len * 512, 2048), 4096)); the ready log
# line of tasks.emulator.model prints the same 2048.
DEFAULT_MAX_RUNNING = 2048
DEFAULT_CHUNKED_PREFILL = 8192  # [S] SGLang's choice for 90-160 GB GPUs (see SchedulerConfig)
CONTEXT_LEN = 262144  # [S] Kimi-K2.5 max_position_embeddings (the ready log's context_len)
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_POLL_S = 0.0005  # idle re-check while a request has not yet arrived in the scheduler


def accept_model(pred: Prediction, seed: int = 0, period: int = 997) -> AcceptModel | None:
    """EAGLE accept lengths from the model's per-position acceptance
    (``pred.spec["position_probs"]``), as a cycle of ``period`` inverse-CDF draws over a
    golden-ratio low-discrepancy sequence (seeded start): every stretch of draws has the
    model's mean accept length, as the single-stream server had. None without speculation."""
    probs = pred.spec.get("position_probs") if pred.spec else None
    if not probs:
        return None
    u0 = random.Random(seed).random()
    values = tuple(accepted_from_uniform(probs, (u0 + k * GOLDEN) % 1.0) for k in range(1, period + 1))
    return AcceptModel(values=values)


def scheduler_config(launch: LaunchConfig, pred: Prediction) -> SchedulerConfig:
    """The batching flags of a launch: KV tokens = min(--max-total-tokens, the memory model's pool)."""
    a = launch.args
    kv = int(pred.memory_gib.get("kv_tokens") or 0) or 1
    if a.get("max_total_tokens"):
        kv = min(kv, int(a["max_total_tokens"]))
    cps = a.get("chunked_prefill_size")
    return SchedulerConfig(max_running_requests=int(a.get("max_running_requests") or DEFAULT_MAX_RUNNING),
                           max_total_tokens=max(1, kv),
                           chunked_prefill_size=DEFAULT_CHUNKED_PREFILL if cps is None else int(cps),
                           mixed_chunk=bool(a.get("enable_mixed_chunk")))


@dataclass
class Chunk:
    """Tokens a stream receives at once (EAGLE: one verify step's accepted tokens)."""

    tokens: int
    index: int  # chunk number, 0 = the first token (from prefill)
    finished: bool


class RequestRejected(Exception):
    """The scheduler refused the request (it can never fit the KV pool)."""


class ServingEngine:
    """Real-time :class:`BatchScheduler` for one emulated server (one asyncio loop).

    Args:
        profile, launch, pred: the server's profile, launch and ``evaluate`` prediction.
        http_overhead_s: tokenizer + HTTP time before a request reaches the scheduler.
        clock: monotonic clock (s).
    """

    def __init__(self, profile: dict, launch: LaunchConfig, pred: Prediction, *, http_overhead_s: float = 0.0,
                 seed: int = 0, clock: Callable[[], float] = time.monotonic):
        self.steps = StepModel(profile, launch, pred)
        self.config = scheduler_config(launch, pred)
        self.sch = BatchScheduler(self.config, self.steps.step_time_s, accept_model(pred, seed))
        self.clock, self.t0 = clock, clock()
        self.http_overhead_s = float(http_overhead_s)
        self.context_len = int(launch.args.get("context_length") or CONTEXT_LEN)
        self.arrivals: list[float] = []  # per rid: s since start the request was received
        self.first_sent: dict[int, float] = {}  # per rid: s since start its first chunk was handed to HTTP

    def now_s(self) -> float:
        """Scheduler time (s since the engine started)."""
        return self.clock() - self.t0

    def submit(self, prompt_len: int, output_len: int, received: float | None = None) -> int:
        """Queue a request received at ``received`` (clock value; None = now): it reaches the
        scheduler ``http_overhead_s`` later (the emulator's own parsing is inside that time).
        Returns its scheduler id."""
        now = self.now_s()
        self.sch.advance(now)
        t = now if received is None else min(now, received - self.t0)
        self.arrivals.append(t)
        return self.sch.submit(prompt_len, output_len, t + self.http_overhead_s)

    def abort(self, rid: int) -> None:
        """The client went away: the request leaves at the next step boundary."""
        if self.sch.state(rid) not in ("done", "aborted", "rejected"):
            now = self.now_s()
            self.sch.abort(rid, now)
            self.sch.advance(now)  # take it out now: nobody may poll the scheduler after it

    async def stream(self, rid: int) -> AsyncIterator[Chunk]:
        """The request's chunks, each yielded at its modelled time.

        Raises:
            RequestRejected: the request can never fit the KV pool.
        """
        since = 0
        while True:
            now = self.now_s()
            self.sch.advance(now)
            new, ended = self.sch.stream(rid, since)
            if self.sch.state(rid) == "rejected":
                raise RequestRejected(self.sch.reqs[rid].error)
            for i, (t, n) in enumerate(new):
                dt = t - self.now_s()
                if dt > 0:
                    await asyncio.sleep(dt)
                last = ended and i == len(new) - 1
                yield Chunk(int(n), since + i, last)
            since += len(new)
            if ended:
                return
            if not new:
                await asyncio.sleep(max(self.sch.now - now, _POLL_S))
