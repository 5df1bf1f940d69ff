#!/usr/bin/env bash
# The suite under load (issue 21): a clean clone of REV runs .ci/run, then `npm test` twice more,
# while two busy loops keep both cores busy throughout. Prints each pass's exit code and seconds;
# exits non-zero if any pass failed. Usage: bash scripts/loaded-suite.sh [REV] (default HEAD).
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
rev=$(git -C "$repo" rev-parse "${1:-HEAD}")
work=$(mktemp -d -t rlq-loaded-XXXX)
git clone -q "$repo" "$work/tree" && git -C "$work/tree" checkout -q "$rev"
sh -c 'while :; do :; done' &
l1=$!
sh -c 'while :; do :; done' &
l2=$!
trap 'kill $l1 $l2 2>/dev/null' EXIT
echo "rev ${rev:0:7}, logs in $work"
failed=0
cd "$work/tree"
for p in 1 2 3; do
  s=$(date +%s)
  if [ "$p" = 1 ]; then bash .ci/run >"$work/pass$p.log" 2>&1; else npm test >"$work/pass$p.log" 2>&1; fi
  rc=$?
  [ "$rc" = 0 ] || failed=1
  echo "pass $p: rc=$rc $(($(date +%s) - s)) s, $(grep -E '^ +Tests ' "$work/pass$p.log" | tail -1 | xargs)"
  # Pass 1 installed Node 22 under .ci/node.sh's cache; the later passes use it too.
  [ "$p" = 1 ] && { node_bin=$(bash .ci/node.sh); [ -n "$node_bin" ] && export PATH="$node_bin:$PATH"; }
  leftover=$(ps -eo ppid,cmd | awk '$1==1' | grep -E 'tsx|vitest|server.py|fake-|rlq.js' | grep -v grep || true)
  [ -z "$leftover" ] || echo "  left behind after pass $p: $leftover"
done
exit $failed
