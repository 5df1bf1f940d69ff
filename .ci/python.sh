#!/usr/bin/env bash
# rlq's Python environment (torch 2.13.0 CPU, transformers, vLLM's CPU build) for the trainer,
# Hugging Face and vLLM tests: built by scripts/python-env.sh into .venv, reused while the lock
# file is unchanged. The tests' global setup does the same; building it here first puts its time
# and its errors in the CI log on their own.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/python-env.sh)
"$py" -c 'import torch, transformers, vllm; print(f"python env: {torch.__version__=} {transformers.__version__=} {vllm.__version__=}")'
