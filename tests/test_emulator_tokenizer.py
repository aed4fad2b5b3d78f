"""The emulated model's shipped tokenizer: counts like the target class, output text that
retokenizes one token per token, and the server using it for text prompts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest

from tasks.emulator.testing import baseline_flags, emulated_servers
from tasks.emulator.tokenizer import SPECIAL_TOKENS, TOKENIZER_DIR, corpus, default_tokenizer

PROSE = Path(__file__).parent / "data" / "english_prose.txt"


def test_shipped_directory_is_a_hf_tokenizer_with_a_chat_template():
    cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "<|im_middle|>" in cfg["chat_template"]
    tok = default_tokenizer()
    assert tok.vocab_size == 16384
    for s in SPECIAL_TOKENS:  # each special token is one id, as in Kimi's tokenizer
        assert len(tok.encode(s)) == 1, s
    chat = tok.chat_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert chat == ("<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
                    "<|im_assistant|>assistant<|im_middle|>")


@pytest.mark.slow  # > 10 s on 2 idle cores (CI's durations): make test-slow runs it
def test_counts_english_like_the_target_class():
    """Moonshot: "for a typical English text, 1 Token is roughly equivalent to 3-4 English
    characters" (platform.kimi.ai/docs/intro); OpenAI: ~4."""
    tok = default_tokenizer()
    prose = PROSE.read_text()
    cpt = len(prose) / len(tok.encode(prose))
    assert 3.0 <= cpt <= 4.5, cpt  # everyday narrative English (measured 3.38)
    _, held = corpus()
    doc = held["docstrings (every 10th)"]
    assert 3.6 <= len(doc) / len(tok.encode(doc)) <= 4.6  # held-out technical English (measured 4.05)


def test_output_text_retokenizes_one_token_per_token():
    tok = default_tokenizer()
    assert len(tok.output_ids) > 4000
    rng = random.Random(7)
    for n in (1, 2, 3, 16, 128, 1024):
        for _ in range(50):
            ids = [tok.output_id(rng.randrange(1 << 32)) for _ in range(n)]
            text = tok.decode(ids)
            assert tok.encode(text) == ids
            cut = rng.randrange(n + 1)  # any split into chunks (a client retokenizing per chunk)
            assert len(tok.encode(tok.decode(ids[:cut]))) + len(tok.encode(tok.decode(ids[cut:]))) == n


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with emulated_servers(tmp_path_factory.mktemp("emu")) as start:
        srv = start(baseline_flags(128))
        srv.wait_healthy()
        yield srv


def test_the_server_counts_text_with_the_tokenizer(server):
    tok = default_tokenizer()
    prose = PROSE.read_text()
    r = httpx.post(server.base_url + "/generate", json={"text": prose, "sampling_params": {"max_new_tokens": 20}},
                   timeout=30).json()
    assert r["meta_info"]["prompt_tokens"] == len(tok.encode(prose))
    assert tok.encode(r["text"]) == r["output_ids"] and len(r["output_ids"]) == 20
    info = httpx.get(server.base_url + "/get_model_info", timeout=10).json()
    assert Path(info["tokenizer_path"]) == TOKENIZER_DIR
    assert Path(httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["tokenizer_path"]) == TOKENIZER_DIR
    # the same prompt as ids is the same request: same tokens out
    r2 = httpx.post(server.base_url + "/generate", json={"input_ids": tok.encode(prose),
                                                         "sampling_params": {"max_new_tokens": 20}}, timeout=30).json()
    assert r2["output_ids"] == r["output_ids"]


def test_stop_n_echo_and_zero_max_tokens(server):
    u = server.base_url
    base = httpx.post(u + "/v1/completions", json={"prompt": "Once", "max_tokens": 12}, timeout=30).json()
    text = base["choices"][0]["text"]
    stop = text.split(" ")[3]  # the third output word
    r = httpx.post(u + "/v1/completions", json={"prompt": "Once", "max_tokens": 12, "stop": [" " + stop]},
                   timeout=30).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["matched_stop"] == " " + stop and r["text"] == text[:text.index(" " + stop)]
    r = httpx.post(u + "/v1/completions", json={"prompt": ["Once", "Twice"], "max_tokens": 3, "n": 2, "echo": True},
                   timeout=30).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert [c["text"].split(" ")[0] for c in r["choices"]] == ["Once", "Once", "Twice", "Twice"]
    assert r["choices"][0]["text"] != r["choices"][1]["text"]
    prompt_tokens = sum(len(default_tokenizer().encode(p)) for p in ("Once", "Twice"))  # once per prompt, not per n
    assert r["usage"]["completion_tokens"] == 12 and r["usage"]["prompt_tokens"] == prompt_tokens
    r = httpx.post(u + "/v1/completions", json={"prompt": "Once", "max_tokens": 0}, timeout=30).json()
    assert r["choices"][0]["text"] == "" and r["usage"]["completion_tokens"] == 0
    r = httpx.post(u + "/v1/completions", json={"prompt": "Once", "max_tokens": 2, "logprobs": 1}, timeout=30).json()
    assert r["sglext"]["emulator_placeholder_logprobs"] is True
    assert r["choices"][0]["logprobs"]["token_logprobs"] == [0.0, 0.0]
    # batched /generate: a list in, a list out
    r = httpx.post(u + "/generate", json={"text": ["a", "b", "c", "d"], "sampling_params": {"max_new_tokens": 3}},
                   timeout=30).json()
    assert isinstance(r, list) and [x["meta_info"]["completion_tokens"] for x in r] == [3] * 4


def test_usage_is_a_separate_last_chunk_only_when_asked(server):
    def chunks(opts):
        body = {"prompt": "Once", "max_tokens": 4, "stream": True, **opts}
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as r:
            return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]

    plain = chunks({})
    assert all(c["choices"] and c["usage"] is None for c in plain) and len(plain) == 4
    asked = chunks({"stream_options": {"include_usage": True}})
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 4
    assert all(c["usage"] is None for c in asked[:-1])
