"""The emulated SGLang server process: ``python -m tasks.emulator.server <SGLang flags>``.

Behaviour (see docs/emulator.md):
* parses SGLang's flags (``tasks.emulator.flags``; argparse errors -> stderr, exit 2);
* reads the profile from ``$SERVESWEEP_EMULATOR_PROFILE`` (JSON; default: shipped conf);
* spawns ``min(tp, emulator.rank_processes)`` child ``tasks.emulator.rank`` processes in
  its own process group (they survive the launcher's death, like SGLang's ranks);
* replays the modelled startup log with sleeps × ``time_scale``; binds HTTP after the
  weights load (``/health`` is 503 until ready); on a modelled failure prints the
  SGLang-like traceback, kills its children and SIGKILLs itself (exit -9) or exits 1;
* serves SGLang's HTTP API (``tasks.emulator.http_api``: /generate, the OpenAI routes, ...),
  pacing tokens at absolute deadlines; text is tokenized with the shipped tokenizer
  (``tasks.emulator.tokenizer``), loaded while the startup log replays;
* SIGTERM: terminates its children, waits ``teardown_s × time_scale``, exits 0
  (faults ``ignore_sigterm`` and ``orphan_children`` change that).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

from aiohttp import web

from tasks.emulator.engine import ServingEngine
from tasks.emulator.flags import LaunchArgError
from tasks.emulator.http_api import HttpApi
from tasks.emulator.launch import LaunchConfig, parse_launch
from tasks.emulator.model import evaluate
from tasks.emulator.physics import run_factor
from tasks.emulator.prediction import Prediction
from tasks.emulator.profile import profile_from_env
from tasks.emulator.tokenizer import EmulatorTokenizer, default_tokenizer

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
BENCH_FAULTS = ("crash_bench", "stall_bench", "early_exit")
REPO_ROOT = str(Path(__file__).resolve().parents[2])


def token_id(prompt_key: int, position: int, vocab: int) -> int:
    """Deterministic output token id for (prompt, position): independent of the launch config."""
    x = (prompt_key * 0x9E3779B1 + position * 0x85EBCA77 + 0x2545F491) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 12
    return x % vocab


def prompt_key(input_ids: list[int]) -> int:
    """CRC32 of the prompt token ids."""
    return zlib.crc32(",".join(map(str, input_ids)).encode())


class EmulatedServer:
    """State of one emulated server process (one asyncio loop)."""

    def __init__(self, profile: dict, launch: LaunchConfig, pred: Prediction):
        self.profile, self.launch, self.pred = profile, launch, pred
        emu = profile["emulator"]
        self.ts = float(emu["time_scale"])
        self.fault = emu.get("fault")
        self.fault_after_s = emu.get("fault_after_s")
        self.fault_after_tokens = int(emu.get("fault_after_tokens") or 24)
        self.seed = int(emu.get("seed") or 0)
        self.vocab = int(profile["model"]["emulator"]["vocab_size"])
        self.factor = run_factor(profile, launch)
        self.ready = False
        self.children: list[subprocess.Popen] = []
        self.runner: web.AppRunner | None = None
        self._engine: ServingEngine | None = None
        self.active = 0
        self.req_counter = 0
        self.bench_tokens = 0
        self.first_bench_t: float | None = None
        self.stalled = asyncio.Event()
        self.last_tau = pred.accept_length
        self.last_rate = 0.0
        self.t_start = time.time()
        self.tok: EmulatorTokenizer | None = None  # set before ready (loaded during the startup replay)

    # ---------------------------------------------------------------- logging
    def out(self, line: str) -> None:
        """Print one raw line to stdout (flushed: the harness tails the log)."""
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def log(self, text: str, tag: str | None = None) -> None:
        """Print an SGLang-style ``[date time TAG] text`` line with the wall clock."""
        lt = time.localtime()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", lt)
        self.out(f"[{stamp}{' ' + tag if tag else ''}] {text}")

    # ---------------------------------------------------------------- processes
    def spawn_ranks(self) -> None:
        """Start ``min(tp, rank_processes)`` child rank processes (they outlive a killed launcher)."""
        n = max(1, min(self.launch.tp, int(self.profile["emulator"].get("rank_processes") or 2)))
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for r in range(n):
            argv = [sys.executable, "-m", "tasks.emulator.rank", "--rank", str(r)]
            if self.fault == "ignore_sigterm":
                argv.append("--ignore-sigterm")
            self.children.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL, env=env, cwd=REPO_ROOT))
        if self.fault == "detach_helper":  # a helper that setsid()s and double-forks out of the tree
            subprocess.run([sys.executable, "-m", "tasks.emulator.detach"], env=env, cwd=REPO_ROOT, check=False)

    def kill_children(self, sig: int = signal.SIGKILL) -> None:
        """Signal every rank child and reap it (SIGKILL after 2 s)."""
        for c in self.children:
            try:
                c.send_signal(sig)
            except ProcessLookupError:
                pass
        for c in self.children:
            try:
                c.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                c.kill()

    def die(self, exit_code: int) -> None:
        """SGLang's failure exit: kill_process_tree -> SIGKILL self (-9), else os._exit(code)."""
        self.kill_children(signal.SIGKILL)
        sys.stdout.flush()
        sys.stderr.flush()
        if exit_code == -9:
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(exit_code)

    def on_sigterm(self) -> None:
        """SIGTERM/SIGINT: graceful exit (ignored under the ``ignore_sigterm`` fault)."""
        if self.fault == "ignore_sigterm":
            return
        asyncio.get_running_loop().create_task(self._graceful_exit())

    async def _graceful_exit(self) -> None:
        self.log("Received SIGTERM. Shutting down.")
        if self.fault != "orphan_children":
            self.kill_children(signal.SIGTERM)
        await asyncio.sleep(self.profile["node"]["emulator"]["startup"]["teardown_s"] * self.ts)
        sys.stdout.flush()
        os._exit(0)

    # ---------------------------------------------------------------- startup
    async def sleep_until(self, t_abs: float) -> None:
        """Sleep until the monotonic time ``t_abs`` (absolute deadlines keep the token rate exact)."""
        dt = t_abs - time.monotonic()
        if dt > 0:
            await asyncio.sleep(dt)

    async def bind(self) -> None:
        """Open the HTTP port (``/health`` answers 503 until ready)."""
        # handler_cancellation: a client that disconnects cancels its handler, which aborts its
        # request in the scheduler (streaming or not), so it stops holding a slot and KV.
        self.runner = web.AppRunner(HttpApi(self).app(), access_log=None, handle_signals=False,
                                    handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.launch.host, self.launch.port, reuse_address=True)
        await site.start()

    async def run(self) -> None:
        """Replay the modelled startup (faults applied), then serve or die as the model says."""
        loop = asyncio.get_running_loop()
        if self.fault == "ignore_sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            loop.add_signal_handler(signal.SIGTERM, self.on_sigterm)
        loop.add_signal_handler(signal.SIGINT, self.on_sigterm)
        self.spawn_ranks()
        tok_loading = loop.run_in_executor(None, self.load_tokenizer)
        t0 = time.monotonic()
        events = self.pred.events
        if self.fault == "crash_startup":
            cut = max((i for i, e in enumerate(events) if "Load weight begin" in e.text), default=0)
            events = events[:cut + 1]
        bind_delay = 0.0
        for ev in events:
            await self.sleep_until(t0 + ev.t_s * self.ts)
            if self.fault == "hang_startup" and "Capture cuda graph begin" in ev.text:
                self.log(ev.text, ev.tag)
                await asyncio.Event().wait()  # never healthy
            if ev.kind == "log":
                self.out(ev.text if ev.raw else f"{self._prefix(ev.tag)} {ev.text}")
            elif ev.kind == "bind":
                if self.fault == "late_bind":
                    bind_delay = float(self.fault_after_s if self.fault_after_s is not None else 2.0)
                else:
                    await self.bind()
            elif ev.kind == "ready":
                await tok_loading
                if bind_delay:
                    await asyncio.sleep(bind_delay)
                    await self.bind()
                self.ready = True
        if self.fault == "crash_startup":
            await asyncio.sleep(2.0 * self.ts)
            self.log("Scheduler hit an exception: Traceback (most recent call last):", "TP0")
            self.out('  File "<VENV>/sglang/srt/model_executor/model_runner.py", line 812, in load_model')
            self.out("RuntimeError: emulated fault crash_startup (SERVESWEEP_EMULATOR_FAULT)")
            self.log("Received sigquit from a child process. It usually means the child failed.")
            self.die(-9)
        if self.pred.outcome != "ok":
            self.die(self.pred.failure.exit_code)
        await asyncio.Event().wait()

    def load_tokenizer(self) -> EmulatorTokenizer:
        """The tokenizer: ``--tokenizer-path`` when it is a local directory with a
        ``tokenizer.json``, else the shipped one (``tasks.emulator.tokenizer.TOKENIZER_DIR``)."""
        given = self.launch.args.get("tokenizer_path")
        if given and (Path(given) / "tokenizer.json").is_file():
            self.tok = EmulatorTokenizer(given)
        else:
            self.tok = default_tokenizer()
        return self.tok

    def _prefix(self, tag: str | None) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        return f"[{stamp}{' ' + tag if tag else ''}]"

    # ---------------------------------------------------------------- generation
    def engine(self) -> ServingEngine:
        """The batching engine (created at the first request: only a healthy server has one)."""
        if self._engine is None:
            http_s = self.profile["node"]["emulator"]["startup"]["http_overhead_ms"] / 1000.0
            self._engine = ServingEngine(self.profile, self.launch, self.pred, http_overhead_s=http_s, seed=self.seed)
        return self._engine

    async def _maybe_fault(self) -> None:
        if self.fault not in BENCH_FAULTS:
            return
        if self.fault_after_s is not None:
            hit = self.first_bench_t is not None and time.monotonic() - self.first_bench_t >= float(self.fault_after_s)
        else:
            hit = self.bench_tokens >= self.fault_after_tokens
        if not hit:
            return
        if self.fault == "crash_bench":
            self.log("Scheduler hit an exception: Traceback (most recent call last):", "TP2")
            self.out('  File "<VENV>/sglang/srt/managers/scheduler.py", line 1123, in event_loop_overlap')
            self.out("RuntimeError: CUDA error: an illegal memory access was encountered")
            self.log("Received sigquit from a child process. It usually means the child failed.")
            self.die(-9)
        elif self.fault == "early_exit":
            self.log("Gracefully exiting... Remaining number of requests 1.")
            self.kill_children(signal.SIGTERM)
            sys.stdout.flush()
            os._exit(0)
        elif self.fault == "stall_bench":
            self.stalled.set()

    async def generate(self, input_ids: list[int], max_new: int, bench: bool, received: float | None = None,
                       sample: int = 0):
        """Async generator of (new_token_ids, verify_passes_so_far, finished) at the batching
        scheduler's times; closing it early (client gone, handler cancelled) aborts the request.

        The ids are the tokenizer's output tokens (:meth:`EmulatorTokenizer.output_id`) of a
        hash of (prompt ids, ``sample``, position): ``sample`` tells the ``n`` choices of one
        prompt apart (0 = the first, as a request without ``n``).

        Raises:
            RequestRejected: the request can never fit the KV pool.
        """
        eng = self.engine()
        self.req_counter += 1
        self.active += 1
        if bench and self.first_bench_t is None:
            self.first_bench_t = time.monotonic()
        key = prompt_key(input_ids) if sample == 0 else zlib.crc32(f"{prompt_key(input_ids)}/{sample}".encode())
        vocab, corrupt = self.vocab, self.fault == "corrupt_tokens"
        tok = self.tok or self.load_tokenizer()

        def tid(pos: int) -> int:
            t = token_id(key, pos, vocab)
            return tok.output_id((t + 7919) % vocab if corrupt and pos >= 1 else t)

        max_new = max(1, int(max_new))
        rid = eng.submit(len(input_ids), max_new, received)
        spec = self.launch.speculative
        pos = cycles = 0
        t_first = None
        finished = False
        try:
            async for ch in eng.stream(rid):
                if bench and ch.index > 0:
                    await self._maybe_fault()
                if self.stalled.is_set():
                    await asyncio.Event().wait()
                if t_first is None:
                    t_first = time.monotonic()
                    eng.first_sent[rid] = eng.now_s()
                new = [tid(pos + j) for j in range(ch.tokens)]
                pos += ch.tokens
                cycles += 1 if (ch.index > 0 or not spec) else 0
                if bench:
                    self.bench_tokens += ch.tokens
                finished = ch.finished
                yield new, max(cycles, 1) if finished else cycles, finished
        finally:
            self.active -= 1
            if not finished:
                eng.abort(rid)
        el = time.monotonic() - t_first if t_first is not None else 0.0
        if pos > 1 and el > 0:
            self.last_rate = (pos - 1) / el
        if spec and cycles:
            self.last_tau = pos / max(cycles, 1)


def main(argv: list[str] | None = None) -> None:
    """Entry point: parse flags, load profile, run the emulated server until signalled."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        profile = profile_from_env()
    except ValueError as e:
        sys.stderr.write(f"servesweep emulator: bad profile: {e}\n")
        sys.exit(3)
    try:
        launch = parse_launch(argv, dict(os.environ), sglang_version=str(profile["emulator"]["sglang_version"]))
    except LaunchArgError as e:
        sys.stderr.write(e.text)
        sys.stderr.flush()
        sys.exit(2)
    pred = evaluate(profile, launch)
    server = EmulatedServer(profile, launch, pred)
    asyncio.run(server.run())


if __name__ == "__main__":
    main()
