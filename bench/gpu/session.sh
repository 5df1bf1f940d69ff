#!/usr/bin/env bash
# One lent GPU session (at most ~8 minutes): the torch trainer's GPU bench with both DCP executors, then the
# tensor/context-parallel parity cases that only CUDA can run. Each part writes its JSON as it goes under $OUT.
#   OUT=DIR bash bench/gpu/session.sh        # on the GPU machine, from the repository root
set -u
OUT=${OUT:?set OUT to a directory}
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  df -h /tmp /dev/shm | tail -n 2
  # the scratch disk's write rate with fsync, what the per-step checkpoint is bounded by
  dd if=/dev/zero of=/tmp/rlq-dd bs=16M count=128 conv=fsync 2>&1 | tail -n 1
  rm -f /tmp/rlq-dd
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
timeout 270 python3 workers/trainer-torch/bench_gpu.py --out "$OUT/gpu" --cases qwen3-0.6b-16k,qwen2-0.5b-512 \
  --dcp-executor thread,process --steps 3 --budget-s 235 2>"$OUT/bench_gpu.stderr" >/dev/null
echo "bench_gpu rc=$?"
grep "^bench_gpu:" "$OUT/bench_gpu.stderr"
timeout 200 python3 workers/trainer-torch/bench_tp.py --device cuda --out "$OUT/tp" --budget-s 130 >"$OUT/bench_tp.log" 2>&1
echo "bench_tp rc=$?"
tail -n 12 "$OUT/bench_tp.log"
