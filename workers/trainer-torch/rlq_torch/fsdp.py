"""Parameter sharding with PyTorch's FullyShardedDataParallel (``server.py --nproc N --sharding fsdp``).

The default many-rank mode (``--sharding zero1``) replicates the parameters and gradients (DDP) and
shards only the optimizer state. With ``fsdp`` the parameters, gradients and optimizer state are
all sharded: each rank holds 1/N of every parameter at rest, FSDP all-gathers a unit's parameters
for its forward and backward, and reduce-scatters the gradients.

How the trainer uses it:

- the policy's forward is wrapped as the DDP one is (trainer._Forward) in
  ``FullyShardedDataParallel(use_orig_params=True)``. ``use_orig_params`` keeps the parameter
  objects the policy lists (``named_params()``), each a view of this rank's shard outside the
  forward and backward, with its gradient shard in ``.grad``. Hugging Face models are wrapped one
  unit per decoder layer (the model's ``_no_split_modules``, as verl does); the embedded model is
  one unit;
- the optimizer (sharded_adamw.py) then runs AdamW elementwise on every rank's own shards: the
  gradient norm is a sum of squares all-reduced over the ranks, weight decay follows the
  parameter's full rank (``ndims``, recorded before wrapping: a shard is flat), and nothing is
  broadcast afterwards;
- every rank runs the same number of forwards and backwards (FSDP's collectives), so a rank with
  no micro-batch left in a round runs a dummy one, as with DDP;
- checkpoints: each rank writes its shards of the moments (``optimizer-K-of-N.safetensors``,
  metadata ``sharding: fsdp``); the weights are gathered to rank 0 (``summon_full_params``) and
  written by the policy's own writer, so the Hugging Face directory is the same as with one rank.
  A group of the same size resumes from its shards (each rank reads its own); another size, or a
  ``zero1`` group, refuses them with a CheckpointError;
- trainer_push: the weights are gathered to rank 0 the same way and pushed from there.

torch >= 2.0 is needed (``use_orig_params``). torch 1.13 (Debian's python3-torch) cannot run it:
under Python 3.11 ``import torch.distributed.fsdp`` fails (a dataclass with a mutable default,
fixed upstream in 2.0), and even with that import patched its FSDP puts every compute device on
CUDA (``_get_compute_device``: "for now, the compute device is always a CUDA GPU device") and
creates CUDA streams, so it cannot run on CPU with gloo. ``fsdp_unavailable()`` says why.

Not yet: PPO's critic with ``fsdp`` (the critic is built from the policy's full weights; it is
refused as bad_request), and a world size change on resume.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Tuple

import torch

SHARDING_MODES = ("zero1", "fsdp")


def torch_version() -> Tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def fsdp_unavailable() -> Optional[str]:
    """None when this torch can shard with FullyShardedDataParallel, else the reason."""
    if torch_version() < (2, 0):
        return (f"--sharding fsdp needs torch >= 2.0 (FullyShardedDataParallel with use_orig_params); this is torch {torch.__version__}, "
                "whose FSDP does not import under Python 3.11 and runs on CUDA only")
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"--sharding fsdp: torch.distributed.fsdp does not import: {type(e).__name__}: {e}"
    return None


def _wrap_policy(module: torch.nn.Module):
    """One FSDP unit per decoder layer of a Hugging Face model (its _no_split_modules); None: the whole model is one unit."""
    names = set(getattr(getattr(module, "inner", module), "_no_split_modules", None) or [])
    if not names:
        return None
    classes = {type(m) for m in module.modules() if type(m).__name__ in names}
    if not classes:
        return None
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)


def wrap(forward_module: torch.nn.Module, device: torch.device):
    """FullyShardedDataParallel around the training forward (trainer._Forward), full sharding, original parameters kept."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    return FullyShardedDataParallel(forward_module, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=_wrap_policy(forward_module),
                                    device_id=device if device.type == "cuda" else None, use_orig_params=True, sync_module_states=False,
                                    limit_all_gathers=True)


@contextmanager
def full_params(fsdp_module, device: torch.device) -> Iterator[None]:
    """The whole parameters on rank 0 inside the block (the policy's parameter objects show them); a collective."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(fsdp_module, recurse=True, writeback=False, rank0_only=True,
                                                     offload_to_cpu=device.type == "cuda"):
        yield


def full_named_params(fsdp_module, policy, device: torch.device, rank: int) -> Optional[List[Tuple[str, torch.Tensor]]]:
    """Copies of the whole parameters on rank 0 (None on the others); every rank must call it."""
    with full_params(fsdp_module, device):
        if rank != 0:
            return None
        return [(n, p.detach().clone()) for n, p in policy.named_params()]


def ndims(policy) -> Dict[str, int]:
    """Each parameter's rank before wrapping (FSDP's shards are flat; weight decay applies to >= 2-D parameters)."""
    return {n: p.dim() for n, p in policy.named_params()}
