"""Running rlq_torch.tp_train on n torchrun ranks in a child process: one launcher for its test
(tests/test_tensor_parallel.py) and its bench (bench_tp.py), so both start the ranks alike and both
get the retry below."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

# workers/trainer-torch: the ranks import rlq_torch from here, whatever the caller's working directory.
TRAINER_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a rank prints when the C++ runtime aborts it because a std::thread was destroyed still running.
# torch's own teardown can do that to a rank on a loaded machine after the work is done (tp_train.py
# waits at a barrier and destroys the process group before it returns, so no rlq thread is left),
# which says nothing about the result. Such a run goes once more, saying so; any other failure, or
# this one twice, is the caller's to report.
THREAD_ABORT = "terminate called without an active exception"


def run_tp_train(
    n: int, args: Sequence[str], timeout_s: float
) -> subprocess.CompletedProcess:
    """tp_train with ``args`` on ``n`` ranks (torchrun --standalone), its output captured as text.

    ``timeout_s`` bounds each attempt; subprocess.TimeoutExpired goes to the caller. A nonzero exit is
    returned, not raised: the caller decides whether a failure is the result (a refusal under test)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(n),
        "-m",
        "rlq_torch.tp_train",
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": TRAINER_ROOT}
    for attempt in (1, 2):
        r = subprocess.run(
            cmd,
            cwd=TRAINER_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
        if r.returncode == 0 or THREAD_ABORT not in r.stderr or attempt == 2:
            break
        print(
            f"torchrun {n} ranks {list(args)}: a rank aborted ({THREAD_ABORT}); running it once more",
            file=sys.stderr,
        )
    return r
