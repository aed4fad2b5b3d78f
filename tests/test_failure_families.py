"""The classifier on logs shaped as public threads post them (issue 21): a crash is read from
where its traceback was raised, an excerpt that ends in an error is a crash and not a timeout,
and message families cover the wordings of the engines' and libraries' own messages.

Every log line here is written from the message in the source named beside it, not copied from
a held-out corpus entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.failure_events import FATAL, parse_log, strip_prefixes
from tasks.failures import KIND, classify

TB = "Traceback (most recent call last):\n"


def _assert_reads(log: str, expected: str, phase: str) -> None:
    """The log alone is classified ``expected`` (with its kind) in the startup ``phase`` ("start": none)."""
    c = classify(log)
    assert (c.failure_class, c.kind, c.phase or "start") == (expected, KIND[expected], phase), c


def _frame(path: str, fn: str, src: str = "    x = f()") -> str:
    return f'  File "/usr/lib/python3.12/site-packages/{path}", line 42, in {fn}\n{src}\n'


# ------------------------------------------------------------------ where it was raised
@pytest.mark.parametrize("frames, exc, expected", [
    # FlashInfer's fused allreduce + RMSNorm (flashinfer/comm/trtllm_ar.py), called by SGLang's
    # flashinfer_comm_fusion.py: a generic exception raised there is the fusion's
    (_frame("sglang/srt/layers/flashinfer_comm_fusion.py", "flashinfer_allreduce_residual_rmsnorm")
     + _frame("flashinfer/comm/trtllm_ar.py", "trtllm_allreduce_fusion"),
     "RuntimeError: an unexpected status was returned\n", "flashinfer_allreduce_fusion_unsupported_arch"),
    # vLLM's custom all-reduce (distributed/device_communicators/custom_all_reduce.py)
    (_frame("vllm/distributed/device_communicators/custom_all_reduce.py", "register_graph_buffers"),
     "RuntimeError: expected a registered buffer\n", "custom_allreduce_graph_error"),
    # DeepEP's buffer (deep_ep/buffer.py) under SGLang's token dispatcher
    (_frame("sglang/srt/layers/moe/token_dispatcher/deepep.py", "dispatch_a")
     + _frame("deep_ep/buffer.py", "low_latency_dispatch"), "AssertionError\n", "moe_ep_a2a_config_error"),
    # the weight loader (vllm model_executor/model_loader/weight_utils.py)
    (_frame("vllm/model_executor/model_loader/weight_utils.py", "safetensors_weights_iterator"),
     "IndexError: list index out of range\n", "model_weights_error"),
    # transformers' AutoTokenizer (models/auto/tokenization_auto.py)
    (_frame("transformers/models/auto/tokenization_auto.py", "from_pretrained"),
     "TypeError: not a string\n", "model_load_error"),
    # torch's extension builder (torch/utils/cpp_extension.py), FlashInfer's JIT
    (_frame("flashinfer/jit/core.py", "build_and_load") + _frame("torch/utils/cpp_extension.py", "_run_ninja_build"),
     "subprocess.CalledProcessError: Command '['make']' returned non-zero exit status 1.\n",
     "flashinfer_jit_build_failure"),
    # vLLM's CUDA-graph capture (v1/worker/gpu_model_runner.py capture_model)
    (_frame("vllm/v1/worker/gpu_model_runner.py", "capture_model") + _frame("torch/cuda/graphs.py", "capture_end"),
     "RuntimeError: CUDA error: operation failed\n", "cuda_graph_capture_failed_other"),
    # a draft model's own forward (sglang srt/models/llama_eagle3.py)
    (_frame("sglang/srt/models/llama_eagle3.py", "forward", "    h = torch.cat([e, h], dim=-1)"),
     "RuntimeError: Sizes of tensors must match except in dimension 1\n", "spec_decode_config_error"),
])
def test_a_generic_exception_takes_the_class_of_the_component_that_raised_it(frames, exc, expected):
    log = "[2026-01-01 00:00:01 TP0] Scheduler hit an exception: " + TB + \
        _frame("sglang/srt/managers/scheduler.py", "run_scheduler_process") + frames + exc
    c = classify(log)
    assert (c.failure_class, c.kind) == (expected, KIND[expected]), c
    # the exception is quoted, not a frame; an exception with no message, by the statement that raised it
    assert c.line.strip() == (exc.strip() if ":" in exc else "x = f()"), c


def test_an_excerpt_cut_inside_a_traceback_is_read_from_its_innermost_frames():
    log = ("[2026-01-01 00:00:01 TP0] Scheduler hit an exception: " + TB
           + _frame("sglang/srt/layers/layernorm.py", "forward_with_allreduce_fusion")
           + _frame("flashinfer/comm/trtllm_mnnvl_ar.py", "trtllm_mnnvl_fused_allreduce_add_rmsnorm",
                    "    module.trtllm_mnnvl_allreduce_fusion("))
    c = classify(log)
    assert c.failure_class == "flashinfer_allreduce_fusion_unsupported_arch", c
    assert "trtllm_mnnvl_ar.py" in c.line


def test_a_specific_error_under_component_frames_keeps_its_own_class():
    # a CUDA OOM raised under the weight loader is an OOM, an IMA under the fusion an IMA
    oom = TB + _frame("vllm/model_executor/model_loader/weight_utils.py", "load") + \
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert classify(oom).failure_class == "cuda_oom_runtime"
    ima = TB + _frame("flashinfer/comm/trtllm_ar.py", "f") + \
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    assert classify(ima).failure_class == "cuda_illegal_memory_access"


def test_engine_call_paths_are_not_a_component():
    # the speculative worker wraps every forward of a speculative server: its frames alone say
    # nothing about the config
    log = TB + _frame("sglang/srt/speculative/eagle_worker.py", "forward_batch_generation") + \
        "RuntimeError: something nobody names\n"
    assert classify(log).failure_class == "unknown"


# ------------------------------------------------------------------ a crash is not a timeout
@pytest.mark.parametrize("log", [
    # an excerpt that ends inside a traceback (nothing names the component)
    "[2026-01-01 00:00:01 TP0] Load weight begin.\n[2026-01-01 00:00:02 TP0] Scheduler hit an exception: " + TB
    + _frame("sglang/srt/managers/scheduler.py", "__init__"),
    # vLLM's engine core ERROR line (v1/engine/core.py: logger.exception("EngineCore failed to start."))
    "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [gpu_model_runner.py:1] Starting to load model x...\n"
    "(EngineCore_DP0 pid=7) ERROR 01-01 00:00:05 [core.py:708] EngineCore failed to start.\n",
    # an error line without a level at the end (nvshmem host/init/init.cu)
    "/sgl-workspace/nvshmem/src/host/init/init.cu:nvshmemi_check_state_and_init:1080: nvshmem initialization failed, "
    "exiting\n",
])
def test_an_excerpt_ending_in_an_error_is_a_crash_not_a_timeout(log):
    c = classify(log)
    assert c.failure_class == "unknown", c
    assert c.line.strip()


def test_a_timeout_needs_evidence_of_waiting():
    stuck = "[2026-01-01 00:00:01 TP0] Load weight begin. avail mem=94.10 GB\n"
    assert classify(stuck).failure_class == "startup_timeout"  # the log just stops while loading
    err = "(EngineCore_DP0 pid=7) ERROR 01-01 00:00:05 [core.py:1] Waiting for a worker took long.\n"
    harness = ("[harness] startup deadline exceeded after 600 s: the server never became ready; last progress line: "
               "Load weight begin.\n")
    assert classify(stuck + err).failure_class == "unknown"
    assert classify(stuck + err + harness).failure_class == "startup_timeout"  # our harness waited


def test_sglang_retracting_under_kv_pressure_is_serving():
    # scheduler.py logs a retract while decoding: the server is serving, not starting
    log = ("[2026-01-01 00:00:01] server_args=ServerArgs(tp_size=2)\n"
           "[2026-01-01 00:10:00 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.1 -> 0.2\n")
    assert classify(log).healthy


def test_a_warning_the_server_served_past_is_healthy():
    # a communicator warns that the GPU lacks what it needs (torch_symm_mem.py); requests are then served
    log = ("(EngineCore_DP0 pid=7) WARNING 01-01 00:00:01 [torch_symm_mem.py:1] torch symmetric memory multicast "
           "operations are not supported on this device.\n"
           "(APIServer pid=1) INFO 01-01 00:00:09 [launcher.py:37] Available routes are:\n"
           "(APIServer pid=1) INFO:     127.0.0.1:5000 - \"POST /v1/completions HTTP/1.1\" 200 OK\n")
    assert classify(log).healthy
    # not when the lifecycle says it failed (an exit code or a phase), nor with no request served
    assert not classify(log, 1, "bench").healthy
    assert classify(log.rsplit("(APIServer", 2)[0]).failure_class == "torch_symm_mem_unsupported"


def test_a_kernel_falling_back_is_not_the_failure():
    # vLLM's sampler warns and falls back (v1/sample/ops/topk_topp_sampler.py); the crash is elsewhere
    log = ("(EngineCore_DP0 pid=7) WARNING 01-01 00:00:01 [topk_topp_sampler.py:1] FlashInfer top-p & top-k sampling "
           "is not supported on this GPU, falling back to the PyTorch-native implementation.\n"
           "(EngineCore_DP0 pid=7) RuntimeError: something the families do not name\n")
    assert classify(log, 1, "startup").failure_class == "unknown"


def test_a_server_that_served_past_an_error_is_healthy_and_one_that_died_is_not():
    served = ('(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK\n')
    # vLLM's shm-broadcast wait (shm_broadcast.py) while a big model compiles, then serving
    slow = ("(EngineCore_DP0 pid=7) INFO 01-01 00:00:01 [backends.py:1] Compiling a graph for dynamic shape\n"
            "(EngineCore_DP0 pid=7) WARNING 01-01 00:01:01 [shm_broadcast.py:466] No available shared memory broadcast "
            "block found in 60 second. This typically happens when some processes are hanging.\n"
            "(APIServer pid=1) INFO 01-01 00:02:00 [launcher.py:37] Available routes are:\n")
    assert classify(slow + served).healthy
    # the API server lists its routes only after the engine core's startup handshake: the wait
    # ended, though no request was served yet
    assert classify(slow).healthy
    # the notice with nothing after it is the hang
    assert classify(slow.rsplit("(APIServer", 1)[0]).failure_class == "engine_hang_detected"
    # one request's error while the server keeps answering others
    bad = ("(APIServer pid=1) ERROR 01-01 00:03:00 [serving_chat.py:1] Error in preprocessing prompt inputs\n"
           "(APIServer pid=1) ValueError: This model's maximum context length is 4096 tokens.\n")
    assert classify(slow + served + bad + served).healthy
    # the engine died: what follows are failed requests (500), not serving
    dead = ("(APIServer pid=1) ERROR 01-01 00:04:00 [async_llm.py:1] AsyncLLM output_handler failed.\n"
            "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
            '(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n')
    assert classify(slow + served + dead).failure_class == "server_crash"


# ------------------------------------------------------------------ message families
@pytest.mark.parametrize("line, expected", [
    # NCCL misc/socket.cc (2.19+): "socketPollConnect: Connect to %s returned %d(%s) errno %d(%s)"
    ("node1:1:1 [0] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 10.0.0.2<40000> returned "
     "113(No route to host) errno 115(Operation now in progress)", "nccl_network_error"),
    # vllm config/vllm.py: a quantization method's minimum capability
    ("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 89. "
     "Current capability: 86.", "unsupported_arch_kernel"),
    # triton runtime/errors.py OutOfResources: a tile tuned for more shared memory than the GPU has
    ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 147456, Hardware limit: 101376. "
     "Reducing block sizes or `num_stages` may help.", "unsupported_arch_kernel"),
    # the KV cache has no memory left, in an engine's own words
    ("RuntimeError: not enough free memory to allocate the KV cache after loading weights", "kv_cache_pool_too_small"),
    # vllm config/scheduler.py
    ("ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (8192). This effectively limits the "
     "maximum sequence length", "server_args_incompatible"),
    # vllm config/model.py _get_and_verify_max_len
    ("ValueError: User-specified max_model_len (200000) is greater than the derived max_model_len "
     "(max_position_embeddings=131072 in model's config.json).", "server_args_incompatible"),
    # two features refused together (feature-combination checks of both engines)
    ("RuntimeError: Prefix caching and sliding window are currently not supported.", "server_args_incompatible"),
    ("ValueError: --enable-dp-attention and --enable-pdmux cannot be used together", "server_args_incompatible"),
    # a speculative method refused by vLLM's pydantic validator
    ("  Value error, Model Runner V2 does not yet support: ngram speculative decoding [type=value_error]",
     "spec_decode_config_error"),
    ("RuntimeError: speculative_num_draft_tokens must not exceed the draft model's vocab", "spec_decode_config_error"),
    # an expert-parallel / all-to-all refusal (vllm config/parallel.py, sglang server_args.py)
    ("ValueError: all2all backend deepep_low_latency requires expert parallel", "moe_ep_a2a_config_error"),
    # torch/utils/cpp_extension.py
    ("OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.",
     "flashinfer_jit_build_failure"),
    # the ptxas a Triton build runs (triton backends/nvidia/compiler.py make_cubin)
    ("subprocess.CalledProcessError: Command '['/x/triton/backends/nvidia/bin/ptxas', '--gpu-name=sm_99', 'a.ptx']' "
     "returned non-zero exit status 255.", "flashinfer_jit_build_failure"),
    # torch/_dynamo/exc.py
    ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: AssertionError", "flashinfer_jit_build_failure"),
    # vllm compilation/compiler_interface.py
    ("RuntimeError: vLLM failed to compile the model. The most likely reason for this is that a previous compilation "
     "failed, leading to a corrupted compilation artifact.", "flashinfer_jit_build_failure"),
    # huggingface_hub errors.py
    ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache and outgoing "
     "traffic has been disabled.", "model_load_error"),
    # the sticky CUDA kernel faults (CUDA runtime errors 715, 716, 719)
    ("RuntimeError: CUDA error: an illegal instruction was encountered", "cuda_illegal_memory_access"),
    ("RuntimeError: CUDA error: unspecified launch failure", "cuda_illegal_memory_access"),
    # a distributed call timing out, in torch's gloo words
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error: gloo barrier timed out",
     "collective_hang_or_timeout"),
    # NCCL checks.h CUDACHECK, with and without the error number (2.18- / 2.19+)
    ("gpu1:1:1 [0] init.cc:194 NCCL WARN Cuda failure 'out of memory'", "cuda_oom_runtime"),
    ("gpu1:1:1 [0] init.cc:194 NCCL WARN Cuda failure 'peer access is not supported between these two devices'",
     "nccl_init_system_error"),
    # nccl-tests common.cu NCCLCHECK: "Test NCCL failure %s:%d '%s'"
    ("gpu1: Test NCCL failure common.cu:891 'unhandled system error (run with NCCL_DEBUG=INFO for details) / '",
     "nccl_init_system_error"),
    # NCCL bootstrap.cc: no interface matching NCCL_SOCKET_IFNAME at communicator init (the host's
    # setup: vllm-project/vllm#2084 and open-r1-multimodal#7 are labelled so); socket.cc: the
    # pre-2.19 connect wording, the network
    ("gpu1:1:1 [0] bootstrap.cc:1 NCCL WARN Bootstrap : no socket interface found", "nccl_init_system_error"),
    ("gpu1:1:1 [0] misc/socket.cc:1 NCCL WARN Connect to 10.0.0.2<35781> failed : Connection refused",
     "nccl_network_error"),
    # DeepGEMM's DG_HOST_ASSERT format (csrc/utils/exception.hpp); its kernels exist for SM90 / SM100
    ("RuntimeError: Assertion error (/build/deep_gemm/csrc/jit_kernels/heuristics/common.hpp:12): "
     "arch_major == 9 or arch_major == 10", "unsupported_arch_kernel"),
    # builds that target another toolchain or no GPU (CUDA runtime error 222; torch's CPU build;
    # the dispatcher without a CUDA kernel for an operator)
    ("RuntimeError: CUDA error: the provided PTX was compiled with an unsupported toolchain.", "arch_not_in_build"),
    ("AssertionError: Torch not compiled with CUDA enabled", "arch_not_in_build"),
    ("NotImplementedError: Could not run '_C::rms_norm' with arguments from the 'CUDA' backend.", "arch_not_in_build"),
    # architecture refusals of kernels and backends named by their architecture (vllm
    # v1/attention/backends/mla/*_sm120.py, triton_attn.py; sglang lora/moe/runner.py)
    ("ValueError: FLASHINFER_MLA_SPARSE_SM120 does not support alibi_slopes", "unsupported_arch_kernel"),
    ("RuntimeError: MoE LoRA supports SM90 and SM100 only; this device is sm_120", "unsupported_arch_kernel"),
    ("ValueError: nvfp4_per_token online quantization requires a Blackwell (SM100) GPU.", "unsupported_arch_kernel"),
    ("ValueError: bfloat16 KV cache is not supported on Tesla T4 (compute capability 7.5)", "unsupported_arch_kernel"),
    # a parallel size that does not divide a model dimension (model files of both engines)
    ("ValueError: num_heads 40 is not divisible by tp_size 16.", "server_args_incompatible"),
    ("ValueError: Tensor parallel size 16 is greater than the number of KV heads (8)", "server_args_incompatible"),
    # one flag refusing another (sglang arg_groups hooks)
    ("ValueError: --enable-kv-cache-sharding does not support --enable-unified-memory: use one", "server_args_incompatible"),
    # a MoE runner backend refusing the model's quantization or mode (vllm fused_moe/oracle, sglang ep_moe)
    ("ValueError: moe_backend='cutlass' is not supported for NvFP4 MoE.", "moe_ep_a2a_config_error"),
    ("NotImplementedError: Unquantized DeepEP MoE currently supports low_latency mode only", "moe_ep_a2a_config_error"),
    # a model refusing a speculative method (sglang models/*.py)
    ("ValueError: Qwen4 PLE does not support NGRAM speculation", "spec_decode_config_error"),
    # the KV pool sizing of both engines (sglang pool_configurator.py, kv_cache_configurator.py;
    # vllm v1/core/kv_cache_utils.py), incl. advice that names speculative decoding
    ("RuntimeError: The SWA pool cap (4096 tokens, 2 GB) leaves no room for the full KV pool within the available "
     "1 GB. Reduce --max-running-requests", "kv_cache_pool_too_small"),
    ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. "
     "Try increasing `gpu_memory_utilization`.", "kv_cache_pool_too_small"),
    ("RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
     "max_mamba_cache_size=0", "kv_cache_pool_too_small"),
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.8. If using "
     "speculative decoding, the draft model's weights count too.", "kv_cache_pool_too_small"),
    # the model files' own weight loaders (load_weights of both engines' models/*.py)
    ("ValueError: No model weights found in /models/m (expected model.safetensors or pytorch_model.bin)",
     "model_weights_error"),
    ("KeyError: Weight model.layers.3.mlp.w9.weight not found in params_dict", "model_weights_error"),
    ("RuntimeError: Expert weight shape mismatch for w13: parameter=(8, 64), checkpoint=(8, 32)", "model_weights_error"),
    # vllm quantization layers: a TP size that splits a quantized weight off its groups
    ("ValueError: The input size is not aligned with the quantized weight shape. This can be caused by too large "
     "tensor parallel size.", "server_args_incompatible"),
    # CUDA's stream-capture errors: NCCL's only beside NCCL evidence, any other op's a capture failure
    ("RuntimeError: CUDA error: operation not permitted when stream is capturing", "cuda_graph_capture_failed_other"),
    ("gpu1:1:1 [0] enqueue.cc:1 NCCL WARN Cuda failure 'operation not permitted when stream is capturing'",
     "nccl_graph_capture_error"),
    # torch's capture guards (CUDAGeneratorImpl.cpp, CUDAGraphsC10Utils.h assertNotCapturing)
    ("RuntimeError: Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture. If you need this call to "
     "be captured, please file an issue. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive",
     "cuda_graph_capture_failed_other"),
    # vllm v1/worker: the device's free memory at startup below the requested share (held by others)
    ("ValueError: Free memory on device cuda:0 (3.10/79.19 GiB) on startup is less than desired GPU memory "
     "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     "gpu_busy"),
    # vllm gpu_worker.py: a negative KV budget after profiling
    ("(EngineCore pid=1) INFO 01-01 00:00:00 [gpu_worker.py:1] Available KV cache memory: -1.50 GiB\n"
     "(EngineCore pid=1) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.", "kv_cache_pool_too_small"),
    # Ray's memory monitor (raylet node_manager.cc)
    ("(raylet) node_manager.cc:1: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed "
     "due to other reasons at node", "host_oom_killed"),
    # EADDRINUSE on Windows (WSAEADDRINUSE 10048) and macOS (48), as uvicorn reports a bind
    ("ERROR:    [Errno 10048] error while attempting to bind on address ('0.0.0.0', 8000): only one usage of each "
     "socket address (protocol/network address/port) is normally permitted", "port_in_use"),
    ("ERROR:    [Errno 48] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
     "port_in_use"),
    # transformers dynamic_module_utils.py resolve_trust_remote_code: its prompt, answered by EOFError
    ("The repository for org/m contains custom code which must be executed to correctly load the model.\n"
     "EOFError: EOF when reading a line", "model_load_error"),
    # torch c10d TCPStore: a rank's rendezvous with the master timed out
    ("torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to connect to "
     "(10.0.0.1, 29500).", "collective_hang_or_timeout"),
    # vLLM v0's engine death under its API server (async_llm_engine.py)
    ("vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.", "server_crash"),
    # a client quoting the server's 500 (openai _exceptions.py) and vLLM's request-level failure
    ("openai.InternalServerError: Error code: 500 - {'object': 'error', 'message': 'boom'}", "server_http_error"),
    ("vllm.v1.engine.exceptions.EngineGenerateError", "server_http_error"),
    # uvicorn run_asgi: a request failing inside a running server's app
    ('INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error\n'
     "ERROR:    Exception in ASGI application\n" + TB
     + '  File "/x/uvicorn/protocols/http/httptools_impl.py", line 1, in run_asgi\n    result = await app(\n',
     "server_http_error"),
])
def test_families_cover_the_wordings_of_engine_messages(line, expected):
    c = classify(line + "\n")
    assert c.failure_class == expected, c


def test_a_timeout_setting_is_not_a_timeout():
    # torch / vLLM log their process-group settings at startup; only a timeout that fired counts
    log = ("(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [parallel_state.py:1] world_size=2 rank=0 backend=nccl "
           "init_process_group timeout=0:30:00\n"
           "(APIServer pid=1) INFO:     127.0.0.1:5000 - \"POST /v1/completions HTTP/1.1\" 200 OK\n")
    assert classify(log).healthy
    assert classify(log, None, "bench").failure_class != "collective_hang_or_timeout"


def test_a_refusal_in_architecture_words_is_not_a_config_combination():
    c = classify("ValueError: FP8 KV cache is not supported with this GPU architecture (sm_75)\n")
    assert c.failure_class == "unsupported_arch_kernel", c


def test_a_shell_reporting_the_loader_killed_is_the_oom_killer_only_for_a_log_alone():
    log = ("Loading checkpoint shards:  50%|#####     | 4/8 [00:12<00:12,  3.0s/it]\n"
           "./serve.sh: line 3: 14875 Killed                  python -m sglang.launch_server --model-path m\n")
    assert classify(log).failure_class == "host_oom_killed"
    assert classify("Loading checkpoint shards:   0%|\nKilled\n").failure_class == "host_oom_killed"
    # torch elastic reporting its worker SIGKILLed while shards load
    elastic = ("Loading checkpoint shards:  25%|##5       | 1/4 [00:30<01:30, 30.0s/it]\n"
               "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 0 (pid: 77) of "
               "binary: /usr/bin/python\n")
    assert classify(elastic).failure_class == "host_oom_killed"
    # with an exit code our harness saw the SIGKILL (its deadline, or the OOM line it appends)
    assert classify(log, -9, "startup").failure_class == "startup_timeout"
    # a shell's Killed while serving is no evidence about host memory
    assert classify("Decode batch. #running-req: 3\nKilled\n").failure_class != "host_oom_killed"


# ------------------------------------------------------------------ how public logs are pasted
@pytest.mark.parametrize("raw, body", [
    ("Aug 17 18:42:18 gpu-box vllm[8052]: (APIServer pid=8052) ERROR 08-17 18:42:18 [core.py:1] boom", "boom"),
    ("2026-01-01T10:00:00.123456789Z stderr F ValueError: bad", "ValueError: bad"),
    ("> [rank0]: RuntimeError: NCCL error", "RuntimeError: NCCL error"),
])
def test_prefixes_of_pasted_logs_are_stripped(raw, body):
    assert strip_prefixes(raw)[0] == body


def test_curly_quotes_and_ray_wrapped_exceptions_read_as_frames_and_exceptions():
    log = ("Traceback (most recent call last):\n"
           "  File \u201c/x/vllm/model_executor/model_loader/weight_utils.py\u201d, line 3, in load\n"
           "KeyError: \u2018model.layers.0.mlp.gate.weight_scale\u2019\n")
    assert classify(log).failure_class == "model_weights_error"
    ev = parse_log(["ray.exceptions.RayTaskError(ValueError): ray::RayWorkerWrapper.execute_method() (pid=1)"])
    assert ev[0].severity == FATAL


def test_a_bad_raised_in_entry_is_named_in_the_error(tmp_path):
    from tasks.failure_signatures import TABLE_PATH, SignatureTableError, load_tables

    data = yaml.safe_load(Path(TABLE_PATH).read_text())
    data["raised_in"][1]["frames"] = "(unclosed"
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(SignatureTableError, match=r"raised_in\[1\] \(custom_allreduce_graph_error\)\.frames: bad regex"):
        load_tables(p)
    data["raised_in"][1] = {"class": "no_such_class", "frames": "x", "source": "y"}
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(SignatureTableError, match=r"raised_in\[1\] \(no_such_class\): class is not in kinds"):
        load_tables(p)
    data["raised_in"][1] = {"class": "unknown", "frames": "x", "source": "y", "stages": ["no_such_stage"]}
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(SignatureTableError, match=r"raised_in\[1\] \(unknown\)\.stages: expected milestone names"):
        load_tables(p)


def test_a_pydantic_value_error_is_the_message_of_its_validation_error():
    # vLLM's config validators raise through pydantic: the "Value error, ..." line under the
    # ValidationError is the validator's message and decides like the exception line
    log = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
           "  Value error, the eagle3 speculative method needs a draft model path [type=value_error, input_value="
           "ArgsKwargs(()), input_type=ArgsKwargs]\n"
           "    For further information visit https://errors.pydantic.dev/2.11/v/value_error\n")
    assert classify(log).failure_class == "spec_decode_config_error"
    other = log.replace("the eagle3 speculative method needs a draft model path", "max_num_seqs must be positive")
    assert classify(other).failure_class == "server_args_incompatible"


def test_an_engine_side_port_is_not_the_servers_port():
    # vllm utils.py get_open_port binding a free port for its own side channel
    log = (TB + _frame("vllm/utils.py", "get_open_port", '    s.bind(("", 0))')
           + "OSError: [Errno 98] Address already in use\n")
    assert classify(log).failure_class != "port_in_use"


def test_the_engine_core_dying_while_it_waits_on_a_worker_is_a_hang():
    # vllm v1/executor/multiproc_executor.py collective_rpc -> shm_broadcast.py dequeue (cut excerpt)
    hdr = "ERROR 01-01 00:00:00 [core.py:1] "
    log = (hdr + "EngineCore encountered a fatal error.\n" + hdr + TB
           + hdr + '  File "/x/vllm/v1/executor/multiproc_executor.py", line 1, in collective_rpc\n'
           + hdr + "    status, result = w.worker_response_mq.dequeue(\n")
    assert classify(log).failure_class == "engine_hang_detected"
    # a worker that reported its own error is that error, not a hang
    assert classify(log + hdr + "RuntimeError: Worker failed with error 'boom'\n").failure_class != "engine_hang_detected"


def test_serving_lines_in_both_sglang_wordings_and_an_engine_done_line_are_healthy():
    for sep in (".", ","):
        log = "".join(f"[2026-01-01 10:00:0{i}] Decode batch{sep} #running-req: 3, #token: 90, token usage: 0.01, "
                      f"gen throughput (token/s): 100.0, #queue-req: 0\n" for i in range(3))
        assert classify(log).healthy
    # vllm v1/engine/core.py: the engine core's startup done
    done = "(EngineCore pid=1) INFO 01-01 00:00:00 [core.py:1] init engine (profile, create kv cache, warmup model) took 40.0 s\n"
    assert classify(done).healthy


def test_a_client_polling_a_server_that_never_came_up_is_a_startup_timeout():
    log = "".join(f"2026-01-01 10:00:0{i},000 - __main__ - WARNING - Attempt {i}: Please wait for the server to become "
                  f"ready...\n" for i in range(3))
    assert classify(log).failure_class == "startup_timeout"
    assert classify(log.splitlines()[0] + "\n").failure_class == "unknown"  # once is a step of a startup


def test_a_traceback_pasted_on_one_line_reads_as_a_traceback():
    # transformers models/auto/configuration_auto.py CONFIG_MAPPING[...] on an unknown model type
    log = ("[2026-01-01 10:00:00] Scheduler hit an exception: Traceback (most recent call last):   File "
           '"/x/transformers/models/auto/configuration_auto.py", line 1, in from_pretrained     config_class = '
           'CONFIG_MAPPING[config_dict["model_type"]]   File "/x/transformers/models/auto/configuration_auto.py", '
           "line 2, in __getitem__     raise KeyError(key) KeyError: 'newarch'  During handling of the above "
           "exception, another exception occurred:\n")
    assert classify(log).failure_class == "model_load_error"


def test_a_log_copied_newest_first_is_read_oldest_first():
    # a console that shows the newest line first: vLLM's capture line, then its OOM (model_runner.py)
    lines = ["INFO 01-01 10:00:00 llm_engine.py:1] # GPU blocks: 7754, # CPU blocks: 2048",
             "INFO 01-01 10:00:01 model_runner.py:1] Capturing the model for CUDA graphs.",
             "ERROR 01-01 10:00:02 engine.py:1] Error initializing vLLM engine: CUDA out of memory. Tried to allocate 2 MiB"]
    blocks = [f"2026-01-01 10:00:0{i}.000\n[info]\n{ln}" for i, ln in enumerate(lines)]
    assert classify("\n".join(blocks) + "\n").failure_class == "cuda_oom_graph_capture"
    assert classify("\n".join(reversed(blocks)) + "\n").failure_class == "cuda_oom_graph_capture"


def test_a_vllm_log_that_stops_after_its_graphs_are_captured_is_up_but_an_sglang_one_is_not():
    # vllm gpu_model_runner.py: the capture is the last step of its engine's startup
    vllm = ("(EngineCore pid=1) INFO 01-01 00:00:00 [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode)\n"
            "(EngineCore pid=1) INFO 01-01 00:00:09 [gpu_model_runner.py:1] Graph capturing finished in 9 secs, took 0.5 GiB\n")
    assert classify(vllm).healthy
    assert classify(vllm, 1, None).failure_class != "server_crash"  # an exit code: not read as up
    # sglang cuda_graph_runner.py: its warmup request still follows the capture
    sgl = ("[2026-01-01 10:00:00] Capture cuda graph begin. This can take up to several minutes.\n"
           "[2026-01-01 10:00:09] Capture cuda graph end. Time elapsed: 9.0 s. mem usage=1.0 GB.\n")
    assert not classify(sgl).healthy


def test_a_notebooks_traceback_reads_where_it_was_raised():
    # IPython / Jupyter frames ("File <path>:<line>, in <qualified name>(<args>)"), cut before the
    # exception line, innermost in the weight loader (vllm model_executor/model_loader/)
    log = ("KeyError                                  Traceback (most recent call last)\n"
           "Cell In[3], line 1\n----> 1 llm = LLM(model=path)\n\n"
           "File ~/env/lib/python3.10/site-packages/vllm/entrypoints/llm.py:123, in LLM.__init__(self, model)\n"
           "File ~/env/lib/python3.10/site-packages/vllm/model_executor/model_loader/loader.py:42, "
           "in DefaultModelLoader.load_model(self, model_config)\n")
    assert classify(log).failure_class == "model_weights_error"


# ------------------------------------------------------------------ test5 round: wordings of other versions
@pytest.mark.parametrize("log, expected, phase", [
    # aws-ofi-nccl's completion error (NCCL_OFI_WARN in nccl_ofi_sendrecv.c; aws/aws-ofi-nccl#161's title)
    ("algo-1:462:1676 [0] ofi_process_cq:1029 NCCL WARN NET/OFI Request completed with error. RC: 21. "
     "Error: unknown error\n", "nccl_network_error", "start"),
    # NCCL socket.cc socketStartConnect with a network errno (NVIDIA/nccl-tests#166)
    ("ubuntu:39964:40075 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed : "
     "Software caused connection abort\n", "nccl_network_error", "start"),
    # socket.cc socketProgressOpt ("Call to %s %s failed : %s") resetting during the bootstrap
    ("node1:9:9 [0] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to recv from 10.0.0.3<41234> failed : "
     "Connection reset by peer\nnode1:9:9 [0] NCCL INFO misc/socket.cc:64 -> 6\n", "nccl_network_error", "start"),
    # NCCL graph/search.cc with an image's NCCL_GRAPH_FILE for more GPUs (NVIDIA/nccl#1008, #1240)
    ("vm:1:2 [0] NCCL INFO NCCL_GRAPH_FILE set by environment to /opt/microsoft/ncv4/graph.xml\n"
     "vm:1:2 [0] graph/search.cc:703 NCCL WARN XML Import Channel : dev 1 not found.\n"
     "vm:1:2 [0] NCCL INFO graph/search.cc:733 -> 2\nvm:1:2 [0] NCCL INFO init.cc:893 -> 2\n",
     "nccl_init_system_error", "start"),
    # vLLM v0's API server finding its engine gone (entrypoints/launcher.py; engine/multiprocessing/client.py)
    ("ERROR 12-06 14:09:37 client.py:282] RuntimeError('Engine process (pid 16470) died.')\n"
     "CRITICAL 12-06 14:09:39 launcher.py:99] MQLLMEngine is already dead, terminating server process\n",
     "server_crash", "start"),
    # Ray's actor death (ray/exceptions.py ActorDiedError; RayActorError before Ray 2: ray-project/ray#5820)
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.\n", "node_lost", "start"),
    # SGLang multimodal_gen http_server.py _run_server_warmup_after_http_ready
    ("[06-17 13:46:56] Server warmup failed; aborting startup: HTTP server did not become ready at "
     "http://127.0.0.1:30000/health\n", "health_check_failed", "start"),
    # the launcher's readiness request through an HTTP proxy answered 403 (urllib3's debug line; sglang#9814)
    ('[2025-08-13 11:01:02] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)\n'
     '[2025-08-13 11:01:03] http://10.0.0.9:3128 "GET http://0.0.0.0:30000/get_model_info HTTP/1.1" 403 3582\n',
     "health_check_failed", "API server up"),
])
def test_families_of_the_test5_round(log, expected, phase):
    _assert_reads(log, expected, phase)


@pytest.mark.parametrize("log", [
    # a peer that crashed resets the socket too: the crash decides, never the network (infra)
    "node1:9:9 [0] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to recv from 10.0.0.3<41234> failed : "
    "Connection reset by peer\nRuntimeError: CUDA error: an illegal memory access was encountered\n",
    # NCCL's internal check (-> 3, ncclInternalError) fits no class (NVIDIA/nccl#520's ring check)
    "n:1:2 [2] graph/rings.cc:38 NCCL WARN Error : ring 2 does not loop back to start (7 != 2)\n"
    "n:1:2 [2] NCCL INFO graph/connect.cc:386 -> 3\n",
    # Ray: the actor's own code raised (ray/exceptions.py "error raised in its creation task")
    "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
    "ray::RayWorkerWrapper.__init__()\nValueError: bad config\n",
    # SGLang's warmup wrapper (srt/entrypoints/http_server.py) names no cause of its own
    "[2024-12-13 01:47:34] Initialization failed. warmup error: Traceback (most recent call last):\n"
    "requests.exceptions.HTTPError: 502 Server Error: Bad Gateway for url: http://127.0.0.1:30000/generate\n",
])
def test_the_test5_families_keep_their_guards(log):
    c = classify(log)
    assert c.kind != "infra" and c.failure_class not in ("nccl_init_system_error", "node_lost", "health_check_failed"), c


# ------------------------------------------------------------------ an excerpt cut inside its traceback
def _cut(*frames: str, head: str = "") -> str:
    """A traceback cut before its exception line, as a thread quotes it (no exception line)."""
    return head + TB + "".join(frames)


@pytest.mark.parametrize("log, expected, phase", [
    # vLLM v1 gpu_worker.py compile_or_warm_up_model calling gpu_model_runner.py capture_model: the
    # excerpt stops at the call, so the capture is where it failed (cause cut off)
    (_cut(_frame("vllm/v1/executor/multiproc_executor.py", "worker_busy_loop", "    output = func(*args, **kwargs)"),
          _frame("vllm/v1/worker/gpu_worker.py", "compile_or_warm_up_model",
                 "    cuda_graph_memory_bytes = self.model_runner.capture_model()")),
     "cuda_graph_capture_failed_other", "graph capture"),
    # SGLang cuda_graph_runner.py capture_one_batch_size, the stack then deep in the model's forward
    (_cut(_frame("sglang/srt/model_executor/cuda_graph_runner.py", "capture_one_batch_size", "    out = run_once()"),
          _frame("sglang/srt/model_executor/cuda_graph_runner.py", "run_once", "    logits = forward(ids, pos, fb)"),
          _frame("torch/nn/modules/module.py", "_call_impl", "    return forward_call(*args, **kwargs)"),
          _frame("sglang/srt/models/llama.py", "forward", "    hidden_states = self.model(")),
     "cuda_graph_capture_failed_other", "graph capture"),
    # a stream synchronize raising (torch/cuda/streams.py): an asynchronous kernel fault
    (_cut(_frame("sglang/srt/managers/tp_worker_overlap_thread.py", "resolve_last_batch_result",
                 "    copy_done.synchronize()"),
          _frame("torch/cuda/streams.py", "synchronize", "    super().synchronize()")),
     "cuda_illegal_memory_access", "start"),
    # SGLang model_runner.py load_model calling the architecture resolver (models/registry.py)
    (_cut(_frame("sglang/srt/managers/router/model_runner.py", "load_model",
                 "    model_class = get_model_cls_by_arch_name(architectures)")),
     "model_load_error", "weights"),
    # vLLM v0 worker_base.py execute_method naming initialize_cache, right after the KV sizing
    (_cut(_frame("vllm/worker/worker_base.py", "execute_method", "    return executor(*args, **kwargs)"),
          head="INFO 06-28 06:11:45 distributed_gpu_executor.py:45] # GPU blocks: 378, # CPU blocks: 1638\n"
               "ERROR 06-28 06:11:45 worker_base.py:145] Error executing method initialize_cache. "
               "This might cause deadlock in distributed execution.\n"),
     "kv_cache_pool_too_small", "KV cache"),
    # vLLM v0: 229 blocks x 16 tokens < the engine config's max_seq_len=4096 (worker.py
    # raise_if_cache_size_invalid's check, read from the numbers the log printed before it)
    (_cut(_frame("vllm/entrypoints/llm.py", "__init__", "    self.llm_engine = LLMEngine.from_engine_args(engine_args)"),
          head="INFO 01-11 15:51:02 llm_engine.py:70] Initializing an LLM engine with config: model='m', "
               "dtype=torch.float16, max_seq_len=4096, tensor_parallel_size=1\n"
               "INFO 01-11 15:51:18 llm_engine.py:275] # GPU blocks: 229, # CPU blocks: 512\n"),
     "kv_cache_pool_too_small", "KV cache"),
])
def test_a_cut_traceback_is_read_where_it_stopped(log, expected, phase):
    _assert_reads(log, expected, phase)


@pytest.mark.parametrize("log, phase", [
    # the same initialize_cache failure after vLLM v0 began capturing: the capture, not the KV check
    (_cut(_frame("vllm/worker/worker_base.py", "execute_method", "    return executor(*args, **kwargs)"),
          head="INFO 01-01 00:00:00 llm_engine.py:1] # GPU blocks: 378, # CPU blocks: 1638\n"
               "INFO 01-01 00:00:01 model_runner.py:1] Capturing the model for CUDA graphs.\n"
               "ERROR 01-01 00:00:09 worker_base.py:145] Error executing method initialize_cache.\n"), "graph capture"),
    # blocks enough for max_seq_len (2290 x 16 >= 4096): the numbers are no evidence
    (_cut(_frame("vllm/entrypoints/llm.py", "__init__", "    self.llm_engine = LLMEngine.from_engine_args(engine_args)"),
          head="INFO 01-11 15:51:02 llm_engine.py:70] Initializing an LLM engine with config: max_seq_len=4096\n"
               "INFO 01-11 15:51:18 llm_engine.py:275] # GPU blocks: 2290, # CPU blocks: 512\n"), "KV cache"),
    # SGLang's scheduler loop cut in a batch's forward: no evidence of the cause, an honest unknown,
    # its phase read from the frame (scheduler.py run_batch)
    (_cut(_frame("sglang/srt/managers/scheduler.py", "run_batch",
                 "    batch_result = self.model_worker.forward_batch_generation(")), "serving a batch"),
])
def test_a_cut_traceback_without_evidence_of_its_cause_is_not_given_one(log, phase):
    c = classify(log)
    expected = "cuda_graph_capture_failed_other" if phase == "graph capture" else "unknown"
    assert (c.failure_class, c.phase or "start") == (expected, phase), c
    if expected == "unknown":
        assert c.signature == classify(log.replace("line 42", "line 77")).signature  # stable: numbers masked


def test_the_driver_apis_name_of_an_illegal_address_is_one():
    # the CUDA driver API's CUresult name (cuda.h CUDA_ERROR_ILLEGAL_ADDRESS = 700) without its text,
    # as numba's driver wrapper words it (numba/cuda/cudadrv/driver.py "Call to %s results in %s")
    c = classify("numba.cuda.cudadrv.driver.CudaAPIError: [700] Call to cuCtxSynchronize results in "
                 "CUDA_ERROR_ILLEGAL_ADDRESS\n")
    assert (c.failure_class, c.kind) == ("cuda_illegal_memory_access", "transient"), c


# ------------------------------------------------------------------ test6 round: wordings of other versions and vendors
@pytest.mark.parametrize("log, expected, phase", [
    # ROCm: torch's HIP build without the GPU's gfx target (pytorch#147626, #132570: wheels without
    # gfx1010 / gfx1102); torch's HIP wording of CUDA's cudaErrorInvalidDeviceFunction
    ("RuntimeError: HIP error: invalid device function\nHIP kernel errors might be asynchronously reported at "
     "some other API call, so the stacktrace below might be incorrect.\n", "arch_not_in_build", "start"),
    ("RuntimeError: CUDA error: invalid device function\n", "arch_not_in_build", "start"),
    # the HIP runtime's own lines (ROCm docs, troubleshooting: "hipErrorNoBinaryForGPU: Unable to find
    # code object for all current devices!"; hip_fatbin.cpp "Missing CO for these ISAs")
    ("hipErrorNoBinaryForGPU: Unable to find code object for all current devices!\n", "arch_not_in_build", "start"),
    (":1:hip_fatbin.cpp           :117 : 1234 us: [pid:1 tid:0x7f] Missing CO for these ISAs - \n"
     ":1:hip_fatbin.cpp           :120 : 1235 us: [pid:1 tid:0x7f]      amdgcn-amd-amdhsa--gfx1031\n",
     "arch_not_in_build", "start"),
    # rocBLAS's Tensile kernels missing for the gfx target (brknsoul/ROCmLibs#4, ROCm/rocBLAS#1339)
    ("rocBLAS error: Cannot read /opt/rocm/lib/rocblas/library/TensileLibrary.dat: No such file or directory "
     "for GPU arch : gfx1103\n", "arch_not_in_build", "start"),
    # torch < 1.13's _check_capability ("Found GPU0 ... which is of cuda capability 3.0. PyTorch no
    # longer supports this GPU because it is too old.")
    ("Found GPU0 Tesla K10 which is of cuda capability 3.0.\n    PyTorch no longer supports this GPU because it "
     "is too old.\n    The minimum cuda capability supported by this library is 3.7.\n", "arch_not_in_build", "start"),
    # vLLM 0.8+ v1/core/kv_cache_utils.py check_enough_kv_cache_memory, its line wrapped by the terminal
    ("(EngineCore_DP0 pid=1) ERROR 10-08 20:33:48 [core.py:708] ValueError: To serve at least one request with "
     "the models's max seq len (40960), (5.62 GiB KV cach\n", "kv_cache_pool_too_small", "start"),
    # TGI's sharded layers (flash_*_modeling.py "`num_heads` must be divisible by `num_shards` (got ...)")
    ("ValueError: `num_heads` must be divisible by `num_shards` (got `num_heads`: 40 and `num_shards`: 3\n",
     "server_args_incompatible", "start"),
    # vLLM's dtype check (worker.py _check_if_gpu_supports_dtype; platforms check_if_supports_dtype)
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU "
     "has compute capability 7.5. You can use float16 instead by explicitly setting the`dtype` flag in CLI, for "
     "example: --dtype=half.\n", "server_args_incompatible", "start"),
    (_cut(_frame("vllm/worker/worker.py", "init_model", "    _check_if_gpu_supports_dtype(self.model_config.dtype)"),
          _frame("vllm/worker/worker.py", "_check_if_gpu_supports_dtype")), "server_args_incompatible", "start"),
    # Ray compiled graphs under vLLM's Ray executor (ray/exceptions.py RayChannelTimeoutError; ray#59249)
    ("(EngineCore_DP0 pid=579) ERROR 12-05 22:43:45 [core.py:845] ray.exceptions.RayChannelTimeoutError: System "
     "error: Timed out waiting for object available to read. ObjectID: 007e768e7da845eb\n",
     "engine_hang_detected", "start"),
    # NCCL socket.cc with EPIPE, and proxy.cc's transport Connect failing (nccl 2.12-2.27 wordings)
    ("n1:9:9 [0] misc/socket.cc:538 NCCL WARN Net : Call to recv from 10.0.0.3<41234> failed : Broken pipe\n",
     "nccl_network_error", "start"),
    ("n1:9:20 [0] proxy.cc:1119 NCCL WARN [Proxy Service 3] Failed to execute operation Connect from rank 3, "
     "retcode 6\nn1:9:9 [0] proxy.cc:862 NCCL WARN Proxy Call to rank 3 failed (Connect)\n",
     "nccl_network_error", "start"),
])
def test_families_of_the_test6_round(log, expected, phase):
    _assert_reads(log, expected, phase)


@pytest.mark.parametrize("log, not_class", [
    # torch's watchdog wraps what it caught (ProcessGroupNCCL.cpp "NCCL watchdog thread terminated with
    # exception: %s"): a CUDA error it raised is no collective timeout
    ("[E ProcessGroupNCCL.cpp:916] [Rank 3] NCCL watchdog thread terminated with exception: CUDA error: unknown "
     "error\n", "collective_hang_or_timeout"),
    # the proxy's Connect failing after a rank of the log crashed: the crash, not the network
    ("Segmentation fault (core dumped)\nn1:9:20 [0] proxy.cc:1119 NCCL WARN [Proxy Service 3] Failed to execute "
     "operation Connect from rank 3, retcode 6\n", "nccl_network_error"),
])
def test_the_test6_families_keep_their_guards(log, not_class):
    c = classify(log)
    assert c.failure_class != not_class and c.kind != "infra", c


def test_the_watchdogs_collective_timeout_is_still_a_hang():
    # ProcessGroupNCCL.cpp: the watchdog's own timeout, wrapped the same way
    c = classify("[rank1]:[E ProcessGroupNCCL.cpp:1414] [PG 1 Rank 1] Process group watchdog thread terminated with "
                 "exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=GATHER) "
                 "ran for 600027 milliseconds before timing out.\n")
    assert c.failure_class == "collective_hang_or_timeout", c


@pytest.mark.parametrize("log, expected, phase", [
    # DJL Serving's relay of the engine's stderr (the LMI containers): its prefix hides the frames; cut
    # in torch's inference_mode wrapper (_contextlib.py decorate_context) around vLLM v0's capture_model
    ("WARN  PyProcess W-1-model-stderr:   File \"/usr/lib/python3.10/site-packages/vllm/worker/worker.py\", line 125, "
     "in warm_up_model\nWARN  PyProcess W-1-model-stderr:     self.model_runner.capture_model(self.gpu_cache)\n"
     "WARN  PyProcess W-1-model-stderr:   File \"/usr/lib/python3.10/site-packages/torch/utils/_contextlib.py\", "
     "line 115, in decorate_context\n", "cuda_graph_capture_failed_other", "graph capture"),
    # both engines' loaders build the model class from its config in _initialize_model before reading
    # any weight (sglang srt/model_loader/loader.py, vllm model_loader/loader.py)
    (_cut(_frame("sglang/srt/model_executor/model_runner.py", "load_model", "    self.model = get_model("),
          _frame("sglang/srt/model_loader/loader.py", "load_model", "    model = _initialize_model(")),
     "model_load_error", "weights"),
])
def test_a_cut_traceback_reads_through_wrappers_and_the_model_constructor(log, expected, phase):
    _assert_reads(log, expected, phase)


def test_a_log_that_ends_on_an_error_after_ready_is_not_healthy():
    # sglang disaggregation/decode.py: the decode side of a PD deployment failing a request's KV transfer
    # ("Decode transfer failed for request rank=... with exception KVTransferError(...)") after ready
    log = ("[2026-01-01 10:00:00] The server is fired up and ready to roll!\n"
           '[2026-01-01 10:00:04] INFO:     127.0.0.1:32770 - "GET /health HTTP/1.1" 200 OK\n'
           "[2026-01-01 10:01:09 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='7f' "
           "with exception KVTransferError(bootstrap_room=1): Failed to get kvcache from prefill instance\n")
    c = classify(log)
    assert not c.healthy and c.failure_class == "unknown" and "Decode transfer failed" in c.line, c
    # a request the server answered (4xx) after its error line: served, still healthy (vllm
    # entrypoints serving_chat.py "Error with model ... does not exist" then the 404 it answers)
    ok = ("INFO:     Application startup complete.\n"
          "ERROR 03-18 09:02:03 [serving_chat.py:133] Error with model object='error' message='The model `m` does "
          "not exist.' type='NotFoundError' param=None code=404\n"
          'INFO:     10.0.0.1:12475 - "POST /v1/chat/completions HTTP/1.1" 404 Not Found\n')
    assert classify(ok).healthy
