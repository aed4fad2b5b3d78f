"""The emulated server process: HTTP API, pacing vs the model, failures, faults, teardown."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import psutil
import pytest

from tasks.emulator.model import evaluate_argv
from tasks.emulator.profile import default_profile
from tasks.emulator.testing import EAGLE_FLAGS, baseline_flags, emulated_servers


@pytest.fixture
def server_factory(tmp_path):
    """Start emulated servers through tasks.server (launch / wait_healthy / terminate)."""
    with emulated_servers(tmp_path) as start:
        yield start


def _tree(pid):
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _stream(url, n, ids=(1, 2, 3, 4), timeout=30.0):
    """Tiny streaming client: returns (chunks, t_first_token, t_last_token)."""
    chunks, times = [], []
    body = {"input_ids": list(ids), "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
            "stream": True}
    with httpx.stream("POST", url + "/generate", json=body, timeout=timeout) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                chunks.append("DONE")
                break
            chunks.append(json.loads(line[6:]))
            times.append(time.monotonic())
    return chunks, times


def test_baseline_rate_through_http_matches_model(server_factory):
    flags = baseline_flags(128)
    srv = server_factory(flags)
    srv.wait_healthy()
    chunks, times = _stream(srv.base_url, 128)
    assert chunks[-1] == "DONE"
    last = chunks[-2]
    assert last["meta_info"]["completion_tokens"] == 128
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    assert chunks[0]["meta_info"]["finish_reason"] is None
    assert last["meta_info"]["spec_verify_ct"] == 128
    measured = 127 / (times[-1] - times[0])
    model = evaluate_argv(default_profile({"noise": 0.0}), flags).decode_tok_s
    assert abs(measured / model - 1) < 0.03, (measured, model)
    log = srv.log_text()
    assert "The server is fired up and ready to roll!" in log
    assert "Capture cuda graph end" in log


def test_eagle_meta_info_and_rate(server_factory):
    flags = baseline_flags(128, *EAGLE_FLAGS)
    srv = server_factory(flags)
    srv.wait_healthy()
    chunks, times = _stream(srv.base_url, 200)
    last = chunks[-2]
    mi = last["meta_info"]
    assert mi["completion_tokens"] == 200 and len(last["output_ids"]) == 200
    tau = mi["completion_tokens"] / mi["spec_verify_ct"]
    assert 1.5 < tau < 1.9  # model tau 1.670
    assert any(len(b["output_ids"]) - len(a["output_ids"]) > 1 for a, b in zip(chunks[:-2], chunks[1:-1]))
    pred = evaluate_argv(default_profile({"noise": 0.0}), flags)
    measured = 199 / (times[-1] - times[0])
    assert abs(measured / pred.decode_tok_s - 1) < 0.06, (measured, pred.decode_tok_s)
    info = httpx.get(srv.base_url + "/get_server_info").json()
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1.0
    assert info["speculative_num_draft_tokens"] == 4 and info["tp_size"] == 8


def test_tokens_identical_across_configs_and_openai_api(server_factory):
    a = server_factory(baseline_flags(128))
    b = server_factory(baseline_flags(128, *EAGLE_FLAGS))
    a.wait_healthy()
    b.wait_healthy()
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 12}}
    ra = httpx.post(a.base_url + "/generate", json=body, timeout=10).json()
    rb = httpx.post(b.base_url + "/generate", json=body, timeout=10).json()
    assert ra["output_ids"] == rb["output_ids"] and len(ra["output_ids"]) == 12
    # non-streaming responses report the last step: finished, one verify per token without EAGLE
    assert ra["meta_info"]["finish_reason"] == rb["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert ra["meta_info"]["spec_verify_ct"] == 12
    assert 1 <= rb["meta_info"]["spec_verify_ct"] <= 11
    c = httpx.post(a.base_url + "/v1/completions", json={"model": "m", "prompt": "hello world", "max_tokens": 5},
                   timeout=10).json()
    # SGLang's UsageInfo: these three plus prompt_tokens_details / reasoning_tokens / completion_tokens_details
    assert {k: c["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert c["choices"][0]["finish_reason"] == "length"
    assert httpx.get(a.base_url + "/health_generate", timeout=10).status_code == 200
    assert httpx.get(a.base_url + "/get_model_info").json()["model_path"] == "moonshotai/Kimi-K2.5"
    assert httpx.get(a.base_url + "/v1/models").json()["data"][0]["id"] == "moonshotai/Kimi-K2.5"
    assert httpx.post(a.base_url + "/flush_cache").text == "Cache flushed.\n"
    bad = httpx.post(a.base_url + "/generate", content=b"not json", timeout=10)
    # FastAPI's RequestValidationError through SGLang's handler: the ErrorResponse shape
    assert bad.status_code == 400 and bad.json()["object"] == "error" and bad.json()["type"] == "Bad Request"
    assert bad.json()["code"] == 400 and "JSON decode error" in bad.json()["message"]


def test_corrupt_tokens_fault_changes_output(server_factory):
    a = server_factory(baseline_flags(128))
    b = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"})
    a.wait_healthy()
    b.wait_healthy()
    body = {"input_ids": [9, 9], "sampling_params": {"max_new_tokens": 6}}
    ra = httpx.post(a.base_url + "/generate", json=body, timeout=10).json()["output_ids"]
    rb = httpx.post(b.base_url + "/generate", json=body, timeout=10).json()["output_ids"]
    assert ra[0] == rb[0] and ra[1:] != rb[1:]


def test_health_503_until_ready(server_factory):
    srv = server_factory(baseline_flags(128), emulator={"time_scale": 0.02})  # ~3.6 s startup
    saw_503 = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20:
        try:
            code = httpx.get(srv.base_url + "/health", timeout=1).status_code
        except httpx.HTTPError:
            code = None
        if code == 503:
            saw_503 = True
        if code == 200:
            break
        time.sleep(0.02)
    assert saw_503 and code == 200


def test_argparse_errors_exit_2(server_factory):
    srv = server_factory(["--model-path", "m", "--tp-size", "8", "--cuda-graph-max-bs", "128"])
    assert srv.proc.wait(20) == 2
    log = srv.log_text()
    assert "usage: launch_server.py" in log
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, " \
           "--cuda-graph-max-bs-prefill" in log
    srv2 = server_factory(["--model-path", "m", "--no-such-flag"])
    assert srv2.proc.wait(20) == 2 and "error: unrecognized arguments: --no-such-flag" in srv2.log_text()


def test_fusion_failure_sigkills_itself_and_children(server_factory):
    flags = ["--model-path", "m", "--tp-size", "8", "--disable-custom-all-reduce",
             "--enable-flashinfer-allreduce-fusion"]
    srv = server_factory(flags, emulator={"time_scale": 0.01})  # fails ~1.7 s after launch
    kids, t0 = [], time.monotonic()
    while len(kids) < 2 and time.monotonic() - t0 < 5:
        kids = [c.pid for c in _tree(srv.proc.pid)[1:]]
        time.sleep(0.02)
    assert srv.proc.wait(20) == -signal.SIGKILL
    log = srv.log_text()
    assert "Capture cuda graph failed: No supported CUDA architectures found for major versions [9, 10]." in log
    assert log.rstrip().endswith("Received sigquit from a child process. It usually means the child failed.")
    time.sleep(0.2)
    assert kids and not any(psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE
                            for k in kids)


def test_sigterm_kills_children_and_exits_0(server_factory):
    srv = server_factory(baseline_flags(128))
    srv.wait_healthy()
    kids = _tree(srv.proc.pid)[1:]
    assert len(kids) >= 2
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(10) == 0
    psutil.wait_procs(kids, timeout=5)
    assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)


def test_orphan_children_survive_parent(server_factory):
    srv = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": "orphan_children"})
    srv.wait_healthy()
    kids = _tree(srv.proc.pid)[1:]
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(10) == 0
    time.sleep(0.3)
    assert kids and all(k.is_running() for k in kids)
    os.killpg(srv.proc.pid, signal.SIGKILL)  # the process group still reaches them
    gone, alive = psutil.wait_procs(kids, timeout=5)
    assert not alive


def test_ignore_sigterm_needs_sigkill(server_factory):
    srv = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": "ignore_sigterm"})
    srv.wait_healthy()
    os.killpg(srv.proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert srv.proc.poll() is None and all(p.is_running() for p in _tree(srv.proc.pid))
    os.killpg(srv.proc.pid, signal.SIGKILL)
    assert srv.proc.wait(10) == -signal.SIGKILL


@pytest.mark.parametrize("fault,expect", [("crash_bench", -9), ("early_exit", 0)])
def test_bench_faults_exit_mid_stream(server_factory, fault, expect):
    srv = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": fault})
    srv.wait_healthy()
    got = 0
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", srv.base_url + "/generate", timeout=10,
                          json={"input_ids": [1], "sampling_params": {"max_new_tokens": 100}, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    got = json.loads(line[6:])["meta_info"]["completion_tokens"]
    assert 0 < got < 100
    assert srv.proc.wait(10) == expect


def test_stall_bench_keeps_process(server_factory):
    srv = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": "stall_bench"})
    srv.wait_healthy()
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", srv.base_url + "/generate", timeout=httpx.Timeout(10, read=1.0),
                          json={"input_ids": [1], "sampling_params": {"max_new_tokens": 100}, "stream": True}) as r:
            for _ in r.iter_lines():
                pass
    assert srv.proc.poll() is None


def test_hang_and_crash_startup(server_factory):
    hang = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": "hang_startup"})
    crash = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": "crash_startup"})
    assert crash.proc.wait(20) == -signal.SIGKILL
    time.sleep(1.0)
    assert hang.proc.poll() is None
    assert httpx.get(hang.base_url + "/health", timeout=2).status_code == 503
    assert "Capture cuda graph begin" in hang.log_text()


def test_late_bind(server_factory):
    srv = server_factory(baseline_flags(128), env={"SERVESWEEP_EMULATOR_FAULT": "late_bind",
                                                   "SERVESWEEP_EMULATOR_FAULT_AFTER_S": "1.5"})
    waited = srv.wait_healthy()
    assert waited >= 1.4
