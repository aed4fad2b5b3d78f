#!/usr/bin/env bash
# Create or refresh the contract-test virtualenv (.contract-venv/, git-ignored) that holds
# SGLang 0.5.23's real argument parser on a CPU-only machine (see requirements-contract.txt).
#
# Idempotent: a stamp file records sha256(requirements-contract.txt + this script + python
# version); when it matches and the venv still has sglang and torch, this exits in ~0.1 s.
# On any mismatch the venv is rebuilt from scratch (no stale packages survive).
#
# Usage: scripts/contract_env.sh            # from anywhere; env PYTHON overrides python3
#        CONTRACT_VENV=/path scripts/contract_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CONTRACT_VENV:-$ROOT/.contract-venv}"
REQ="$ROOT/requirements-contract.txt"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.contract-stamp"

pyver="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
want="$( { cat "$REQ" "${BASH_SOURCE[0]}"; echo "python=$pyver"; } | sha256sum | cut -d' ' -f1)"

# Cheap "still installed" probe for the up-to-date path (~0.1 s; the full smoke import
# costs 4-8 s because it imports torch).
installed() {
  "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("sglang"); m.version("torch")' >/dev/null 2>&1
}

smoke() {
  "$VENV/bin/python" -c '
import argparse
from sglang.srt.server_args import ServerArgs, prepare_server_args  # noqa: F401
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
assert "--cuda-graph-max-bs-decode" in p._option_string_actions
' >/dev/null 2>&1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]] && installed; then
  echo "contract env up to date: $VENV"
  exit 0
fi

# One builder at a time (two `make test` in parallel must not interleave pip runs).
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]] && installed; then
  echo "contract env up to date: $VENV"
  exit 0
fi

start=$(date +%s)
echo "building contract env in $VENV (python $pyver) ..."
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# --no-deps: the file is the full pinned closure; SGLang's own pins (CUDA torch, kernels) stay out.
# (grep drops pip's noise about this machine's extra local index folders)
set +o pipefail
"$VENV/bin/python" -m pip install -q --no-deps -r "$REQ" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
rc=${PIPESTATUS[0]}
set -o pipefail
if [[ $rc -ne 0 ]]; then
  echo "contract env: pip install failed (exit $rc)" >&2
  exit 1
fi
if ! smoke; then
  echo "contract env: smoke import of sglang.srt.server_args failed:" >&2
  "$VENV/bin/python" -c 'from sglang.srt.server_args import ServerArgs' >&2 || true
  exit 1
fi
echo "$want" >"$STAMP"
echo "contract env ready in $(( $(date +%s) - start )) s: $VENV"
