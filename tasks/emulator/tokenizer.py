"""The emulated model's tokenizer: a byte-level BPE the project trains and ships.

The emulated node serves Kimi-K2.5, whose real tokenizer (a tiktoken BPE of 163,840 ids) is not
shipped here. In its place :data:`TOKENIZER_DIR` holds a Hugging Face tokenizer directory
(``tokenizer.json`` + ``tokenizer_config.json`` with a Kimi-style chat template) that counts
English text about as the target does, so a client that tokenizes (SGLang's ``bench_serving``,
vLLM's ``bench serve``) and the server agree on lengths, offline: ``--tokenizer
<TOKENIZER_DIR>``; ``/get_model_info`` and ``/v1/models`` name that path.

Counts (measured by :func:`train` on held-out text, printed by ``python -m
tasks.emulator.tokenizer train``): 16,384 ids; ~4.35 characters per token on the GPL-3 text,
~4.06 on held-out Python docstrings. Published figures for the target class: Moonshot's
platform docs ("for a typical English text, 1 Token is roughly equivalent to 3-4 English
characters", platform.kimi.ai/docs/intro) and OpenAI's "1 token ≈ 4 characters of common
English text" (help.openai.com, "What are tokens and how to count them?").

Output text: the server's output ids are drawn from :attr:`EmulatorTokenizer.output_ids`, the
tokens that are one space + 2-12 lowercase letters and encode back to themselves alone. The
byte-level pre-tokenizer splits text before every such space-led word, so any concatenation of
them (a chunk, a whole completion) retokenizes one token per token
(tests/test_emulator_tokenizer.py checks it).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import sys
import sysconfig
from pathlib import Path
from typing import Any

#: The shipped tokenizer directory (package data).
TOKENIZER_DIR = Path(__file__).resolve().with_name("tokenizer_k25")
#: Vocabulary size :func:`train` asks for (16k: the docstring corpus has ~23k distinct merges;
#: 16k gives ~4 chars/token on held-out English, 8k only ~3.9 on docstrings and 3.95 on GPL-3).
VOCAB_SIZE = 16384
#: Kimi-K2's chat special tokens (its tokenizer_config.json), ids 0-7 here.
SPECIAL_TOKENS = ("[BOS]", "[EOS]", "[PAD]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                  "<|im_middle|>")
#: Kimi's chat format (role marker, role name, ``<|im_middle|>``, content, ``<|im_end|>``).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>{{ message['role'] }}<|im_middle|>{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- elif message['content'] -%}{{ message['content'] | selectattr('text', 'defined') | map(attribute='text')"
    " | join('') }}{%- endif -%}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
#: Kimi-K2.5's context (256k tokens).
MODEL_MAX_LENGTH = 262144
_SAFE = re.compile(r"^ [a-z]{2,12}$")


class EmulatorTokenizer:
    """The shipped BPE (``tokenizers.Tokenizer``) plus the chat template and the output table.

    Args:
        path: a tokenizer directory (default :data:`TOKENIZER_DIR`).
    Raises:
        FileNotFoundError: ``path`` has no ``tokenizer.json``.
    """

    def __init__(self, path: str | Path = TOKENIZER_DIR) -> None:
        from tokenizers import Tokenizer

        self.path = Path(path).resolve()
        self.tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        cfg = json.loads((self.path / "tokenizer_config.json").read_text())
        self.chat_template: str = cfg["chat_template"]
        self.vocab_size = self.tok.get_vocab_size()
        cands = list(enumerate(self.tok.decode_batch([[i] for i in range(self.vocab_size)])))
        cands = [(i, s) for i, s in cands if _SAFE.match(s)]
        enc = self.tok.encode_batch([s for _, s in cands], add_special_tokens=False)
        #: token ids usable as output: each retokenizes to itself, also inside any concatenation
        self.output_ids: list[int] = [i for (i, _), e in zip(cands, enc) if e.ids == [i]]
        self._piece = {i: s for i, s in cands}

    def encode(self, text: str) -> list[int]:
        """Text -> token ids (special-token strings become their ids; nothing is added)."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text (one call into the Rust tokenizer)."""
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Token ids -> text; output ids (:meth:`output_id`) by table lookup, others by the BPE."""
        try:
            return "".join(self._piece[i] for i in ids)
        except KeyError:
            return self.tok.decode(list(ids), skip_special_tokens=False)

    def output_id(self, x: int) -> int:
        """The output token for a generator value ``x`` >= 0 (``x mod len(output_ids)``)."""
        return self.output_ids[x % len(self.output_ids)]

    def chat_prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render OpenAI chat ``messages`` with the chat template (Jinja2 sandbox, as transformers'
        ``apply_chat_template``).

        Raises:
            jinja2.TemplateError: a message the template cannot render.
        """
        return _compiled(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt)


@functools.cache
def _compiled(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)


@functools.cache
def default_tokenizer() -> EmulatorTokenizer:
    """The shipped tokenizer, loaded once per process (~0.1 s)."""
    return EmulatorTokenizer()


# ---------------------------------------------------------------- training (developer tool)
def corpus() -> tuple[list[str], dict[str, str]]:
    """(training texts, held-out texts by name): docstrings (> 80 chars) of this Python's
    standard library, every 10th held out, plus /usr/share/common-licenses' texts except the
    GNU ones (near-duplicates of each other); GPL-3 is held out."""
    std = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for f in sorted(std.rglob("*.py")):
        if "test" in f.parts or "site-packages" in f.parts or "idlelib" in f.parts:
            continue
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for n in ast.walk(tree):
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(n)
                if d and len(d) > 80:
                    docs.append(d)
    lic = {p.name: p.read_text(errors="replace") for p in sorted(Path("/usr/share/common-licenses").glob("*"))
           if p.is_file()}
    train_texts = [d for i, d in enumerate(docs) if i % 10] + [v for k, v in lic.items()
                                                               if "GPL" not in k and "GFDL" not in k]
    held = {"docstrings (every 10th)": "\n".join(docs[::10])}
    if "GPL-3" in lic:
        held["GPL-3"] = lic["GPL-3"]
    return train_texts, held


def train(out: Path = TOKENIZER_DIR, vocab_size: int = VOCAB_SIZE) -> dict[str, float]:
    """Train the byte-level BPE on :func:`corpus` and write ``tokenizer.json`` +
    ``tokenizer_config.json`` into ``out``.

    Returns:
        characters per token on each held-out text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts, held = corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]", "eos_token": "[EOS]",
           "pad_token": "[PAD]", "unk_token": None, "add_bos_token": False, "add_eos_token": False,
           "clean_up_tokenization_spaces": False, "model_max_length": MODEL_MAX_LENGTH,
           "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return {k: len(v) / len(tok.encode(v, add_special_tokens=False).ids) for k, v in held.items()}


def main(argv: list[str] | None = None) -> int:
    """CLI: ``train [--out DIR]`` rebuilds the tokenizer and prints chars/token on held-out text."""
    ap = argparse.ArgumentParser(prog="python -m tasks.emulator.tokenizer")
    ap.add_argument("cmd", choices=["train"])
    ap.add_argument("--out", type=Path, default=TOKENIZER_DIR)
    a = ap.parse_args(argv)
    print(json.dumps({k: round(v, 3) for k, v in train(a.out).items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
