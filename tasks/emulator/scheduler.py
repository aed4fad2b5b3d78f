"""Continuous batching as SGLang's scheduler does it, as a pure discrete-event simulation.

Time advances in *steps* (one forward pass each). A step serves the running decode batch
(<= ``max_running_requests``) and, with chunked prefill, up to ``chunked_prefill_size``
prompt tokens of admitted requests; its duration comes from the caller's
``step_time_s(decode_batch, prefill_tokens)`` (the emulator's performance model; for EAGLE
it prices verifying ``decode_batch x num_draft_tokens`` tokens). Each step's tokens reach
the client at the step's end: a request's first token when its prefill completes (so TTFT
= queueing + its prefill steps, and grows with prompt length and load), then one token per
decode step, or with EAGLE the accepted length of each verify step.

SGLang 0.5.23 behaviours modelled (``sglang/srt/managers/``):

* Admission, first come first served, while a slot is free and the KV pool can hold the
  prompt plus ``min(max_new_tokens, 4096)`` of the new request beyond what the running
  requests reserve: ``min(remaining, CLIP_MAX_NEW_TOKENS=4096) x new_token_ratio`` each
  (schedule_policy.py:89 and :785-794 ``_get_running_request_total_token_offset``; the ratio
  is 1.0 for ``ignore_eos`` requests, as benchmarks send them). A request that does not fit
  blocks the queue behind it.
* KV exhaustion in decode: requests are retracted (back to the head of the queue, their KV
  freed, prompt + generated tokens prefilled again later) fewest-generated-tokens first,
  then longest prompt, always keeping one (schedule_batch.py:3451-3510 ``retract_decode``,
  :3542-3580 ``_get_decode_retraction_order``).
* ``--enable-mixed-chunk``: with ``mixed_chunk=False`` (SGLang's default) a prefill step
  pauses decoding; with ``True`` decode and prefill share the step.
* A client disconnect aborts the request at the next step boundary and frees its slot/KV.

Between events (an admissible arrival, an abort, a finish, KV exhaustion) decode steps are
identical, so the loop jumps over them in one go; a 200-request load level simulates in
milliseconds. :mod:`tasks.emulator.batch_sim` drives it with a whole workload (instant mode).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

StepTime = Callable[[int, int], float]
CLIP_MAX_NEW_TOKENS = 4096  # sglang/srt/managers/schedule_policy.py:89 (env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION)
_MAX_JUMP = 4096  # decode steps simulated in one block at most (bounds the EAGLE draw matrix)


@dataclass(frozen=True)
class SchedulerConfig:
    """The launch flags that shape batching.

    Attributes:
        max_running_requests: ``--max-running-requests`` (>= 1).
        max_total_tokens: KV pool capacity in tokens (``--max-total-tokens`` or what the
            memory fraction leaves), >= 1.
        chunked_prefill_size: ``--chunked-prefill-size``: prompt tokens per step; <= 0
            disables chunking. Default 8192: SGLang's choice for 90-160 GB GPUs when unset
            (srt/arg_groups/memory_hook.py:146-154).
        mixed_chunk: ``--enable-mixed-chunk`` (SGLang's default: off).
        new_token_ratio: share of each running request's remaining output reserved at
            admission (1.0 for ``ignore_eos`` requests, SGLang's 0.7 -> 0.1 estimate otherwise).
    """

    max_running_requests: int
    max_total_tokens: int
    chunked_prefill_size: int = 8192
    mixed_chunk: bool = False
    new_token_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {self.max_total_tokens}")
        if not 0.0 <= self.new_token_ratio <= 1.0:
            raise ValueError(f"new_token_ratio must be in [0, 1], got {self.new_token_ratio}")


@dataclass(frozen=True)
class AcceptModel:
    """Tokens a request gains per EAGLE verify step (accept length, >= 1).

    Attributes:
        values: accept lengths.
        probs: their probabilities (iid draws, seeded); ``None`` = cycle ``values`` in order.
        seed: draw seed.
    """

    values: tuple[int, ...]
    probs: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.values or min(self.values) < 1:
            raise ValueError(f"AcceptModel.values must be non-empty accept lengths >= 1, got {self.values}")
        if self.probs is not None and (len(self.probs) != len(self.values) or abs(sum(self.probs) - 1) > 1e-6):
            raise ValueError("AcceptModel.probs must match values and sum to 1")


class _Req:
    __slots__ = ("rid", "arrival", "prompt", "out", "need", "done_pf", "emitted", "kv", "state",
                 "segs", "first_s", "finish_s", "preemptions", "error", "_chunks")

    def __init__(self, rid: int, arrival: float, prompt: int, out: int):
        self.rid, self.arrival, self.prompt, self.out = rid, arrival, prompt, out
        self.need = prompt  # tokens to prefill (prompt, or prompt + generated after a retraction)
        self.done_pf = self.emitted = self.kv = self.preemptions = 0
        self.state = "arriving"  # waiting | prefill | running | done | aborted | rejected
        self.segs: list[tuple[float, float, int, np.ndarray | None]] = []  # (t0, dt, steps, counts)
        self.first_s = self.finish_s = math.nan
        self.error = ""
        self._chunks: tuple[int, np.ndarray, np.ndarray] | None = None  # (segments seen, times, counts)


class BatchScheduler:
    """Incremental continuous-batching simulation (the emulated server drives it in real time).

    Use: :meth:`submit` requests (arrival times may be in the future), :meth:`abort` them,
    :meth:`advance` the clock; read :meth:`chunks` / :meth:`state`. All times in seconds.
    """

    def __init__(self, config: SchedulerConfig, step_time_s: StepTime, accept: AcceptModel | None = None):
        self.cfg, self.step_time_s, self.accept = config, step_time_s, accept
        self.now = 0.0
        self.reqs: list[_Req] = []
        self._arrivals: list[tuple[float, int]] = []
        self._aborts: list[tuple[float, int]] = []
        self.waiting: deque[_Req] = deque()
        self.prefilling: list[_Req] = []
        self.running: list[_Req] = []
        self.kv_used = 0
        self.steps = 0
        self._rng = np.random.default_rng(accept.seed if accept else 0)
        self._cycle = 0  # position in the accept cycle, or in the pool of iid draws
        self._pool = np.empty(0, dtype=np.int64)
        self._values = None if accept is None else np.asarray(accept.values, dtype=np.int64)  # converted once
        self._max_accept = 1 if accept is None else max(accept.values)
        self._mean_accept = 1.0 if accept is None else float(
            np.mean(accept.values) if accept.probs is None else np.dot(accept.values, accept.probs))

    # --- client side --------------------------------------------------------------------
    def submit(self, prompt_len: int, output_len: int, t_s: float) -> int:
        """Queue a request arriving at ``t_s``; returns its id. One that can never fit the KV
        pool (prompt + output > capacity) is rejected at once (state ``rejected``).

        Raises:
            ValueError: prompt_len < 1 or output_len < 1.
        """
        if prompt_len < 1 or output_len < 1:
            raise ValueError(f"prompt_len and output_len must be >= 1, got {prompt_len}, {output_len}")
        r = _Req(len(self.reqs), float(t_s), int(prompt_len), int(output_len))
        self.reqs.append(r)
        if r.prompt + r.out > self.cfg.max_total_tokens:
            r.state, r.error, r.finish_s = "rejected", "prompt + output exceed the KV pool", r.arrival
        else:
            heapq.heappush(self._arrivals, (r.arrival, r.rid))
        return r.rid

    def abort(self, rid: int, t_s: float) -> None:
        """The client of ``rid`` disconnects at ``t_s``: it leaves at the first step boundary >= t_s."""
        heapq.heappush(self._aborts, (float(t_s), rid))

    def state(self, rid: int) -> str:
        """arriving | waiting | prefill | running | done | aborted | rejected."""
        return self.reqs[rid].state

    def chunks(self, rid: int) -> tuple[np.ndarray, np.ndarray]:
        """(arrival times s, tokens per chunk) of everything ``rid`` emitted so far."""
        r = self.reqs[rid]
        if r._chunks is None or r._chunks[0] != len(r.segs):
            if not r.segs:
                return np.empty(0), np.empty(0, np.int64)
            t0, dt, k = (np.array(c) for c in zip(*((s[0], s[1], s[2]) for s in r.segs)))
            first = np.repeat(np.cumsum(k) - k, k)
            times = np.repeat(t0, k) + np.repeat(dt, k) * (np.arange(int(k.sum())) - first)
            if all(s[3] is None for s in r.segs):
                counts = np.ones(len(times), dtype=np.int64)
            else:
                counts = np.concatenate([np.ones(s[2], np.int64) if s[3] is None else s[3] for s in r.segs])
            r._chunks = (len(r.segs), times, counts)
        return r._chunks[1], r._chunks[2]

    def stream(self, rid: int, since: int = 0) -> tuple[list[tuple[float, int]], bool]:
        """What a server streams: ``rid``'s chunks from index ``since`` as (time s, tokens),
        and whether it has ended (done, aborted or rejected). Call :meth:`advance` with the
        current time first; a chunk's time may lie up to one step ahead (pace to it)."""
        ts, ns = self.chunks(rid)
        new = list(zip(ts[since:].tolist(), ns[since:].tolist()))
        return new, self.reqs[rid].state in ("done", "aborted", "rejected")

    @property
    def busy(self) -> bool:
        """Anything left to simulate (arrivals to come, queued, prefilling or decoding)."""
        return bool(self._arrivals or self.waiting or self.prefilling or self.running)

    # --- the loop -----------------------------------------------------------------------
    def advance(self, until_s: float, stop_on_finish: bool = False) -> float:
        """Run every step that starts at or before ``until_s``; with ``stop_on_finish``
        return right after a step in which a request finished or left. Returns the clock
        (the end of the last step run; a step may end after ``until_s``)."""
        while True:
            if self._boundary() and stop_on_finish:
                return self.now
            if not (self.running or self.prefilling):
                if not self._arrivals or self._arrivals[0][0] > until_s:
                    return self.now
                self.now = max(self.now, self._arrivals[0][0])
                continue
            if self.now > until_s:
                return self.now
            left = self._prefill_step() if self.prefilling else self._decode_block(until_s)
            if stop_on_finish and left:
                self._boundary()
                return self.now

    def _boundary(self) -> bool:
        """Take in arrivals and aborts due by now, admit; returns whether a request left."""
        while self._arrivals and self._arrivals[0][0] <= self.now:
            r = self.reqs[heapq.heappop(self._arrivals)[1]]
            if r.state == "arriving":
                r.state = "waiting"
                self.waiting.append(r)
        left = False
        while self._aborts and self._aborts[0][0] <= self.now:
            left |= self._drop(self.reqs[heapq.heappop(self._aborts)[1]], "aborted")
        self._admit()
        return left

    def _drop(self, r: _Req, state: str) -> bool:
        if r.state in ("done", "aborted", "rejected"):
            return False
        for q in (self.running, self.prefilling):
            if r in q:
                q.remove(r)
        if r in self.waiting:
            self.waiting.remove(r)
        self.kv_used -= r.kv
        r.kv, r.state, r.finish_s = 0, state, self.now
        if state == "aborted":
            r.error = "client disconnected"
        return True

    def _reserved(self) -> float:
        ratio = self.cfg.new_token_ratio
        res = sum(min(r.out - r.emitted, CLIP_MAX_NEW_TOKENS) * ratio for r in self.running)
        return res + sum(r.need - r.done_pf + min(r.out - r.emitted, CLIP_MAX_NEW_TOKENS) for r in self.prefilling)

    def _admissible(self) -> bool:
        if not self.waiting or len(self.running) + len(self.prefilling) >= self.cfg.max_running_requests:
            return False
        r = self.waiting[0]
        free = self.cfg.max_total_tokens - self.kv_used - self._reserved()
        return free >= r.need + min(r.out - r.emitted, CLIP_MAX_NEW_TOKENS)

    def _admit(self) -> None:
        while self._admissible():
            r = self.waiting.popleft()
            r.state = "prefill"
            self.prefilling.append(r)

    def _draw(self, b: int, k: int) -> np.ndarray:
        """A (b, k) block of accept lengths: iid draws from a seeded pool, or the cycle."""
        a, n = self.accept, b * k
        if a.probs is None:
            idx = (self._cycle + np.arange(n)) % len(a.values)
            self._cycle = int((self._cycle + n) % len(a.values))
            return self._values[idx].reshape(b, k)
        if len(self._pool) - self._cycle < n:
            fresh = self._rng.choice(np.asarray(a.values), size=max(n, 1 << 16), p=np.asarray(a.probs))
            self._pool, self._cycle = np.concatenate([self._pool[self._cycle:], fresh]), 0
        out = self._pool[self._cycle:self._cycle + n].reshape(b, k)
        self._cycle += n
        return out

    def _retract_until(self, need_per_req: int) -> None:
        """Retract running requests until one more step of ``need_per_req`` tokens each fits."""
        while len(self.running) > 1 and self.kv_used + need_per_req * len(self.running) > self.cfg.max_total_tokens:
            victim = min(self.running, key=lambda r: (r.emitted, -r.prompt, -r.rid))
            self.running.remove(victim)
            self.kv_used -= victim.kv
            victim.kv, victim.done_pf, victim.need = 0, 0, victim.prompt + victim.emitted
            victim.state, victim.preemptions = "waiting", victim.preemptions + 1
            self.waiting.appendleft(victim)

    def _finish(self, r: _Req) -> None:
        self.running.remove(r)
        self.kv_used -= r.kv
        r.kv, r.state, r.finish_s = 0, "done", self.now

    def _prefill_step(self) -> bool:
        """One step with prefill work; returns whether a request finished."""
        budget = self.cfg.chunked_prefill_size if self.cfg.chunked_prefill_size > 0 else math.inf
        decoding = list(self.running) if self.cfg.mixed_chunk else []
        if decoding:
            self._retract_until(1)
            decoding = list(self.running)
        taken: list[tuple[_Req, int]] = []
        for r in self.prefilling:
            if budget <= 0:
                break
            n = int(min(budget, r.need - r.done_pf))
            taken.append((r, n))
            budget -= n
        ptoks = sum(n for _, n in taken)
        dt = float(self.step_time_s(len(decoding), ptoks))
        t_end = self.now + dt
        finished = False
        for r in decoding:
            counts = None if self.accept is None else np.minimum(self._draw(1, 1)[0], r.out - r.emitted)
            self._gain(r, t_end, dt, 1, counts)
        for r, n in taken:
            r.done_pf += n
            r.kv += n
            self.kv_used += n
            if r.done_pf >= r.need:
                self.prefilling.remove(r)
                self.running.append(r)
                r.state = "running"
                self._gain(r, t_end, dt, 1, None)
        self.now, self.steps = t_end, self.steps + 1
        for r in [r for r in self.running if r.emitted >= r.out]:
            self._finish(r)
            finished = True
        return finished

    def _gain(self, r: _Req, t0: float, dt: float, k: int, counts: np.ndarray | None) -> None:
        n = k if counts is None else int(counts.sum())
        r.segs.append((t0, dt, k, counts))
        if math.isnan(r.first_s):
            r.first_s = t0
        r.emitted += n
        r.kv += n
        self.kv_used += n

    def _steps_until_event(self, dt: float, until_s: float) -> int:
        k = min(_MAX_JUMP, int(math.floor((until_s - self.now) / dt)) + 1 if math.isfinite(until_s) else _MAX_JUMP)
        if self._aborts:
            k = min(k, max(1, math.ceil((self._aborts[0][0] - self.now) / dt)))
        if self._arrivals and len(self.running) < self.cfg.max_running_requests and not self.waiting:
            k = min(k, max(1, math.ceil((self._arrivals[0][0] - self.now) / dt)))
        return max(1, k)

    def _spec_block(self, remaining: list[int], k: int, free: int) -> tuple[int, np.ndarray, list[int]]:
        """EAGLE decode block: (steps, per-request tokens per step, per-request tokens) until
        the first request finishes or the KV pool would overflow."""
        rem = np.asarray(remaining)
        least = min(remaining)
        # draw only about as many steps as the first finisher needs (a block may end early)
        k = int(min(k, least, math.ceil(1.5 * least / self._mean_accept) + 4))
        draw = self._draw(len(remaining), k)
        cum = draw.cumsum(axis=1)
        reached = (cum >= rem[:, None]).any(axis=0)
        if reached.any():
            k = int(reached.argmax()) + 1
        if sum(remaining) > free:  # the pool might run out within the block
            used = np.minimum(cum[:, :k], rem[:, None]).sum(axis=0)
            k = max(1, int(np.searchsorted(used, free, side="right")))
        counts = draw[:, :k].copy()
        last = np.minimum(cum[:, k - 1], rem)
        counts[:, -1] = last - (cum[:, k - 2] if k > 1 else 0)
        return k, counts, last.tolist()

    def _decode_block(self, until_s: float) -> bool:
        """Identical decode steps up to the next event; returns whether a request finished."""
        spec = self.accept is not None
        self._retract_until(self._max_accept)
        batch = self.running
        dt = float(self.step_time_s(len(batch), 0))
        k = self._steps_until_event(dt, until_s)
        remaining = [r.out - r.emitted for r in batch]
        free = self.cfg.max_total_tokens - self.kv_used
        counts = None
        if not spec:
            k = int(min(k, min(remaining), max(1, free // len(batch))))
        else:
            k, counts, sums = self._spec_block(remaining, k, free)
        t0 = self.now + dt
        if counts is None:
            seg = (t0, dt, k, None)
            for r in batch:  # the hot loop: one segment per request per event
                r.segs.append(seg)
                r.emitted += k
                r.kv += k
            self.kv_used += k * len(batch)
        else:
            for r, row, n in zip(batch, counts, sums):
                r.segs.append((t0, dt, k, row))
                r.emitted += n
                r.kv += n
            self.kv_used += sum(sums)
        self.now, self.steps = self.now + k * dt, self.steps + k
        done = [r for r in self.running if r.emitted >= r.out]
        for r in done:
            self._finish(r)
        return bool(done)
