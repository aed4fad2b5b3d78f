"""Run SGLang 0.5.23's own benchmark client (``sglang.benchmark.serving.benchmark``) against a
live server; run with the contract venv's python: ``python tests/sglang_bench_client.py``
with a JSON job on stdin ``{"base_url", "prompt_len", "output_len", "num_prompts",
"max_concurrency"}`` and optionally ``"backend"`` (``sglang``: ``/generate``, the default;
``sglang-oai``: ``/v1/completions``), ``"tokenizer"`` (a tokenizer directory, loaded with
bench_serving's own ``get_tokenizer``), ``"dataset_path"`` (a ShareGPT-format JSON) with
``"return_text"`` (prompts as text, as bench_serving sends by default, or as the same prompts'
token ids) and ``"seed"``; prints one JSON line: SGLang's BenchmarkMetrics fields, per-request
``ttfts``, ``itls``, ``output_lens``, ``prompt_lens`` (the server's counts when it reports them)
and ``success``.

Prompts: with ``dataset_path`` bench_serving's own ``sample_random_requests`` (its ``random``
dataset: ShareGPT prompts tokenized, cut or repeated to ``prompt_len`` tokens, decoded back to
text when ``return_text``); without, fixed token-id lists (no tokenizer needed).
Client-only shims: modules bench_serving imports but does not use on this path (datasets,
torchvision, model configs) are stubbed when they are not installed.
"""

import asyncio
import importlib
import json
import sys
import types


def _stub(name, **attrs):
    m = types.ModuleType(name)
    m.__path__ = []
    m.__getattr__ = lambda a: (_ for _ in ()).throw(AttributeError(a)) if a.startswith("__") else type(a, (), {})
    m.__dict__.update(attrs)
    sys.modules[name] = m


def load_serving():
    import sglang  # noqa: F401  (before the stubs: its transformers patches are a no-op without transformers)

    _stub("sglang.srt.disaggregation.utils", FAKE_BOOTSTRAP_HOST="")
    for _ in range(12):
        try:
            return importlib.import_module("sglang.benchmark.serving")
        except ModuleNotFoundError as e:
            _stub(e.name)
    raise RuntimeError("could not import sglang.benchmark.serving")


def _rows(job, tokenizer):
    from sglang.benchmark.datasets.common import DatasetRow

    if job.get("dataset_path"):
        import random

        import numpy as np
        from sglang.benchmark.datasets.random import sample_random_requests

        random.seed(job.get("seed", 1))
        np.random.seed(job.get("seed", 1))
        return sample_random_requests(input_len=job["prompt_len"], output_len=job["output_len"],
                                      num_prompts=job["num_prompts"], range_ratio=1.0, tokenizer=tokenizer,
                                      dataset_path=job["dataset_path"], random_sample=True,
                                      return_text=bool(job.get("return_text", True)))
    return [DatasetRow(prompt=[(7 * i + j) % 1000 + 1 for j in range(job["prompt_len"])],
                       prompt_len=job["prompt_len"], output_len=job["output_len"]) for i in range(job["num_prompts"])]


def main():
    job = json.load(sys.stdin)
    S = load_serving()
    backend = job.get("backend", "sglang")

    S.args = types.SimpleNamespace(
        temperature=0.0, disable_ignore_eos=False, top_p=1.0, disable_stream=False, return_logprob=False,
        return_routed_experts=False, logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None,
        cache_report=False, header=None, dataset_name="random", backend=backend, random_output_len=job["output_len"],
        random_input_len=job["prompt_len"], num_prompts=job["num_prompts"], output_file=None, goodput=None,
        warmup_requests=1, sharegpt_output_len=None, random_range_ratio=1.0, profile_steps=None,
        plot_throughput=False, output_details=False, mooncake_num_rounds=1, image_resolution=None, image_count=0)
    if job.get("tokenizer"):
        from sglang.benchmark.utils import get_tokenizer

        tok = get_tokenizer(job["tokenizer"])
    else:
        tok = types.SimpleNamespace(encode=lambda text, add_special_tokens=False: [])
    rows = _rows(job, tok)
    base = job["base_url"]
    captured = {}
    real_calc = S.calculate_metrics

    def calc(*a, **kw):
        captured["outputs"] = kw.get("outputs")
        return real_calc(*a, **kw)

    S.calculate_metrics = calc
    res = asyncio.run(S.benchmark(
        backend=backend, api_url=base + ("/generate" if backend == "sglang" else "/v1/completions"), base_url=base,
        model_id="m", tokenizer=tok,
        input_requests=rows, request_rate=float("inf"), max_concurrency=job["max_concurrency"], disable_tqdm=True,
        lora_names=[], lora_request_distribution=None, lora_zipf_alpha=None, extra_request_body={}, profile=False))
    outs = captured["outputs"]
    metrics = {k: v for k, v in res.items() if isinstance(v, (int, float))} if isinstance(res, dict) else {}
    print(json.dumps({"metrics": metrics, "ttfts": [o.ttft for o in outs], "itls": [o.itl for o in outs],
                      "output_lens": [o.output_len for o in outs], "prompt_lens": [o.prompt_len for o in outs],
                      "row_prompt_lens": [r.prompt_len for r in rows], "success": [o.success for o in outs]}))


if __name__ == "__main__":
    main()
