"""PPO's critic inside a train step: start it, its values before any update, and one optimizer step per global batch (ranks as the policy)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import algorithms as A
from .fsdp import grad_sync
from .micro_batching import micro_batches
from .models import CheckpointError, path_from_uri
from .train_config import bad_request

if TYPE_CHECKING:
    from .weight_loading import Held


class CriticSteps:
    """TorchTrainer's critic half (a mixin: it uses self.device, self.dist, self._critic_ddp_cache and self._adamw)."""

    def _critic_start(self, req: dict[str, Any], start: Held, policy):
        """(critic, moments, [iteration]): held with the policy, else from checkpoint_uri_in/critic, else from the policy's weights."""
        from .critic import Critic, CriticError, load_critic

        d = self.dist
        if start.critic is not None:
            return start.critic, start.critic_moments, [start.critic_iteration]
        loaded = None
        if req["checkpoint_uri_in"] is not None:
            try:
                mine = lambda c: [
                    n for n, r in d.owners(c.named_params()).items() if r == d.rank
                ]  # noqa: E731  (sharded: own moments only)
                loaded = load_critic(
                    os.path.realpath(path_from_uri(req["checkpoint_uri_in"])),
                    self.device,
                    names_for=mine,
                    shard=(d.rank, d.world),
                )
            except CriticError as e:
                raise CheckpointError(str(e)) from e
        try:
            critic = (
                loaded[0]
                if loaded is not None
                else Critic.from_policy(policy, self.device)
            )
        except CriticError as e:
            raise bad_request(f"advantage_estimator ppo: {e}") from e
        moments, iteration = {}, 0
        if loaded is not None and loaded[1] is not None:
            iteration, moments = loaded[1]
        owner = d.owners(critic.named_params())
        for n, p in critic.named_params():
            p.requires_grad_(True)
            if n not in moments and owner[n] == d.rank:
                moments[n] = (
                    torch.zeros_like(p, dtype=torch.float32),
                    torch.zeros_like(p, dtype=torch.float32),
                )
        return critic, moments, [iteration]

    def _critic_ddp(self, critic):
        if not self.dist.active:
            return None
        if self._critic_ddp_cache is not None and self._critic_ddp_cache[0] is critic:
            return self._critic_ddp_cache[1]
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            critic.net, device_ids=ids, broadcast_buffers=False
        )
        self._critic_ddp_cache = (critic, ddp)
        return ddp

    def _critic_values_all(self, critic, samples, mbs, report, check) -> np.ndarray:
        """The critic's values for every response token before any update (micro-batch k on rank k mod world, all-gathered)."""
        d = self.dist
        mine: dict[int, np.ndarray] = {}
        rounds = (len(mbs) + d.world - 1) // d.world
        for rnd in range(rounds):
            d.agree_cancel(check)
            k = rnd * d.world + d.rank
            if k < len(mbs):
                lo, hi = mbs[k]
                mine[k] = (
                    critic.values(samples[lo:hi], grad=False).double().cpu().numpy()
                )
            report(f"old_values {min((rnd + 1) * d.world, len(mbs))}/{len(mbs)}")
        for part in d.all_gather(mine) if d.active else []:
            mine.update(part)
        parts = [mine[k] for k in range(len(mbs))]
        return np.concatenate(parts) if parts else np.zeros(0)

    def _critic_update(
        self,
        critic,
        gsamples,
        g_shape,
        a,
        old_values,
        returns,
        loss_mask,
        own,
        normalizer,
        o,
        t,
        lr_of,
        check,
    ) -> dict[str, float]:
        """One optimizer step of the critic on a global batch: clipped value loss (value_clip) with the global batch's
        denominators, micro-batched, then clip + AdamW (critic_lr, else the actor's schedule)."""
        d = self.dist
        model, moments, it = critic
        params = model.named_params()
        owner = d.owners(params)
        fwd = self._critic_ddp(model)
        for _, p in params:
            p.grad = None
        mbs = micro_batches(gsamples, t.max_tokens_per_gpu)
        rounds = (len(mbs) + d.world - 1) // d.world
        by_mb: dict[int, dict[str, float]] = {}
        for rnd in range(
            rounds
        ):  # as the policy: micro-batch k on rank k mod world, gradients synced on the last round
            d.agree_cancel(check)
            k = rnd * d.world + d.rank
            with grad_sync(fwd, rnd == rounds - 1):
                if k >= len(mbs):
                    if fwd is not None:
                        model.zero_backward(fwd)
                    continue
                lo, hi = mbs[k]
                v_t = model.values(gsamples[lo:hi], grad=True, fwd=fwd)
                mb_shape = g_shape.slice(lo, hi)
                ma, mb_ = a + int(g_shape.offsets[lo]), a + int(g_shape.offsets[hi])
                loss, dv, m = A.value_loss_terms(
                    mb_shape.like(v_t.detach().double().cpu().numpy()),
                    old_values[ma:mb_],
                    np.asarray(returns)[ma:mb_],
                    loss_mask[ma:mb_],
                    o["value_clip"],
                    o["calculate_per_token_loss"],
                    sample_denominators=own[lo:hi],
                    normalizer=normalizer,
                )
                if v_t.numel() > 0:
                    (
                        v_t
                        * torch.from_numpy((dv * d.world).astype(np.float32)).to(
                            self.device
                        )
                    ).sum().backward()  # DDP averages
                elif fwd is not None:
                    model.zero_backward(fwd)
                by_mb[k] = m
        for part in d.all_gather(by_mb) if d.active else []:
            by_mb.update(part)
        metrics: dict[str, float] = {}
        for k in range(len(mbs)):
            for key, v in by_mb[k].items():
                metrics[key] = metrics.get(key, 0.0) + v
        d.agree_cancel(check)
        lr = t.critic_lr if t.critic_lr is not None else lr_of(it[0])
        metrics["critic_grad_norm"] = self._adamw(params, moments, owner, it[0], lr, t)
        metrics["critic_lr"] = lr
        it[0] += 1
        return metrics
