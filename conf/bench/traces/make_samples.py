"""Regenerate the synthetic samples in this directory (seeded; see README.md for sources).

    .venv/bin/python conf/bench/traces/make_samples.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BLOCK = 512  # Mooncake's hash block size (tokens), FAST25-release/README.md

# Mooncake FAST'25 conversation trace (FAST25-release/traces/conversation_trace.jsonl, 12,031 rows):
# mean input 12,035 / output 343 tokens (its README table); sd, range and rate measured on the file.
CONV = {"in_mean": 12035, "in_sd": 15800, "in_min": 891, "in_max": 126195,
        "out_mean": 343, "out_sd": 250, "out_min": 1, "out_max": 2000, "rate_req_s": 3.40}


def lognormal(rng: np.random.Generator, mean: float, sd: float, lo: int, hi: int, n: int) -> np.ndarray:
    s2 = math.log1p((sd / mean) ** 2)
    return np.clip(np.rint(rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), n)), lo, hi).astype(int)


def mooncake_sample(n: int = 200, seed: int = 12) -> list[dict]:
    """Conversation-like rows: lengths and Poisson arrivals at the trace's mean rate; every
    prompt starts with the shared block 0 (as every row of the trace does) and about a third
    continue an earlier request's prefix (the trace shares 38 % of blocks with earlier rows)."""
    rng = np.random.default_rng(seed)
    ins = lognormal(rng, CONV["in_mean"], CONV["in_sd"], CONV["in_min"], CONV["in_max"], n)
    outs = lognormal(rng, CONV["out_mean"], CONV["out_sd"], CONV["out_min"], CONV["out_max"], n)
    ts = np.concatenate([[0.0], np.cumsum(rng.exponential(1000.0 / CONV["rate_req_s"], n - 1))])
    rows, next_id = [], 1
    for i in range(n):
        blocks = -(-int(ins[i]) // BLOCK)
        prefix = [0]
        if rows and rng.random() < 0.35:
            parent = rows[int(rng.integers(len(rows)))]["hash_ids"]
            prefix = parent[: min(len(parent), blocks - 1)] or [0]
        new = list(range(next_id, next_id + blocks - len(prefix)))
        next_id += len(new)
        rows.append({"timestamp": int(ts[i]), "input_length": int(ins[i]), "output_length": int(outs[i]),
                     "hash_ids": prefix + new})
    return rows


def chat_sample(n: int = 200, seed: int = 13) -> list[dict]:
    """The conversation trace's length shape scaled down (input / 16, output / 4), so that a
    real-time emulated load level of a few hundred requests runs in seconds."""
    rng = np.random.default_rng(seed)
    ins = lognormal(rng, CONV["in_mean"] / 16, CONV["in_sd"] / 16, 16, 8192, n)
    outs = lognormal(rng, CONV["out_mean"] / 4, CONV["out_sd"] / 4, 1, 512, n)
    return [{"prompt_len": int(a), "output_len": int(b)} for a, b in zip(ins, outs)]


def main() -> None:
    for name, rows in (("mooncake_conversation_sample.jsonl", mooncake_sample()),
                       ("chat_prompts_sample.jsonl", chat_sample())):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
