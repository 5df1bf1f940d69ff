"""Parameter sharding with PyTorch's FSDP (``server.py --nproc N --sharding fsdp``).

Which FSDP: ``--sharding fsdp`` uses FSDP2 (``fully_shard``, torch >= 2.6, or 2.4-2.5 under
torch.distributed._composable) where the installed torch has it, else FSDP1
(``FullyShardedDataParallel``, torch >= 2.0). ``--sharding fsdp1`` forces FSDP1. The two keep their
shards differently (FSDP1: flat pieces of a flattened unit; FSDP2: each parameter a DTensor cut
along dim 0), so their optimizer files say which (metadata ``sharding: fsdp`` or ``fsdp2``) and a
group resumes only from its own kind.

FSDP2 (``fully_shard``) in the trainer:

- one ``fully_shard`` per Hugging Face decoder layer (``_no_split_modules``) and one around the
  training forward, over a 1-D device mesh of the group (``init_device_mesh(device.type, ...)``:
  ``cpu`` with gloo, ``cuda`` with NCCL);
- the parameters become DTensors; the policies read their parameters from the module on every
  call (models.py, gpt.py), because FSDP2 swaps the module's attributes between the sharded and the
  gathered parameter around each forward and backward;
- the optimizer works on each DTensor's local shard (``local()``), as with FSDP1's flat views;
- gradient accumulation: ``set_requires_gradient_sync(False)`` for every micro-batch but a rank's
  last (``grad_sync``), FSDP1's ``no_sync()``;
- the whole weights for a save or a push: ``unshard()`` of every FSDP module (``full_params``),
  so every rank holds the whole model for that moment (FSDP1 gathers to rank 0 only, on the CPU).

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
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

SHARDING_MODES = ("zero1", "fsdp", "fsdp1")
FSDP_IMPLS = ("fsdp1", "fsdp2")
OPTIMIZER_SHARDING = {
    "fsdp1": "fsdp",
    "fsdp2": "fsdp2",
}  # what an optimizer file's metadata says


def torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def fsdp_unavailable() -> str | None:
    """None when this torch can shard with FullyShardedDataParallel, else the reason."""
    if torch_version() < (2, 0):
        return (
            f"--sharding fsdp needs torch >= 2.0 (FullyShardedDataParallel with use_orig_params); this is torch {torch.__version__}, "
            "whose FSDP does not import under Python 3.11 and runs on CUDA only"
        )
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"--sharding fsdp: torch.distributed.fsdp does not import: {type(e).__name__}: {e}"
    return None


def _fully_shard():
    """torch's fully_shard (FSDP2) and FSDPModule, or None when this torch has none."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard  # torch >= 2.6

        return fully_shard, FSDPModule
    except Exception:  # noqa: BLE001
        try:
            from torch.distributed._composable.fsdp import FSDPModule, fully_shard  # noqa: F811  (torch 2.4, 2.5)

            return fully_shard, FSDPModule
        except Exception:  # noqa: BLE001
            return None


def resolve(mode: str) -> str:
    """--sharding → what the trainer runs: zero1, fsdp1 (FullyShardedDataParallel) or fsdp2 (fully_shard, where torch has it)."""
    if mode == "fsdp":
        return "fsdp2" if _fully_shard() is not None else "fsdp1"
    return mode


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's shard of an FSDP2 (DTensor) parameter or gradient, itself for a plain tensor (in-place updates land in the shard)."""
    return t.to_local() if t is not None and hasattr(t, "to_local") else t


def _layer_classes(module: torch.nn.Module):
    names = set(
        getattr(getattr(module, "inner", module), "_no_split_modules", None) or []
    )
    return (
        {type(m) for m in module.modules() if type(m).__name__ in names}
        if names
        else set()
    )


def _wrap_policy(module: torch.nn.Module):
    """One FSDP unit per decoder layer of a Hugging Face model (its _no_split_modules); None: the whole model is one unit."""
    classes = _layer_classes(module)
    if not classes:
        return None
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls=classes
    )


def optimizer_sharding(dist) -> str:
    """What a sharded optimizer file's metadata says: the FSDP kind, and the TP size when > 1 (its shards are cut
    along the TP dimension too, so only a group of the same mesh reads them)."""
    tag = OPTIMIZER_SHARDING[dist.sharding]
    return tag if dist.tp == 1 else f"{tag}-tp{dist.tp}"


def wrap(
    forward_module: torch.nn.Module,
    device: torch.device,
    impl: str = "fsdp1",
    tp: int = 1,
):
    """The training forward (trainer._Forward) sharded: FSDP1 with the original parameters kept, or FSDP2 in place.

    FSDP1 is always given the device: without ``device_id`` it computes on CUDA whenever CUDA is
    available, so a CPU (gloo) group on a machine with a GPU failed with "An FSDP-managed module
    unexpectedly has parameters on cpu" (seen with torch 2.11 on an H100 host)."""
    if impl == "fsdp2":
        fully_shard, _ = _fully_shard()
        from torch.distributed.device_mesh import init_device_mesh

        # tensor parallel: TP inside each layer first, then FSDP2 over the data-parallel ranks (tensor_parallel.py)
        if tp > 1:
            from .tensor_parallel import tp_shard_mesh

            mesh = tp_shard_mesh(forward_module.inner, device, tp)
        else:
            mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
        classes = _layer_classes(forward_module)
        for m in list(forward_module.modules()):
            if type(m) in classes:
                fully_shard(m, mesh=mesh)
        fully_shard(forward_module, mesh=mesh)
        return forward_module
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    return FullyShardedDataParallel(
        forward_module,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        auto_wrap_policy=_wrap_policy(forward_module),
        device_id=device,
        use_orig_params=True,
        sync_module_states=False,
        limit_all_gathers=True,
    )


def grad_sync(fwd, on: bool):
    """A context: gradients reduced at this backward (on) or accumulated locally (off: DDP's and FSDP1's no_sync)."""
    if fwd is None or on:
        return nullcontext()
    if hasattr(fwd, "set_requires_gradient_sync"):
        return _fsdp2_no_sync(fwd)
    return fwd.no_sync()


@contextmanager
def _fsdp2_no_sync(fwd) -> Iterator[None]:
    fwd.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        fwd.set_requires_gradient_sync(True)


@contextmanager
def full_params(fsdp_module, device: torch.device) -> Iterator[None]:
    """The whole parameters on rank 0 inside the block (the policy's parameter objects show them); a collective."""
    fs = _fully_shard()
    if fs is not None and isinstance(fsdp_module, fs[1]):
        mods = [m for m in fsdp_module.modules() if isinstance(m, fs[1])]
        for m in mods:
            m.unshard()
        from .tensor_parallel import whole_params

        try:
            # TP shards, which FSDP's gather leaves cut along the TP dimension, made whole
            with whole_params(fsdp_module):
                yield
        finally:
            for m in mods:
                m.reshard()
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(
        fsdp_module,
        recurse=True,
        writeback=False,
        rank0_only=True,
        offload_to_cpu=device.type == "cuda",
    ):
        yield


def full_named_params(
    fsdp_module, policy, device: torch.device, rank: int
) -> list[tuple[str, torch.Tensor]] | None:
    """Copies of the whole parameters on rank 0 (None on the others); every rank must call it."""
    with full_params(fsdp_module, device):
        if rank != 0:
            return None
        # LoRA: the merged weights an engine loads, not the adapters the optimizer updates (lora.py)
        named = getattr(policy, "engine_params", policy.named_params)()
        return [(n, p.detach().clone()) for n, p in named]


def ndims(policy) -> dict[str, int]:
    """Each parameter's rank before wrapping (FSDP1's shards are flat; weight decay applies to >= 2-D parameters)."""
    return {n: p.dim() for n, p in policy.named_params()}
