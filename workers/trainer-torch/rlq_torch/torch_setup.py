"""Process-wide torch settings, the same for the one-process server and every torchrun rank."""

from __future__ import annotations

import os
from typing import Any


def configure_torch(args: Any) -> None:
    """--threads, and deterministic kernels on CPU or with --deterministic (the protocol's bit-exact
    steps); on CUDA, no TF32 (its matmuls differ from fp32 ones)."""
    if args.deterministic and args.device.startswith("cuda"):
        os.environ.setdefault(
            "CUBLAS_WORKSPACE_CONFIG", ":4096:8"
        )  # before cuBLAS starts
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cpu" or args.deterministic:
        try:
            torch.use_deterministic_algorithms(True, warn_only=True)
        except TypeError:  # torch < 1.11 has no warn_only
            torch.use_deterministic_algorithms(True)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
