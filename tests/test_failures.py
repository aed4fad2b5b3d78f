"""Tests for tasks.failures: the shared failure cases, variants, exit-code semantics, fuzz, CLI."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.failures import (
    HEALTHY,
    KIND,
    PRECEDENCE,
    SIGNATURES,
    Classification,
    classify,
    detect_perf_findings,
    detect_perf_tags,
    harness_classification,
    normalize_line,
    spec_no_speedup,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SERVESWEEP_SHARED_DIR", REPO.parent / "shared")).resolve()
DATA = SHARED / "data"
FAILURES = DATA / "failures"

needs_shared = pytest.mark.skipif(not (FAILURES / "cases.yaml").is_file(),
                                  reason=f"shared failure cases not found under {SHARED} (set SERVESWEEP_SHARED_DIR)")


def _cases() -> list[dict]:
    if not (FAILURES / "cases.yaml").is_file():
        return []
    return yaml.safe_load((FAILURES / "cases.yaml").read_text())["cases"]


CASES = _cases()
CASE_IDS = [c["id"] for c in CASES]


def _log(case: dict) -> str:
    return (FAILURES / case["log"]).read_text()


# ------------------------------------------------------------------ the shared cases
@needs_shared
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_case_classifies_to_expected(case):
    c = classify(_log(case), case["exit_code"])
    assert isinstance(c, Classification)
    assert c.failure_class == case["expected_class"], (case["id"], c)
    assert c.kind == KIND[case["expected_class"]]
    assert c.line and c.line in _log(case)  # the decisive line is a real line of the log
    assert c.signature == normalize_line(c.line)


@needs_shared
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_case_with_its_phase(case):
    """The harness also passes the phase; a specific signature still wins over phase rules."""
    text = _log(case)
    phase = "bench" if "fired up and ready to roll" in text else "startup"
    if case["exit_code"] == 0:
        phase = None  # healthy server: perf classification, no lifecycle phase failed
    assert classify(text, case["exit_code"], phase).failure_class == case["expected_class"]


@needs_shared
def test_kind_table_complete_vs_canonical_classes():
    text = (DATA / "failure_classes.md").read_text()
    canonical: dict[str, str] = {}
    for m in re.finditer(r"^\|\s*([a-z0-9_]+)\b[^|]*\|\s*(deterministic|transient|infra|perf)\s*\|", text, re.M):
        canonical[m.group(1)] = m.group(2)
    assert len(canonical) >= 30
    # the shared classes keep their names and kinds; the others are the documented additions
    assert {c: KIND.get(c) for c in canonical} == canonical
    from tasks.failure_signatures import TABLES

    assert set(KIND) - set(canonical) == set(TABLES.added)


def test_every_class_is_in_the_table_and_vice_versa():
    assert set(PRECEDENCE) == set(KIND)
    assert all(s.failure_class in KIND for s in SIGNATURES)
    # rows of one class are contiguous, so class precedence is well defined
    seen: list[str] = []
    for s in SIGNATURES:
        if not seen or seen[-1] != s.failure_class:
            assert s.failure_class not in seen, f"{s.failure_class} rows are not contiguous"
            seen.append(s.failure_class)
    assert PRECEDENCE[-1] == "unknown"


@needs_shared
def test_precedence_follows_taxonomy_order():
    text = (DATA / "failure_taxonomy.md").read_text()
    block = text.split("Suggested match precedence", 1)[1].split("Rationale", 1)[0]
    order = re.findall(r"`([a-z0-9_]+)`", block)
    assert len(order) > 15
    pos = [PRECEDENCE.index(c) for c in order]
    assert pos == sorted(pos), order


# ------------------------------------------------------------------ variants
def _perturb(text: str, rng: random.Random) -> str:
    """Same failure, other run: timestamps, ranks, pids, line numbers, sizes, paths, hosts."""
    def ts(_m):
        day = f"2027-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        return f"{day} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"

    subs = [
        (r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", ts),
        (r"(?<![A-Za-z])TP\d+", lambda m: f"TP{rng.randint(0, 15)}"),
        (r"EP\d+", lambda m: f"EP{rng.randint(0, 15)}"),
        (r"pid=\d+", lambda m: f"pid={rng.randint(2, 99999)}"),
        (r"line \d+", lambda m: f"line {rng.randint(1, 3000)}"),
        (r"\brank(\d+)\]", lambda m: f"rank{rng.randint(0, 15)}]"),
        (r"Rank \d+", lambda m: f"Rank {rng.randint(0, 15)}"),
        (r"\d+\.\d+ (GB|GiB|MiB)", lambda m: f"{rng.uniform(0.1, 900):.2f} {m.group(1)}"),
        (r"#tokens: \d+", lambda m: f"#tokens: {rng.randint(1000, 900000)}"),
        (r"<VENV>", lambda m: rng.choice(["/usr/local/lib/python3.12/dist-packages",
                                          "/home/u/.venv/lib/python3.11/site-packages"])),
        (r"<HOST>", lambda m: rng.choice(["gpu-node-07", "a100x8.example.org", "worker3"])),
        (r"<MODEL>", lambda m: rng.choice(["/models/kimi-k2.5", "/mnt/ckpt/qwen3-235b"])),
        (r"<PORT>", lambda m: str(rng.randint(20000, 40000))),
    ]
    for pat, fn in subs:
        text = re.sub(pat, fn, text)
    return text


@needs_shared
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_variant_same_class_and_signature(case):
    text = _log(case)
    base = classify(text, case["exit_code"])
    for seed in range(3):
        v = _perturb(text, random.Random(seed))
        assert v != text or "<" not in text
        c = classify(v, case["exit_code"])
        assert c.failure_class == case["expected_class"], (seed, c)
        assert c.signature == base.signature, (seed, c.line)


@needs_shared
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_truncated_logs_still_classify(case):
    text = _log(case)
    lines = text.splitlines()
    base = classify(text, case["exit_code"])
    i = lines.index(base.line)
    # a log tail: everything older than a few lines before the decisive one is gone
    head_cut = "\n".join(lines[max(0, i - 3):])
    assert classify(head_cut, case["exit_code"]).failure_class == case["expected_class"]
    # the log captured up to the decisive line (launcher's sigquit/self-kill lines lost)
    tail_cut = "\n".join(lines[: i + 1])
    assert classify(tail_cut, case["exit_code"]).failure_class == case["expected_class"]
    # a byte-level tail that starts mid-line
    start = max(0, text.index(base.line) - 150)
    assert classify(text[start:], case["exit_code"]).failure_class == case["expected_class"]


# ------------------------------------------------------------------ normalization
def test_signature_groups_logs_differing_only_in_numbers():
    a = ("[2026-02-01 10:00:00 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
         '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/foo.py", line 41, in bar\n'
         "RuntimeError: widget 0x7f3a2b exploded after 1234 steps on cuda:3 (10.0.0.12:29500)\n")
    b = ("[2027-11-30 23:59:59 TP6] Scheduler hit an exception: Traceback (most recent call last):\n"
         '  File "/usr/lib/python3.12/dist-packages/sglang/srt/foo.py", line 977, in bar\n'
         "RuntimeError: widget 0xdeadbeef exploded after 7 steps on cuda:5 (192.168.4.2:30001)\n")
    ca, cb = classify(a, -9, "bench"), classify(b, -9, "bench")
    assert ca.failure_class == cb.failure_class == "server_crash"
    assert ca.signature == cb.signature
    assert "exploded" in ca.signature and "1234" not in ca.signature and "10.0.0.12" not in ca.signature
    other = classify(a.replace("exploded", "imploded"), -9, "bench")
    assert other.signature != ca.signature


def test_unknown_failures_group_by_normalized_line():
    a = classify("starting\nFooError: flux capacitor at 88 mph on node-3:4000\n", 1, "startup")
    b = classify("starting\nFooError: flux capacitor at 121 mph on node-9:4100\n", 1, "startup")
    assert a.failure_class == b.failure_class == "unknown"
    assert a.kind == "transient"
    assert a.signature == b.signature == "FooError: flux capacitor at <N> mph on <HOST>:<PORT>"


@pytest.mark.parametrize("raw, expected", [
    ("[2026-01-01 10:00:01 TP3] x", "[<TS> TP<R>] x"),
    ("(Worker_TP1_EP1 pid=120) ERROR y", "(Worker_TP<R>_EP<R> pid=<N>) ERROR y"),
    ("open /dev/shm/nccl-AbCd12 failed", "open <PATH> failed"),
    ("comm 0x55d0 rank 0", "comm <HEX> rank <R>"),
    ("connect 10.1.2.3:29500 refused", "connect <IP> refused"),
    ("enqueue.cc:1390 NCCL WARN", "enqueue.cc:<N> NCCL WARN"),
    ("sglang 0.5.23 on sm_120", "sglang <V> on sm_120"),
    ("capability: 120.", "capability: <N>."),
])
def test_normalize_line(raw, expected):
    assert normalize_line(raw) == expected


# ------------------------------------------------------------------ exit-code and phase semantics
TB = "Traceback (most recent call last):\n"
SIGQUIT = "[2026-01-01 00:00:09] Received sigquit from a child process. It usually means the child failed.\n"
READY = "[2026-01-01 00:00:05] The server is fired up and ready to roll!\n"


@pytest.mark.parametrize("log, exit_code, phase, expected", [
    # exit 2 + usage, error line lost -> argparse rejected the CLI
    ("usage: launch_server.py [-h] --model-path MODEL_PATH\n", 2, "startup", "cli_arg_error"),
    ("usage: launch_server.py [-h]\nlaunch_server.py: error: argument --tp-size: invalid int value: 'x'\n",
     2, "startup", "cli_arg_error"),
    # -9 without sigquit/traceback: host OOM only with the OOM-killer evidence
    ("Load weight begin\n[dmesg] Out of memory: Killed process 4242 (python3) total-vm:9000kB\n",
     -9, "startup", "host_oom_killed"),
    ("Load weight begin\nKilled\n", -9, "startup", "startup_timeout"),
    ("Load weight begin\nKilled\n", -9, None, "unknown"),
    # sglang#5095: shell "Killed" after SGLang's self-kill; the real cause is above
    (TB + "  File \"/x/sglang/srt/model_loader/loader.py\", line 5, in load_weights\n"
     "KeyError: 'model.layers.55.mlp.gate_up_proj.input_scale'\n" + SIGQUIT + "Killed\n", 137, None,
     "model_weights_error"),
    # startup deadline with the process still running
    ("[x TP0] Load weight begin. avail mem=94.10 GB\n", None, "startup", "startup_timeout"),
    ("[x TP0] Init torch distributed begin.\n", None, "startup", "collective_hang_or_timeout"),
    ("[x TP0] Init torch distributed begin.\n", None, None, "collective_hang_or_timeout"),
    # after healthy
    (READY + "[x TP0] Decode batch. #running-req: 1\n" + TB + "RuntimeError: boom\n" + SIGQUIT, -9, "bench",
     "server_crash"),
    (READY + TB + "RuntimeError: CUDA error: an illegal memory access was encountered\n" + SIGQUIT, -9, "bench",
     "cuda_illegal_memory_access"),
    (READY + "[x TP0] Decode batch. #running-req: 1\n", None, "bench", "bench_stall"),
    # no phase given and no failure after ready: the log alone shows a healthy server
    (READY + "[x TP0] Decode batch. #running-req: 1\n", None, None, "healthy"),
    (READY, 0, "bench", "early_exit"),
    (READY, None, "teardown", "teardown_timeout"),
    # OOM: capture stage vs runtime
    ("Capture cuda graph begin. avail mem=2 GB\n" + TB + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n",
     -9, "startup", "cuda_oom_graph_capture"),
    (READY + TB + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n", -9, "bench", "cuda_oom_runtime"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n", -9, "startup",
     "kv_cache_pool_too_small"),
    # [9, 10] arch list with fusion explicitly disabled is another module -> unsupported arch kernel
    ("server_args=ServerArgs(enforce_disable_flashinfer_allreduce_fusion=True)\n"
     "Exception: Capture cuda graph failed: No supported CUDA architectures found for major versions [9, 10].\n",
     -9, "startup", "unsupported_arch_kernel"),
    ("Exception: Capture cuda graph failed: No supported CUDA architectures found for major versions [10].\n",
     -9, "startup", "unsupported_arch_kernel"),
    ("Exception: Capture cuda graph failed: Triton Error [CUDA]: misaligned address\nPossible solutions:\n",
     -9, "startup", "cuda_graph_capture_failed_other"),
    # NCCL invalid usage is the algo/proto class only when an algorithm or protocol is pinned
    ("env: NCCL_PROTO=LL128\nRuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)\n",
     -9, "startup", "nccl_env_algo_proto_invalid"),
    ("Exception: Capture cuda graph failed: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)\n",
     -9, "startup", "nccl_graph_capture_error"),
    ("OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use\n",
     1, "startup", "port_in_use"),
    ("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.\n", None, "bench",
     "health_check_failed"),
    # "near" guards look at traceback frames, not at knob names echoed in the server_args line
    ("server_args=ServerArgs(moe_runner_backend='auto', speculative_eagle_topk=2)\n" + TB +
     '  File "<VENV>/sglang/srt/server_args.py", line 2400, in _handle_speculative_decoding\n'
     "    assert self.speculative_num_steps is not None\nAssertionError\n", 1, "startup", "spec_decode_config_error"),
    ("server_args=ServerArgs(enable_torch_symm_mem=False, disable_custom_all_reduce=True)\n" + TB +
     '  File "<VENV>/sglang/srt/layers/foo.py", line 3, in bar\nKeyError: 12\n' + SIGQUIT, -9, "startup", "unknown"),
    ("server_args=ServerArgs(disable_custom_all_reduce=True)\n" + TB +
     '  File "<VENV>/sglang/srt/layers/foo.py", line 3, in bar\nRuntimeError: invalid argument\n' + SIGQUIT,
     -9, "startup", "unknown"),
    # vLLM-style warnings that are perf information, not the failure
    ("WARNING SymmMemCommunicator: Device capability 12.0 not supported, communicator is not available.\n"
     "Loading safetensors checkpoint shards:   3% Completed | 3/94\n", None, "startup", "startup_timeout"),
    # an empty log alone is no evidence of waiting; a caller saying it was still starting is
    ("", None, None, "unknown"),
    ("", None, "startup", "startup_timeout"),
    ("", 1, None, "unknown"),
])
def test_exit_code_and_phase_semantics(log, exit_code, phase, expected):
    c = classify(log, exit_code, phase)
    assert c.failure_class == expected, c
    assert c.kind == (HEALTHY if expected == HEALTHY else KIND[expected])


def test_healthy_server_with_degraded_path_is_perf():
    log = "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs.\n" + READY
    c = classify(log, 0)
    assert (c.failure_class, c.kind) == ("allreduce_path_degraded", "perf")
    # the same warning in a failed startup is not the failure
    assert classify(log.replace(READY, ""), -9, "startup").failure_class == "startup_timeout"


def test_harness_classification():
    c = harness_classification("gpu_busy", "GPU 3 holds 1234 MiB before launch")
    assert (c.failure_class, c.kind) == ("gpu_busy", "infra")
    assert c.signature == "GPU <N> holds <N> MiB before launch"
    with pytest.raises(KeyError):
        harness_classification("not_a_class")


# ------------------------------------------------------------------ perf helpers
@needs_shared
def test_detect_perf_tags_on_shared_logs():
    by_id = {c["id"]: c for c in CASES}
    assert "spec_decode_no_speedup" in detect_perf_tags(_log(by_id["B16"]))
    assert detect_perf_tags(_log(by_id["B18"])) == ["spec_decode_no_speedup"]
    b12 = detect_perf_findings(_log(by_id["B12"]))
    assert {f.path for f in b12} == {"custom_allreduce", "torch_symm_mem"}
    assert detect_perf_tags(_log(by_id["B12"])) == ["allreduce_path_degraded"]
    # only the paths the trial expected to run count when expected_paths is given
    assert detect_perf_tags(_log(by_id["B12"]), {"custom_allreduce": False}) == []
    assert detect_perf_tags(_log(by_id["B12"]), {"custom_allreduce": True}) == ["allreduce_path_degraded"]
    # the allreduce level form returned by tasks.backends.sglang.knobs.render_launch
    assert detect_perf_tags(_log(by_id["B12"]), {"allreduce": "custom"}) == ["allreduce_path_degraded"]
    assert detect_perf_tags(_log(by_id["B12"]), {"allreduce": "torch_symm_mem"}) == ["allreduce_path_degraded"]
    assert detect_perf_tags(_log(by_id["B12"]), {"allreduce": "nccl"}) == []
    assert detect_perf_tags(_log(by_id["B12"]), {"allreduce": "flashinfer_fusion"}) == []


def test_detect_perf_tags_faster_spec_is_not_a_finding():
    log = ("[bench] baseline (no spec) Output token throughput (tok/s): 61.0\n"
           "[bench] this trial Output token throughput (tok/s): 88.0\n")
    assert detect_perf_tags(log) == []
    assert detect_perf_tags(log.replace("88.0", "60.9")) == ["spec_decode_no_speedup"]
    assert detect_perf_tags("FlashInfer allreduce fusion is disabled on this GPU\n") == ["allreduce_path_degraded"]
    # our own rendered flags are not a finding
    assert detect_perf_tags("$ python -m sglang.launch_server --enforce-disable-flashinfer-allreduce-fusion "
                            "--cuda-graph-backend-decode=disabled\n") == []


@pytest.mark.parametrize("t, b, expected", [(59.0, 61.0, True), (61.0, 61.0, True), (54.1, 82.0, True),
                                            (90.0, 82.0, False), (0.0, 1.0, True)])
def test_spec_no_speedup(t, b, expected):
    assert spec_no_speedup(t, b) is expected


def test_spec_no_speedup_threshold_and_errors():
    assert spec_no_speedup(83.0, 82.0, min_speedup=1.05) is True
    for bad in [(1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf")), (-1.0, 2.0), ("1", 2.0)]:
        with pytest.raises(ValueError):
            spec_no_speedup(*bad)


# ------------------------------------------------------------------ fuzz
def _healthy_ok(c, exit_code, phase) -> bool:
    """``healthy`` only without a phase, without a failing exit code, on a line of the log."""
    return c.healthy and c.kind == HEALTHY and phase is None and exit_code in (None, 0) and bool(c.line)


_PHASES = st.sampled_from([None, "preflight", "startup", "warmup", "bench", "teardown"])
_EXITS = st.one_of(st.none(), st.integers(min_value=-64, max_value=300))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=2000), exit_code=_EXITS, phase=_PHASES)
def test_fuzz_random_text_never_raises(text, exit_code, phase):
    c = classify(text, exit_code, phase)
    assert (c.failure_class in KIND and c.kind == KIND[c.failure_class]) or _healthy_ok(c, exit_code, phase)
    assert not c.signature.startswith("<classifier error")
    assert len(c.signature) <= 300


_ALL_LOGS = [p.read_text() for p in sorted((FAILURES / "logs").glob("*.log"))] if FAILURES.is_dir() else ["x"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(idx=st.integers(min_value=0, max_value=max(0, len(_ALL_LOGS) - 1)), a=st.floats(0, 1), b=st.floats(0, 1),
       junk=st.text(max_size=50), exit_code=_EXITS, phase=_PHASES)
def test_fuzz_truncated_real_logs_never_raise(idx, a, b, junk, exit_code, phase):
    text = _ALL_LOGS[idx]
    lo, hi = sorted((int(a * len(text)), int(b * len(text))))
    c = classify(junk + text[lo:hi] + junk, exit_code, phase)
    assert c.failure_class in KIND or _healthy_ok(c, exit_code, phase)
    assert not c.signature.startswith("<classifier error")


def test_huge_single_line_is_fast():
    import time

    t0 = time.perf_counter()
    c = classify("a" * 2_000_000 + "\nKeyError: 12\n" + "(" * 100_000, -9, "startup")
    assert c.failure_class in KIND
    assert time.perf_counter() - t0 < 5.0


# ------------------------------------------------------------------ CLI
@needs_shared
def test_cli_prints_path_class_kind_signature():
    logs = [str(FAILURES / "logs" / n) for n in ("B01.log", "B22.log")]
    r = subprocess.run([sys.executable, "-m", "tasks.failures", "--tsv", "--exit-code", "-9", *logs],
                       cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stderr  # the logs show failures
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert [row[0] for row in rows] == logs
    assert [row[1] for row in rows] == ["flashinfer_allreduce_fusion_unsupported_arch", "cli_arg_error"]
    assert [row[2] for row in rows] == ["deterministic", "deterministic"]
    assert all(len(row) == 4 and row[3] for row in rows)


def test_cli_exit_code_flag_and_missing_file(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("[x TP0] Init torch distributed begin.\n")
    r = subprocess.run([sys.executable, "-m", "tasks.failures", "--tsv", "--exit-code", "none", "--phase", "startup",
                        str(log), str(tmp_path / "missing.log")],
                       cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert r.stdout.split("\t")[1] == "collective_hang_or_timeout"
    assert "missing.log" in r.stderr


def test_cli_a_bad_exit_code_says_what_to_give(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tasks.failures", "--exit-code", "abc", str(tmp_path / "x.log")],
                       cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert "--exit-code: 'abc': give the exit code as an integer" in r.stderr and "'none'" in r.stderr
    assert "_exit_code_arg" not in r.stderr



def test_cli_reads_a_corpus_entry_as_its_log_field(tmp_path, capsys):
    """A corpus entry file is classified on its ``log`` field with its exit code, never on the
    person's ``why:`` sentence (which names the cause in words a signature would match)."""
    from tasks.failures import main

    entry = tmp_path / "x-1.yaml"
    entry.write_text(yaml.safe_dump({
        "id": "x-1", "exit_code": None, "expected_class": "healthy", "expected_kind": "healthy",
        "why": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "log": "[2025-01-01 00:00:00] INFO:     Started server process [1]\n"
               "[2025-01-01 00:00:02] The server is fired up and ready to roll!\n"
               "[2025-01-01 00:00:03] INFO:     127.0.0.1:5000 - \"POST /generate HTTP/1.1\" 200 OK\n"}))
    assert main(["--nearest", "0", str(entry)]) == 0
    out = capsys.readouterr().out
    assert "class:    healthy" in out and "illegal memory access" not in out
    assert "corpus entry x-1: its log field; expected healthy (healthy)" in out
    plain = tmp_path / "plain.yaml"  # a YAML file that is not an entry is read as it is
    plain.write_text("key: value\n")
    assert main(["--tsv", str(plain)]) == 1 and capsys.readouterr().out.startswith(f"{plain}\t")

@needs_shared
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_redacted_log_classifies_the_same(case):
    """Logs are redacted before they leave the node; redaction must not hide a signature."""
    from tasks.redact import redact_text

    text = _log(case)
    assert classify(redact_text(text), case["exit_code"]) == classify(text, case["exit_code"])


@pytest.mark.parametrize("line", [
    "[2026-11-29 10:00:00 TP0] Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs.",
    "[2026-11-29 10:00:00 TP3] CustomAllReduceV2 is disabled because it's not supported on more than two PCIe-only GPUs. "
    "To silence this warning, specify disable_custom_all_reduce=True explicitly.",
    "[2026-11-29 10:00:00 TP1] CustomAllreduce is disabled because your platform lacks GPU P2P capability or P2P test failed.",
])
def test_custom_allreduce_fallback_wordings_of_sglang_0_5_23(line):
    from tasks.failures import detect_perf_tags

    assert detect_perf_tags(line) == ["allreduce_path_degraded"]


@pytest.mark.parametrize("log, expected", [
    # SGLang's model registry, vLLM's serve CLI, ensure_divisibility / ParallelConfig (both engines)
    ("Traceback (most recent call last):\n  File \"/sgl/srt/models/registry.py\", line 70, in resolve_model_cls\n"
     "ValueError: Unsupported architectures: FooForCausalLM. Supported list: ['LlamaForCausalLM']", "model_load_error"),
    ("ValueError: With `vllm serve`, you should provide the model as a positional argument or in a config file "
     "instead of via the `--model` option.", "cli_arg_error"),
    ("[2026-11-30 10:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
     "  File \"/sgl/srt/distributed/utils.py\", line 31, in ensure_divisibility\n"
     "AssertionError: 40 is not divisible by 6", "server_args_incompatible"),
    ("ValueError: Total number of attention heads (28) must be divisible by tensor parallel size (8).",
     "server_args_incompatible"),
    # NCCL 2.19+ words socketStartConnect as socketPollConnect; a bind to an address not on this host
    ("node5:240:240 [6] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 10.0.0.4<56841> failed : "
     "Software caused connection abort\nnode5:240:240 [6] NCCL INFO misc/socket.cc:564 -> 2", "nccl_network_error"),
    ("h1:7:7 [0] misc/socket.cc:379 NCCL WARN Call to bind failed : Cannot assign requested address\n"
     "h1:7:7 [0] NCCL INFO bootstrap.cc:95 -> 2\nRuntimeError: NCCL error: unhandled system error", "nccl_network_error"),
    # vLLM's logger.exception line of a KeyError on a checkpoint tensor, before its traceback
    ("Loading safetensors checkpoint shards:   0% Completed | 0/2\n"
     "ERROR 12-09 00:49:29 engine.py:366] 'model.layers.3.mlp.gate_proj.weight.absmax'\n"
     "ERROR 12-09 00:49:29 engine.py:366] Traceback (most recent call last):", "model_weights_error"),
])
def test_engine_wordings_of_config_network_and_weight_failures(log, expected):
    assert classify(log, None).failure_class == expected


def test_a_quoted_tensor_name_outside_weight_loading_is_no_weights_error():
    assert classify("ERROR 12-09 00:49:29 engine.py:366] 'model.layers.3.mlp.gate_proj.weight'\n", 1).failure_class \
        != "model_weights_error"


# ------------------------------------------------------------------ the signature table file
def _table_with(tmp_path: Path, edit) -> Path:
    from tasks.failure_signatures import TABLE_PATH

    data = yaml.safe_load(TABLE_PATH.read_text())
    edit(data)
    p = tmp_path / "sig.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_shipped_table_loads_to_the_classifier_tables():
    from tasks.failure_signatures import load_tables

    t = load_tables()
    assert t.kinds == KIND
    assert [s.failure_class for s in t.signatures] == [s.failure_class for s in SIGNATURES]
    assert [p.pattern for s in t.signatures for p in s.patterns] == [p.pattern for s in SIGNATURES for p in s.patterns]


def _first_row(cls: str) -> int:
    from tasks.failure_signatures import TABLE_PATH

    return next(i for i, r in enumerate(yaml.safe_load(TABLE_PATH.read_text())["signatures"]) if r["class"] == cls)


_FUSION_ROW = _first_row("flashinfer_allreduce_fusion_unsupported_arch")
_FUSION = rf"signatures\[{_FUSION_ROW}\] \(flashinfer_allreduce_fusion_unsupported_arch\)"


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["signatures"][_FUSION_ROW]["patterns"].append("(unclosed"), _FUSION + r"\.patterns\[2\]: bad regex"),
    (lambda d: d["signatures"][0].update({"class": "no_such_class"}),
     r"signatures\[0\] \(no_such_class\): class is not in kinds"),
    (lambda d: d["signatures"][1].update({"requirs": "x"}), r"signatures\[1\] \(cli_arg_error\): unknown keys \['requirs'\]"),
    (lambda d: d["signatures"][0].update({"exit_codes": ["2"]}), r"signatures\[0\] \(cli_arg_error\)\.exit_codes"),
    (lambda d: d["signatures"][0].update({"stages": ["nowhere"]}), r"signatures\[0\] \(cli_arg_error\)\.stages"),
    (lambda d: d["signatures"][0].update({"check": "magic"}), r"signatures\[0\] \(cli_arg_error\)\.check: 'magic'"),
    (lambda d: d["kinds"].update({"cli_arg_error": "sometimes"}), r"kinds\.cli_arg_error: 'sometimes'"),
    (lambda d: d["signatures"].append({"class": "cli_arg_error", "patterns": ["x"]}),
     r"rows of cli_arg_error are not contiguous"),
    (lambda d: d["kinds"].update({"brand_new": "transient"}), r"no row for \['brand_new'\]"),
    (lambda d: d["normalizers"].append(["x"]), r"normalizers\[\d+\]: expected \[regex, replacement\]"),
    (lambda d: d["milestones"][0].update({"pattern": "[bad"}), r"milestones\[0\] \(dist_init\): bad regex"),
])
def test_bad_table_entry_is_named_in_the_error(tmp_path, edit, message):
    from tasks.failure_signatures import SignatureTableError, load_tables

    with pytest.raises(SignatureTableError, match=message):
        load_tables(_table_with(tmp_path, edit))


# ------------------------------------------------------------------ phase read from the log
VLLM_LOGS = REPO / "tests" / "data" / "vllm_logs"


def _all_cases() -> list[tuple[Path, str]]:
    """(log path, expected class) of the shared cases and the real vLLM logs."""
    out = [(FAILURES / c["log"], c["expected_class"]) for c in CASES]
    out += [(VLLM_LOGS / c["log"], c["expected_class"])
            for c in yaml.safe_load((VLLM_LOGS / "cases.yaml").read_text())["cases"]]
    return out


def _healthy_logs(tmp_path: Path) -> list[Path]:
    """A healthy SGLang log (the emulated node's baseline) and a healthy vLLM startup (the real
    vLLM log of V03 up to uvicorn's "Application startup complete", before the kill)."""
    from sweeps.app.driver import emulator_profile
    from sweeps.config.spec import backend_dict, load_spec
    from tasks.backends.sglang.knobs import render_launch
    from tasks.emulator.instant import simulate
    from tests.conftest import compose_cfg

    spec = load_spec(compose_cfg(["backend=instant", "sweep=eagle3_allreduce"]))
    argv, env, _ = render_launch(dict(spec.sweep.baseline), spec.node.model_dump(), spec.model.model_dump(),
                                 backend_dict(spec))
    out = simulate(emulator_profile(spec), argv, env, spec.bench_spec(), seed=0)
    assert out["status"] == "ok"
    sg = tmp_path / "healthy_sglang.log"
    sg.write_text(out["log"])
    v = (VLLM_LOGS / "cpu_engine_core_sigkill_mid_stream.log").read_text()
    i = v.index("Application startup complete")
    vl = tmp_path / "healthy_vllm.log"
    vl.write_text(v[:v.index("\n", i) + 1])
    return [sg, vl]


def _cli(*args: str) -> list[list[str]]:
    r = subprocess.run([sys.executable, "-m", "tasks.failures", "--tsv", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=120, check=False)
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    # 0 when every log is healthy (or a perf finding), 1 when one shows a failure
    assert r.returncode == int(any(row[2] not in ("healthy", "perf") for row in rows)), r.stderr
    return rows


@needs_shared
def test_cli_with_logs_only_classifies_every_case_and_healthy_logs(tmp_path):
    """No exit code, no phase: the phase is read from the log (ready line or not)."""
    cases = _all_cases()
    healthy = _healthy_logs(tmp_path)
    rows = _cli(*[str(p) for p, _ in cases], *[str(p) for p in healthy])
    got = {row[0]: row[1] for row in rows}
    wrong = {str(p): (want, got.get(str(p))) for p, want in cases if got.get(str(p)) != want}
    assert not wrong, wrong
    assert [got[str(p)] for p in healthy] == [HEALTHY, HEALTHY]
    assert all(row[2] == HEALTHY for row in rows if row[1] == HEALTHY)
    assert len(CASES) >= 20 and sum("vllm_logs" in str(p) for p, _ in cases) >= 4
    # a failure stays a failure whatever the speedup
    assert _cli("--speedup", "0.5", str(FAILURES / "logs" / "B01.log"))[0][1] == \
        "flashinfer_allreduce_fusion_unsupported_arch"


def test_log_stuck_in_distributed_init_is_a_collective_hang_without_phase():
    log = ("[2026-01-01 00:00:00] server_args=ServerArgs(tp_size=8)\n"
           "[2026-01-01 00:00:02 TP0] Init torch distributed begin.\n"
           "[2026-01-01 00:00:03 TP3] NCCL INFO NCCL version 2.27.3+cuda12.9\n")
    c = classify(log)
    assert c.failure_class == "collective_hang_or_timeout", c
    # it got past distributed init and stopped loading: a startup timeout, not a hang
    assert classify(log + "[2026-01-01 00:00:09 TP0] Init torch distributed ends.\n"
                    "[2026-01-01 00:00:09 TP0] Load weight begin. avail mem=90 GB\n").failure_class == "startup_timeout"
    # the same log with the harness's phase keeps its meaning
    assert classify(log, None, "startup").failure_class == "collective_hang_or_timeout"


def test_healthy_needs_no_phase_and_no_failing_exit(tmp_path):
    sg = _healthy_logs(tmp_path)[0].read_text()
    assert classify(sg).healthy and classify(sg, 0).healthy
    assert classify(sg, None, "bench").failure_class == "bench_stall"  # the harness says the stream stopped
    assert classify(sg, 1).failure_class == "server_crash"


@pytest.mark.parametrize("speedup,expected", [(0.93, "spec_decode_no_speedup"), (1.0, "spec_decode_no_speedup"),
                                              (1.2, HEALTHY)])
def test_cli_speedup_and_bench_json(tmp_path, speedup, expected):
    sg = _healthy_logs(tmp_path)[0]
    assert _cli("--speedup", str(speedup), str(sg))[0][1] == expected
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"metrics": {"decode_tok_s": 80.0 * speedup, "baseline_decode_tok_s": 80.0}}))
    row = _cli("--bench", str(bench), str(sg))[0]
    assert row[1] == expected and (row[2] == "perf" if expected != HEALTHY else row[2] == HEALTHY)


@pytest.mark.parametrize("log", [
    # Triton's bundled ptxas (RLinf#92 shape: a Triton codegen error inside SGLang's scheduler)
    "RuntimeError: Internal Triton PTX codegen error:\nptxas fatal   : Value 'sm_120' is not defined for option 'gpu-name'\n",
    # the same check worded by nvcc of a CUDA older than the GPU
    "nvcc fatal   : Unsupported gpu architecture 'compute_120a'\nninja: build stopped: subcommand failed.\n",
])
def test_toolchain_without_the_gpu_arch_is_arch_not_in_build(log):
    # the build (torch, a kernel wheel, or the compiler a JIT runs) lacks the arch: a newer build
    # fixes it, so it is the recheck class arch_not_in_build, not a JIT source error
    c = classify(log, 1, "startup")
    assert (c.failure_class, c.kind) == ("arch_not_in_build", "deterministic")
    assert "sm_120" in c.line or "compute_120a" in c.line


# ------------------------------------------------------------------ odd input
def test_a_log_with_no_progress_and_no_error_is_no_startup_timeout():
    """An empty log or binary noise, no exit code, no phase: no evidence of waiting (a timeout
    needs it, docs/failure_classifier.md rule 6), so unknown with the reason; a caller that says
    the server was still starting gets the timeout."""
    noise = random.Random(7).randbytes(20_000).decode("utf-8", errors="replace")
    for log in ("", "\n\n", noise):
        c = classify(log)
        assert c.failure_class == "unknown", (log[:40], c)
        assert "cannot tell a timeout from a crash" in c.signature and c.line == ""
    assert classify("", None, "startup").failure_class == "startup_timeout"
    # a log that stops in a startup stage with no error still is one
    assert classify("[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=70.00 GB\n").failure_class == "startup_timeout"


def test_terminal_escapes_are_stripped_so_a_wrapped_error_reads_as_itself():
    wrapped = "\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mRuntimeError: boom\x1b[0m\x1b[?25l\x07\x08\n"
    c, plain = classify(wrapped), classify("RuntimeError: boom\n")
    assert (c.failure_class, c.line, c.signature) == (plain.failure_class, plain.line, plain.signature)
    assert c.line == "RuntimeError: boom" and "PWNED" not in c.signature


def test_cli_never_prints_control_bytes(tmp_path, capsys):
    from tasks.failures import main

    log = tmp_path / "term\x1b[2J.log"
    log.write_bytes(b"\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mRuntimeError: boom\x1b[0m\x9b2J\x7f\n")
    for args in (["--nearest", "0"], ["--tsv"]):
        assert main([*args, str(log)]) == 1  # RuntimeError: a failure
        out = capsys.readouterr().out
        assert "RuntimeError: boom" in out
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out), repr(out)


# vLLM's fd-limit advice (vllm/utils/system_utils.py) on a host whose hard limit is low: a
# WARNING that says "failed" and "errors", printed at start, served past
_ULIMIT_ADVICE = ("(APIServer pid=5026) WARNING 12-05 07:34:01 [system_utils.py:101] Found ulimit of 4096 and failed "
                  "to automatically increase with error current limit exceeds maximum limit. This can cause fd limit "
                  "errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n")
_SERVED = ["(APIServer pid=5026) INFO 12-05 07:34:00 [api_server.py:1] vLLM API server version 0.11.0",
           _ULIMIT_ADVICE,
           "(APIServer pid=5026) INFO:     Started server process [5026]",
           "(APIServer pid=5026) INFO:     Application startup complete.",
           '(APIServer pid=5026) INFO:     127.0.0.1:40312 - "POST /v1/completions HTTP/1.1" 200 OK',
           "(APIServer pid=5026) INFO 12-05 07:34:35 [loggers.py:335] Engine 000: Avg prompt throughput: 35.0 tokens/s, "
           "Avg generation throughput: 474.2 tokens/s, Running: 4 reqs, Waiting: 0 reqs"]


@pytest.mark.parametrize("exit_code, cls", [(None, "bench_stall"), (-9, "server_crash"), (0, "early_exit")])
def test_a_warning_the_server_served_past_is_not_the_line_a_bench_failure_quotes(exit_code, cls):
    verdict = "[servesweep] bench: stream stalled: no data for 10 s after 412 chunks"
    c = classify("\n".join([*_SERVED, "", verdict]), exit_code, "bench")
    assert (c.failure_class, c.line) == (cls, verdict)
    # the same warning with nothing served after it is still what the log has to say
    c = classify("\n".join(_SERVED[:2]), 1, "startup")
    assert c.line == _ULIMIT_ADVICE


def test_an_algorithm_pin_nccl_echoes_is_a_pin():
    # NCCL echoes every variable it reads (misc/param.cc: "%s set by environment to %s"); a log
    # captured without the shell's environment shows the pin only that way
    log = ("node1:2528103:2528103 [0] NCCL INFO NCCL_ALGO set by environment to Ringg\n"
           "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, invalid usage, "
           "NCCL version 2.21.5\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n")
    assert classify(log, 1, "startup").failure_class == "nccl_env_algo_proto_invalid"
    # the same error with some other variable echoed is no pin of the algorithm
    other = log.replace("NCCL_ALGO set by environment to Ringg", "NCCL_P2P_DISABLE set by environment to 1")
    assert classify(other, 1, "startup").failure_class != "nccl_env_algo_proto_invalid"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(alphabet="ab\n\r k/sT", max_size=12), max_size=12))
def test_lines_holding_finds_the_lines_a_per_line_test_finds_in_order(chunks):
    from tasks.perf_findings import _lines_holding

    text = "".join(chunks)
    words = ("ab", "k/s", "b\rk")
    assert list(_lines_holding(text, words)) == [ln for ln in text.split("\n") if any(w in ln for w in words)]
