#!/usr/bin/env bash
# Build (or reuse) TRL's environment for bench/peers-trl.ts: a virtualenv at .venv-peers holding
# exactly bench/peers/requirements.lock (--no-deps), apart from rlq's own .venv so a peer's pins never
# move rlq's. Reused while its stamp matches the lock. Prints the venv's python.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$root/.venv-peers
lock=$root/bench/peers/requirements.lock
stamp=$(sha256sum "$lock" | cut -d' ' -f1)
if [ -f "$venv/.stamp" ] && [ "$(cat "$venv/.stamp")" = "$stamp" ]; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --no-deps -r "$lock" 2>&1 | grep -v "^WARNING: Location" >&2 || true
"$venv/bin/python" -c 'import trl, torch, transformers; print("peers env:", trl.__version__, torch.__version__, transformers.__version__)' >&2
echo "$stamp" > "$venv/.stamp"
echo "$venv/bin/python"
