"""Run SGLang 0.5.23's own benchmark client (``sglang.benchmark.serving.benchmark``) against a
live server; run with the contract venv's python: ``python tests/sglang_bench_client.py``
with a JSON job on stdin ``{"base_url", "prompt_len", "output_len", "num_prompts",
"max_concurrency"}``; prints one JSON line: SGLang's BenchmarkMetrics fields, per-request
``ttfts``, ``itls``, ``output_lens`` and ``success``.

Client-only shims: the modules bench_serving imports but does not use on this path
(transformers, datasets, torchvision, model configs) are stubbed; the prompts are token-id
lists (the ``input_ids`` form of ``/generate``), so no tokenizer is needed.
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


def main():
    job = json.load(sys.stdin)
    S = load_serving()
    from sglang.benchmark.datasets.common import DatasetRow

    S.args = types.SimpleNamespace(
        temperature=0.0, disable_ignore_eos=False, top_p=1.0, disable_stream=False, return_logprob=False,
        return_routed_experts=False, logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None,
        cache_report=False, header=None, dataset_name="random", backend="sglang", random_output_len=job["output_len"],
        random_input_len=job["prompt_len"], num_prompts=job["num_prompts"], output_file=None, goodput=None,
        warmup_requests=1, sharegpt_output_len=None, random_range_ratio=1.0, profile_steps=None,
        plot_throughput=False, output_details=False, mooncake_num_rounds=1, image_resolution=None, image_count=0)
    rows = [DatasetRow(prompt=[(7 * i + j) % 1000 + 1 for j in range(job["prompt_len"])],
                       prompt_len=job["prompt_len"], output_len=job["output_len"]) for i in range(job["num_prompts"])]
    tok = types.SimpleNamespace(encode=lambda text, add_special_tokens=False: [])
    base = job["base_url"]
    captured = {}
    real_calc = S.calculate_metrics

    def calc(*a, **kw):
        captured["outputs"] = kw.get("outputs")
        return real_calc(*a, **kw)

    S.calculate_metrics = calc
    res = asyncio.run(S.benchmark(
        backend="sglang", api_url=base + "/generate", base_url=base, model_id="m", tokenizer=tok,
        input_requests=rows, request_rate=float("inf"), max_concurrency=job["max_concurrency"], disable_tqdm=True,
        lora_names=[], lora_request_distribution=None, lora_zipf_alpha=None, extra_request_body={}, profile=False))
    outs = captured["outputs"]
    metrics = {k: v for k, v in res.items() if isinstance(v, (int, float))} if isinstance(res, dict) else {}
    print(json.dumps({"metrics": metrics, "ttfts": [o.ttft for o in outs], "itls": [o.itl for o in outs],
                      "output_lens": [o.output_len for o in outs], "success": [o.success for o in outs]}))


if __name__ == "__main__":
    main()
