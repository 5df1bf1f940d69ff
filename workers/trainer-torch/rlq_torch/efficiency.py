"""Where a train step's time goes, and how much of the device it used: the step-time split, tokens/s, TFLOP/s and MFU.

FLOPs per token (``model_flops``): ``6·N + 6·L·d_attn·T`` for a forward and backward, where N is the
model's parameter count (embeddings included, tied ones once), L the layers, d_attn = heads × head_dim and
T the token's sequence length. 6·N is the dense matmuls (2 forward + 4 backward per parameter); the
attention term is PaLM's 12·L·d_attn·T (Chowdhery et al. 2022, appendix B) halved for causal masking,
which is what prime-rl reports: its published Qwen3-0.6B figure, 11.9k tokens/s at 16k on one H100, gives
its published 11.1% MFU by this formula. A forward alone (the old or reference log-probs) is a third of it.
Recomputation (gradient checkpointing, the chunked log-probs' second lm_head pass) is not counted: it is
the trainer's overhead, not the model's work. Sums over samples use each sample's own length (T² per
sample for attention), never padding.

MFU = achieved FLOP/s ÷ the device's dense bf16 peak (``device_peak_flops``): a table of known devices,
or ``RLQ_DEVICE_PEAK_TFLOPS`` in the environment (which also gives a CPU one); unknown → MFU is null.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

# Dense bf16 tensor-core peaks in TFLOP/s (vendor data sheets, no sparsity), matched on the device name, first hit wins.
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),
    ("H200", 989.4),
    ("H20", 148.0),
    ("GH200", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.1),
    ("A10G", 70.0),
    ("L4", 121.0),
)
PEAK_ENV = "RLQ_DEVICE_PEAK_TFLOPS"


def device_peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak in FLOP/s: RLQ_DEVICE_PEAK_TFLOPS when set, else the table by CUDA device name, else None."""
    env = os.environ.get(PEAK_ENV)
    if env:
        try:
            v = float(env)
        except ValueError as e:
            raise ValueError(
                f"{PEAK_ENV}={env!r}: expected the device's peak in TFLOP/s, e.g. 989.4"
            ) from e
        if not v > 0:
            raise ValueError(f"{PEAK_ENV}={env!r}: the peak must be > 0 TFLOP/s")
        return v * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS:
        if key in name:
            return tflops * 1e12
    return None


def model_shape(policy) -> dict[str, int]:
    """{params, layers, d_attn} of an EmbeddedPolicy or HFPolicy, for model_flops."""
    if policy.kind == "embedded":
        c = policy.config
        return {
            "params": sum(p.numel() for _, p in policy.named_params()),
            "layers": int(c["n_layers"]),
            "d_attn": int(c["d_model"]),
        }
    cfg = policy.module.config
    cfg = getattr(cfg, "get_text_config", lambda: cfg)()
    params = sum(
        p.numel() for p in policy.module.parameters()
    )  # parameters() yields a tied tensor once
    heads = int(
        getattr(cfg, "num_attention_heads", 0) or 0
    )  # 0: no attention (a state-space model): no T² term
    head_dim = getattr(cfg, "head_dim", None) or (
        int(cfg.hidden_size) // heads if heads else 0
    )
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    return {"params": int(params), "layers": layers, "d_attn": heads * int(head_dim)}


def model_flops(
    shape: dict[str, int], lengths: Sequence[int], forward_only: bool = False
) -> float:
    """FLOPs of a forward and backward (or a forward alone) over sequences of these lengths: Σ 6·N·T + 6·L·d_attn·T² (÷3 forward only)."""
    n, la, d = shape["params"], shape["layers"], shape["d_attn"]
    total = sum(6.0 * n * t + 6.0 * la * d * float(t) * t for t in lengths)
    return total / 3 if forward_only else total


class StepClock:
    """The step's wall time as contiguous phases: ``mark(phase)`` closes the time since the previous mark into
    ``phase`` (after waiting for the device, so queued kernels count where they were queued). The phases
    therefore sum to the step's wall time up to the clock's own rounding."""

    def __init__(self, device: torch.device):
        self.device = device
        self.t0 = self.last = time.perf_counter()
        self.split: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.split[phase] = self.split.get(phase, 0.0) + now - self.last
        self.last = now

    def elapsed(self) -> float:
        return self.last - self.t0


# The split's keys in the step's metrics (seconds); a phase that did not run reports 0.
SPLIT_KEYS = (
    "load_s",
    "old_logprobs_s",
    "ref_logprobs_s",
    "prepare_s",
    "critic_s",
    "fwd_bwd_s",
    "optimizer_s",
    "save_s",
    "push_s",
    "other_s",
)


def efficiency_metrics(
    clock: StepClock, tokens: int, flops: float, peak: float | None
) -> dict[str, float | None]:
    """The split (SPLIT_KEYS), step_s, tokens_per_s, tflops and mfu (None without a known peak)."""
    step_s = clock.elapsed()
    out: dict[str, float | None] = {k: clock.split.get(k, 0.0) for k in SPLIT_KEYS}
    out["step_s"] = step_s
    out["tokens_per_s"] = tokens / max(step_s, 1e-9)
    out["tflops"] = flops / max(step_s, 1e-9) / 1e12
    out["mfu"] = None if peak is None else flops / max(step_s, 1e-9) / peak
    return out


def add_push_time(metrics: dict[str, float], push_s: float) -> None:
    """The weight push (server.py, after train_step) into a step's metrics: push_s, and step_s, tokens_per_s, tflops
    and mfu over the longer step, so the split still sums to step_s."""
    step_s = metrics.get("step_s")
    if step_s is None:
        return
    longer = step_s + push_s
    metrics["push_s"] = metrics.get("push_s", 0.0) + push_s
    metrics["step_s"] = longer
    for k in ("tokens_per_s", "tflops", "mfu"):
        if k in metrics:
            metrics[k] = metrics[k] * step_s / max(longer, 1e-9)
