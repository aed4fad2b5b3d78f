"""Tests for tasks.redact: secrets never leave the node in logs, argv or env."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.redact import MASK, is_secret_name, redact_argv, redact_env, redact_text

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
SK = "sk-proj-" + "Z9y8X7w6V5u4T3s2R1q0"


@pytest.mark.parametrize("name", ["HF_TOKEN", "--api-key", "--hf-token", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                                  "passwd", "apiKey", "secretKey", "GITHUB_TOKEN", "MLFLOW_TRACKING_PASSWORD",
                                  "--ssl-keyfile-password", "Authorization", "HUGGING_FACE_HUB_TOKEN", "credentials"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["--max-total-tokens", "--tokenizer-path", "--speculative-eagle-topk", "NCCL_ALGO",
                                  "--speculative-token-map", "--kv-cache-dtype", "TOKENIZERS_PARALLELISM", "--port",
                                  "--ssl-keyfile", "--model-path", "", "--"])
def test_not_secret_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("raw, secret, kept", [
    (f"HF_TOKEN={HF} python -m sglang.launch_server", HF, "HF_TOKEN=*** python"),
    ("Authorization: Bearer abc.def-ghi_123456789", "abc.def-ghi_123456789", "Authorization: Bearer ***"),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNz' x", "dXNlcjpwYXNz", "Basic ***"),
    ("postgresql://bob:hunter2@db:5432/mlflow", "hunter2", "postgresql://bob:***@db:5432/mlflow"),
    ("ServerArgs(model_path='/m', api_key='xyz123', tp_size=8)", "xyz123", "api_key='***', tp_size=8"),
    ('{"token": "abc987", "password":"p@ss"}', "abc987", '"token": "***"'),
    (f"export OPENAI_API_KEY={SK}", SK, "OPENAI_API_KEY=***"),
    (f"loaded token {HF} from cache", HF, "loaded token *** from cache"),
    (f"key is {SK}!", SK, "key is ***!"),
    ("--max-total-tokens 8192 --hf-token tok12345 --port 3", "tok12345", "--max-total-tokens 8192 --hf-token *** --port 3"),
    ("ghp_" + "a" * 36 + " pushed", "ghp_" + "a" * 36, "*** pushed"),
    ("AKIAIOSFODNN7EXAMPLE used", "AKIAIOSFODNN7EXAMPLE", "*** used"),
])
def test_redact_text_masks_secret_keeps_layout(raw, secret, kept):
    out = redact_text(raw)
    assert secret not in out
    assert kept in out


@pytest.mark.parametrize("line", [
    "[2026-01-20 15:06:10 TP0] Prefill batch. #new-seq: 1, #new-token: 16384, #cached-token: 0, token usage: 0.02",
    "[2026-01-11 13:03:00 TP0] Decode batch. #running-req: 1, #token: 9400, token usage: 0.00, accept len: 2.31",
    "KV Cache is allocated. #tokens: 612000, KV size: 40.1 GB",
    "[bench] this trial Output token throughput (tok/s): 59.0",
    "KeyError: 12",
    "KeyError: 'model.layers.55.mlp.gate_up_proj.input_scale'",
    "AuthenticationError: denied",
    "python -m sglang.launch_server --model-path /m --tp-size 8 --max-total-tokens 4096 --speculative-eagle-topk 4",
])
def test_redact_text_leaves_ordinary_log_lines_alone(line):
    assert redact_text(line) == line


def test_redact_argv():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "X1", "--hf-token=Y2", "--enable-auth", "--port", "1",
            "--max-total-tokens", "9", "env", "A_SECRET=z3", f"--header=Bearer {'q' * 20}"]
    out = redact_argv(argv)
    assert len(out) == len(argv)
    joined = " ".join(out)
    for s in ("X1", "Y2", "z3", "q" * 20):
        assert s not in joined
    assert out[3:6] == ["--api-key", MASK, "--hf-token=***"]
    assert out[6:11] == ["--enable-auth", "--port", "1", "--max-total-tokens", "9"]
    assert argv[4] == "X1"  # input untouched
    assert redact_argv(["--api-key"]) == ["--api-key"]  # trailing secret flag without a value


def test_redact_env():
    env = {"HF_TOKEN": HF, "NCCL_ALGO": "Tree", "MLFLOW_TRACKING_URI": "http://u:pw9@h:5000", "PATH": "/bin",
           "EXTRA": f"token={HF}"}
    out = redact_env(env)
    assert out == {"HF_TOKEN": MASK, "NCCL_ALGO": "Tree", "MLFLOW_TRACKING_URI": "http://u:***@h:5000", "PATH": "/bin",
                   "EXTRA": "token=***"}
    assert env["HF_TOKEN"] == HF


@settings(max_examples=200, deadline=None)
@given(prefix=st.text(max_size=40), suffix=st.text(max_size=40),
       secret=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=30))
def test_fuzz_assignment_secret_never_survives(prefix, suffix, secret):
    out = redact_text(f"{prefix} HF_TOKEN={secret} {suffix}")
    assert f"={secret}" not in out
    if secret not in prefix + suffix:
        assert secret not in out


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_total(s):
    assert isinstance(redact_text(s), str)
    assert len(redact_argv(s.split())) == len(s.split())


@pytest.mark.parametrize("text", ["A= HF_TOKEN=00000000 ", "x: HF_TOKEN=a0000000 :", "HF_TOKEN=a0000000 ="])
def test_assignment_after_another_assignment_is_masked(text):
    assert "0000000" not in redact_text(text)
