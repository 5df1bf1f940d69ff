#!/usr/bin/env bash
# The reference GPU trainer's tests need a Python that imports torch. Use one
# that already does; else install Debian's python3-torch (CPU build).
set -uo pipefail
for py in "${RLQ_PYTHON:-}" python3 /usr/bin/python3; do
  [ -n "$py" ] && "$py" -c "import torch" 2>/dev/null && { echo "python with torch: $py"; exit 0; }
done
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch python3-numpy >/dev/null 2>&1 || {
  $SUDO apt-get update -q >/dev/null 2>&1
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch python3-numpy >/dev/null 2>&1
}
/usr/bin/python3 -c "import torch" 2>/dev/null && { echo "python with torch: /usr/bin/python3"; exit 0; }
exit 1
