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
        """Megatron's optimizer step: the global-norm clip, then AdamW; returns the pre-clip norm."""
        norm = self._clip_grads(params, t.clip_grad)
        self._adam_update(params, moments, owner, iteration, lr, t)
        return norm

    def _clip_grads(self, params, clip_grad: float) -> float:
        """Megatron's clip_grad_norm_fp32: the L2 norm over every gradient, then each gradient scaled in place by
        clip_grad / (norm + 1e-6) when that is < 1 (torch.nn.utils.clip_grad_norm_'s rule); returns the pre-clip norm.

        Many ranks: the gradients are already all-reduced (every rank computes the same norm). fsdp: each rank
        holds a shard of every gradient, so the squares are summed over the ranks."""
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for _, p in params:
            if p.grad is not None:
                sq = sq + local(p.grad).double().pow(2).sum()
        if getattr(self, "fsdp", False):
            torch.distributed.all_reduce(sq)
        norm = float(sq.sqrt())
        if not math.isfinite(norm):
            raise StepError("internal", f"gradient norm is {norm}: refusing to update the weights", True)
        coeff = clip_grad / (norm + 1e-6)
        if coeff < 1:
            with torch.no_grad():
                for _, p in params:
                    if p.grad is not None:
                        local(p.grad).mul_(coeff)
        return norm

    def _adam_update(self, params, moments, owner: Dict[str, int], iteration: int, lr: float, t: TrainConfig) -> None:
        """AdamW at ``lr`` on the (clipped) gradients, decay on >= 2-D tensors only.

        Many ranks: each parameter is updated by its owner (the only rank holding its moments) and broadcast
        from it. fsdp: each rank updates its own shards, and nothing is broadcast (fsdp.py)."""
        fsdp = bool(getattr(self, "fsdp", False))
        ndims = getattr(self, "_ndims", None) or {}
        step = iteration + 1
        bias1 = 1 - t.adam_beta1 ** step
        bias2 = 1 - t.adam_beta2 ** step
        with torch.no_grad():
            for name, p in params:
                if owner[name] != self.dist.rank:
                    continue
                grad = p.grad
                p = local(p)  # FSDP2: this rank's shard of the DTensor, updated in place
                g = local(grad).float() if grad is not None else torch.zeros_like(p)
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
