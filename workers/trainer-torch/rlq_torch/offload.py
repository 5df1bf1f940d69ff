"""Colocated mode (run config ``colocate`` / ``offload_train``, slime's --colocate and --offload-train):
the trainer and the engines share GPUs and take turns. Between steps the trainer gives its share back:
after a step it moves what it holds for the next one (the policy's parameters and buffers, its Adam
moments, the critic's, the cached reference policy for KL terms) to CPU memory; the next step moves
them back to the trainer's device before it starts (the reference policy when it is used). The controller releases the engines before it dispatches a step and resumes them after the
step committed (src/core/colocate.ts), so the two never hold the GPUs at once.

On a CPU trainer both moves are to the device the tensors are on already: the calls, their order
(``MemoryMoves.log``) and what each move covered (``MemoryMoves.last``: bytes and seconds, which the
step reports as ``offload_bytes``, ``offload_s``, ``onload_bytes`` and ``onload_s``) are what the
tests see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def should_offload(config: dict[str, Any]) -> bool:
    """The run config's offload_train, which follows colocate when unset (src/config/colocate-keys.ts effectiveOffload)."""
    explicit = config.get("offload_train")
    if explicit is not None:
        return bool(explicit)
    return bool(config.get("colocate", False))


def _nbytes(t: torch.Tensor) -> int:
    """This rank's bytes of a tensor: an FSDP2 (DTensor) parameter counts its local shard only."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _move_module(obj: Any, to: Any, root: nn.Module | None = None) -> int:
    """A policy or critic: its torch module moved in place (parameters keep their identity, so the
    optimizer's and DDP's references stay valid); a bare list of parameters otherwise. The bytes moved.

    ``root``: the FSDP2 root the policy was sharded under (trainer._Forward after fully_shard, fsdp.py
    ``wrap``), moved whole instead of the policy's module. FSDP2 re-registers each parameter group's
    shard after a move only in the ``_apply`` of the FSDP module that owns the group
    (torch/distributed/fsdp/_fully_shard/_fully_shard.py FSDPModule._apply, _fsdp_param.py
    reset_sharded_param); the root's group (the embeddings, final norm and output layer) is not the
    policy's module's, so moving only that module leaves the group's all-gather source on the old
    storage: its device memory is kept through the rollout, and after the onload the forward
    gathers the old tensors while the optimizer updates the new ones."""
    module = root if root is not None else getattr(obj, "module", None)
    if isinstance(module, nn.Module):
        module.to(to)
        return sum(_nbytes(p) for p in module.parameters()) + sum(
            _nbytes(b) for b in module.buffers()
        )
    moved = 0
    for _, p in obj.named_params():
        p.data = p.data.to(to)
        moved += _nbytes(p)
    return moved


def _move_moments(
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]] | None, to: Any
) -> int:
    if moments is None:
        return 0
    moved = 0
    for name, (m, v) in list(moments.items()):
        moments[name] = (m.to(to), v.to(to))
        moved += _nbytes(m) + _nbytes(v)
    return moved


def move_held(held: Any, to: Any, root: nn.Module | None = None) -> int:
    """What ``held`` holds (policy, Adam moments, critic and its moments) moved with ``.to(to)``: a
    device here; tests pass a dtype, which makes new tensors on the CPU as a move between devices
    does. ``root``: the policy's FSDP2 root (``_move_module``). The bytes moved on this rank."""
    moved = _move_module(held.policy, to, root) + _move_moments(held.moments, to)
    if held.critic is not None:
        moved += _move_module(held.critic, to)
        moved += _move_moments(held.critic_moments, to)
    return moved


@dataclass
class Move:
    """One offload or onload on this rank: the bytes of the tensors it moved and its wall time."""

    nbytes: int = 0
    seconds: float = 0.0


class MemoryMoves:
    """What the trainer holds between steps, moved off and back by ``offload`` and ``onload``. One writer:
    TorchTrainer.train_step, which onloads first and offloads last."""

    def __init__(self) -> None:
        self.is_offloaded = False
        # Reference policies (KL terms) the last offload moved: each comes back when a step uses it
        # (``onload_reference``), not with the held weights, since a step without KL never reads it.
        self._references_off: list[Any] = []
        # Each move, in order, with the device it moved to (tests read it).
        self.log: list[str] = []
        # The latest move of each kind; an onload that found nothing held (a fresh process, a
        # step after a cancel) leaves Move() there, which the step reports as 0 bytes.
        self.last: dict[str, Move] = {"offload": Move(), "onload": Move()}

    def offload(
        self,
        held: Any,
        root: nn.Module | None = None,
        references: list[Any] | tuple[Any, ...] = (),
    ) -> None:
        """After a step: the held policy, moments and critic to CPU memory (``root``: ``move_held``),
        and the cached reference policies, which would otherwise keep their device memory through
        the rollout."""
        self.last["offload"] = Move()
        if held is None or self.is_offloaded:
            return
        began = time.perf_counter()
        cpu = torch.device("cpu")
        moved = move_held(held, cpu, root)
        for ref in references:
            moved += _move_module(ref, cpu)
        self._references_off = list(references)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.is_offloaded = True
        self.last["offload"] = Move(moved, time.perf_counter() - began)
        self.log.append("offload:cpu")

    def onload(
        self, held: Any, device: torch.device, root: nn.Module | None = None
    ) -> None:
        """Before a step: what ``offload`` moved comes back to the trainer's device."""
        self.last["onload"] = Move()
        if not self.is_offloaded:
            return
        self.is_offloaded = False
        if held is None:
            return
        began = time.perf_counter()
        moved = move_held(held, device, root)
        self.last["onload"] = Move(moved, time.perf_counter() - began)
        self.log.append(f"onload:{device.type}")

    def onload_reference(self, ref: Any, device: torch.device) -> None:
        """A reference policy the step is about to use, back on the trainer's device if the last
        offload moved it; its bytes and time join the step's onload."""
        if not any(r is ref for r in self._references_off):
            return
        self._references_off = [r for r in self._references_off if r is not ref]
        began = time.perf_counter()
        moved = _move_module(ref, device)
        last = self.last["onload"]
        self.last["onload"] = Move(
            last.nbytes + moved, last.seconds + time.perf_counter() - began
        )
        self.log.append(f"onload_reference:{device.type}")
