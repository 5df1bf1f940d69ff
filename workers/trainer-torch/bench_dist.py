#!/usr/bin/env python3
"""Step time and tokens/s of the trainer at 1, 2 and 4 ranks (server.py --nproc N), through the protocol.

    python3 workers/trainer-torch/bench_dist.py --device cpu --ranks 1,2,4 --out bench/results/trainer-torch-dist-cpu.json

For each rank count: a server process (``--nproc N --threads T``), a fixed model and batch served
over HTTP, one warm-up step (it also starts the torchrun group), then --steps steps, each from the
previous one's weights held by the ranks (as a run does). Reported per step: the wall time from
POST /v1/steps to ``done`` (what rlq waits), and the trainer's own ``train_step_time_s`` (rank 0,
after the batch fetch). tokens/s counts prompt + response tokens of the batch per wall second.
Packing (use_dynamic_batch_size) on and off with the same max_tokens_per_gpu.

On CPU the ranks share the machine's cores: N ranks × T threads should not exceed them, or the
numbers measure contention (this repository's box has 2 vCPUs shared with other work, so 4 ranks
there oversubscribe it: read those as the overhead of the group, not a speed-up).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tests"))

from helpers import BatchServer  # noqa: E402
from rlq_torch.batch import Batch, Sample  # noqa: E402

MODEL = {
    "vocab_size": 512,
    "context_length": 256,
    "d_model": 64,
    "n_heads": 4,
    "n_layers": 4,
    "d_mlp": 256,
}


def batch(step: int, groups: int, per_group: int, seed: int = 3) -> Batch:
    rng = np.random.default_rng(seed)
    samples = []
    for g in range(groups):
        p = rng.integers(0, MODEL["vocab_size"], size=int(rng.integers(16, 48))).astype(
            np.int32
        )
        for k in range(per_group):
            r = int(rng.integers(8, 96))
            samples.append(
                Sample(
                    np.concatenate(
                        [
                            p,
                            rng.integers(0, MODEL["vocab_size"], size=r).astype(
                                np.int32
                            ),
                        ]
                    ),
                    len(p),
                    np.ones(r, dtype=np.uint8),
                    (-rng.uniform(0.1, 5, size=r)).astype(np.float32),
                    np.zeros(r, dtype=np.int32),
                    float(rng.integers(0, 2)),
                    g,
                    k,
                )
            )
    return Batch("bench", step, samples)


class Server:
    def __init__(self, *args: str):
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "server.py"), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening"):
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def call(self, method, path, body=None):
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        r = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(r, timeout=60) as res:
            return json.loads(res.read())

    def close(self):
        import signal

        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()


def run(
    ranks: int,
    device: str,
    threads: int,
    steps: int,
    cfg: dict,
    groups: int,
    per_group: int,
    batches: BatchServer,
    sharding: str = "zero1",
) -> dict:
    srv = Server(
        "--device",
        device,
        "--threads",
        str(threads),
        "--nproc",
        str(ranks),
        "--model-config",
        json.dumps(MODEL),
        "--dist-timeout-s",
        "900",
        *(["--sharding", sharding] if ranks > 1 else []),
    )
    fsdp = (
        srv.call("GET", "/v1/health").get("distributed", {}).get("fsdp")
        if ranks > 1
        else None
    )
    tmp = tempfile.mkdtemp(prefix="rlq-bench-dist-")
    walls, inner = [], []
    tokens = 0
    try:
        uri = None
        for s in range(steps + 1):
            b = batch(s, groups, per_group)
            tokens = sum(len(x.tokens) for x in b.samples)
            url = batches.add(f"r{ranks}-{s}-{id(cfg)}", b)
            out = os.path.join(tmp, f"s{s}")
            t0 = time.perf_counter()
            srv.call(
                "POST",
                "/v1/steps",
                {
                    "run_id": "bench",
                    "step": s,
                    "attempt": "0",
                    "weight_version_in": s,
                    "checkpoint_uri_in": uri,
                    "output_dir": out,
                    "batch_url": url,
                    "config": {"lr": 1e-4, "seed": 1, **cfg},
                },
            )
            while True:
                st = srv.call("GET", f"/v1/steps/bench/{s}")
                if st["state"] != "running":
                    break
                time.sleep(0.01)
            dt = time.perf_counter() - t0
            if st["state"] != "done":
                raise RuntimeError(f"step {s} at {ranks} ranks: {st}")
            uri = st["result"]["checkpoint_uri"]
            if s > 0:
                walls.append(dt)
                inner.append(st["result"]["metrics"]["train_step_time_s"])
    finally:
        srv.close()
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median(walls)
    return {
        "ranks": ranks,
        "sharding": sharding if ranks > 1 else "none (one rank)",
        "fsdp": fsdp,
        "threads_per_rank": threads,
        "config": cfg,
        "samples": groups * per_group,
        "tokens": tokens,
        "step_wall_s_median": round(med, 4),
        "step_wall_s_all": [round(x, 4) for x in walls],
        "train_step_time_s_median": round(statistics.median(inner), 4),
        "tokens_per_s": round(tokens / med, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--max-tokens-per-gpu", type=int, default=512)
    ap.add_argument(
        "--sharding",
        default="zero1",
        help="comma-separated --sharding modes to measure at each rank count > 1 (zero1,fsdp,fsdp1)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    batches = BatchServer()
    results = []
    try:
        for packing in (False, True):
            cfg = {
                "max_tokens_per_gpu": args.max_tokens_per_gpu,
                "use_dynamic_batch_size": packing,
            }
            for n in [int(x) for x in args.ranks.split(",")]:
                for mode in args.sharding.split(",") if n > 1 else ["zero1"]:
                    r = run(
                        n,
                        args.device,
                        args.threads,
                        args.steps,
                        cfg,
                        args.groups,
                        args.per_group,
                        batches,
                        mode,
                    )
                    print(json.dumps(r), flush=True)
                    results.append(r)
                    save(
                        args, torch.__version__, results, complete=False
                    )  # a run cut by a time limit keeps its rows
    finally:
        batches.close()
    save(args, torch.__version__, results, complete=True)


def save(args, torch_version: str, results: list, complete: bool) -> None:
    if not args.out:
        return
    doc = {
        "bench": "trainer-torch data parallel (server.py --nproc N, through the protocol)",
        "command": "python3 workers/trainer-torch/bench_dist.py "
        + " ".join(sys.argv[1:]),
        "device": args.device,
        "torch": torch_version,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "model": MODEL,
        "note": "wall = POST to done as rlq sees it; the box's vCPUs are shared with other work (noise), and ranks x threads above the vCPUs oversubscribe it",
        "complete": complete,
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
