"""The optimizer step: Megatron's global-norm clip and AdamW, with the moments sharded ZeRO-1 style (each parameter's owner rank updates it and broadcasts it)."""
from __future__ import annotations

import math
from typing import Dict

import torch

from .fsdp import local
from .train_config import StepError, TrainConfig


class ShardedAdamW:
    """TorchTrainer's optimizer half (a mixin: it uses self.device and self.dist)."""

    def _zero_backward(self, policy, fwd) -> None:
        """A backward with zero gradients, so a rank with no micro-batch left still joins DDP's all-reduce."""
        if fwd is None:
            return
        (self._dummy_forward(fwd).float().sum() * 0.0).backward()

    def _masters(self, policy, owner: Dict[str, int]) -> Dict[str, torch.Tensor]:
        if policy.kind != "hf" or policy.save_dtype == torch.float32:
            return {}
        return {n: local(p).detach() for n, p in policy.named_params() if owner[n] == self.dist.rank}

    def _adamw(self, params, moments, owner: Dict[str, int], iteration: int, lr: float, t: TrainConfig) -> float:
        """Megatron clip (clip_grad / (norm + 1e-6) when < 1) then AdamW; returns the pre-clip norm.

        Many ranks: the gradients are already all-reduced (every rank computes the same norm); each
        parameter is updated by its owner (the only rank holding its moments) and broadcast from it.
        fsdp: each rank holds a shard of every gradient: the squares are summed over the ranks, each rank
        updates its own shards, and nothing is broadcast (fsdp.py)."""
        fsdp = bool(getattr(self, "fsdp", False))
        ndims = getattr(self, "_ndims", None) or {}
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for _, p in params:
            if p.grad is not None:
                sq = sq + local(p.grad).double().pow(2).sum()
        if fsdp:
            torch.distributed.all_reduce(sq)
        norm = float(sq.sqrt())
        if not math.isfinite(norm):
            raise StepError("internal", f"gradient norm is {norm}: refusing to update the weights", True)
        coeff = t.clip_grad / (norm + 1e-6)
        scale = coeff if coeff < 1 else 1.0
        step = iteration + 1
        bias1 = 1 - t.adam_beta1 ** step
        bias2 = 1 - t.adam_beta2 ** step
        with torch.no_grad():
            for name, p in params:
                if owner[name] != self.dist.rank:
                    continue
                grad = p.grad
                p = local(p)  # FSDP2: this rank's shard of the DTensor, updated in place
                g = local(grad) if grad is not None else torch.zeros_like(p)
                g = g.float() * scale if scale != 1.0 else g.float()
                m, v = moments[name]
                m.mul_(t.adam_beta1).add_(g, alpha=1 - t.adam_beta1)
                v.mul_(t.adam_beta2).addcmul_(g, g, value=1 - t.adam_beta2)
                update = (m / bias1) / ((v / bias2).sqrt() + t.adam_eps)
                if (ndims.get(name, p.dim()) if fsdp else p.dim()) > 1 and t.weight_decay != 0:
                    p.mul_(1 - lr * t.weight_decay)
                p.sub_(lr * update)
            if self.dist.active and not fsdp:
                for name, p in params:
                    self.dist.broadcast_from(p.data, owner[name])
        return norm
