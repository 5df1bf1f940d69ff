#!/usr/bin/env python3
"""The torch trainer's GPU bench, one run of at most ~7 minutes on one GPU (issue 47: a trainer that spends its GPU on the model).

    python3 workers/trainer-torch/bench_gpu.py --out DIR            # on the GPU machine, from the repository root
    python3 workers/trainer-torch/bench_gpu.py --out DIR --dry-run  # tiny shapes on the CPU, seconds (CI runs it)

Cases, in order (each skipped or cut short when the run's time budget would not hold it):

- ``qwen3-0.6b-16k``: a Qwen3-0.6B shape (vocab 151936, hidden 1024, 28 layers, 16 heads / 8 KV heads of
  128, MLP 3072, tied embeddings; random init, bf16 weights file), samples of 16384 tokens, one per packed
  row (use_dynamic_batch_size), as prime-rl's published 1×H100 figure (11.9k tokens/s, 11.1% MFU). Target:
  1.2× that, 14.3k tokens/s.
- ``qwen2-0.5b-512``: the Qwen2-0.5B shape of bench/results/trainer-torch-gpu-h100.json (256 samples of 128 +
  384 tokens, micro-batches of 16384 padded tokens), to compare with its 10.5k tokens/s.
- ``qwen3-0.6b-16k-mixed``: the Qwen3 shape with samples of 1k to 6k tokens packed into rows of up to 16384
  (position ids restart per sample, attention stays within a sample).

A step is TorchTrainer.train_step as the server runs it (old log-probs where needed, forward/backward, the
loss, AdamW, the step's files; by default with --trainer-checkpoint dcp, as the server runs on one GPU: the
weights file fsync'd before the step answers, the optimizer state saved asynchronously, its wait counted in the
next step's save_s), continuing from the previous step's weights in memory. Each case: one warm-up
step, then up to --steps measured ones. Reported per case: tokens/s, TFLOP/s and MFU (efficiency.py's
formula), the step's time split (medians), peak GPU memory, the weights file's dtype and size, and the same
without the save (``*_without_save``). The JSON is rewritten after every step, so a run stopped at its time
limit keeps what it measured. It needs torch, transformers and numpy only (rlq_torch imports nothing else).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch
from rlq_torch import models as M
from rlq_torch.batch import Batch, Sample
from rlq_torch.efficiency import PEAK_ENV, SPLIT_KEYS, device_peak_flops, model_shape
from rlq_torch.trainer import Held, TorchTrainer, parse_algorithm, parse_train_config

# The overlapped save's parts (trainer.py _save_overlapped): the wait for the previous step's optimizer write, the
# staging of this step's, and the weights file (on a second thread, beside the staging).
SAVE_PARTS = ("save_wait_s", "save_stage_s", "save_weights_s")
TARGET_TOKENS_PER_S = (
    1.2 * 11_900
)  # issue 47: 1.2× prime-rl's published Qwen3-0.6B / 1×H100 / 16k figure

QWEN3_06B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}
QWEN2_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "dtype": "bfloat16",
    "tie_word_embeddings": True,
}
TINY_QWEN3 = {
    **QWEN3_06B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
}
TINY_QWEN2 = {
    **QWEN2_05B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


def cases(dry: bool) -> list:
    """(name, model config, sample lengths as (prompt, response) pairs, train config, seconds budgeted)."""
    if dry:
        return [
            (
                "qwen3-0.6b-16k",
                TINY_QWEN3,
                [(32, 224)] * 4,
                {"max_tokens_per_gpu": 256, "use_dynamic_batch_size": True},
                20,
            ),
            (
                "qwen2-0.5b-512",
                TINY_QWEN2,
                [(16, 48)] * 8,
                {"max_tokens_per_gpu": 256},
                20,
            ),
            (
                "qwen3-0.6b-16k-mixed",
                TINY_QWEN3,
                mixed_lengths(256, 512, 16, 120, seed=1),
                {"max_tokens_per_gpu": 256, "use_dynamic_batch_size": True},
                20,
            ),
        ]
    return [
        (
            "qwen3-0.6b-16k",
            QWEN3_06B,
            [(1024, 15360)] * 8,
            {"max_tokens_per_gpu": 16384, "use_dynamic_batch_size": True},
            170,
        ),
        (
            "qwen2-0.5b-512",
            QWEN2_05B,
            [(128, 384)] * 256,
            {"max_tokens_per_gpu": 16384},
            90,
        ),
        (
            "qwen3-0.6b-16k-mixed",
            QWEN3_06B,
            mixed_lengths(16384, 8 * 16384, 1024, 6144, seed=1),
            {"max_tokens_per_gpu": 16384, "use_dynamic_batch_size": True},
            120,
        ),
    ]


def mixed_lengths(row: int, total: int, lo: int, hi: int, seed: int) -> list:
    """Samples of lo..hi tokens (prompt an eighth) filling about ``total`` tokens, each no longer than a row."""
    rng = np.random.default_rng(seed)
    out, n = [], 0
    while n < total:
        length = min(
            int(rng.integers(lo, hi + 1)), row + 1
        )  # a sample of row + 1 tokens fills a row (its last token is no input)
        p = max(1, length // 8)
        out.append((p, length - p))
        n += length
    return out


def batch_of(step: int, vocab: int, lengths: list) -> Batch:
    rng = np.random.default_rng(1000 + step)
    samples = []
    for i, (p, r) in enumerate(lengths):
        toks = rng.integers(0, vocab, size=p + r).astype(np.int32)
        samples.append(
            Sample(
                toks,
                p,
                np.ones(r, dtype=np.uint8),
                (-rng.uniform(0.1, 5, size=r)).astype(np.float32),
                np.full(r, step, dtype=np.int32),
                float(rng.integers(0, 2)),
                i // 8,
                i % 8,
            )
        )
    return Batch("bench", step, samples)


def pick_attention(device: torch.device) -> tuple:
    """(implementation, why): flash attention where its package is installed (varlen kernels for packed rows), else sdpa
    (one sample per row runs its causal flash kernel; packed rows a block-diagonal mask)."""
    if device.type != "cuda":
        return "sdpa", "cpu"
    for impl, module in (
        ("flash_attention_3", "flash_attn_interface"),
        ("flash_attention_2", "flash_attn"),
    ):
        if importlib.util.find_spec(module) is None:
            continue
        try:
            importlib.import_module(
                module
            )  # a wheel built for another torch fails here, not halfway through a case
        except Exception as e:  # noqa: BLE001
            print(
                f"bench_gpu: {module} is installed but does not import ({type(e).__name__}: {e}); trying the next",
                file=sys.stderr,
            )
            continue
        return impl, f"{module} imports"
    return (
        "sdpa",
        "no importable flash attention package: torch's scaled_dot_product_attention",
    )


def several_per_row(lengths, train_cfg) -> bool:
    """Whether packing puts more than one sample in a row of max_tokens_per_gpu tokens."""
    row = train_cfg.get("max_tokens_per_gpu") or 0
    return bool(train_cfg.get("use_dynamic_batch_size")) and any(
        (p + r) * 2 <= row for p, r in lengths
    )


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_case(
    name,
    executor,
    model_cfg,
    lengths,
    train_cfg,
    budget_s,
    deadline,
    args,
    dev,
    attn,
    doc,
    out_path,
):
    """Warm-up plus measured steps within min(budget_s, the run's deadline); appends the case's result to doc and rewrites the file."""
    started = time.perf_counter()
    stop_at = min(started + budget_s, deadline)
    res = {
        "case": name,
        "model": model_cfg,
        "samples": len(lengths),
        "tokens_per_step": int(sum(p + r for p, r in lengths)),
        "max_tokens_per_gpu": train_cfg.get("max_tokens_per_gpu"),
        "packed": bool(train_cfg.get("use_dynamic_batch_size")),
        "steps": [],
        "complete": False,
    }
    doc["results"].append(res)
    trainer = TorchTrainer(
        str(dev), checkpoint_format=args.trainer_checkpoint, dcp_executor=executor
    )
    res["dcp_executor"] = executor
    if attn == "sdpa" and dev.type == "cuda" and several_per_row(lengths, train_cfg):
        # sdpa takes packed rows as a dense block-diagonal mask, which sends it to its math kernel (out of memory
        # at 16k-token rows); flex_attention masks them by block. One sample per row keeps sdpa's causal flash kernel.
        attn = "flex_attention"
    policy = M.hf_from_config(model_cfg, dev, 1, attn_implementation=attn)
    res["attention"] = policy.module.config._attn_implementation
    res["parameters"] = int(sum(p.numel() for p in policy.module.parameters()))
    res["model_shape"] = model_shape(policy)
    res["weights_dtype"] = str(policy.save_dtype).replace("torch.", "")
    tmp = tempfile.mkdtemp(prefix="rlq-bench-gpu-", dir=args.scratch)
    cfg = {"lr": 1e-6, **train_cfg}
    t, o = parse_train_config(cfg, {}), parse_algorithm(cfg)
    trainer.held = Held(policy, {}, 0, 0, os.path.realpath(os.path.join(tmp, "v0")))
    uri = "file://" + os.path.join(tmp, "v0")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    try:  # the model and the trainer are freed whatever happens: the next case needs the memory
        step = 0
        while step <= args.steps:
            last = res["steps"][-1]["wall_s"] if res["steps"] else res.get("warmup_s")
            # The case's budget stops it after one measured step at least; the run's deadline at any step.
            limit = stop_at if res["steps"] else deadline
            if last is not None and time.perf_counter() + 1.3 * last > limit:
                res["stopped"] = (
                    f"time budget: {budget_s} s for the case, or the run's deadline"
                )
                break
            batch = batch_of(step, policy.vocab_size, lengths)
            out = os.path.join(tmp, f"v{step + 1}")
            req = {
                "run_id": "bench",
                "step": step,
                "attempt": "0",
                "weight_version_in": step,
                "checkpoint_uri_in": uri,
                "output_dir": out,
                "config": cfg,
            }
            sync(dev)
            t0 = time.perf_counter()
            try:
                r = trainer.train_step(req, batch, t, o, lambda *a: None, lambda: None)
            except Exception as e:
                if trainer.checkpoint_format != "dcp" or isinstance(
                    e, torch.cuda.OutOfMemoryError
                ):
                    raise
                # One run must settle it: a DCP save that fails on this machine falls back to the files, and says so.
                traceback.print_exc()
                res["dcp_error"] = f"{type(e).__name__}: {str(e)[:1000]}"
                trainer.checkpoint_format = "safetensors"
                trainer.async_ckpt = type(trainer.async_ckpt)()
                # The step again from the weights as they are (a bench measures time, not these numbers).
                trainer.held = Held(
                    policy, {}, 0, step, os.path.realpath(M.path_from_uri(uri))
                )
                r = trainer.train_step(req, batch, t, o, lambda *a: None, lambda: None)
            res["trainer_checkpoint"] = trainer.checkpoint_format
            sync(dev)
            wall = time.perf_counter() - t0
            prev, uri = M.path_from_uri(uri), r["checkpoint_uri"]
            if os.path.isdir(prev):
                shutil.rmtree(
                    prev, ignore_errors=True
                )  # the disk holds the latest version only
            if step == 0:
                res["warmup_s"] = round(wall, 3)
            else:
                m = r["metrics"]
                keep = list(SPLIT_KEYS) + [
                    "step_s",
                    "tokens_per_s",
                    "tflops",
                    "mfu",
                    "model_flops_per_step",
                    "pg_loss",
                    "grad_norm",
                    *SAVE_PARTS,
                ]
                res["steps"].append(
                    {"wall_s": round(wall, 4), **{k: m[k] for k in keep if k in m}}
                )
                summarize(res, out, dev)
                write(doc, out_path)
            step += 1
        res["complete"] = "stopped" not in res
    finally:
        try:
            trainer.async_ckpt.wait()  # the last step's optimizer state, before its directory goes
        except Exception as e:  # noqa: BLE001 - recorded; the case's measurements stand
            res["dcp_error"] = f"{type(e).__name__}: {str(e)[:1000]}"
        trainer.held = None
        trainer = policy = None
        shutil.rmtree(tmp, ignore_errors=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    summarize(res, None, dev)
    return res


def summarize(res: dict, out_dir, dev: torch.device) -> None:
    """Medians over the measured steps: tokens/s, TFLOP/s, MFU and the split, with and without the save."""
    steps = res["steps"]
    if not steps:
        return
    med = lambda k: (
        statistics.median(s[k] for s in steps) if all(k in s for s in steps) else None
    )
    step_s = med("step_s")
    save_s = med("save_s") or 0.0
    flops = med("model_flops_per_step")
    res["steps_measured"] = len(steps)
    res["step_s_median"] = step_s
    res["tokens_per_s"] = round(res["tokens_per_step"] / step_s, 1)
    res["tflops"] = flops / step_s / 1e12
    res["mfu"] = med("mfu")
    res["tokens_per_s_without_save"] = round(
        res["tokens_per_step"] / (step_s - save_s), 1
    )
    res["tflops_without_save"] = flops / (step_s - save_s) / 1e12
    if res["mfu"] is not None:
        res["mfu_without_save"] = res["mfu"] * step_s / (step_s - save_s)
    res["split_median_s"] = {k: med(k) for k in SPLIT_KEYS if med(k) is not None}
    res["save_parts_median_s"] = {k: med(k) for k in SAVE_PARTS if med(k) is not None}
    res["split_sum_over_step"] = sum(res["split_median_s"].values()) / step_s
    if dev.type == "cuda":
        res["peak_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    if out_dir is not None and os.path.isfile(os.path.join(out_dir, M.WEIGHTS_FILE)):
        res["weights_file_mib"] = round(
            os.path.getsize(os.path.join(out_dir, M.WEIGHTS_FILE)) / 2**20, 1
        )


def write(doc: dict, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out", required=True, help="directory for trainer-torch-gpu-bench.json"
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny shapes on the CPU (seconds): checks the script end to end",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=3,
        help="measured steps per case, after one warm-up step",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=380.0,
        help="the whole run's time budget; the process stops itself 30 s after it (~7 minutes in all)",
    )
    ap.add_argument(
        "--cases", default=None, help="comma-separated case names (default: all)"
    )
    ap.add_argument(
        "--trainer-checkpoint",
        choices=["safetensors", "dcp"],
        default="dcp",
        help="the trainer's own checkpoint, as server.py's flag: dcp saves it asynchronously (the GPU setting)",
    )
    ap.add_argument(
        "--dcp-executor",
        default="thread",
        help="comma-separated: each case runs once per DCP executor (thread, process; server.py's flag), "
        "named CASE@EXECUTOR after the first",
    )
    ap.add_argument(
        "--attention",
        default=None,
        help="the model's attn_implementation for every case (default: flash attention where it imports, else sdpa)",
    )
    ap.add_argument(
        "--scratch",
        default=None,
        help="where the steps' checkpoints go (default: the system's temporary directory)",
    )
    args = ap.parse_args()
    begun = time.perf_counter()
    deadline = begun + args.budget_s
    dev = torch.device(
        "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda:0"
    )
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # as the server (torch_setup.py): bf16 autocast for the model, fp32 elsewhere
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    attn, why = pick_attention(dev)
    if args.attention is not None:
        attn, why = args.attention, "--attention"
    import transformers

    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "trainer-torch-gpu-bench.json")
    peak = device_peak_flops(dev)
    doc = {
        "what": "rlq torch trainer: train steps (TorchTrainer.train_step) on random-init HF shapes; medians after one warm-up step",
        "command": "python3 workers/trainer-torch/bench_gpu.py "
        + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": args.dry_run,
        "device": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)",
        "peak_tflops": None if peak is None else peak / 1e12,
        "peak_from": PEAK_ENV
        if os.environ.get(PEAK_ENV)
        else ("device table (efficiency.py)" if peak else None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "trainer_checkpoint": args.trainer_checkpoint,
        "attention": attn,
        "attention_why": why,
        "flops_formula": "6·N·T + 6·L·d_attn·T² per sample of T tokens (N all parameters, tied once); a forward alone a third",
        "target_tokens_per_s": TARGET_TOKENS_PER_S,
        "results": [],
        "complete": False,
    }
    write(doc, out_path)

    def on_alarm(signum, frame):
        raise TimeoutError(f"the bench ran past its budget of {args.budget_s} s + 30 s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.budget_s) + 30)
    wanted = None if args.cases is None else set(args.cases.split(","))
    executors = args.dcp_executor.split(",")
    runs = [
        (name if i == 0 else f"{name}@{ex}", ex, *rest)
        for name, *rest in cases(args.dry_run)
        if wanted is None or name in wanted
        for i, ex in enumerate(executors)
    ]
    try:
        for name, executor, model_cfg, lengths, train_cfg, budget in runs:
            if time.perf_counter() > deadline - 20:
                doc["results"].append(
                    {"case": name, "skipped": "the run's time budget is spent"}
                )
                continue
            print(f"bench_gpu: {name} ...", file=sys.stderr, flush=True)
            try:
                res = run_case(
                    name,
                    executor,
                    model_cfg,
                    lengths,
                    train_cfg,
                    budget,
                    deadline,
                    args,
                    dev,
                    attn,
                    doc,
                    out_path,
                )
                print(
                    f"bench_gpu: {name}: {res.get('tokens_per_s')} tokens/s, {res.get('tflops')} TFLOP/s, MFU {res.get('mfu')}, "
                    f"split {res.get('split_median_s')}",
                    file=sys.stderr,
                    flush=True,
                )
            except TimeoutError:
                raise
            except Exception as e:  # noqa: BLE001 - a case that fails (OOM, a missing kernel) is recorded and the next one runs
                traceback.print_exc()
                if not doc["results"] or doc["results"][-1].get("case") != name:
                    doc["results"].append({"case": name})
                doc["results"][-1]["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            write(doc, out_path)
        doc["complete"] = True
    except TimeoutError as e:
        doc["stopped"] = str(e)
    finally:
        signal.alarm(0)
        doc["elapsed_s"] = round(time.perf_counter() - begun, 1)
        write(doc, out_path)
        print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
