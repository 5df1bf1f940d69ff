"""Tensor and context parallel: step time of TP=1 against TP=2, and on a GPU the parity cases CPU cannot run.

    python3 workers/trainer-torch/bench_tp.py --device cpu --out bench/results/trainer-torch-tp-cpu.json
    python3 workers/trainer-torch/bench_tp.py --device cuda --out DIR     # the GPU session, under 8 minutes

Every case is ``rlq_torch/tp_train.py`` under torchrun (one rank: in a subprocess too, for the same start-up).
The step time is the median over the steps after the first (the first builds DTensor's sharding caches).

On ``--device cuda`` it also runs what CPU cannot (docs/trainer-torch.md, "Tensor and context parallel"):

- CP=2 alone and CP=2 with FSDP2 (dp=2, 4 ranks) against one rank, loss and gradients within 1e-5 over 3 steps
  (fp32, SDPA's efficient kernel under ring attention);
- TP=2 and TP=2 x FSDP2 on CUDA (NCCL with one GPU per rank; with fewer GPUs than ranks the ranks share
  them over gloo, which moves CUDA tensors through the host);
- the TP=1 against TP=2 timing on a Qwen2-0.5B-shaped random model, meaningful only with two GPUs.

A case that fails is recorded with its error and the bench goes on: the JSON says what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from rlq_torch.tp_launch import run_tp_train  # noqa: E402

ATOL = 1e-5
EXC = re.compile(r"\b\w+(Error|Exception): ")


def torchrun(n: int, args: list[str], timeout_s: float) -> tuple[dict | None, str]:
    import torch

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.pt")
        try:
            r = run_tp_train(n, [*args, "--out", out], timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout_s:.0f} s"
        if r.returncode != 0:
            # the ranks' own exceptions, not torchrun's ChildFailedError summary
            lines = [
                ln
                for ln in r.stderr.splitlines()
                if EXC.search(ln) and "ChildFailedError" not in ln
            ]
            return None, "\n".join(dict.fromkeys(lines[-4:])) or r.stderr[-2000:]
        return torch.load(out), ""


def compare(ref: dict, got: dict) -> dict:
    loss = max(abs(a - b) for a, b in zip(ref["losses"], got["losses"]))
    grad = 0.0
    for s, gs in enumerate(ref["grads"]):
        for n, g in gs.items():
            grad = max(
                grad, float((got["grads"][s][n].float() - g.float()).abs().max())
            )
    return {
        "max_loss_diff": loss,
        "max_grad_diff": grad,
        "within_1e-5": loss < ATOL and grad < ATOL,
    }


def parity_cases(device: str, budget_end: float, out: list[dict], save) -> None:
    """Each case against the one-rank run of the same model. CP runs on multi-head attention (4 key/value heads)
    and on GQA: transformers passes SDPA enable_gqa=True when there is no mask, which ring attention may not take."""
    common = ["--device", device, "--keep-grads", "--steps", "3", "--seq", "32"]
    mha = ["--kv-heads", "4"]
    cases = [
        # CP first: the CPU cannot run it at all, while TP's cases also run in CI on gloo
        ("CP=2 (MHA)", 2, ["--cp", "2", *mha]),
        ("CP=2 x FSDP2 dp=2 (MHA)", 4, ["--cp", "2", "--fsdp", *mha]),
        ("CP=2 (GQA)", 2, ["--cp", "2"]),
        ("TP=2", 2, ["--tp", "2"]),
        ("TP=2 SP", 2, ["--tp", "2", "--sequence-parallel"]),
        ("TP=2 x FSDP2 dp=2", 4, ["--tp", "2", "--fsdp"]),
    ]
    refs: dict[tuple, tuple] = {}
    for name, n, extra in cases:
        model = tuple(mha) if "--kv-heads" in extra else ()
        if model not in refs:
            refs[model] = torchrun(
                1,
                common + list(model),
                max(30.0, min(300.0, budget_end + 150 - time.time())),
            )
        ref, err = refs[model]
        if ref is None:
            out.append(
                {
                    "case": name,
                    "ranks": n,
                    "error": f"the one-rank reference failed: {err}",
                }
            )
            continue
        if time.time() > budget_end:
            out.append(
                {
                    "case": name,
                    "ranks": n,
                    "error": "skipped: the bench's time budget ran out",
                }
            )
            continue
        got, err2 = torchrun(
            n, common + extra, max(30.0, min(300.0, budget_end + 150 - time.time()))
        )
        row = {"case": name, "ranks": n}
        row.update(compare(ref, got) if got is not None else {"error": err2})
        out.append(row)
        save()  # a run stopped by its time limit keeps the rows it has
        print(json.dumps(row), flush=True)


def timing(
    device: str, shape: list[str], steps: int, threads: int, budget_end: float
) -> list[dict]:
    rows = []
    for tp in (1, 2):
        left = budget_end - time.time()
        if left < 30:
            rows.append({"tp": tp, "error": "skipped: the bench's time budget ran out"})
            continue
        args = [
            "--device",
            device,
            "--tp",
            str(tp),
            "--steps",
            str(steps),
            "--threads",
            str(threads),
            *shape,
        ]
        got, err = torchrun(tp, args, left)
        row = {"tp": tp, "ranks": tp, "threads_per_rank": threads}
        if got is None:
            row["error"] = err
        else:
            st = got["step_s"][1:] or got["step_s"]
            row.update(
                {"median_step_s": statistics.median(st), "step_s": got["step_s"]}
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    ok = [r for r in rows if "median_step_s" in r]
    if len(ok) == 2:
        rows.append(
            {"tp2_over_tp1_step_time": ok[1]["median_step_s"] / ok[0]["median_step_s"]}
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--out", required=True, help="a JSON file (cpu) or a directory (cuda)"
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=420,
        help="the parity cases stop starting after this",
    )
    args = ap.parse_args()
    import torch

    start = time.time()
    result: dict = {
        "bench": "bench_tp.py",
        "device": args.device,
        "torch": torch.__version__,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.device == "cpu":
        # width 256, 4 layers, 4 sequences of 128 tokens: big enough that the layers' matmuls are most of a step
        shape = ["--hidden", "256", "--layers", "4", "--batch", "4", "--seq", "128"]
        result["shape"] = shape
        result["timing"] = timing(
            "cpu", shape, args.steps, threads=1, budget_end=start + 600
        )
        path = args.out
    else:
        result["gpus"] = torch.cuda.device_count()
        result["gpu"] = torch.cuda.get_device_name(0)
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "trainer-torch-tp-gpu.json")
        result["parity"] = []
        parity_cases(
            "cuda", start + args.budget_s, result["parity"], lambda: write(path, result)
        )
        if torch.cuda.device_count() >= 2 and time.time() < start + args.budget_s:
            shape = [
                "--hidden",
                "896",
                "--layers",
                "24",
                "--batch",
                "4",
                "--seq",
                "2048",
                "--lr",
                "1e-5",
            ]
            result["shape"] = shape
            result["timing"] = timing(
                "cuda", shape, args.steps, threads=4, budget_end=start + 470
            )
        else:
            result["timing"] = (
                "skipped: TP=2 against TP=1 needs two GPUs (or the time budget ran out)"
            )
    result["wall_s"] = time.time() - start
    write(path, result)
    print(path)
    return 0


def write(path: str, result: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
