"""Rules kept in the cls3 round because they hold across parts, vendors and versions
(docs/failure_classifier.md, "Rules that transfer"): each log line is a real one, its public
source named beside it; each test fails without its rule.
"""

from __future__ import annotations

import pytest

from tasks.failures import KIND, classify


def _reads(log: str, expected: str, phase: str):
    c = classify(log)
    assert (c.failure_class, c.kind, c.phase or "start") == (expected, KIND.get(expected, expected), phase), c
    return c


# ------------------------------------------------------------------ an unknown always quotes a line
def test_an_unknown_cut_in_a_traceback_quotes_where_it_stopped():
    # an SGLang scheduler's traceback cut in its batch step (sgl-project/sglang#6309, as posted)
    log = ("(SGLangEngine pid=952, ip=10.150.236.219)   File \"/sgl-workspace/sglang/python/sglang/srt/managers/"
           "scheduler.py\", line 1060, in event_loop_normal\n"
           "(SGLangEngine pid=952, ip=10.150.236.219)     result = self.run_batch(batch)\n"
           "(SGLangEngine pid=952, ip=10.150.236.219)   File \"/sgl-workspace/sglang/python/sglang/srt/managers/"
           "scheduler.py\", line 2035, in run_batch\n"
           "(SGLangEngine pid=952, ip=10.150.236.219)     batch_result = self.model_worker.forward_batch_generation(\n")
    c = _reads(log, "unknown", "serving a batch")
    assert "in run_batch" in c.line and "in run_batch" in c.signature, c


def test_an_unknown_with_no_progress_quotes_its_last_line():
    # nccl-tests' option banner with nothing after it (NVIDIA/nccl-tests README's all_reduce_perf run)
    log = ("# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 "
           "agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n")
    c = _reads(log, "unknown", "start")
    assert c.line == "# Using devices" and "Using devices" in c.signature, c


# ------------------------------------------------------------------ a failure is never healthy
def test_requests_answered_5xx_are_not_served_past():
    # SGLang under slime answering a burst of chat requests 500, mixed with 200s (THUDM/slime#1514)
    log = ('[2026-01-29 06:53:43] INFO:     11.251.218.253:45400 - "POST /v1/chat/completions HTTP/1.1" 500 '
           "Internal Server Error\n"
           '[2026-01-29 06:53:43] INFO:     11.251.218.253:52558 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    c = _reads(log, "server_http_error", "start")
    assert '" 500' in c.line


def test_a_thread_dump_after_serving_is_not_healthy():
    # SGLang's scheduler dumped by py-spy on its first request (gpustack/gpustack#3139)
    log = ('[2025-11-05 10:18:47] INFO:     127.0.0.1:43844 - "GET /v1/models HTTP/1.1" 200 OK\n'
           "[2025-11-05 10:18:51] Pyspy dump for PID 499:\n"
           "Process 499: sglang::scheduler\n"
           'Thread 499 (idle): "MainThread"\n'
           "    replay (npu_graph_runner.py:82)\n"
           "    run_batch (scheduler.py:1987)\n")
    c = _reads(log, "unknown", "first request")
    assert "Pyspy dump" in c.line


def test_requests_running_with_no_token_made_is_a_stall():
    # vLLM v0's metrics while two requests stay running (vllm-project/vllm#8299, a maintainer's CI log)
    head = "INFO 09-10 09:54:45 async_llm_engine.py:206] Added request cmpl-5feb07c5-0.\n"
    stalled = ("INFO 09-10 09:55:01 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
               "0.0 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%\n")
    _reads(head + stalled * 3, "bench_stall", "first request")
    # vLLM v1's idle server (vllm-project/vllm#26349's log): nothing running, healthy
    idle = ("(APIServer pid=19189) INFO 10-06 11:27:21 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 "
            "tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs\n")
    assert classify(head + idle * 3).healthy
