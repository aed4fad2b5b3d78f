"""``python -m tasks.backends.sglang.client --url URL ...``: benchmark any running SGLang-compatible (``/generate``)
or OpenAI-compatible (``/v1/completions``) server with a workload and print JSON.

Examples::

    python -m tasks.backends.sglang.client --url http://127.0.0.1:30000 --concurrency 16 --num-requests 64 \\
        --input-len 512 --output-len 128
    python -m tasks.backends.sglang.client --url http://127.0.0.1:8000 --api openai --workload conf/bench/chat_goodput.yaml \\
        --load-search

The output: ``{"metrics": {...}, "levels": [...]}`` (:func:`tasks.serving_metrics.summarize`'s
keys; with ``--load-search`` also ``max_rate_at_slo_req_s`` and each level of the search).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from tasks.load_client import Target, run_level
from tasks.trial_load import run_load, slo_ms
from tasks.types import BenchSpec, LoadSearchSpec, SloSpec
from tasks.workloads import parse_workload


def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    p = argparse.ArgumentParser(prog="python -m tasks.backends.sglang.client", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--api", choices=["sglang", "openai"], default="sglang")
    p.add_argument("--workload", type=Path, help="a conf/bench/*.yaml with a `workload:` (or a bare workload)")
    p.add_argument("--concurrency", type=int, default=1, help="closed-loop clients (without --workload)")
    p.add_argument("--request-rate", type=float, help="open-loop Poisson rate, req/s (without --workload)")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft-ms", type=float, help="p99 TTFT SLO, ms")
    p.add_argument("--slo-tpot-ms", type=float, help="p99 TPOT SLO, ms")
    p.add_argument("--slo-e2e-ms", type=float, help="per-request E2E bound for goodput, ms")
    p.add_argument("--load-search", action="store_true", help="search max_rate_at_slo_req_s (needs both SLOs)")
    p.add_argument("--rate-lo", type=float, help="search range low, req/s (default: the file's or 0.5)")
    p.add_argument("--rate-hi", type=float, help="search range high, req/s (default: the file's or 64)")
    p.add_argument("--max-levels", type=int, default=6)
    p.add_argument("--request-timeout-s", type=float, default=60.0)
    p.add_argument("--deadline-s", type=float, help="time limit of the whole run, s")
    return p


def _bench_file(args: argparse.Namespace) -> dict[str, Any]:
    if args.workload is None:
        arrival = ({"kind": "poisson", "rate_req_s": args.request_rate} if args.request_rate
                   else {"kind": "closed", "concurrency": args.concurrency})
        return {"workload": {"num_requests": args.num_requests, "arrival": arrival, "prompt_len": args.input_len,
                             "output_len": args.output_len, "seed": args.seed}}
    doc = yaml.safe_load(args.workload.read_text()) or {}
    return doc if "workload" in doc else {"workload": doc}


def build_spec(args: argparse.Namespace) -> BenchSpec:
    """The :class:`tasks.types.BenchSpec` the arguments describe (command line over file).

    Raises:
        ValueError: an invalid workload, or a load search without both SLOs.
    """
    doc = _bench_file(args)
    w = parse_workload(doc["workload"], where="workload")
    s = doc.get("slo") or {}
    ttft, tpot = args.slo_ttft_ms or s.get("ttft_ms_p99"), args.slo_tpot_ms or s.get("tpot_ms_p99")
    slo = SloSpec(float(ttft), float(tpot), args.slo_e2e_ms or s.get("e2e_ms")) if ttft and tpot else None
    ls = None
    if args.load_search:
        if slo is None:
            raise ValueError("--load-search needs --slo-ttft-ms and --slo-tpot-ms (or a file's slo:)")
        f = doc.get("load_search") or {}
        ls = LoadSearchSpec(args.rate_lo or f.get("rate_lo", 0.5), args.rate_hi or f.get("rate_hi", 64.0),
                            min(args.max_levels, int(f.get("max_levels", 6))), float(f.get("rel_tol", 0.05)))
        if w.arrival.kind == "closed":
            w = parse_workload({**w.model_dump(), "arrival": {"kind": "poisson", "rate_req_s": 1.0}})
    return BenchSpec(workload=w.model_dump(), slo=slo, load_search=ls, seed=args.seed,
                     request_timeout_s=args.request_timeout_s,
                     concurrency_levels=tuple(doc.get("concurrency_levels") or ()))


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON; exit 2 on bad arguments."""
    args = parser().parse_args(argv)
    try:
        bench = build_spec(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if bench.load_search is not None or bench.concurrency_levels:
        metrics, arts = run_load(args.url, args.api, bench, args.deadline_s)
        out = {"metrics": metrics, "levels": [lv for a in arts for lv in a["levels"]]}
    else:
        m, _ = run_level(Target(args.url, args.api), parse_workload(bench.workload), slos_ms=slo_ms(bench.slo),
                         seed=args.seed, request_timeout_s=args.request_timeout_s, deadline_s=args.deadline_s)
        out = {"metrics": m, "levels": []}
    out["bench"] = _finite(dataclasses.asdict(bench))
    print(json.dumps(_finite(out), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
