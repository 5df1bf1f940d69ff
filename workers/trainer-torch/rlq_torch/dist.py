"""Data parallelism for the trainer: PyTorch's own distributed stack (torch.distributed), no home-made transport.

One ``Dist`` per process. With one process it is the identity (no collectives at all), so
the single-device trainer is unchanged. Under torchrun (``dist_worker.py``):

- **gradients**: the model runs inside ``DistributedDataParallel`` (``--sharding zero1``), or
  ``FullyShardedDataParallel`` with every parameter sharded (``--sharding fsdp``, torch >= 2.0,
  fsdp.py), with ``no_sync()`` for every micro-batch but a rank's last one, so gradients
  accumulate locally and are reduced once per optimizer step;
- **optimizer state** is sharded (ZeRO-1, as torch.distributed.optim.ZeroRedundancyOptimizer
  partitions it): each parameter has one owner rank (greedy by size, deterministic), only the
  owner keeps its Adam moments and updates it, then broadcasts the new values (with fsdp each
  rank keeps and updates the moments of its own shards);
- **FSDP2** (``fully_shard``): ``--sharding fsdp`` uses it where torch has it (fsdp.py), and
  /v1/health reports ``fsdp2_available``;
- **agreement**: cancellation is decided by rank 0 and agreed with one all-reduce at points
  every rank reaches the same number of times (per micro-batch round), so no rank is ever
  left waiting in a collective the others skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def fsdp2_available() -> bool:
    """This torch has FSDP2's fully_shard (fsdp.py finds it; torch >= 2.4)."""
    from .fsdp import _fully_shard

    return _fully_shard() is not None


def partition(params: Sequence[tuple[str, torch.Tensor]], world: int) -> dict[str, int]:
    """name → owner rank: largest tensors first, each to the least loaded rank (ties: lowest rank)."""
    load = [0] * world
    owner: dict[str, int] = {}
    order = sorted(range(len(params)), key=lambda i: (-params[i][1].numel(), i))
    for i in order:
        r = min(range(world), key=lambda k: (load[k], k))
        owner[params[i][0]] = r
        load[r] += params[i][1].numel()
    return owner


class Dist:
    """rank / world and the few collectives the train step needs."""

    def __init__(self, rank: int = 0, world: int = 1, sharding: str = "zero1"):
        self.rank = rank
        self.world = world
        self.sharding = sharding  # zero1: replicated parameters, owner-sharded moments; fsdp1 | fsdp2: every parameter sharded (fsdp.py)
        self.cancel_requested: Callable[[], bool] = lambda: False
        # tensor parallel (tensor_parallel.py): tp consecutive ranks share each micro-batch, so the data-parallel
        # slots are world // tp and rank r is slot r // tp (the mesh's innermost dimension is tp)
        self.tp = 1

    @property
    def slots(self) -> int:
        return self.world // self.tp

    @property
    def slot(self) -> int:
        return self.rank // self.tp

    @property
    def active(self) -> bool:
        return self.world > 1

    def mine(self, k: int) -> bool:
        """Micro-batch k (of a round-robin split) is this rank's (its slot's, under tensor parallel)."""
        return k % self.slots == self.slot

    def agree_cancel(self, check: Callable[[], None]) -> None:
        """Every rank calls this the same number of times; all stop together when rank 0 was asked to."""
        if not self.active:
            check()
            return
        flag = torch.tensor(
            [1 if (self.rank == 0 and self.cancel_requested()) else 0],
            dtype=torch.int32,
        )
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if int(flag.item()):
            from .trainer import Cancelled

            raise Cancelled()

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast_from(self, tensor: torch.Tensor, src: int) -> None:
        if self.active:
            torch.distributed.broadcast(tensor, src=src)

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def owners(self, params: Sequence[tuple[str, torch.Tensor]]) -> dict[str, int]:
        """Which rank keeps each parameter's moments and updates it. fsdp: every rank, its own shard of each."""
        if self.active and self.sharding in ("fsdp1", "fsdp2"):
            return {n: self.rank for n, _ in params}
        return (
            partition(params, self.world) if self.active else {n: 0 for n, _ in params}
        )
