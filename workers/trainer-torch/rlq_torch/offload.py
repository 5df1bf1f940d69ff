"""Colocated mode (run config ``colocate`` / ``offload_train``, slime's --colocate and --offload-train):
the trainer and the engines share GPUs and take turns. Between steps the trainer gives its share back:
after a step it moves what it holds for the next one (the policy's parameters and buffers, its Adam
moments, the critic's) to CPU memory; the next step moves them back to the trainer's device before it
starts. The controller releases the engines before it dispatches a step and resumes them after the
step committed (src/core/colocate.ts), so the two never hold the GPUs at once.

On a CPU trainer both moves are to the device the tensors are on already: the calls, and their order
(``MemoryMoves.log``), are what the tests see.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def should_offload(config: dict[str, Any]) -> bool:
    """The run config's offload_train, which follows colocate when unset (src/config/colocate-keys.ts effectiveOffload)."""
    explicit = config.get("offload_train")
    if explicit is not None:
        return bool(explicit)
    return bool(config.get("colocate", False))


def _move_module(obj: Any, device: torch.device) -> None:
    """A policy or critic: its torch module moved in place (parameters keep their identity, so the
    optimizer's and DDP's references stay valid); a bare list of parameters otherwise."""
    module = getattr(obj, "module", None)
    if isinstance(module, nn.Module):
        module.to(device)
        return
    for _, p in obj.named_params():
        p.data = p.data.to(device)


def _move_moments(
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]] | None, device: torch.device
) -> None:
    if moments is None:
        return
    for name, (m, v) in list(moments.items()):
        moments[name] = (m.to(device), v.to(device))


class MemoryMoves:
    """What the trainer holds between steps, moved off and back by ``offload`` and ``onload``. One writer:
    TorchTrainer.train_step, which onloads first and offloads last."""

    def __init__(self) -> None:
        self.is_offloaded = False
        # Each move, in order, with the device it moved to (tests read it).
        self.log: list[str] = []

    def offload(self, held: Any) -> None:
        """After a step: the held policy, moments and critic to CPU memory."""
        if held is None or self.is_offloaded:
            return
        cpu = torch.device("cpu")
        _move_module(held.policy, cpu)
        _move_moments(held.moments, cpu)
        if held.critic is not None:
            _move_module(held.critic, cpu)
            _move_moments(held.critic_moments, cpu)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.is_offloaded = True
        self.log.append("offload:cpu")

    def onload(self, held: Any, device: torch.device) -> None:
        """Before a step: what ``offload`` moved comes back to the trainer's device."""
        if not self.is_offloaded:
            return
        self.is_offloaded = False
        if held is None:
            return
        _move_module(held.policy, device)
        _move_moments(held.moments, device)
        if held.critic is not None:
            _move_module(held.critic, device)
            _move_moments(held.critic_moments, device)
        self.log.append(f"onload:{device.type}")
