"""The optimizer step: Megatron's global-norm clip and AdamW, with the moments sharded ZeRO-1 style (each parameter's owner rank updates it and broadcasts it)."""

from __future__ import annotations

import math

import torch

from .fsdp import local
from .tensor_parallel import piece_share
from .train_config import StepError, TrainConfig

# Devices whose AdamW step runs as torch's fused kernel (one launch per group of tensors instead of ~8 per
# parameter). The CPU keeps the plain loop below, whose order of operations its bit-exact tests fix.
FUSED_DEVICES = ("cuda",)


class ShardedAdamW:
    """TorchTrainer's optimizer half (a mixin: it uses self.device and self.dist)."""

    def _zero_backward(self, policy, fwd) -> None:
        """A backward with zero gradients, so a rank with no micro-batch left still joins DDP's all-reduce."""
        if fwd is None:
            return
        (self._dummy_forward(fwd).float().sum() * 0.0).backward()

    def _masters(self, policy, owner: dict[str, int]) -> dict[str, torch.Tensor]:
        if policy.kind != "hf" or policy.save_dtype == torch.float32:
            return {}
        return {
            n: local(p).detach()
            for n, p in policy.named_params()
            if owner[n] == self.dist.rank
        }

    def _adamw(
        self,
        params,
        moments,
        owner: dict[str, int],
        iteration: int,
        lr: float,
        t: TrainConfig,
    ) -> float:
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
        tp = getattr(self.dist, "tp", 1) > 1
        for _, p in params:
            if p.grad is not None:
                part = local(p.grad).double().pow(2).sum()
                # tensor parallel: a piece several ranks hold is counted once in the all-reduced sum
                sq = sq + (part * piece_share(p, self.dist.world) if tp else part)
        if getattr(self, "fsdp", False):
            torch.distributed.all_reduce(sq)
        norm = float(sq.sqrt())
        if not math.isfinite(norm):
            raise StepError(
                "internal",
                f"gradient norm is {norm}: refusing to update the weights",
                True,
            )
        coeff = clip_grad / (norm + 1e-6)
        if coeff < 1:
            with torch.no_grad():
                for _, p in params:
                    if p.grad is not None:
                        local(p.grad).mul_(coeff)
        return norm

    def _adam_update(
        self,
        params,
        moments,
        owner: dict[str, int],
        iteration: int,
        lr: float,
        t: TrainConfig,
    ) -> None:
        """AdamW at ``lr`` on the (clipped) gradients, decay on >= 2-D tensors only.

        Many ranks: each parameter is updated by its owner (the only rank holding its moments) and broadcast
        from it. fsdp: each rank updates its own shards, and nothing is broadcast (fsdp.py)."""
        fsdp = bool(getattr(self, "fsdp", False))
        ndims = getattr(self, "_ndims", None) or {}
        step = iteration + 1
        if self.device.type in FUSED_DEVICES:
            decays = lambda name, p: (
                (ndims.get(name, p.dim()) if fsdp else p.dim()) > 1
                and t.weight_decay != 0
            )
            self._fused_update(params, moments, owner, step, lr, t, decays)
            if self.dist.active and not fsdp:
                for name, p in params:
                    self.dist.broadcast_from(p.data, owner[name])
            return
        bias1 = 1 - t.adam_beta1**step
        bias2 = 1 - t.adam_beta2**step
        with torch.no_grad():
            for name, p in params:
                if owner[name] != self.dist.rank:
                    continue
                grad = p.grad
                p = local(
                    p
                )  # FSDP2: this rank's shard of the DTensor, updated in place
                g = local(grad).float() if grad is not None else torch.zeros_like(p)
                m, v = moments[name]
                m.mul_(t.adam_beta1).add_(g, alpha=1 - t.adam_beta1)
                v.mul_(t.adam_beta2).addcmul_(g, g, value=1 - t.adam_beta2)
                update = (m / bias1) / ((v / bias2).sqrt() + t.adam_eps)
                if (
                    ndims.get(name, p.dim()) if fsdp else p.dim()
                ) > 1 and t.weight_decay != 0:
                    p.mul_(1 - lr * t.weight_decay)
                p.sub_(lr * update)
            if self.dist.active and not fsdp:
                for name, p in params:
                    self.dist.broadcast_from(p.data, owner[name])

    def _fused_update(
        self,
        params,
        moments,
        owner: dict[str, int],
        step: int,
        lr: float,
        t: TrainConfig,
        decays,
    ) -> None:
        """_adam_update as torch's fused AdamW kernel (torch._fused_adamw_, what torch.optim.AdamW(fused=True) calls) on
        rlq's own moments: the same update, p ← p·(1 − lr·wd) − lr·m̂ / (√v̂ + eps), up to float rounding. Two calls:
        the tensors with weight decay, and those without."""
        groups = {True: ([], [], [], []), False: ([], [], [], [])}
        with torch.no_grad():
            for name, p in params:
                if owner[name] != self.dist.rank:
                    continue
                grad = p.grad
                local_p = local(p)
                g = local(grad) if grad is not None else torch.zeros_like(local_p)
                if g.dtype != torch.float32:
                    g = g.float()
                m, v = moments[name]
                group = groups[bool(decays(name, local_p))]
                for lst, x in zip(group, (local_p, g, m, v)):
                    lst.append(x)
            for decay, (ps, gs, ms, vs) in groups.items():
                if not ps:
                    continue
                steps = [
                    torch.full(
                        (), float(step), dtype=torch.float32, device=ps[0].device
                    )
                ] * len(ps)
                torch._fused_adamw_(
                    ps,
                    gs,
                    ms,
                    vs,
                    [],
                    steps,
                    lr=lr,
                    beta1=t.adam_beta1,
                    beta2=t.adam_beta2,
                    weight_decay=t.weight_decay if decay else 0.0,
                    eps=t.adam_eps,
                    amsgrad=False,
                    maximize=False,
                )
