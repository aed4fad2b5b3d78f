"""Rules kept in the cls3 round because they hold across parts, vendors and versions
(docs/failure_classifier.md, "Rules that transfer", "test8 read"): each log line is a real one,
its public source named beside it, except in the guards, which change one thing of such a log to
show where a rule stops; each test fails without its rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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


# ------------------------------------------------------------------ OOM on any device
@pytest.mark.parametrize("line", [
    # torch_npu's allocator (gpustack/gpustack#4761, SGLang on Ascend)
    "RuntimeError: NPU out of memory. Tried to allocate 98.71 GiB (NPU 0; 60.96 GiB total capacity; 25.03 GiB "
    "already allocated; 25.03 GiB current active; 35.47 GiB free; 25.08 GiB reserved in total by PyTorch)",
    # torch's hipified allocator on ROCm (Comfy-Org/ComfyUI#9529; pytorch/pytorch#138002)
    "HIP out of memory. Tried to allocate 432.00 MiB. GPU 0 has a total capacity of 15.92 GiB of which 7.12 GiB "
    "is free.",
    # torch's MPS allocator (pharmapsychotic/clip-interrogator-ext#74)
    "RuntimeError: MPS backend out of memory (MPS allocated: 6.04 GB, other allocations: 1.04 GB, max allowed: "
    "6.77 GB). Tried to allocate 459.07 MB on private pool.",
])
def test_an_out_of_memory_of_any_accelerator_is_an_oom(line):
    _reads(line + "\n", "cuda_oom_runtime", "start")


# ------------------------------------------------------------------ node state at NCCL / CUDA init
@pytest.mark.parametrize("log", [
    # nccl-tests on an 8x H100 node without its fabric manager (NVIDIA/nccl-tests#264)
    "test: Test CUDA failure common.cu:941 'system not yet initialized'\n .. test pid 54340: Test failure common.cu:891\n",
    # torch's device count on an 8x A100 node without it (dstackai/dstack#2348)
    "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 802: system not yet "
    "initialized (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)\n",
    # NCCL's init trail ending in ncclSystemError with no WARN (NVIDIA/nccl#1099)
    "nd20-01:191191:219889 [0] NCCL INFO misc/socket.cc:564 -> 2\n"
    "nd20-01:191191:219889 [0] NCCL INFO bootstrap.cc:270 -> 2\n"
    "nd20-01:191191:219889 [0] NCCL INFO init.cc:1303 -> 2\n"
    "nd20-01:191191:191191 [0] NCCL INFO group.cc:106 -> 2\n",
    # NVLS setup failing a CUDA call, ncclUnhandledCudaError up the init trail (NVIDIA/nccl#1338)
    "node2:242431:242475 [1] transport/nvls.cc:158 NCCL WARN Cuda failure 1 'invalid argument'\n"
    "node2:242431:242475 [1] NCCL INFO transport/nvls.cc:330 -> 1\n"
    "node2:242431:242475 [1] NCCL INFO init.cc:1277 -> 1\n",
])
def test_the_node_failing_cuda_or_nccl_init_is_infra(log):
    _reads(log, "nccl_init_system_error", "start")


def test_an_internal_nccl_return_stays_unknown():  # a guard of the rule above
    # ncclInternalError (3) up the init trail: no class names it (the NVIDIA/nccl#1099 trail, result 3)
    log = ("nd20-01:191191:219889 [0] NCCL INFO bootstrap.cc:270 -> 3\n"
           "nd20-01:191191:219889 [0] NCCL INFO init.cc:1303 -> 3\n")
    _reads(log, "unknown", "start")


# ------------------------------------------------------------------ serving evidence
BENCH = ("============ Serving Benchmark Result ============\n"  # vllm-project/vllm#18566 (vllm bench serve)
         "Successful requests:                     1000\n"
         "Benchmark duration (s):                  30.85\n"
         "Request throughput (req/s):              32.42\n")


def test_a_benchmark_result_is_serving():
    _reads(BENCH, "healthy", "requests served")


def test_a_route_list_is_vllms_api_server_up():
    # vLLM's launcher listing its routes (entrypoints/launcher.py; club-3090 benchmark report)
    log = ("(APIServer pid=1) INFO 05-09 10:37:24 [launcher.py:46] Route: /ping, Methods: GET\n"
           "(APIServer pid=1) INFO 05-09 10:37:24 [launcher.py:46] Route: /v1/chat/completions, Methods: POST\n")
    _reads(log, "healthy", "API server up")


def test_an_error_after_serving_still_ends_it():  # a guard of the rule above
    # a benchmark result, then the engine's death (vllm v1/engine/exceptions.py)
    log = BENCH + "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    assert classify(log).failure_class == "server_crash"


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
    c = _reads(log, "unknown", "requests served")
    assert "Pyspy dump" in c.line


def test_requests_running_with_no_token_made_is_a_stall():
    # vLLM v0's metrics while two requests stay running (vllm-project/vllm#8299, a maintainer's CI log)
    head = "INFO 09-10 09:54:45 async_llm_engine.py:206] Added request cmpl-5feb07c5-0.\n"
    stalled = ("INFO 09-10 09:55:01 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
               "0.0 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%\n")
    _reads(head + stalled * 3, "bench_stall", "requests served")
    # vLLM v1's idle server (vllm-project/vllm#26349's log): nothing running, healthy
    idle = ("(APIServer pid=19189) INFO 10-06 11:27:21 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 "
            "tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs\n")
    assert classify(head + idle * 3).healthy


def test_a_queue_pair_that_cannot_connect_is_the_network_in_any_rdma_library():
    # UCCL's EP setup on MI355X nodes (uccl-project/uccl#641); NCCL's ibvwrap wording of the same verbs
    # call (NVIDIA/nccl#2013) was already the network's
    _reads("Failed to modify QP to RTR: Connection timed out\n", "nccl_network_error", "start")
    _reads("host-01.example.com:XXXXXX [5] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 Connection "
           "timed out, on dev mlx_x:1, curr state INIT, next state RTR, local GID index 3\n", "nccl_network_error", "start")


# ------------------------------------------------------------------ read from test8 (docs: "test8 read")
@pytest.mark.parametrize("log", [
    # vLLM-Omni's diffusion engine on an Ascend NPU (PKU-YuanGroup/Helios#62, corpus test8): CANN's
    # own allocation error code, no "out of memory" anywhere
    "[ERROR] 2026-04-09-21:56:46 (PID:210907, Device:0, RankID:0) ERR00100 PTA call acl api failed.\n"
    "[PID: 210907] 2026-04-09-21:56:40.384.694 Memory_Allocation_Failure(EL0004): Failed to allocate memory "
    "requested by GE module.\n        Possible Cause: Available memory is insufficient.\n",
])
def test_ascends_allocation_failure_is_an_oom(log):
    _reads(log, "cuda_oom_runtime", "start")


_WARMUP = ("[2025-10-22 10:27:27] INFO:     Application startup complete.\n"
           "[2025-10-22 10:27:27] INFO:     Uvicorn running on http://127.0.0.1:9316 (Press CTRL+C to quit)\n"
           "[2025-10-22 10:29:28] Initialization failed. warmup error: Traceback (most recent call last):\n"
           "  File \"/home/u/.local/lib/python3.11/site-packages/sglang/srt/entrypoints/http_server.py\", line 1407, "
           "in _execute_server_warmup\n"
           "    assert res.status_code == 200, f\"{res=}, {res.text=}\"\n"
           "AssertionError: res=<Response [{code}]>, res.text='{body}'\n")


def test_a_warmup_refused_in_front_of_the_server_is_a_health_check_failure():
    # SGLang's own warmup answered by a 403 page (NVlabs/DiffusionNFT#21, corpus test8)
    log = _WARMUP.replace("{code}", "403").replace("{body}", "<html><head><title>403 Forbidden</title></head></html>")
    _reads(log, "health_check_failed", "API server up")


def test_a_warmup_the_engine_answered_500_is_not():  # a guard of the rule above
    log = _WARMUP.replace("{code}", "500").replace("{body}", "Internal Server Error")
    assert classify(log).failure_class != "health_check_failed"


def test_a_launchers_own_readiness_deadline_is_a_startup_timeout():
    # Modal's SGLang deploy script (modal-labs/modal-examples#1553, corpus test8)
    log = ("  File \"/root/sglang_low_latency_deploy.py\", line 319, in wait_ready\n"
           "    raise TimeoutError(f\"SGLang server not ready within {timeout} seconds\")\n"
           "TimeoutError: SGLang server not ready within 300 seconds\n"
           "Runner failed with exception: TimeoutError('SGLang server not ready within 300 seconds')\n")
    _reads(log, "startup_timeout", "start")


def test_a_readiness_deadline_after_the_engines_own_error_is_that_error():  # a guard of the rule above
    log = ("[2025-03-28 09:41:59 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
           "  File \"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py\", line 1060, in event_loop_normal\n"
           "ValueError: boom\n"
           "TimeoutError: SGLang server not ready within 300 seconds\n")
    assert classify(log).failure_class != "startup_timeout"


def test_canns_bare_error_code_line_is_an_oom():
    # vllm-project/vllm-ascend#4026's title, the code line without Memory_Allocation_Failure
    _reads("EL0004: [PID: 14004] 2025-11-06-01:17:59.527.855 Failed to allocate memory.\n", "cuda_oom_runtime", "start")


@pytest.mark.parametrize("line", [
    # the wordings of test harnesses' wait-for-server loops (no number of seconds in them)
    "RuntimeError: Server failed to start in time.",
    "TimeoutError: Server failed to start within the timeout period.",
    "ERROR: Timed out waiting for the vLLM server to start (waited 1200 s)",
])
def test_a_launchers_deadline_in_other_wordings(line):
    log = ("(EngineCore_DP0 pid=123) INFO 12-03 12:10:20 [gpu_model_runner.py:2602] Starting to load model "
           "meta-llama/Llama-3.1-70B-Instruct...\n" + line + "\n")
    assert classify(log).failure_class == "startup_timeout", classify(log)


def test_a_retry_line_of_a_server_that_came_up_is_no_deadline():  # a guard of the rule above
    log = ("[2025-10-22 10:25:05 TP0] Init torch distributed begin.\n"
           "health probe: Server not ready in 1 s, retrying\n"
           "[2025-10-22 10:25:28] The server is fired up and ready to roll!\n")
    for args in ((None, None), (137, "bench")):
        assert classify(log, *args).failure_class != "startup_timeout", args


def test_a_deadline_after_an_error_no_row_names_is_not_the_cause():  # a guard of the rule above
    log = ("[2025-10-22 10:25:01] server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B-Instruct', tp_size=1)\n"
           "ValueError: User-specified context_length (131072) is greater than the derived context_length (32768).\n"
           "RuntimeError: SGLang server not ready within 300 seconds\n")
    assert classify(log, 1).failure_class != "startup_timeout"


# ------------------------------------------------------------------ test9 read
def test_the_driver_apis_out_of_memory_is_an_oom():
    # vLLM's EngineCore repacking GPTQ weights at load (noonghunna/club-3090#60, as posted):
    # torch's driver-API check words it "CUDA driver error: out of memory"
    log = ("(EngineCore pid=77) ERROR 05-05 07:35:19 [core.py:1136]   File \"/usr/local/lib/python3.12/dist-packages/"
           "vllm/_custom_ops.py\", line 1279, in gptq_marlin_repack\n"
           "(EngineCore pid=77) ERROR 05-05 07:35:19 [core.py:1136]     return torch.ops._C.gptq_marlin_repack(\n"
           "(EngineCore pid=77) ERROR 05-05 07:35:19 [core.py:1136] RuntimeError: CUDA driver error: out of memory\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("cuda_oom_runtime", "transient"), c


def test_the_same_words_from_torchs_symmetric_memory_are_its_limit():  # a guard of the rule above
    # a 2 GiB symmetric-memory workspace that cannot be mapped while 2 GiB - 1 can (pytorch/pytorch#137145)
    log = ("[rank0]: Traceback (most recent call last):\n"
           "[rank0]:   File \"/home/u/.local/lib/python3.10/site-packages/torch/distributed/_symmetric_memory/"
           "__init__.py\", line 115, in get_symm_mem_workspace\n"
           "[rank0]:     tensor = _SymmetricMemory.empty_strided_p2p(\n"
           "[rank0]: RuntimeError: CUDA driver error: out of memory\n")
    assert classify(log).failure_class == "torch_symm_mem_unsupported"


def test_a_cuda_check_failing_in_the_custom_all_reduce_source_is_that_path():
    # sgl_kernel's JIT custom all-reduce under slime's SGLang engine (THUDM/slime#1998, as posted)
    log = ("RuntimeError: Runtime check failed at /sgl-workspace/sglang/python/sglang/jit_kernel/include/sgl_kernel/"
           "distributed/custom_all_reduce.cuh:37: CUDA error: invalid argument\n"
           "Exception: Capture cuda graph failed\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("custom_allreduce_graph_error", "deterministic"), c


def test_a_compiler_warning_in_the_custom_all_reduce_header_is_not():  # a guard of the rule above
    log = ("/sgl-workspace/sglang/python/sglang/jit_kernel/include/sgl_kernel/distributed/custom_all_reduce.cuh:37:5: "
           "warning: variable 'rank' set but not used [-Wunused-but-set-variable]\n"
           "INFO:     Application startup complete.\n")
    assert classify(log).failure_class != "custom_allreduce_graph_error"


# ------------------------------------------------------------------ test10 read
_REPORT = ("============ Serving Benchmark Result ============\n"
           "Successful requests:                     200       \n"
           "Failed requests:                         0         \n"
           "Benchmark duration (s):                  207.09    \n"
           "Output token throughput (tok/s):         123.62    \n")


def test_a_benchmark_report_with_zero_failed_requests_is_healthy():
    # vllm bench serve's result table (vllm-project/vllm-ascend#12577, as posted)
    assert classify(_REPORT).failure_class == "healthy"


def test_a_benchmark_report_with_failed_requests_is_not():  # a guard of the rule above
    c = classify(_REPORT.replace("0         \n", "3         \n", 1))
    assert c.failure_class != "healthy" and c.line.startswith("Failed requests:"), c


_PYDANTIC = ("(APIServer pid=1)     s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)\n"
             "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
             "(APIServer pid=1)   Value error, {msg} [type=value_error, input_value=ArgsKwargs((), {{'model': ...\n")


def test_a_validation_errors_header_is_what_its_message_says():
    # vLLM's pydantic ModelConfig on vllm-ascend (vllm-project/vllm-ascend#4206, as posted)
    log = _PYDANTIC.format(msg="Model architectures ['Qwen3NextForCausalLM'] failed to be inspected. "
                               "Please check the logs for more details.")
    assert classify(log).failure_class == "model_load_error"


def test_a_validation_error_about_a_setting_is_still_the_settings():  # a guard of the rule above
    log = _PYDANTIC.format(msg="max_num_batched_tokens (2048) must be greater than or equal to max_num_seqs (4096).")
    assert classify(log).failure_class == "server_args_incompatible"


def test_an_error_that_refuses_a_mode_and_names_the_setting_to_use_is_the_config():
    # a model's own assertion (vllm-project/vllm#33808, a vLLM maintainer's log, as posted)
    log = ("(EngineCore_DP0 pid=1961908) ERROR 02-04 17:11:02 [core.py:966]   File \"/home/u/vllm/vllm/model_executor/"
           "models/voxtral_realtime.py\", line 229, in __init__\n"
           "(EngineCore_DP0 pid=1961908) ERROR 02-04 17:11:02 [core.py:966]     not vllm_config.compilation_config."
           "cudagraph_mode.has_full_cudagraphs()\n"
           "(EngineCore_DP0 pid=1961908) ERROR 02-04 17:11:02 [core.py:966] AssertionError: Voxtral realtime doesn't "
           "support full cudagraphs yet. Please use PIECEWISE.\n")
    assert classify(log).failure_class == "server_args_incompatible"


def test_a_gpu_it_does_not_support_is_no_setting():  # a guard of the rule above
    log = "RuntimeError: FlashAttention does not support Turing GPUs yet. Please use the xformers backend.\n"
    assert classify(log).failure_class != "server_args_incompatible"


def test_the_api_servers_engine_handshake_timing_out_is_a_startup_timeout():
    # vLLM's wait_for_engine_startup on vllm-ascend (vllm-project/vllm-ascend#3800, as posted)
    log = ("(ApiServer_0 pid=26419)   File \"/vllm-workspace/vllm/vllm/v1/engine/core_client.py\", line 496, in __init__\n"
           "(ApiServer_0 pid=26419)     raise TimeoutError(\"Timed out waiting for engines to send\"\n"
           "(ApiServer_0 pid=26419) TimeoutError: Timed out waiting for engines to sendinitial message on input socket.\n")
    assert classify(log).failure_class == "startup_timeout"


def test_the_engines_own_rpc_timeout_is_still_its_hang_detector():  # a guard of the rule above
    log = "(EngineCore pid=7) ERROR TimeoutError: Timed out waiting for execute_model of the workers (collective_rpc)\n"
    assert classify(log).failure_class == "engine_hang_detected"


def test_an_ascend_c_kernels_own_assert_is_a_device_side_assert():
    # CANN 8.1's gather_v3 kernel under vllm-ascend after serving (vllm-project/vllm-ascend#1127, as posted)
    log = ('INFO:     127.0.0.1:55330 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
           "(RayWorkerWrapper pid=1954) [ASSERT] [CANN_VERSION : 8.1.RC1][TimeStamp : 0] /home/slave1/Ascend/8.1.RC1/"
           "opp/built-in/op_impl/ai_core/tbe/impl/dynamic/../ascendc/gather_v3/gather_v3_base.h:137: Assertion "
           "`(0 <= val && val < this->gxSize_)' Index 4096 out of range[0 4096)!\n"
           "(RayWorkerWrapper pid=1954) [rank2]:[W611 13:31:09.562926627 compiler_depend.ts:57] Warning: EZ9999: "
           "Inner Error!\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("device_side_assert", "deterministic"), c


def test_a_host_programs_assert_is_not():  # a guard of the rule above
    log = "server: /src/scheduler.cpp:88: void run(): Assertion `queue.size() > 0' failed.\nAborted (core dumped)\n"
    assert classify(log).failure_class != "device_side_assert"


def test_tgis_warmup_running_out_of_memory_is_an_oom():
    # TGI's warmup re-raising the allocator's OOM (huggingface/text-generation-inference#1067, as posted)
    log = ("  File \"/opt/conda/lib/python3.9/site-packages/text_generation_server/models/flash_causal_lm.py\", line 755, "
           "in warmup\n    raise RuntimeError(\n"
           "RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease "
           "`--max-batch-prefill-tokens`\n\n"
           "2023-09-26T21:48:00.969072Z ERROR text_generation_launcher: Method Warmup encountered an error.\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("cuda_oom_runtime", "transient"), c


# ------------------------------------------------------------------ test11 read
_STEP_TIMEOUT = ("(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968]     raise TimeoutError\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968] TimeoutError\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968]\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968] The above exception was the direct "
                 "cause of the following exception:\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968] Traceback (most recent call last):\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968]   File \"/usr/local/lib/python3.12/"
                 "dist-packages/vllm/v1/engine/core.py\", line 986, in run_busy_loop\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968]     self._process_engine_step()\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968]   File \"/usr/local/lib/python3.12/"
                 "dist-packages/vllm/v1/engine/core.py\", line 1019, in _process_engine_step\n"
                 "(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968]     outputs, model_executed = "
                 "self.step_fn()\n")


def test_a_bare_timeout_that_failed_the_engines_step_is_its_hang_detector():
    # vLLM's engine core, its wait's own frames cut off (vllm-project/vllm#33802, a maintainer's CI log)
    assert classify(_STEP_TIMEOUT).failure_class == "engine_hang_detected"


def test_a_bare_timeout_elsewhere_is_not():  # a guard of the rule above
    log = ("Traceback (most recent call last):\n  File \"/app/client.py\", line 12, in main\n    wait()\n"
           "TimeoutError\n")
    assert classify(log).failure_class != "engine_hang_detected"


def test_torchs_allocator_over_a_memory_fraction_is_an_oom():
    # TGI's warmup on torch's allocator with a per-process fraction (huggingface/text-generation-inference#563)
    log = ("thread 'main' panicked at 'Unable to warmup model: Generation(\"Allocation on device 0 would exceed allowed "
           "memory. (out of memory)\\nCurrently allocated     : 16.08 GiB\\nRequested               : 4.88 GiB\")'\n"
           "2023-07-07T17:55:43.805488Z ERROR text_generation_launcher: Webserver Crashed\nError: WebserverFailed\n")
    assert classify(log).failure_class == "cuda_oom_runtime"


def test_trt_llms_executor_without_gpu_memory_is_an_oom():
    # TensorRT-LLM's executor creation (NVIDIA/TensorRT-LLM#5872, as posted)
    log = ("[07/08/2025-19:47:15] [TRT-LLM] [RANK 1] [E] Failed to initialize executor on rank 1: Executor creation "
           "failed due to insufficient GPU memory.\n")
    assert classify(log).failure_class == "cuda_oom_runtime"



# ------------------------------------------------------------------ an adversary's logs
# Logs an adversary wrote in real engines' formats against the test9-test11 rules
# (tests/data/adversary_logs.yaml): where a rule fired wrongly ("not": anything but that class) or
# missed a real variant of its wording. Crafted, not posted: each is a guard of the rule it names.
_ADVERSARY = yaml.safe_load((Path(__file__).parent / "data" / "adversary_logs.yaml").read_text())


@pytest.mark.parametrize("case", _ADVERSARY, ids=[c["name"] for c in _ADVERSARY])
def test_an_adversarys_log(case):
    got = classify(case["log"], case["exit_code"], case["phase"])
    if "not" in case:
        assert got.failure_class != case["not"], got
    else:
        assert got.failure_class == case["want"], got

def test_an_error_the_server_served_past_is_not_the_line_a_later_stall_quotes():
    sv = "(APIServer pid=5026) "
    verdict = "[servesweep] bench: stream stalled: no data for 10 s after 412 chunks"
    log = "\n".join([sv + "INFO:     Application startup complete.",
                     sv + "ERROR 12-05 07:34:10 [serving_chat.py:222] Error in preprocessing prompt inputs",
                     sv + 'INFO:     127.0.0.1:40300 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
                     sv + 'INFO:     127.0.0.1:40312 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
                     "", verdict])
    c = classify(log, None, "bench")
    assert (c.failure_class, c.line) == ("bench_stall", verdict), c


# ------------------------------------------------------------------ test12 read
# A measured result is evidence the work ran, whatever ran it: a test's or an eval's result
# lines make a log with warnings and no engine ready line healthy, as a serving report does.
_DEEPEP = ("/DeepEP-test/nvshmem_src/src/host/transport/transport.cpp:nvshmemi_transport_init:282: init failed for "
           "transport: IBGDA\n"
           "WARN: device mlx5_3 cannot allocate buffer on the specified memory type. Skipping...\n"
           "[rank 7] Dispatch + combine bandwidth: {bw} GB/s, avg_t=222.52 us, min_t=217.31 us, max_t=228.74 us\n"
           "[rank 6] Dispatch + combine bandwidth: {bw} GB/s, avg_t=222.27 us, min_t=215.90 us, max_t=229.50 us\n")


def test_a_tests_measured_bandwidth_after_warnings_is_healthy():
    # DeepEP's intranode test (deepseek-ai/DeepEP#303, as posted)
    assert classify(_DEEPEP.format(bw="99.09")).failure_class == "healthy"


def test_a_bandwidth_of_zero_is_no_evidence():  # a guard of the rule above
    assert classify(_DEEPEP.format(bw="0.00")).failure_class != "healthy"


_NCCL_ROWS = ("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
              "         512           128     float     sum      -1    18.30    0.03    0.03      {w}"
              "    19.42    0.03    0.03      0\n"
              "        1024           256     float     sum      -1    19.97    0.05    0.05      {w}"
              "    19.67    0.05    0.05      0\n")


def test_nccl_tests_rows_with_no_wrong_result_are_healthy():
    # an all_reduce_perf sweep (NVIDIA/nccl-tests#293, as posted)
    assert classify(_NCCL_ROWS.format(w="0")).failure_class == "healthy"


def test_nccl_tests_rows_with_wrong_results_are_not():  # a guard of the rule above
    assert classify(_NCCL_ROWS.format(w="4")).failure_class != "healthy"


def test_an_evals_output_throughput_is_healthy():
    # SGLang's few-shot eval output in a pull request (sgl-project/sglang#21392, as posted)
    log = "Accuracy: 0.954\nInvalid: 0.000\nLatency: 196.836 s\nOutput throughput: 514.743 token/s\n"
    assert classify(log).failure_class == "healthy"


def test_a_runtime_allocation_call_out_of_memory_is_an_oom():
    # llama.cpp's HIP build (ggml-org/llama.cpp#16725, as posted)
    log = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 14136.04 MiB on device 0: cudaMalloc failed: out "
           "of memory\n"
           "graph_reserve: failed to allocate compute buffers\n"
           "main: exiting due to model loading error\n")
    assert classify(log).failure_class == "cuda_oom_runtime"


def test_pinned_host_memory_out_of_memory_is_not_a_gpu_oom():  # a guard of the rule above
    log = "ggml_cuda_host_malloc: failed to allocate 512.00 MiB of pinned memory: cudaMallocHost failed: out of memory\n"
    assert classify(log).failure_class != "cuda_oom_runtime"


def test_a_gguf_with_an_unknown_architecture_is_a_model_load_error():
    # llama.cpp's server (ggml-org/llama.cpp#28050, as posted)
    log = ("0.00.148.150 E llama_model_load: error loading model: unknown model architecture: ''\n"
           "0.00.148.154 E llama_model_load_from_file_impl: failed to load model\n"
           "0.00.148.906 E srv  llama_server: exiting due to model loading error\n")
    assert classify(log, 1).failure_class == "model_load_error"


# ------------------------------------------------------------------ test13 read
def test_nvshmems_queue_pair_and_endpoint_connect_failures_are_network_errors():
    # DeepEP's low-latency test over RoCE (deepseek-ai/DeepEP#17, as posted)
    log = ("Allocating buffer size: 2116.2912 MB ...\n"
           "/root/nvshmem_src/src/modules/transport/ibgda/ibgda.cpp:1345: non-zero status: 121 Error in "
           "mlx5dv_devx_obj_modify for INIT2RTR_QP with syndrome 29e0df\n"
           "/root/nvshmem_src/src/modules/transport/ibgda/ibgda.cpp:3005: non-zero status: 7 ibgda_rc_init2rtr failed "
           "on RC #0.\n"
           "/root/nvshmem_src/src/host/transport/transport.cpp:400: non-zero status: 7 connect EPS failed\n"
           "/root/nvshmem_src/src/host/init/init.cu:1001: non-zero status: 7\n\nnvshmem setup connections failed\n")
    assert classify(log).failure_class == "nccl_network_error"


def test_nvshmems_transport_warning_alone_is_no_network_error():  # a guard of the rule above
    log = ("/DeepEP/nvshmem_src/src/host/transport/transport.cpp:nvshmemi_transport_init:282: init failed for "
           "transport: IBGDA\n"
           "WARN: Failed to initialize all selected devices. Perf may be limited.\n")
    assert classify(log).failure_class != "nccl_network_error"


def test_a_kernel_assert_whose_message_runs_onto_the_next_line_is_a_device_side_assert():
    # ATen's IndexKernel under SGLang's draft graph capture (Tencent/AngelSlim#16, as posted)
    log = ("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [0,0,0], thread: [127,0,0] "
           "Assertion '-sizes[i] < index && index < sizes [1] &&\n"
           "\"index out of bounds\"' failed.\n"
           "Capturing batches (bs=1 avail_mem=7.44 GB): 0% | | 0/2 [00:00<?, ?it/s]\n")
    assert classify(log).failure_class == "device_side_assert"


def test_a_kernels_block_and_thread_without_an_assertion_are_not():  # a guard of the rule above
    log = ("kernel.cu:40: debug_dump: block: [0,0,0], thread: [3,0,0] value=7\n"
           "RuntimeError: something else went wrong\n")
    assert classify(log).failure_class != "device_side_assert"


def test_a_kernel_not_implemented_for_a_gpu_generation_is_an_arch_verdict():
    # vLLM 0.10 on an RTX 5090 (vllm-project/vllm#16515, as posted)
    log = ("  File \"/usr/local/lib/python3.12/dist-packages/vllm/_custom_ops.py\", line 727, in cutlass_scaled_mm\n"
           "    torch.ops._C.cutlass_scaled_mm(out, a, b, scale_a, scale_b, bias)\n"
           "RuntimeError: Currently, block scaled fp8 gemm is not implemented for Blackwell\n")
    assert classify(log).failure_class == "unsupported_arch_kernel"


def test_a_generation_named_beside_a_fallback_is_not():  # a guard of the rule above
    log = ("INFO 08-06 00:24:01 [cuda.py:290] Using FlashAttention backend.\n"
           "WARNING 08-06 00:24:02 [fp8.py:88] CUTLASS block fp8 is not supported on Blackwell, falling back to Triton\n"
           "INFO 08-06 00:25:10 [api_server.py:1800] Starting vLLM API server on http://0.0.0.0:8000\n"
           "INFO:     Application startup complete.\n")
    assert classify(log).failure_class == "healthy"


def test_a_gguf_with_tensors_its_engine_does_not_know_is_a_model_load_error():
    # ollama's llama.cpp runner (ollama/ollama#6998, as posted)
    log = ("llm_load_tensors: ggml ctx size =    0.13 MiB\n"
           "llama_model_load: error loading model: done_getting_tensors: wrong number of tensors; expected 255, got 254\n"
           "llama_load_model_from_file: exception loading model\n"
           "terminate called after throwing an instance of 'std::runtime_error'\n")
    assert classify(log).failure_class == "model_load_error"


def test_a_gguf_loader_out_of_buffer_memory_is_not_a_model_load_error():  # a guard of the rule above
    log = "llama_model_load: error loading model: unable to allocate CUDA0 buffer\n"
    assert classify(log).failure_class != "model_load_error"


_TRTLLM_BENCH = ("Total Token Throughput (tokens/sec):              {tps}\n"
                 "Total Latency (ms):                               120736.4401\n"
                 "Average request latency (ms):                     53522.9014\n")


def test_trtllm_benchs_report_is_healthy():
    # trtllm-bench's report (NVIDIA/TensorRT-LLM#6294, as posted)
    assert classify(_TRTLLM_BENCH.format(tps="38762.1169")).failure_class == "healthy"


def test_trtllm_benchs_report_of_nothing_is_not():  # a guard of the rule above
    assert classify(_TRTLLM_BENCH.format(tps="0.0000")).failure_class != "healthy"


# ------------------------------------------------------------------ test14 read
_LLAMA_TIMINGS = ("slot update_slots: id  0 | task 0 | prompt done, n_past = 51, n_tokens = 51\n"
                  "slot      release: id  0 | task 0 | stop processing: n_past = 325, truncated = 0\n"
                  "prompt eval time =     915.13 ms /    {n} tokens (   17.94 ms per token,    55.73 tokens per second)\n"
                  "       eval time =   23038.87 ms /   {n} tokens (   83.78 ms per token,    11.94 tokens per second)\n")


def test_llama_cpps_request_timings_are_work_done():
    # llama-server (ggml-org/llama.cpp#9013, as posted)
    assert classify(_LLAMA_TIMINGS.format(n="51")).failure_class == "healthy"


def test_llama_cpps_timings_of_no_token_are_not():  # a guard of the rule above
    assert classify(_LLAMA_TIMINGS.format(n="0")).failure_class != "healthy"


_OLD_NCCL_ROWS = ("[1,0]<stdout>:           8             2   float     sum    93.26    0.00    0.00  {e}"
                  "    51.12    0.00    0.00  2e-07\n"
                  "[1,0]<stdout>:          16             4   float     sum    53.46    0.00    0.00  {e}"
                  "    44.64    0.00    0.00  1e-07\n")


def test_old_nccl_tests_rows_with_a_tiny_max_error_under_mpirun_are_work_done():
    # nccl-tests of NCCL 2.x printing the max error (NVIDIA/nccl#513, as posted)
    assert classify(_OLD_NCCL_ROWS.format(e="2e-07")).failure_class == "healthy"


def test_old_nccl_tests_rows_with_a_large_error_are_not():  # a guard of the rule above
    assert classify(_OLD_NCCL_ROWS.format(e="3e+01")).failure_class != "healthy"


def test_nccls_proxy_connect_as_the_last_error_of_an_internal_error_is_a_network_error():
    # vLLM's Ray workers across two nodes (vllm-project/vllm#798, as posted)
    tag = "(LLMEngine pid=2347640, ip=10.58.226.15) "
    log = "".join(tag + x + "\n" for x in ("ncclInternalError: Internal check failed.", "Last error:",
                                           "Proxy Call to rank 7 failed (Connect)"))
    assert classify(log).failure_class == "nccl_network_error"


def test_a_proxy_connect_beside_a_crash_of_its_own_is_not():  # a guard of the rule above
    log = ("RuntimeError: CUDA error: an illegal memory access was encountered\n"
           "ncclInternalError: Internal check failed.\nLast error:\nProxy Call to rank 7 failed (Connect)\n")
    assert classify(log).failure_class != "nccl_network_error"


def test_a_clicks_unknown_option_is_a_cli_error():
    # trtllm-serve's click CLI (NVIDIA/TensorRT-LLM#3583, as posted)
    log = ("Usage: trtllm-serve [OPTIONS] MODEL\nTry 'trtllm-serve --help' for help.\n\n"
           "Error: No such option: --ep (Possible options: --help, --pp, --tp)\n")
    assert classify(log, 2).failure_class == "cli_arg_error"


def test_an_error_naming_an_option_mid_sentence_is_not_a_cli_error():  # a guard of the rule above
    log = "RuntimeError: Error: Invalid value for the KV cache size computed at startup\n"
    assert classify(log).failure_class != "cli_arg_error"


def test_a_kernel_refusing_below_an_arch_bound_is_an_arch_verdict():
    # Triton under vLLM with an fp8 KV cache (vllm-project/vllm#7714, as posted)
    log = ("  File \"/usr/local/lib/python3.10/dist-packages/triton/language/semantic.py\", line 1241, in cast\n"
           "    assert builder.options.allow_fp8e4nv, \"fp8e4nv data type is not supported on CUDA arch < 89\"\n"
           "AssertionError: fp8e4nv data type is not supported on CUDA arch < 89\n")
    assert classify(log).failure_class == "unsupported_arch_kernel"


# ------------------------------------------------------------------ test15 read
def test_a_tp_size_that_splits_a_quantized_weight_below_the_kernels_tile_is_the_config():
    # vLLM's Marlin check (vllm-project/vllm#10913, as posted)
    log = ("ERROR 12-04 19:54:40 engine.py:366] Weight input_size_per_partition = 448 is not divisible by min_thread_k "
           "= 128. Consider reducing tensor_parallel_size or running with --quantization gptq.\n")
    assert classify(log).failure_class == "server_args_incompatible"


_V0_PROFILE = ("INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch "
               "activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is {kv}GiB.\n"
               "INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: {blocks}, # CPU blocks: 4681\n"
               "INFO 02-26 09:54:05 executor_base.py:116] Maximum concurrency for 4096 tokens per request: {conc}x\n")


def test_vllm_v0s_profile_leaving_no_kv_block_is_the_kv_budget():
    # vLLM 0.7 on an 8 GiB GPU (vllm-project/vllm#13882, as posted)
    assert classify(_V0_PROFILE.format(kv="-1.05", blocks="0", conc="0.00")).failure_class == "kv_cache_pool_too_small"


def test_vllm_v0s_profile_with_kv_blocks_is_not():  # a guard of the rule above
    got = classify(_V0_PROFILE.format(kv="1.05", blocks="2150", conc="8.40")).failure_class
    assert got != "kv_cache_pool_too_small"


def test_tgis_missing_weight_is_a_weights_error():
    # TGI's weight loader (huggingface/text-generation-inference#2270, as posted)
    log = ("  File \"/opt/conda/lib/python3.10/site-packages/text_generation_server/utils/weights.py\", line 206, in "
           "get_filename\n    raise RuntimeError(f\"weight {tensor_name} does not exist\")\n"
           "RuntimeError: weight lm_head.weight does not exist\n")
    assert classify(log).failure_class == "model_weights_error"


# ------------------------------------------------------------------ test16 read
def test_torchs_rendezvous_port_taken_is_not_the_servers_port():
    # TGI's shards' torch.distributed store on 29500, its frames cut (huggingface/text-generation-inference#1156)
    log = ("RuntimeError: The server socket has failed to listen on any local network address. The server socket has "
           "failed to bind to [::]:29500 (errno: 98 - Address already in use).\n rank=0\n"
           "2023-10-16T06:54:28.059380Z ERROR text_generation_launcher: Shard 0 failed to start\n"
           "Error: ShardCannotStart\n")
    c = classify(log, 1)
    assert c.failure_class != "port_in_use" and c.kind != "infra", c


def test_the_api_servers_own_port_taken_is_still_port_in_use():  # a guard of the rule above
    log = ("INFO:     Started server process [812]\nINFO:     Waiting for application startup.\n"
           "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use\n")
    assert classify(log, 1).failure_class == "port_in_use"


def test_claps_invalid_value_is_a_cli_error():
    # TGI's Rust launcher (huggingface/text-generation-inference#1451, as posted)
    log = ("error: invalid value 'True' for '--disable-custom-kernels'\n  [possible values: true, false]\n\n"
           "For more information, try '--help'.\n")
    assert classify(log, 2).failure_class == "cli_arg_error"


def test_an_error_quoting_a_value_mid_line_is_not_a_cli_error():  # a guard of the rule above
    log = "RuntimeError: engine error: invalid value 'nan' for 'logits' in the sampler\n"
    assert classify(log).failure_class != "cli_arg_error"


_EVALSCOPE = ("Benchmarking summary:\n+-----------------------------------+-----------+\n"
              "| Succeed requests                  |  {ok}      |\n+-----------------------------------+-----------+\n"
              "| Failed requests                   |    {failed}      |\n"
              "+-----------------------------------+-----------+\n"
              "| Output token throughput (tok/s)   |  589.434  |\n")


def test_a_benchmark_tables_succeeded_requests_are_work_done():
    # evalscope's perf summary against vLLM on ROCm (vllm-project/vllm#27776, as posted)
    assert classify(_EVALSCOPE.format(ok="100", failed="0")).failure_class == "healthy"


def test_a_benchmark_table_of_no_success_is_not():  # a guard of the rule above
    assert classify(_EVALSCOPE.format(ok="0", failed="100")).failure_class != "healthy"


# ------------------------------------------------------------------ test17 read
_RAY_FATAL = ("[2026-05-06 23:35:23,306 {lvl} 129 129] (raylet) {where}:\n"
              "  An unexpected system state has occurred. You have likely discovered a bug in Ray.\n"
              "  Check failed: {check}\n")


def test_the_raylets_fatal_check_is_its_node_lost():
    # a raylet's fatal check in Ray's C++ log (the format of ray-project/ray#63229, a node manager's check)
    c = classify(_RAY_FATAL.format(lvl="C", where="node_manager.cc:1851", check="entry"))
    assert (c.failure_class, c.kind) == ("node_lost", "infra")
    assert "(raylet)" in c.line


def test_the_raylets_compiled_graph_channel_check_is_not_the_node():  # a guard of the rule above
    # vLLM pipeline-parallel on Ray compiled graphs (ray-project/ray#63229, as posted): a Ray
    # software path that multi-node PP trips on every node, no evidence about one
    check = ("object_manager_->WriteAcquire(info.local_object_id, total_data_size, nullptr,\n"
             "    Status not OK: ChannelError: Channel closed.")
    log = _RAY_FATAL.format(lvl="C", where="experimental_mutable_object_provider.cc:154", check=check)
    assert classify(log).failure_class != "node_lost"
    info = "[2026-05-06 23:35:23,306 I 129 129] (raylet) node_manager.cc:154: Raylet of id 12 started.\n"
    assert classify(info).failure_class != "node_lost"


def test_rays_agent_finding_its_raylet_gone_is_node_lost():
    # Ray's dashboard agent (ray-project/ray#45041, as posted)
    log = ("2024-05-03 18:48:26,722\tERROR process_watcher.py:116 -- Raylet is terminated. Termination is unexpected. "
           "Possible reasons include: (1) SIGKILL by the user or system OOM killer, (2) Invalid memory access from "
           "Raylet causing SIGSEGV or SIGBUS, (3) Other termination signals. Last 20 lines of the Raylet logs:\n")
    assert classify(log).failure_class == "node_lost"


_UP_THEN_CHECK = ("(APIServer pid=1) INFO:     Application startup complete.\n"
                  "(EngineCore pid=107) INFO 04-03 12:10:43 [ray_executor.py:634] Using Ray's NCCL communicator.\n"
                  "[2026-04-03 12:10:44,576 C 107 107] experimental_mutable_object_manager.cc:177:  An unexpected "
                  "system state has occurred. You have likely discovered a bug in Ray. Please report this issue at "
                  "https://github.com/ray-project/ray/issues. Check failed: RAY_PREDICT_TRUE(_left_ != _right_)  0 vs 0\n")


def test_a_fatal_check_in_a_server_that_was_up_is_a_crash():
    # vLLM's engine core on Ray compiled graphs, at the first request (ray-project/ray#62328, as posted)
    assert classify(_UP_THEN_CHECK).failure_class == "server_crash"


def test_a_fatal_check_before_the_server_was_up_is_not_a_crash_after_serving():  # a guard of the rule above
    log = _UP_THEN_CHECK.split("\n", 1)[1]
    assert classify(log).failure_class != "server_crash"


def test_llama_cpps_http_socket_that_would_not_bind_is_its_port():
    # llama-server under a one-click launcher (an uncited llama.cpp launcher thread, as posted)
    log = ("build: 3923 (becfd387) with MSVC 19.29.30154.0 for x64\n"
           "main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("port_in_use", "infra")


def test_nccls_socket_that_would_not_bind_is_not_the_port():  # a guard of the rule above
    log = "node1:12:12 [0] NCCL WARN couldn't bind HTTP server socket for RAS on port 28028\n"
    assert classify(log).failure_class != "port_in_use"


_GO_KILLED = ("time=2024-10-18T11:09:09.594-06:00 level=INFO source=server.go:108 msg=\"system memory\" "
              "total=\"16.0 GiB\" free=\"9.4 GiB\" free_swap=\"0 B\"\n"
              "{served}Error: llama runner process has terminated: signal: killed\n")


def test_a_go_supervisors_runner_killed_while_loading_is_the_host_oom_killer():
    # ollama loading a 43 GiB model on a 16 GB machine (ollama/ollama#7255, as posted)
    c = classify(_GO_KILLED.format(served=""))
    assert (c.failure_class, c.kind) == ("host_oom_killed", "infra")


def test_a_runner_killed_after_it_served_is_not_blamed_on_loading():  # a guard of the rule above
    served = "main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
    assert classify(_GO_KILLED.format(served=served)).failure_class != "host_oom_killed"


_PIECEWISE = ("[2026-06-10 13:08:34 TP7] Piecewise CUDA Graph failed with error: {err}\n"
              "Piecewise CUDA Graph is enabled by default as an experimental feature.\n"
              "To work around this error, add --disable-piecewise-cuda-graph to your launch command.\n")


def test_sglangs_piecewise_graph_failure_is_a_capture_failure():
    # SGLang on MI350 after a refactor (sgl-project/sglang#27811, as posted)
    err = "'TcPiecewiseForwardContext' object has no attribute 'num_tokens'"
    assert classify(_PIECEWISE.format(err=err)).failure_class == "cuda_graph_capture_failed_other"


def test_a_cuda_fault_the_piecewise_runner_quotes_keeps_its_class():  # a guard of the rule above
    err = "CUDA error: an illegal memory access was encountered"
    assert classify(_PIECEWISE.format(err=err)).failure_class == "cuda_illegal_memory_access"


def test_dynamos_refusal_to_trace_is_the_compile_flag_against_the_model():
    # SGLang's piecewise CUDA graphs on Qwen3.5 (sgl-project/sglang#19573, as posted)
    log = ("[2026-02-28 15:04:30 TP0] Scheduler hit an exception: torch._dynamo.exc.Unsupported: Logger not "
           "supported for non-export cases. To avoid graph breaks caused by logger in compile-mode, it is "
           "recommended to disable logging by adding logging methods to config.ignore_logger_methods\n")
    assert classify(log).failure_class == "server_args_incompatible"


def test_dynamos_internal_error_wrapping_a_capture_error_is_not():  # a guard of the rule above
    log = ("torch._dynamo.exc.InternalTorchDynamoError: RuntimeError: Cannot call CUDAGeneratorImpl::current_seed "
           "during CUDA graph capture. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive\n")
    assert classify(log).failure_class != "server_args_incompatible"


_TRT_FOLDED = ("E1103 02:59:01.152656 81041 backend_model.cc:553] ERROR: Failed to create instance: unexpected error "
               "when creating modelInstanceState: [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, "
               "n, mCudaSt\n"
               "ream->get()): {err} (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)\n")


def test_tensorrt_llms_allocation_error_wrapped_mid_call_is_an_oom():
    # Triton's TensorRT-LLM backend at startup (triton-inference-server/tensorrtllm_backend#260, as posted)
    assert classify(_TRT_FOLDED.format(err="out of memory")).failure_class == "cuda_oom_runtime"


def test_the_same_call_failing_otherwise_is_not_an_oom():  # a guard of the rule above
    assert classify(_TRT_FOLDED.format(err="invalid argument")).failure_class != "cuda_oom_runtime"


_LLAMA_SERVER = ("main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
                 "srv  update_slots: all slots are idle\n"
                 "srv  log_server_r: request: GET /props 127.0.0.1 200\n"
                 "slot launch_slot_: id  0 | task 0 | processing task\n"
                 "slot update_slots: id  0 | task 0 | kv cache rm [0, end)\n{tail}")


def test_llama_cpps_server_listening_and_taking_a_task_is_healthy():
    # llama-server (ggml-org/llama.cpp#14201, as posted)
    assert classify(_LLAMA_SERVER.format(tail="")).failure_class == "healthy"


def test_llama_cpps_server_that_then_aborts_is_not():  # a guard of the rule above
    tail = "/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:75: CUDA error\nCUDA error: an illegal memory access was encountered\n"
    assert classify(_LLAMA_SERVER.format(tail=tail)).failure_class == "cuda_illegal_memory_access"


_CLIENT_REPORT = ("[2026-01-05|15:58:35] INFO     TTFT: 117.59 ms (p50:  95.63 ms, p90: 207.66 ms)\n"
                  "[2026-01-05|15:58:35] INFO     Duration: 146.56 s\n"
                  "[2026-01-05|15:58:35] INFO     Throughput:   {tps} token/s, 6.8232 req/s\n")


def test_a_clients_throughput_in_tokens_per_second_is_work_done():
    # mini-sglang's benchmark against SGLang's launch_server (sgl-project/mini-sglang#59, as posted)
    assert classify(_CLIENT_REPORT.format(tps="2409")).failure_class == "healthy"


def test_a_throughput_of_zero_is_not():  # a guard of the rule above
    assert classify(_CLIENT_REPORT.format(tps="0")).failure_class != "healthy"


# ------------------------------------------------------------------ test18 read
def test_llama_cpps_argument_parser_refusals_are_cli_errors():
    # llamafile (mozilla-ai/llamafile#936) and llama-server under llama-swap (mostlygeek/llama-swap#283), as posted
    assert classify("$ ./llamafile-0.10.0 -m models/Qwen3.5-2B-Q8_0.gguf --tools read_file\n"
                    "error: invalid argument: --tools\n").failure_class == "cli_arg_error"
    log = ("llama-swap-1  | load_backend: loaded CUDA backend from /app/libggml-cuda.so\n"
           "llama-swap-1  | error while handling argument \"--flash-attn\": error: unkown value for --flash-attn: "
           "'--ctx-size'\n")
    assert classify(log, 1).failure_class == "cli_arg_error"


def test_a_runtime_invalid_argument_is_not_a_cli_error():  # a guard of the rule above
    log = "ggml_cuda_compute_forward: MUL_MAT failed\nCUDA error: invalid argument\n  current device: 0\n"
    assert classify(log).failure_class != "cli_arg_error"


def test_an_ascend_cores_invalid_mpu_address_is_an_illegal_memory_access():
    # SGLang on Ascend (sgl-project/sglang#12464, as posted)
    log = ("EZ9999: [PID: 696742] 2025-10-31-21:35:03.992.057 The error from device(chipId:7, dieId:0), there is an "
           "exception of aivec error, core id is 9, error code = 0\n"
           "       The extend info: errcode:(0, 0x200000000000000, 0) errorStr: The MPU address access is invalid. "
           "fixp_error0 info: 0xa0bfbd5[FUNC:ProcessStarsCoreErrorInfo][FILE:device_error_core_proc.cc][LINE:322]\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("cuda_illegal_memory_access", "transient")


def test_an_mpu_mentioned_in_passing_is_not_one():  # a guard of the rule above
    log = "WARNING: MPU address map refreshed; the MPU address access is checked at start\n"
    assert classify(log).failure_class != "cuda_illegal_memory_access"


# ------------------------------------------------------------------ test19 read
_ERROR_TB = ("[2026-02-26 15:56:59] ERROR: Traceback (most recent call last):\n"
             "[2026-02-26 15:56:59] ERROR:   File \"/usr/local/lib/python3.12/dist-packages/transformers/models/auto/"
             "configuration_auto.py\", line 1048, in __getitem__\n"
             "[2026-02-26 15:56:59] ERROR:     raise KeyError(key)\n"
             "[2026-02-26 15:56:59] ERROR: {exc}\n")


def test_an_exception_after_a_level_colon_keeps_its_name():
    # SGLang's launcher logging a transformers traceback, each line "ERROR: ..." (sgl-project/sglang#19408, as posted)
    assert classify(_ERROR_TB.format(exc="KeyError: 'glm_moe_dsa'")).failure_class == "model_load_error"


def test_a_logger_name_after_the_level_is_still_stripped():  # a guard of the rule above
    log = ("INFO:     Started server process [1]\nINFO:     Application startup complete.\n"
           "INFO:     uvicorn.access: 127.0.0.1:5000 - \"POST /v1/completions HTTP/1.1\" 200 OK\n")
    assert classify(log).failure_class == "healthy"


def test_a_gguf_tensor_past_the_end_of_its_file_is_the_weights():
    # llama-cli on a truncated GGUF download (ollama/ollama#6228, as posted)
    log = ("llama_model_load: error loading model: tensor 'blk.2.ffn_down.weight' data is not within the file bounds, "
           "model is corrupted or incomplete\nllama_load_model_from_file: failed to load model\n"
           "main: error: unable to load model\n")
    assert classify(log).failure_class == "model_weights_error"


def test_a_gguf_of_an_unknown_architecture_is_still_the_model():  # a guard of the rule above
    log = ("llama_model_load: error loading model: error loading model architecture: unknown model architecture: "
           "'gemma3'\nllama_load_model_from_file: failed to load model\n")
    assert classify(log).failure_class == "model_load_error"


_POLLS = ("2025-03-19 17:03:53,347 - __main__ - INFO - [2025-03-19 17:03:53 TP0] max_total_num_tokens=378594, "
          "context_len=32768\n"
          "INFO:httpx:HTTP Request: GET http://localhost:30024/v1/models \"HTTP/1.1 {status}\"\n"
          "2025-03-19 17:03:53,825 - __main__ - INFO - Attempt 23: Unexpected status code 502\n")


def test_a_clients_readiness_polls_answered_502_are_a_failed_health_check():
    # olmocr waiting on its SGLang server (allenai/olmocr#130, as posted)
    assert classify(_POLLS.format(status="502 Bad Gateway")).failure_class == "health_check_failed"


def test_polls_answered_200_are_not():  # a guard of the rule above
    assert classify(_POLLS.format(status="200 OK")).failure_class != "health_check_failed"


def test_a_launcher_that_gave_up_waiting_is_a_startup_timeout():
    # olmocr's pipeline (allenai/olmocr#82, as posted)
    log = ("  File \"/root/olmocr/olmocr/pipeline.py\", line 649, in sglang_server_ready\n"
           "    raise Exception(\"sglang server did not become ready after waiting.\")\n"
           "Exception: sglang server did not become ready after waiting.\n")
    assert classify(log).failure_class == "startup_timeout"


def test_a_launcher_that_retries_after_waiting_is_not():  # a guard of the rule above
    log = "WARNING: server did not become ready after waiting, retrying in 5 s\nINFO: attempt 2\n"
    assert classify(log).failure_class != "startup_timeout"


_OLD_BENCH = ("Total time: 166.88 s\nThroughput: {rps} requests/s\nAverage latency: 67.59 s\n"
              "Average latency per output token: 1.10 s\n")


def test_an_early_vllm_benchmarks_requests_per_second_is_work_done():
    # vLLM's benchmark_serving.py of 2023 (vllm-project/vllm#359, as posted)
    assert classify(_OLD_BENCH.format(rps="5.99")).failure_class == "healthy"


def test_zero_requests_per_second_is_not():  # a guard of the rule above
    assert classify(_OLD_BENCH.format(rps="0.00")).failure_class != "healthy"


# ------------------------------------------------------------------ test20 read
def test_torchs_store_refusing_its_port_over_several_lines_is_not_our_port():
    # SGLang's DP schedulers' TCPStore binds (sgl-project/sglang#37215, as posted)
    log = ("torch.distributed.DistNetworkError:\nThe server socket has failed to listen on any local network address.\n"
           "code: -98,\nname: EADDRINUSE,\nmessage: address already in use\n")
    c = classify(log)
    assert c.failure_class != "port_in_use" and c.kind != "infra"


def test_the_http_servers_own_eaddrinuse_is_still_our_port():  # a guard of the rule above
    log = ("INFO:     Started server process [1]\n"
           "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use\n")
    assert classify(log).failure_class == "port_in_use"


_COLOURED = ("[0;36m(EngineCore_DP0 pid=224)[0;0m ERROR 03-03 10:59:11 [core.py:938]   File \"/vllm-workspace/vllm/vllm/"
             "distributed/device_communicators/shm_broadcast.py\", line 536, in acquire_read\n"
             "[0;36m(EngineCore_DP0 pid=224)[0;0m ERROR 03-03 10:59:11 [core.py:938]     raise TimeoutError\n"
             "[0;36m(EngineCore_DP0 pid=224)[0;0m ERROR 03-03 10:59:11 [core.py:938] TimeoutError\n")


def test_colour_codes_that_lost_their_escape_byte_are_still_a_prefix():
    # vLLM's coloured process prefix as pasted into vllm-project/vllm-ascend#7015
    assert classify(_COLOURED).failure_class == "engine_hang_detected"


def test_a_bracketed_count_is_not_taken_for_a_colour_code():  # a guard of the rule above
    from tasks.failure_events import strip_prefixes
    assert strip_prefixes("evicted [5m] of cache, [10;2] kept")[0] == "evicted [5m] of cache, [10;2] kept"


_FAKE = ("[rank0]: Exception: Capture cuda graph failed: Failed running call_function <built-in function linear>"
         "(*(FakeTensor(..., device='cuda:0', size=(1, 3584), dtype=torch.bfloat16), {w}), **{{}}):\n"
         "[rank0]: 'FakeTensor' object has no attribute 'layout_type'\n")


def test_dynamo_failing_an_op_on_fake_tensors_is_the_compile_flag():
    # SGLang's --enable-torch-compile with torchao's int8 weights (sgl-project/sglang#2219, as posted)
    log = _FAKE.format(w="AffineQuantizedTensor(layout_tensor=FakeTensor(..., device='cuda:0', size=(576, 32, 32, 4)))")
    assert classify(log).failure_class == "server_args_incompatible"


def test_a_capture_failure_without_dynamos_words_stays_a_capture_failure():  # a guard of the rule above
    log = "[rank0]: Exception: Capture cuda graph failed: CUDA error: operation not permitted when stream is capturing\n"
    assert classify(log).failure_class != "server_args_incompatible"


def test_llama_cpp_out_of_kv_slots_at_one_token_is_the_kv_cache():
    # llama.cpp's server with a full context (ggml-org/llama.cpp#4185, as posted)
    log = "".join(f"update_slots : failed to find free space in the KV cache, retrying with smaller n_batch = {n}\n"
                  for n in (4, 2, 1)) + "update_slots : failed to decode the batch, n_batch = 1, ret = 1\n"
    assert classify(log).failure_class == "kv_cache_pool_too_small"


def test_llama_cpp_retrying_with_a_smaller_batch_is_no_verdict():  # a guard of the rule above
    log = ("main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
           "update_slots : failed to find free space in the KV cache, retrying with smaller n_batch = 256\n"
           "slot 0 : released (105 tokens in cache)\n")
    assert classify(log).failure_class != "kv_cache_pool_too_small"


def test_a_wrappers_unknown_model_architecture_is_the_model():
    # LM Studio's load error (lmstudio-ai/model-catalog#55, as posted)
    log = ('{\n  "cause": "unknown model architecture: \'phi2\'",\n  "title": "Failed to load model",\n'
           '  "errorData": {\n    "n_ctx": 32768\n  }\n}\n')
    assert classify(log).failure_class == "model_load_error"


def test_a_split_gguf_loaded_from_its_second_part_is_the_weights():
    # WasmEdge's llama.cpp backend (moly-ai/moly-ai#159, as posted)
    log = ("[error] [WASI-NN] llama.cpp: llama_model_load: error loading model: illegal split file: 2, model must be "
           "loaded with the first split\n[error] [WASI-NN] llama.cpp: llama_load_model_from_file: failed to load model\n")
    assert classify(log).failure_class == "model_weights_error"


def test_ollama_timing_out_on_its_runner_is_a_startup_timeout():
    # ollama/ollama#8690, as posted
    log = ('ollama[3237]: time=2025-01-30T12:01:19.487Z level=ERROR source=sched.go:455 msg="error loading llama server" '
           'error="timed out waiting for llama runner to start - progress 0.00 - "\n'
           'ollama[3237]: time=2025-01-30T12:01:26.104Z level=WARN source=sched.go:646 msg="gpu VRAM usage didn\'t '
           'recover within timeout" seconds=6.6\n')
    assert classify(log).failure_class == "startup_timeout"


def test_a_throughput_with_a_parenthetical_is_work_done():
    # LMDeploy's profile_throughput (InternLM/lmdeploy#946, as posted)
    log = ("concurrency: 256\nelapsed_time: 295.300s\n"
           "token throughput (completion token): 2353.993 token/s\n"
           "RPM (request per minute): 609.550 req/min\n")
    assert classify(log).failure_class == "healthy"


def test_a_zero_throughput_with_a_parenthetical_is_not():  # a guard of the rule above
    log = "concurrency: 256\ntoken throughput (completion token): 0.000 token/s\n"
    assert classify(log).failure_class != "healthy"


_KUBELET = ("  Warning  Unhealthy  41s (x3 over 61s)    kubelet            {kind} probe failed: {why}\n")
_RESTART = "  Normal   Killing    41s   kubelet   Container {name} failed liveness probe, will be restarted\n"
_REFUSED = 'Get "http://10.0.10.177:8000/v2/health/live": dial tcp 10.0.10.177:8000: connect: connection refused'


def test_a_server_restarted_for_its_liveness_probes_5xx_is_a_failed_health_check():
    log = _KUBELET.format(kind="Liveness", why="HTTP probe failed with statuscode: 503") + _RESTART.format(name="vllm")
    assert classify(log).failure_class == "health_check_failed"


def test_a_server_restarted_before_anything_listened_is_a_startup_timeout():
    # Triton under Kubernetes, the probe refused while the model loaded (triton-inference-server/server#7154, as posted)
    log = _KUBELET.format(kind="Liveness", why=_REFUSED) + _RESTART.format(name="triton-inference-server")
    assert classify(log).failure_class == "startup_timeout"


def test_a_readiness_probe_failing_while_it_starts_is_not():  # a guard of the rules above
    assert classify(_KUBELET.format(kind="Readiness", why=_REFUSED)).failure_class not in (
        "health_check_failed", "startup_timeout")


def test_a_sidecar_restarted_for_its_probe_is_not_the_server():  # a guard of the rules above
    log = _KUBELET.format(kind="Liveness", why="HTTP probe failed with statuscode: 503") + _RESTART.format(name="istio-proxy")
    assert classify(log).failure_class != "health_check_failed"


def test_a_bare_assertion_is_quoted_by_the_statement_that_raised_it():
    # the emulated node's FlashInfer all-to-all assertion (tasks/emulator/failure_logs.py a2a_failure)
    log = ("[2026-11-29 15:02:45 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
           '  File "<VENV>/sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py", line 686, in fused_experts\n'
           "    assert TopKOutputChecker.format_is_bypassed(topk_output)\nAssertionError\n")
    c = classify(log, -9, "startup")
    assert c.line == "    assert TopKOutputChecker.format_is_bypassed(topk_output)", c
    assert c.signature == "assert TopKOutputChecker.format_is_bypassed(topk_output)"


def test_two_bare_assertions_of_different_statements_get_two_signatures():  # a guard of the rule above
    tb = ("Traceback (most recent call last):\n  File \"/x/{m}.py\", line 1, in f\n    assert {cond}\nAssertionError\n")
    a, b = classify(tb.format(m="a", cond="x > 0")), classify(tb.format(m="b", cond="y is None"))
    assert a.failure_class == b.failure_class == "unknown" and a.signature != b.signature, (a, b)


def test_an_exception_with_a_message_keeps_its_own_line():  # a guard of the rule above
    log = ("Traceback (most recent call last):\n  File \"/x/a.py\", line 1, in f\n    raise ValueError(msg)\n"
           "ValueError: bad shape\n")
    assert classify(log).line == "ValueError: bad shape"


# ------------------------------------------------------------------ test21 read
def test_systemds_oom_notice_for_a_served_unit_is_the_host_oom_killer():
    # llama-server run as a systemd unit (ggml-org/llama.cpp#20509, as posted)
    log = ("srv   prompt_save:  - saving prompt with length 28960, total state size = 3462.850 MiB\n\n"
           "A process of this unit has been killed by the OOM killer.\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("host_oom_killed", "infra")


def test_a_unit_stopped_by_hand_is_not():  # a guard of the rule above
    log = "llama-server.service: Deactivated successfully.\nStopped llama-server.service - llama.cpp server.\n"
    assert classify(log).failure_class != "host_oom_killed"


def test_getopts_refusal_of_a_servers_option_is_the_command_line():
    # tritonserver under clearml-serving (allegroai/clearml-serving#88, as posted)
    log = ("clearml-serving - Nvidia Triton Engine Controller\n"
           "tritonserver: unrecognized option '--t_exit_on_error=True'\nUsage: tritonserver [options]\n  --help\n")
    assert classify(log).failure_class == "cli_arg_error"


def test_an_option_named_in_a_help_text_is_not():  # a guard of the rule above
    log = "Usage: tritonserver [options]\n  --exit-on-error <boolean>\n        Exit the inference server if an error occurs.\n"
    assert classify(log).failure_class != "cli_arg_error"


def test_experts_that_do_not_divide_over_the_ep_ranks_are_the_ep_config():
    # vLLM with EPLB on 3 data-parallel ranks (vllm-project/vllm#52435, as posted)
    log = ("(Worker_DP2_EP2 pid=1216) ERROR 08-15 08:18:38 multiproc_executor.py:912] AssertionError: "
           "n_physical_experts=256 must be divisible by ep_size=3. Adjust num_redundant_experts.\n")
    assert classify(log).failure_class == "moe_ep_a2a_config_error"


def test_c10ds_watchdog_hitting_a_capture_is_nccls_graph_capture_error():
    # vLLM on ROCm 7.0 (ROCm/hip#3876, as posted)
    log = ("[rank0]:[E1030 15:32:32.970893361 ProcessGroupNCCL.cpp:2055] [PG ID 5 PG GUID 51 Rank 0] Process group "
           "watchdog thread terminated with exception: HIP error: operation not permitted when stream is capturing\n")
    assert classify(log).failure_class == "nccl_graph_capture_error"


def test_a_kernel_refused_under_capture_away_from_nccl_stays_a_capture_failure():  # a guard of the rule above
    log = ("Capture cuda graph failed: CUDA error: operation not permitted when stream is capturing\n"
           "  File \"/x/sampler.py\", line 3, in forward\n")
    assert classify(log).failure_class == "cuda_graph_capture_failed_other"


_TRITON_TABLE = ("I0524 03:33:13.130393 2517 server.cc:677]\n"
                 "+--------------+---------+------------------------------+\n"
                 "| Model        | Version | Status                       |\n"
                 "+--------------+---------+------------------------------+\n"
                 "| tensorrt_llm | 1       | {status} |\n"
                 "+--------------+---------+------------------------------+\n")


def test_a_model_triton_marks_unavailable_failed_to_load():
    # NVIDIA/TensorRT-LLM#1659, as posted (one row)
    status = "UNAVAILABLE: Internal: unexpected error when creating modelInstanceState: key 'num_layers' not found"
    assert classify(_TRITON_TABLE.format(status=status)).failure_class == "model_load_error"


def test_a_model_triton_marks_ready_did_not():  # a guard of the rule above
    assert classify(_TRITON_TABLE.format(status="READY")).failure_class != "model_load_error"


def test_a_grpc_unavailable_outside_tritons_table_is_not_a_model_load():  # a guard of the rule above
    log = "UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:8001\n"
    assert classify(log).failure_class != "model_load_error"


def test_an_engine_built_without_in_flight_batchings_plugins_is_an_incompatible_setting():
    # triton-inference-server/tensorrtllm_backend#40, as posted
    log = ("E1025 09:17:53.664847 126 backend_model.cc:553] ERROR: Failed to create instance: unexpected error when "
           "creating modelInstanceState: TrtGptModelInflightBatching requires GPT attention plugin with packed input "
           "and paged KV cache.\n")
    assert classify(log).failure_class == "server_args_incompatible"


def test_a_slow_tokenizers_sentencepiece_load_failing_is_the_model():
    # TGI loading xgen with LlamaTokenizer (huggingface/text-generation-inference#538, as posted)
    log = ("Traceback (most recent call last):\n"
           "  File \"/opt/conda/lib/python3.9/site-packages/transformers/models/llama/tokenization_llama.py\", line 96, "
           "in __init__\n    self.sp_model.Load(vocab_file)\n"
           "  File \"/opt/conda/lib/python3.9/site-packages/sentencepiece/__init__.py\", line 310, in LoadFromFile\n"
           "    return _sentencepiece.SentencePieceProcessor_LoadFromFile(self, arg)\nTypeError: not a string\n")
    assert classify(log).failure_class == "model_load_error"


# ------------------------------------------------------------------ a degraded path in a log alone
_DEGRADED = ("[2026-12-05 17:42:40] server_args=ServerArgs(model_path='m', tp_size=8, disable_custom_all_reduce={off}, "
             "enable_torch_symm_mem=False)\n"
             "[2026-12-05 17:42:46 TP0] Custom allreduce is disabled because it's not supported on more than two "
             "PCIe-only GPUs.\n"
             "[2026-12-05 17:43:10] The server is fired up and ready to roll!\n")


def test_a_log_alone_that_asked_for_custom_allreduce_and_lost_it_is_a_perf_finding():
    # what the sweep calls the custom level's trial (the probe log of an emulated campaign)
    c = classify(_DEGRADED.format(off="False"))
    assert (c.failure_class, c.kind) == ("allreduce_path_degraded", "perf"), c


def test_a_log_alone_that_never_asked_for_it_stays_healthy():  # a guard of the rule above
    assert classify(_DEGRADED.format(off="True")).failure_class == "healthy"


def test_a_server_killed_while_starting_is_no_perf_finding():  # a guard of the rule above
    log = _DEGRADED.format(off="False").rsplit("[2026-12-05 17:43:10]", 1)[0]
    assert classify(log, None, "startup").failure_class == "startup_timeout"


# ------------------------------------------------------------------ stages a fresh user read
def test_vllms_nccl_version_line_is_before_the_communicators_init():
    log = ("(EngineCore_DP0 pid=7) INFO 01-01 00:00:01 [pynccl.py:70] vLLM is using nccl==2.21.5\n"
           "(EngineCore_DP0 pid=7) ERROR 01-01 00:00:02 [core.py:1] RuntimeError: NCCL error: unhandled system error "
           "(run with NCCL_DEBUG=INFO for details)\n")
    c = classify(log)
    assert (c.failure_class, c.phase) == ("nccl_init_system_error", "distributed init"), c


def test_sglangs_capture_failure_banner_is_in_graph_capture():
    log = "[rank0]: Exception: Capture cuda graph failed: CUDA error: an illegal memory access was encountered\n"
    assert classify(log).phase == "graph capture"


# ------------------------------------------------------------------ test22 read
def test_the_driver_apis_out_of_memory_code_is_an_oom():
    # torch_memory_saver under SGLang in verl (sgl-project/sglang#14092, as posted)
    log = ("(SGLangHttpServer pid=250977) [torch_memory_saver.cpp] CUresult error: 2 (out of memory)  file=csrc/utils.h "
           "func=cu_mem_create line=194\n"
           "(WorkerDict pid=209740) WARNING:2025-11-28 16:00:45,396:Async request to resume_memory_occupation timed out "
           "(attempt 1)\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("cuda_oom_runtime", "transient"), c


def test_another_curesult_code_is_not_an_oom():  # a guard of the rule above
    log = "[torch_memory_saver.cpp] CUresult error: 1 (invalid argument)  file=csrc/utils.h func=cu_mem_create line=194\n"
    assert classify(log).failure_class not in ("cuda_oom_runtime", "cuda_oom_graph_capture")


_BENCH_REPORT = ("python3 -m sglang.bench_serving --backend sglang --dataset-name sharegpt --num-prompts 3000\n"
                 "============ Serving Benchmark Result ============\n"
                 "Backend:                                 sglang    \n"
                 "Successful requests:                     {ok}      \n"
                 "Benchmark duration (s):                  170.41    \n"
                 "Output token throughput (tok/s):         1915.40   \n")


def test_a_report_short_of_the_prompts_asked_is_not_healthy():
    # sgl-project/sglang#2805 (1648 of 3000 succeeded, as posted, trimmed)
    c = classify(_BENCH_REPORT.format(ok=1648))
    assert c.failure_class == "unknown" and "1648" in c.line, c


def test_a_report_with_every_prompt_answered_stays_healthy():  # a guard of the rule above
    assert classify(_BENCH_REPORT.format(ok=3000)).failure_class == "healthy"


def test_tgis_automodel_fallback_refusing_to_shard_is_the_model():
    # huggingface/text-generation-inference#3272 (Falcon-H1), as posted
    log = ("2025-06-10T09:02:18.377370Z ERROR text_generation_launcher: Error when initializing model\n"
           "Traceback (most recent call last):\n"
           '  File "/usr/src/server/text_generation_server/models/__init__.py", line 1709, in get_model\n'
           '    raise NotImplementedError("sharded is not supported for AutoModel")\n'
           "NotImplementedError: sharded is not supported for AutoModel\n")
    assert classify(log).failure_class == "model_load_error"


def test_a_flag_not_supported_with_another_stays_an_incompatible_setting():  # a guard of the rule above
    log = "NotImplementedError: FP8 KV cache is not supported with chunked prefill\n"
    assert classify(log).failure_class == "server_args_incompatible"


def test_an_ascend_ops_tiling_check_refusing_the_shape_is_an_unsupported_kernel():
    # vllm-project/vllm-ascend#5310, as posted (the last lines)
    log = ("(EngineCore_DP0 pid=11521) RuntimeError: Worker failed with error 'npu_moe_gating_top_k:build/CMakeFiles/"
           "torch_npu.dir/compiler_depend.ts:48 NPU function error: call aclnnMoeGatingTopK failed, error code is 561002\n"
           "(EngineCore_DP0 pid=11521) EZ9999: Inner Error!\n"
           "(EngineCore_DP0 pid=11521) EZ9999: [PID: 11657] 2025-12-24-02:36:12.999.877 expert count is: 128, but "
           "currently only support 256.[FUNC:CheckInputShape][FILE:moe_gating_top_k_tiling.cpp][LINE:166]\n")
    c = classify(log)
    assert (c.failure_class, c.kind) == ("unsupported_arch_kernel", "deterministic"), c


def test_an_ascend_device_fault_stays_a_memory_fault():  # a guard of the rule above
    log = ("EZ9999: Inner Error!\nEZ9999: [PID: 1] The error from device(chipId:7, dieId:0), there is an exception of "
           "aivec error, core id is 9.[FUNC:ProcessStarsCoreErrorInfo][FILE:device_error_core_proc.cc][LINE:303]\n")
    assert classify(log).failure_class != "unsupported_arch_kernel"


def test_a_worker_that_died_after_vllms_shm_wait_notice_is_the_crash():
    # OpenPipe/ART#201, as posted
    log = ("DEBUG 07-04 17:35:10 [shm_broadcast.py:456] No available shared memory broadcast block found in 60 second.\n"
           "ERROR 07-04 17:35:16 [multiproc_executor.py:140] Worker proc VllmWorker-1 died unexpectedly, shutting down "
           "executor.\n"
           "DEBUG 07-04 17:36:10 [shm_broadcast.py:456] No available shared memory broadcast block found in 60 second.\n")
    assert classify(log).failure_class == "server_crash"


def test_the_shm_wait_notice_alone_is_still_the_engines_hang_detector():  # a guard of the rule above
    log = ("WARNING 07-04 17:35:10 [shm_broadcast.py:456] No available shared memory broadcast block found in 60 second.\n"
           "ERROR 07-04 17:36:16 [core.py:1] TimeoutError: RPC call to execute_model timed out.\n")
    assert classify(log).failure_class == "engine_hang_detected"


_RUN = ("python3 -m sglang.bench_serving --backend sglang --dataset-name {ds} --num-prompts {asked}\n"
        "============ Serving Benchmark Result ============\n"
        "Successful requests:                     {ok}      \n"
        "Failed requests:                         {failed}      \n"
        "Output token throughput (tok/s):         1915.40   \n")
_UP = "[2025-06-18 11:02:45] The server is fired up and ready to roll!\n"


def test_each_report_of_a_log_is_read_with_its_own_numbers():
    # report lines differ only in their digits: the second run's numbers are its own
    short = _UP + _RUN.format(ds="random", asked=5000, ok=5000, failed=0) + _RUN.format(ds="random", asked=5000, ok=4000,
                                                                                        failed=0)
    c = classify(short)
    assert c.failure_class == "unknown" and "4000" in c.line, c
    failed = _UP + _RUN.format(ds="random", asked=200, ok=200, failed=0) + _RUN.format(ds="random", asked=200, ok=197,
                                                                                       failed=3)
    c = classify(failed)
    assert c.failure_class == "unknown" and c.line.split()[-1] == "3", c


def test_runs_that_each_got_what_they_asked_for_stay_healthy():  # a guard of the rule above
    log = _UP + _RUN.format(ds="random", asked=1000, ok=1000, failed=0) + _RUN.format(ds="sharegpt", asked=5000, ok=5000,
                                                                                      failed=0)
    assert classify(log).failure_class == "healthy"
    # argparse keeps the last of a repeated flag
    assert classify(_UP + _RUN.format(ds="random --num-prompts 1000", asked=200, ok=200, failed=0)).failure_class == "healthy"
    # the generated-shared-prefix dataset ignores --num-prompts, its flags on continued lines
    gsp = _UP + ("python3 -m sglang.bench_serving --backend sglang \\\n  --dataset-name generated-shared-prefix \\\n"
                 "  --num-prompts 3000\n") + _RUN.format(ds="x", asked=0, ok=2048, failed=0).split("\n", 1)[1]
    assert classify(gsp).failure_class == "healthy"
    # a client's own retries that all succeeded are no failed requests
    assert classify(_UP + "retried failed requests: 2 (all succeeded)\n" +
                    _RUN.format(ds="random", asked=10, ok=10, failed=0)).failure_class == "healthy"


def test_a_short_report_in_the_middle_of_a_long_log_is_found():
    prompts = "".join(f"INFO 01-01 00:00:00 [logger.py:39] Received request cmpl-{i}: prompt: 'q{i} {i * 7}'\n"
                      for i in range(6000))
    log = _UP + prompts + _RUN.format(ds="random", asked=3000, ok=1648, failed=0) + prompts.replace("cmpl-", "cmpl-b")
    c = classify(log)
    assert c.failure_class == "unknown" and "1648" in c.line, c


# ------------------------------------------------------------------ test23 read
_HCCL = ("(EngineCore_DP0 pid=384) ERROR 10-10 17:15:01 [core.py:708] RuntimeError: Worker failed with error "
         "'create_config:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:148 HCCL function error: "
         "hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is {code}\n"
         "(EngineCore_DP0 pid=384) ERROR 10-10 17:15:01 [core.py:708] [ERROR] 2025-10-10-17:15:01 (PID:1195, Device:0, "
         "RankID:-1) ERR02200 DIST call hccl api failed.\n"
         "(EngineCore_DP0 pid=384) ERROR 10-10 17:15:01 [core.py:708] ', please check the stack trace above for the "
         "root cause\n"
         "(EngineCore_DP0 pid=384) ERROR 10-10 17:15:12 [multiproc_executor.py:154] Worker proc VllmWorker-4 died "
         "unexpectedly, shutting down\n")


def test_an_hccl_error_is_read_by_its_code_ahead_of_the_worker_death_after_it():
    # vllm-project/vllm-ascend#3367 as posted (code 1, a parameter: no class), and the same line with
    # the codes HCCL gives a network failure, a system call and a timeout (hccl HcclResult.md)
    c = classify(_HCCL.format(code=1))
    assert c.failure_class == "unknown" and "HCCL function error" in c.line, c
    assert classify(_HCCL.format(code=12)).failure_class == "nccl_network_error"
    assert classify(_HCCL.format(code=8)).failure_class == "nccl_init_system_error"
    assert classify(_HCCL.format(code=9)).failure_class == "collective_hang_or_timeout"


def test_a_worker_death_with_no_error_before_it_is_still_a_crash():  # a guard of the rule above
    log = _HCCL.split("\n")[-2] + "\n"
    assert classify(log).failure_class == "server_crash"


def test_a_readiness_poll_answered_with_no_json_is_a_failed_health_check():
    # xorbitsai/inference#2126 (SGLang's warm-up thread reading /get_model_info), as posted, trimmed
    log = ('  File "/x/lib/python3.11/site-packages/sglang/srt/server.py", line 410, in _wait_and_warmup\n'
           "    model_info = res.json()\n"
           "                 ^^^^^^^^^^\n"
           '  File "/x/lib/python3.11/site-packages/requests/models.py", line 978, in json\n'
           "    raise RequestsJSONDecodeError(e.msg, e.doc, e.pos)\n"
           "requests.exceptions.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n")
    c = classify("Traceback (most recent call last):\n" + log)
    assert (c.failure_class, c.kind) == ("health_check_failed", "transient"), c
    # the same decoder error anywhere else is not the server's readiness poll
    other = log.replace("in _wait_and_warmup", "in load_chat_template").replace("model_info = res.json()", "t = r.json()")
    assert classify("Traceback (most recent call last):\n" + other).failure_class != "health_check_failed"


# ------------------------------------------------------------------ test24 read
_SHM = ("(EngineCore pid=128) INFO 06-01 09:47:39 [shm_broadcast.py:698] No available shared memory broadcast block "
        "found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming "
        "work (e.g. compilation, weight/kv cache quantization).\n")


def test_a_hang_notice_the_startup_went_on_past_is_no_hang():
    # a vLLM engine waiting a minute on a worker that was compiling, then going on
    # (noonghunna/club-3090#294, trimmed): the notice is a wait that ended, no verdict
    went_on = _SHM + ("(Worker_TP0 pid=138) INFO 06-01 09:47:53 [monitor.py:81] Initial profiling/warmup run took 62.77 s\n"
                      "(Worker_TP0 pid=138) INFO 06-01 09:47:53 [backends.py:1148] Dynamo bytecode transform time: "
                      "0.11 s\n")
    c = classify(went_on)  # a log that stops in torch.compile: the harness's view, never the notice
    assert c.failure_class == "startup_timeout" and "shm_broadcast" not in c.line, c
    # the notice as the log's last word, or said again after the work went on, is the hang
    assert classify(_SHM * 3).failure_class == "engine_hang_detected"
    assert classify(went_on + _SHM.replace("09:47:39", "09:48:53")).failure_class == "engine_hang_detected"
    # a traceback's frames after the notice are no progress either
    died = _SHM + ("Traceback (most recent call last):\n"
                   '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 3300, in capture_model\n'
                   "    self._capture_cudagraphs(\n")
    assert classify(died).failure_class == "engine_hang_detected"


def test_a_ray_actor_prefix_with_nested_parentheses_is_stripped():
    # vllm-project/vllm#37250: vLLM inside Ray Data, its lines prefixed by the actor's nested name
    pre = ("2026-03-09 01:31:29.489217213 (MapWorker(MapBatches(vLLMEngineActor)) pid=1202, ip=10.53.120.118) "
           "(EngineCore_DP0 pid=32080) ERROR 03-08 17:31:28 [core.py:1102] ")
    log = "".join(pre + ln + "\n" for ln in (
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py", '
        'line 542, in acquire_read', "    raise TimeoutError", "TimeoutError"))
    c = classify(log)
    assert c.failure_class == "engine_hang_detected" and c.line.endswith("TimeoutError"), c


def test_a_system_error_after_an_ib_completion_error_is_the_network():
    # deepspeedai/DeepSpeed#2931, trimmed: the IB transport's failed completion, then NCCL's system
    # error up the proxy's stack and torch's abort
    ib = ("PHLRR4036:24141:24296 [2] ib_plugin.c:978 NCCL WARN NET/IB : Got completion from peer "
          "10.226.98.98<48598> with error 12, opcode 0, len 0, vendor err 129\n")
    tail = ("PHLRR4036:24141:24296 [2] NCCL INFO proxy.cc:520 -> 2\n"
            "terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  NCCL error: unhandled system error, NCCL version 2.14.3\n")
    assert classify(ib + tail).failure_class == "nccl_network_error"
    assert classify(tail).failure_class == "nccl_init_system_error"  # without it, the system error's class


def test_a_launchers_deadline_on_a_handler_process_is_a_startup_timeout():
    # cubist38/mlx-openai-server#293 (a 300 s readiness deadline, made configurable in its fix)
    line = ("2026-05-01 22:10:16 | ERROR    | app.server:lifespan:449 | Failed to initialize multi-handler setup: "
            "Handler process for 'mlx-community/MiMo-V2-Flash-4bit' did not become ready within 300 s\n")
    assert classify(line).failure_class == "startup_timeout"
    # a launcher's poll line and a stated setting name the nouns too, and say nothing failed
    poll = ("INFO 2026-05-01 22:05:40 launcher: model runner not ready after 30 s (elapsed 30/900 s)\n"
            "Segmentation fault (core dumped)\n")
    assert classify(poll, exit_code=139).failure_class != "startup_timeout"
    setting = "INFO | app.config:load:88 | a handler process that is not ready within 300 s is killed\n"
    assert classify(setting + "ValueError: Model type x not supported.\n", exit_code=1).failure_class != "startup_timeout"


def test_a_gpu_too_old_for_triton_is_an_arch_the_build_lacks():
    # torch/_inductor/scheduler.py (GPUTooOldForTriton), as a P40 user posted it
    log = ("RuntimeError: Found Tesla P40 which is too old to be supported by the triton GPU compiler, which is used "
           "as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of CUDA "
           "capability 6.1\n")
    assert (classify(log).failure_class, classify(log).kind) == ("arch_not_in_build", "deterministic")


def test_an_acl_graph_capture_call_that_fails_is_a_graph_capture_failure():
    # vllm-project/vllm-ascend#8393, its first line
    log = (" RuntimeError: Worker failed with error 'NPUModelRunner init failed, error is NPUModelRunner failed, "
           "error is capture_begin:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:214 NPU function error: "
           "c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), error code is 207005\n")
    assert classify(log).failure_class == "cuda_graph_capture_failed_other"
    # another ACL call's failure is not a capture's
    assert classify(log.replace("AclmdlRICaptureBegin", "AclrtMalloc")).failure_class != "cuda_graph_capture_failed_other"


def test_a_failed_ib_completion_yields_to_a_crash_before_it_not_to_one_after_it():
    # the order decides which is the cause: NVIDIA/nccl-tests#24 (error 12, then an illegal access
    # as fallout) and a survivor's error 12 after its peer's illegal access
    ib = ("gpu5:35917:35994 [0] transport/net_ib.cu:788 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4000> "
          "with error 12, opcode 1, len 0, vendor err 129\n")
    ima = "gpu5:35917:35917 [1] init.cu:194 NCCL WARN Cuda failure 'an illegal memory access was encountered'\n"
    assert classify(ib + ima).failure_class == "nccl_network_error"
    assert classify(ima + ib).failure_class == "cuda_illegal_memory_access"


def test_a_health_probe_answered_is_no_request_served_past_a_hang():
    # vLLM V1's API server answers /health while its engine core hangs (vllm#36451): a probe
    # between or after the hang notices is no sign the engine went on
    probe = '(APIServer pid=1) INFO:     10.0.0.3:5112 - "GET /health HTTP/1.1" 200 OK\n'
    compiling = "(EngineCore_DP0 pid=7) INFO 01-01 00:00:01 [backends.py:1] Compiling a graph for dynamic shape\n"
    assert classify(compiling + _SHM + probe + _SHM).failure_class == "engine_hang_detected"
    assert classify(compiling + _SHM + probe).failure_class == "engine_hang_detected"
    # a request served after the notice still is
    served = '(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    assert classify(compiling + _SHM + served).failure_class != "engine_hang_detected"


# ------------------------------------------------------------------ test25 read
def test_tgi_refusing_a_model_type_it_has_no_class_for_is_a_model_load_error():
    # huggingface/text-generation-inference#1807 (Phi-3 before TGI supported it), its last line
    tail = ("  File \"/opt/conda/lib/python3.10/site-packages/text_generation_server/models/__init__.py\", line 648, "
            "in get_model\n    raise ValueError(f\"Unsupported model type {model_type}\")\n\n"
            "ValueError: Unsupported model type phi3\n")
    assert (classify(tail).failure_class, classify(tail).kind) == ("model_load_error", "deterministic")
    # the wording used for something else than the model's type (a method of it) is not a load error
    other = "ValueError: Unsupported model type phi3 for speculative decoding with ngram\n"
    assert classify(other).failure_class != "model_load_error"


def test_rocm_memory_access_fault_is_an_illegal_memory_access():
    # vllm-project/vllm#43605 (MI355X, an AITER MoE kernel), the HSA runtime's line as posted
    log = ("[aiter] LoadKernel: _ZN5aiter43fmoe_bf16_blockscaleFp8_g1u1_vs_silu_32x384E hsaco: /usr/local/lib/"
           "python3.12/dist-packages/aiter_meta/hsa//gfx950/fmoe/silu/fmoe_bf16_blockscaleFp8_g1u1_vs_silu_32x384.co\n"
           "Memory access fault by GPU node-3 (Agent handle: 0x13e852f0) on address 0x77d445e00000. Reason: Unknown.\n"
           "(Worker_TP3_EP3 pid=891) [aiter] import [module_rmsnorm_quant] under /usr/local/lib/python3.12/"
           "dist-packages/aiter/jit/module_rmsnorm_quant.so\n")
    assert (classify(log).failure_class, classify(log).kind) == ("cuda_illegal_memory_access", "transient")


def test_ptxas_refusing_the_target_for_its_ptx_version_is_an_arch_the_build_lacks():
    # NixOS/nixpkgs#406675 (vLLM 0.9.1's Inductor-generated Triton kernel on an RTX 5090), as posted
    pre = "[rank0]:E0701 14:28:21.083000 911603 torch/_inductor/runtime/triton_heuristics.py:539] [0/0] "
    log = (pre + "ptxas /tmp/tmpmwke15zw.ptx, line 6; error   : PTX .version 8.4 does not support .target sm_120a\n"
           + pre + "ptxas fatal   : Ptx assembly aborted due to errors\n"
           "ERROR 07-01 14:28:21 [core.py:515] EngineCore failed to start.\n")
    assert classify(log).failure_class == "arch_not_in_build"
    # ptxas giving up for another reason is the JIT toolchain's failure, not the architecture's
    other = log.replace("PTX .version 8.4 does not support .target sm_120a", "Entry function 'k' uses too much "
                        "shared data (0x1c000 bytes, 0xc000 max)")
    assert (classify(other).failure_class, classify(other).kind) == ("flashinfer_jit_build_failure", "deterministic")


def test_llama_server_decode_progress_is_a_request_served():
    # ggml-org/llama.cpp#25121: a llama-server log of nothing but its periodic decode progress
    lines = "".join(f"2.{s:02d}.846.974 I slot print_timing: id  3 | task 0 | n_decoded =   {1081 + 38 * s}, "
                    f"tg =  12.93 t/s, tg_3s =  12.57 t/s\n" for s in range(5))
    assert classify(lines).failure_class == "healthy"
    # a slot that decoded nothing yet is no request served
    zero = "2.00.846.974 I slot print_timing: id  3 | task 0 | n_decoded =   0, tg =  0.00 t/s, tg_3s =  0.00 t/s\n"
    assert classify(zero).failure_class != "healthy"


# ------------------------------------------------------------------ test26 read
def test_a_cuda_runtime_error_out_of_memory_is_a_runtime_oom():
    # triton-inference-server/fastertransformer_backend#29 (FasterTransformer's check_cuda_error), as posted
    log = ("terminate called after throwing an instance of 'std::runtime_error'\n"
           "  what():  [FT][ERROR] CUDA runtime error: out of memory /workspace/build/fastertransformer_backend/build/"
           "_deps/repo-ft-src/src/fastertransformer/utils/memory_utils.cu:26 \n\n"
           "[gv013:3677168] *** Process received signal ***\n[gv013:3677168] Signal: Aborted (6)\n")
    assert (classify(log).failure_class, classify(log).kind) == ("cuda_oom_runtime", "transient")
    # another runtime error of the same wrapper is no OOM
    assert classify(log.replace("out of memory", "invalid argument")).failure_class != "cuda_oom_runtime"


def test_a_bus_error_inside_nccl_is_its_shared_memory_at_init():
    # msr-fiddle/pipedream#76 (a torchrun job in Docker, fixed with --shm-size), its first lines
    log = ("[8d6bf97c3bf4:3039 :0:3095] Caught signal 7 (Bus error: nonexistent physical address)\n"
           "==== backtrace (tid:   3095) ====\n 0 0x0000000000043090 killpg()  ???:0\n"
           " 2 0x000000000007587d ncclGroupEnd()  ???:0\n 4 0x0000000000059e97 ncclGetUniqueId()  ???:0\n"
           " 5 0x00000000000489b1 ???()  /usr/lib/x86_64-linux-gnu/libnccl.so.2:0\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    assert (classify(log).failure_class, classify(log).kind) == ("nccl_init_system_error", "infra")
    # a bus error nowhere near NCCL is no evidence about its shared memory
    other = "\n".join(ln for ln in log.splitlines() if "nccl" not in ln) + "\n"
    assert classify(other).failure_class != "nccl_init_system_error"


def test_triton_servers_endpoints_started_are_ready():
    # triton-inference-server/server#2312 (Triton 20.03), as posted
    log = ("I1204 08:17:45.082233 1 grpc_server.cc:1939] Started GRPCService at 0.0.0.0:8001\n"
           "I1204 08:17:45.082251 1 http_server.cc:1411] Starting HTTPService at 0.0.0.0:8000\n"
           "I1204 08:17:45.124574 1 http_server.cc:1426] Starting Metrics Service at 0.0.0.0:8002\n"
           "I1204 08:17:45.130062 1 server.cc:224] Polling model repository\n")
    assert classify(log).failure_class == "healthy"
    # the metrics endpoint alone says nothing of the inference endpoints
    assert classify(log.splitlines()[2] + "\n").failure_class != "healthy"


def test_tgi_refusing_the_gpus_capability_is_a_kernel_without_that_architecture():
    # huggingface/text-generation-inference#424 (falcon-7b sharded on a V100), its error line
    log = "ImportError: GPU with CUDA capability 7 0 is not supported\n"
    assert (classify(log).failure_class, classify(log).kind) == ("unsupported_arch_kernel", "deterministic")


def test_trtllm_without_a_model_for_the_architecture_is_a_model_load_error():
    # NVIDIA/TensorRT-LLM#2845 (trtllm-serve 0.17 with DeepSeek-V3), its title's error line
    log = ("NotImplementedError: The given huggingface model architecture DeepseekV3ForCausalLM is not supported "
           "in TRT-LLM yet\n")
    assert (classify(log).failure_class, classify(log).kind) == ("model_load_error", "deterministic")


def test_torchs_arch_warning_tail_then_a_failure_is_an_arch_the_build_lacks():
    # vllm-project/vllm#16267 (an RTX 5070 Ti under a cu124 torch): the excerpt starts at the
    # warning's last line
    warn = ("If you want to use the NVIDIA GeForce RTX 5070 Ti GPU with PyTorch, please check the instructions at "
            "https://pytorch.org/get-started/locally/\n\n  warnings.warn(\n")
    died = ("ERROR 04-07 13:31:03 [core.py:390] EngineCore hit an exception: Traceback (most recent call last):\n"
            "ERROR 04-07 13:31:03 [core.py:390]   File \"/x/vllm/v1/engine/core.py\", line 378, in run_engine_core\n")
    assert classify(warn + died).failure_class == "arch_not_in_build"
    # a server that served past the warning was fine (a PTX build can JIT for the GPU)
    served = ('INFO:     Application startup complete.\n'
              'INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK\n')
    assert classify(warn + served).failure_class == "healthy"


def test_the_mlx5_provider_dumping_a_failed_completion_is_the_network():
    # OpenRLHF/OpenRLHF#621 (a vLLM engine actor during a multi-node weight broadcast), as posted
    log = ("(LLMRayActor pid=90621, ip=172.19.24.110) update weight: model.embed_tokens.weight, dtype: torch.bfloat16\n"
           "(LLMRayActor pid=90738, ip=172.19.24.110) mlx5: host_unknown: got completion with error:\n"
           "(LLMRayActor pid=90738, ip=172.19.24.110) 00000000 00000000 00000000 00000000\n")
    assert (classify(log).failure_class, classify(log).kind) == ("nccl_network_error", "infra")


def test_nccl_before_2_4_is_read_as_nccl():
    # NVIDIA/nccl-tests#15 (NCCL 2.2.13: its level without "NCCL"), as posted
    log = ("gpu-bql-144-103:18553:18553 [0] INFO NET/Socket : 1 interfaces found\nNCCL version 2.2.13+cuda9.0\n"
           "gpu-bql-144-103:18553:18611 [0] include/socket.h:360 WARN Call to connect failed : Connection timed out\n"
           "gpu-bql-144-103:18553:18611 [0] INFO transport/net_socket.cu:118 -> 2\n")
    assert (classify(log).failure_class, classify(log).kind) == ("nccl_network_error", "infra")
    from tasks.failure_events import strip_prefixes

    # both releases' lines read alike; a later release's line is left as it is
    assert strip_prefixes("h:1:2 [0] include/socket.h:360 WARN x")[0] == "include/socket.h:360 NCCL WARN x"
    assert strip_prefixes("h:1:2 [0] misc/socket.cc:484 NCCL WARN x")[0] == "misc/socket.cc:484 NCCL WARN x"
    assert strip_prefixes("h:1:2 [0] INFO x")[0] == "NCCL INFO x"


# ------------------------------------------------------------------ test27 read
def test_tvm_ffis_ninja_exiting_is_the_jit_build_failing():
    # sgl-project/sglang#30936 (nvcc segfaulting in SGLang's own JIT kernel build), as posted
    log = ("  File \"/x/.venv/lib/python3.12/site-packages/tvm_ffi/cpp/extension.py\", line 601, in build_ninja\n"
           "    raise RuntimeError(\"\\n\".join(msg))\nRuntimeError: ninja exited with status 139\nstdout:\n"
           "FAILED: [code=139] cuda_0.o\n")
    assert (classify(log).failure_class, classify(log).kind) == ("flashinfer_jit_build_failure", "deterministic")


def test_nccls_named_symbol_not_found_is_an_arch_the_build_lacks():
    # pytorch/pytorch#152077 (NCCL 2.14 under torch 2.0 on an RTX 5090), as posted
    log = ("4d1a2ae696c8:50555:50555 [0] NCCL WARN Cuda failure 'named symbol not found'\n"
           "4d1a2ae696c8:50555:50555 [0] NCCL INFO Bootstrap : Using eth0:172.17.0.2<0>\nNCCL version 2.14.3+cuda11.8\n")
    assert (classify(log).failure_class, classify(log).kind) == ("arch_not_in_build", "deterministic")
    # another CUDA failure of NCCL's is not the build's
    assert classify(log.replace("named symbol not found", "invalid argument")).failure_class != "arch_not_in_build"


def test_tgis_webserver_crashed_is_a_crash_after_it_came_up():
    # huggingface/text-generation-inference#1795 (a router panic on a multi-byte character), its tail
    log = ("thread 'tokio-runtime-worker' panicked at /usr/src/router/src/server.rs:180:45:\n"
           "byte index 1000 is not a char boundary; it is inside '\u4f60' (bytes 999..1002)\n"
           "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
           "2024-04-23T08:26:48.209311Z ERROR text_generation_launcher: Webserver Crashed\n"
           "2024-04-23T08:26:48.209348Z  INFO text_generation_launcher: Shutting down shards\n")
    assert (classify(log).failure_class, classify(log).kind) == ("server_crash", "transient")
    # what the router died of, when a family names it, decides (huggingface/text-generation-inference#563)
    oom = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert classify(oom + log).failure_class == "cuda_oom_runtime"


def test_tensorrt_refusing_a_serialized_engine_is_the_weights():
    # triton-inference-server/tensorrtllm_backend#424 (an engine built with another TensorRT), its line
    log = ("| tensorrt_llm     | 1       | UNAVAILABLE: Internal: unexpected error when creating modelInstanceState: "
           "[TensorRT-LLM][ERROR] Assertion failed: Failed to deserialize cuda engine (/tmp/tritonbuild/tensorrtllm/"
           "tensorrt_llm/cpp/tensorrt_llm/runtime/tllmRuntime.cpp:72) |\n")
    assert (classify(log).failure_class, classify(log).kind) == ("model_weights_error", "deterministic")


def test_a_launcher_starting_vllm_is_not_vllms_api_server_up():
    # gpustack/gpustack#2616: GPUStack's notice that it starts vLLM, then nothing from vLLM
    log = ("2025-07-25 10:11:49.749324+00:00 - gpustack.worker.backends.vllm - INFO - Starting vLLM server: "
           "/var/lib/gpustack/bin/vllm_v0.10.0\n"
           "2025-07-25 10:11:49.749362+00:00 - gpustack.worker.backends.vllm - DEBUG - Run vLLM with arguments: "
           "serve /data/Qwen3-4B --enable-reasoning --host 0.0.0.0 --port 40057\n")
    assert classify(log).failure_class != "healthy"
    # vLLM's own line says where it listens, in both wordings
    for own in ("Starting vLLM API server on http://0.0.0.0:8000", "Starting vLLM server on http://0.0.0.0:8000",
                "Starting vLLM API server 0 on http://0.0.0.0:8000"):
        assert classify(f"(APIServer pid=1) INFO 05-06 04:33:07 [api_server.py:602] {own}\n"
                        "(APIServer pid=1) INFO:     Application startup complete.\n").failure_class == "healthy"


# ------------------------------------------------------------------ the test28 round
# Each log is written from the message in the source named beside it, in another engine's or
# another run's words than the corpus entry that showed the family.
@pytest.mark.parametrize("log, expected", [
    # Go's net.Listen on Windows (WSAEADDRINUSE's own text, capitalised), here LocalAI's API port
    ("1:02PM INF Starting LocalAI using 8 threads\n"
     "Error: listen tcp 127.0.0.1:8080: bind: Only one usage of each socket address (protocol/network address/port) "
     "is normally permitted.\n", "port_in_use"),
    # older llama.cpp's CUDA_CHECK (ggml-cuda.cu: "CUDA error %d at %s:%d: %s"), llama-server loading
    ("llm_load_tensors: offloaded 33/33 layers to GPU\nllama_new_context_with_model: n_ctx = 32768\n"
     "CUDA error 2 at /src/llama.cpp/ggml-cuda.cu:9007: out of memory\ncurrent device: 0\n", "cuda_oom_runtime"),
    # torch's allocator warning (c10/cuda/CUDACachingAllocator.cpp) before vLLM's engine core dies
    ("(EngineCore_DP0 pid=812) INFO 12-03 10:00:01 [gpu_model_runner.py:2602] Model loading took 61.2 GiB\n"
     "[rank0]:[W1203 10:00:07.120000000 CUDACachingAllocator.cpp:3933] memory allocation failed with OOM on device 0 "
     "while trying to allocate 8589934592 bytes (free: 2147483648, total: 85899345920).\n"
     "(EngineCore_DP0 pid=812) ERROR 12-03 10:00:07 [core.py:708] EngineCore failed to start.\n", "cuda_oom_runtime"),
    # LLVM's option parser refusing a --target the compiler was not built with (a ROCm Triton on a new gfx)
    ("ERROR 12-03 10:00:07 [core.py:708] triton.compiler.errors.MLIRCompilationError:\n"
     "ERROR 12-03 10:00:07 [core.py:708] llc: for the --target option: Cannot find option named 'gfx1250'!\n",
     "unsupported_arch_kernel"),
    # HCCL's watchdog on the RoCE NIC's error completion (CANN error code EI0013), another rank
    ("[rank3]:[E1203 10:00:07.000000000 compiler_depend.ts:1693] [Rank 3] HCCL watchdog thread terminated with "
     "exception: [PID: 41] 2026-12-03-10:00:07.000.000 Execution_Error_ROCE_CQE(EI0013): An error CQE occurred "
     "during operation.\n", "nccl_network_error"),
    # SGLang's scheduler raising while it serves (run_scheduler_process), its traceback cut
    ("[2026-12-03 10:00:00] The server is fired up and ready to roll!\n"
     "[2026-12-03 10:05:00 TP0] Decode batch. #running-req: 12, #token: 9012, token usage: 0.40, gen throughput "
     "(token/s): 310.22, #queue-req: 0\n"
     "[2026-12-03 10:05:01 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
     '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2311, in run_scheduler_process\n',
     "server_crash"),
    # TabbyAPI taking a request once Uvicorn is up (its request log: "Information for GET request <id>:")
    ("INFO:     Application startup complete.\nINFO:     Uvicorn running on http://127.0.0.1:5000 (Press CTRL+C to quit)\n"
     "2026-12-03 10:00:09.000 INFO:     Information for POST request 0f1e2d3c4b5a69788796a5b4c3d2e1f0:\n",
     "healthy"),
])
def test_families_of_the_test28_round(log, expected):
    assert classify(log).failure_class == expected, classify(log)


def test_nccl_without_infiniband_is_no_network_error_unless_it_warns():
    """``NET/IB : No device found.`` at INFO is a host without InfiniBand, on which NCCL goes on over
    sockets (NVIDIA/nccl#606's run then hung in a collective); as a WARN it is a failure."""
    head = ("host:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>\n"
            "host:1:1 [0] NCCL INFO NET/IB : No device found.\nhost:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>\n"
            "host:1:1 [0] NCCL INFO Using network Socket\n")
    assert classify(head).kind != "infra", classify(head)
    warned = head.replace("NCCL INFO NET/IB : No device found.", "transport/net_ib.cc:1 NCCL WARN NET/IB : No device found.")
    assert classify(warned).failure_class == "nccl_network_error", classify(warned)
