#!/usr/bin/env bash
# Build (or reuse) rlq's Python environment: a virtualenv at $RLQ_VENV (default .venv in the
# repository) holding exactly python/requirements.lock, installed with --no-deps. Reused while its
# stamp matches the lock file and the interpreter; rebuilt otherwise. Prints the venv's python.
#
#   bash scripts/python-env.sh            # build or reuse; last line of stdout: path of python
#   bash scripts/python-env.sh --relock   # resolve python/requirements.txt anew and rewrite the lock
#
# Needs Python 3.11 (the lock's wheels are cp311 or abi3) with venv, and PyPI. torch comes from the
# CPU build of 2.13.0 that pip finds on the project's machines; elsewhere pip downloads it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${RLQ_VENV:-$root/.venv}
lock=$root/python/requirements.lock
base_python=${RLQ_BASE_PYTHON:-python3}

if ! "$base_python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
  echo "python-env: $base_python is not Python 3.11 (python/requirements.lock is for 3.11); set RLQ_BASE_PYTHON to a Python 3.11" >&2
  exit 1
fi

if [ "${1:-}" = "--relock" ]; then
  tmp=$(mktemp -d)
  "$base_python" -m venv "$tmp/v"
  "$tmp/v/bin/pip" install -q -r "$root/python/requirements.txt" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  head -6 "$lock" > "$tmp/lock"
  "$tmp/v/bin/pip" freeze | grep -viE '^(torchvision|torchaudio|torchcodec|triton)==' >> "$tmp/lock"
  mv "$tmp/lock" "$lock"
  rm -rf "$tmp"
  echo "python-env: rewrote $lock" >&2
  exit 0
fi

# One build at a time (two test projects' global setups, a demo beside a test run): the others wait, then reuse it.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
stamp="$(sha256sum "$lock" | cut -d' ' -f1) $("$base_python" -c 'import sys; print(sys.version.split()[0])')"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.rlq-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$venv/bin/python"
  exit 0
fi

echo "python-env: building $venv from python/requirements.lock (a few minutes, once)" >&2
start=$(date +%s)
rm -rf "$venv"
"$base_python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$lock" 2>&1 | grep -v "^WARNING: Location" >&2 || true
# pip's exit status is lost in the pipe above; the imports are the check.
"$venv/bin/python" -c 'import torch, transformers, safetensors, tokenizers, numpy, vllm, peft, onnx, onnxscript, pandas' || {
  echo "python-env: the environment at $venv does not import torch, transformers and vllm; see pip's output above" >&2
  exit 1
}
echo "$stamp" > "$venv/.rlq-stamp"
echo "python-env: built in $(( $(date +%s) - start )) s: $("$venv/bin/python" -c 'import torch, transformers, vllm; print(f"torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")')" >&2
echo "$venv/bin/python"
