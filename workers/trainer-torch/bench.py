#!/usr/bin/env python3
"""Measures train steps of the PyTorch trainer (no HTTP, no Node): the embedded model and a
small randomly initialised Hugging Face architecture (when transformers is importable).

    python3 workers/trainer-torch/bench.py --device cuda [--out bench/results/trainer-torch-gpu.json]

Each model: one warm-up step, then --steps steps, each continuing from the previous one's
weights held in memory (as a run does), GRPO defaults, bf16 autocast on cuda. A step is
everything the server does after fetching the batch: old log-probs forward, the policy
forward/backward per micro-batch, AdamW, writing weights.safetensors and
optimizer.safetensors. tokens/s counts prompt + response tokens trained per second.
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

import torch  # noqa: E402
from rlq_torch import models as M  # noqa: E402
from rlq_torch.batch import Batch, Sample  # noqa: E402
from rlq_torch.trainer import Held, TorchTrainer, parse_algorithm, parse_train_config  # noqa: E402


def random_batch(
    step: int,
    vocab: int,
    groups: int,
    per_group: int,
    prompt: int,
    response: int,
    seed: int,
) -> Batch:
    rng = np.random.default_rng(seed + step)
    samples = []
    for g in range(groups):
        p = rng.integers(0, vocab, size=prompt).astype(np.int32)
        for k in range(per_group):
            r = rng.integers(0, vocab, size=response).astype(np.int32)
            samples.append(
                Sample(
                    np.concatenate([p, r]),
                    prompt,
                    np.ones(response, dtype=np.uint8),
                    (-rng.uniform(0.1, 5, size=response)).astype(np.float32),
                    np.full(response, step, dtype=np.int32),
                    float(rng.integers(0, 2)),
                    g,
                    k,
                )
            )
    return Batch("bench", step, samples)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_model(
    name: str,
    make_policy,
    device: str,
    shape: dict,
    steps: int,
    max_tokens: int,
    config: dict,
) -> dict:
    trainer = TorchTrainer(device)
    dev = trainer.device
    policy = make_policy(dev)
    nparams = sum(p.numel() for _, p in policy.named_params())
    tmp = tempfile.mkdtemp(prefix="rlq-bench-")
    cfg = {"lr": 1e-5, "max_tokens_per_gpu": max_tokens, **config}
    t = parse_train_config(cfg, {})
    o = parse_algorithm(cfg)
    # Start from an in-memory version 0 (what a loaded checkpoint would be).
    trainer.held = Held(policy, {}, 0, 0, os.path.realpath(os.path.join(tmp, "v0")))
    times, phases = [], []
    uri = "file://" + os.path.join(tmp, "v0")
    tokens = None
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for s in range(steps + 1):
        batch = random_batch(s, policy.vocab_size, **shape, seed=11)
        tokens = sum(len(x.tokens) for x in batch.samples)
        out = os.path.join(tmp, f"v{s + 1}")
        req = {
            "run_id": "bench",
            "step": s,
            "attempt": "0",
            "weight_version_in": s,
            "checkpoint_uri_in": uri,
            "output_dir": out,
            "config": cfg,
        }
        sync(dev)
        t0 = time.perf_counter()
        res = trainer.train_step(req, batch, t, o, lambda *a: None, lambda: None)
        sync(dev)
        dt = time.perf_counter() - t0
        prev = M.path_from_uri(uri)
        uri = res["checkpoint_uri"]
        if os.path.isdir(prev):
            shutil.rmtree(
                prev, ignore_errors=True
            )  # keep the disk bounded: only the latest version
        if s > 0:
            times.append(dt)
        phases.append(res["metrics"])
    med = statistics.median(times)
    mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None
    size = os.path.getsize(os.path.join(tmp, f"v{steps + 1}", M.WEIGHTS_FILE))
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.held = None
    del policy
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "model": name,
        "parameters": nparams,
        "batch": {
            "samples": shape["groups"] * shape["per_group"],
            "prompt_len": shape["prompt"],
            "response_len": shape["response"],
            "tokens": tokens,
        },
        "max_tokens_per_gpu": max_tokens,
        "steps_measured": steps,
        "step_s_median": round(med, 4),
        "step_s_all": [round(x, 4) for x in times],
        "tokens_per_s": round(tokens / med, 1),
        "peak_gpu_mem_gib": None if mem is None else round(mem, 2),
        "weights_file_mib": round(size / 2**20, 1),
        "last_metrics": {
            k: phases[-1][k]
            for k in ("pg_loss", "entropy_loss", "grad_norm")
            if k in phases[-1]
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU smoke run)")
    args = ap.parse_args()
    gpu = args.device.startswith("cuda")
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
    results = []
    emb = {
        "vocab_size": 258,
        "context_length": 64,
        "d_model": 32,
        "n_heads": 4,
        "n_layers": 2,
        "d_mlp": 64,
    }
    runs = [
        (
            "embedded tiny (test model: vocab 258, d 32, 2 layers)",
            emb,
            {"groups": 4, "per_group": 4, "prompt": 14, "response": 24},
            1 << 14,
        )
    ]
    if gpu or not args.quick:
        if gpu:
            gpt2 = {
                "vocab_size": 32768,
                "context_length": 1024,
                "d_model": 768,
                "n_heads": 12,
                "n_layers": 12,
                "d_mlp": 3072,
            }
            runs.append(
                (
                    "embedded GPT-2-small shape (vocab 32768, d 768, 12 layers)",
                    gpt2,
                    {"groups": 32, "per_group": 8, "prompt": 128, "response": 384},
                    16384,
                )
            )
        else:
            mid = {
                "vocab_size": 8192,
                "context_length": 256,
                "d_model": 256,
                "n_heads": 4,
                "n_layers": 4,
                "d_mlp": 1024,
            }
            runs.append(
                (
                    "embedded mid (vocab 8192, d 256, 4 layers)",
                    mid,
                    {"groups": 4, "per_group": 4, "prompt": 32, "response": 96},
                    2048,
                )
            )
    for name, c, shape, mt in runs:
        from rlq_torch import gpt

        make = lambda dev, c=c: (
            M.EmbeddedPolicy(c, gpt.init_weights(c, 1), dev)
            if c["d_model"] < 256
            else M.EmbeddedPolicy(c, _fast_init(c), dev)
        )  # noqa: E731
        print(f"bench {name} ...", file=sys.stderr)
        results.append(bench_model(name, make, args.device, shape, args.steps, mt, {}))
        save(args, gpu, results, None)
    if M.hf_available():
        import transformers

        hf_runs = [
            (
                "hf qwen2 tiny (random init: hidden 256, 4 layers, vocab 4096)",
                {
                    "model_type": "qwen2",
                    "hidden_size": 256,
                    "intermediate_size": 704,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 2,
                    "vocab_size": 4096,
                    "max_position_embeddings": 2048,
                    "dtype": "bfloat16",
                    "tie_word_embeddings": True,
                },
                {"groups": 4, "per_group": 4, "prompt": 32, "response": 64},
                4096,
            )
        ]
        if gpu:
            hf_runs.append(
                (
                    "hf qwen2 0.5B shape (random init: hidden 896, 24 layers, vocab 151936)",
                    {
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
                    },
                    {"groups": 32, "per_group": 8, "prompt": 128, "response": 384},
                    16384,
                )
            )
            hf_runs.append(
                (
                    "hf llama 1B-ish shape (random init: hidden 2048, 16 layers, vocab 32000)",
                    {
                        "model_type": "llama",
                        "hidden_size": 2048,
                        "intermediate_size": 5632,
                        "num_hidden_layers": 16,
                        "num_attention_heads": 32,
                        "num_key_value_heads": 8,
                        "vocab_size": 32000,
                        "max_position_embeddings": 4096,
                        "dtype": "bfloat16",
                    },
                    {"groups": 16, "per_group": 8, "prompt": 128, "response": 384},
                    16384,
                )
            )
        for name, hc, shape, mt in hf_runs:
            print(f"bench {name} ...", file=sys.stderr)
            results.append(
                bench_model(
                    name,
                    lambda dev, hc=hc: M.hf_from_config(hc, dev, 1),
                    args.device,
                    shape,
                    args.steps,
                    mt,
                    {},
                )
            )
            save(args, gpu, results, transformers.__version__)
        tv = transformers.__version__
    else:
        tv = None
        print("transformers is not importable: HF models skipped", file=sys.stderr)
    save(args, gpu, results, tv, final=True)


def save(args, gpu: bool, results: list, tv, final: bool = False) -> None:
    """Writes the document after every model (a run stopped at a time limit keeps what it measured); prints it at the end."""
    doc = {
        "what": "rlq PyTorch trainer: one train step (old log-probs, fwd/bwd per micro-batch, AdamW, save), median after a warm-up step",
        "command": "python3 workers/trainer-torch/bench.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0)
        if gpu
        else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "torch": torch.__version__,
        "transformers": tv,
        "bf16_autocast": gpu,
        "complete": final,
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    if final:
        print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


def _fast_init(c):
    """GPT-2 init from torch's generator (rlq's bit-exact initWeights is pure Python: slow for 100M parameters)."""
    import math
    from collections import OrderedDict

    from rlq_torch import gpt

    g = torch.Generator().manual_seed(1)
    out = OrderedDict()
    for name, shape, kind in gpt.parameter_specs(c):
        if kind == "ones":
            out[name] = torch.ones(shape)
        elif kind == "zeros":
            out[name] = torch.zeros(shape)
        else:
            std = 0.02 if kind == "normal" else 0.02 / math.sqrt(2 * c["n_layers"])
            out[name] = torch.randn(shape, generator=g) * std
    return out


if __name__ == "__main__":
    main()
