"""One train step of the PyTorch trainer (the HTTP layer is in server.py).

Mirrors rlq's embedded trainer (src/trainer/embedded/train-step.ts):

 1. start weights: the held ones when they are exactly ``checkpoint_uri_in`` at
    ``weight_version_in``, else reloaded from it (weights AND optimizer state); with no
    checkpoint (version 0): ``hf_checkpoint``, else the embedded ``model`` config
    initialised from ``seed`` (bit-identical to rlq's initWeights);
 2. samples sorted by (group_index, sample_index); old log-probs and entropies under the
    start weights, reference log-probs when a KL term needs them;
 3. rewards → post_process_rewards (group normalisation by group index) →
    compute_advantages_and_returns, once over the whole batch (algorithms.py);
 4. num_optimizer_steps = samples / global_batch_size AdamW steps; each global batch runs
    as micro-batches of at most ``max_tokens_per_gpu`` padded tokens; per micro-batch the
    loss math (policy_loss_terms, with the global batch's denominators) gives d loss / d logp
    and d loss / d H, and the model backpropagates sum(dlogp·logp) + sum(dH·H);
    global-norm clipping, Megatron's LR schedule, AdamW (decay on ≥2-D tensors only);
 5. weights.safetensors and optimizer.safetensors into output_dir.

Deterministic on CPU: the same request (same input checkpoint, batch and config) writes
bit-identical files.
"""
from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote

import numpy as np
import torch

from . import algorithms as A
from . import fsdp as fsdp_mod
from .batch import Batch, Sample
from .critic_step import CriticSteps
from .dist import Dist
from .micro_batching import micro_batches, packed_micro_batches, use_packing, validate_samples
from .models import SAVE_DTYPES, write_optimizer
from .sharded_adamw import ShardedAdamW
# Re-exported: server.py, dist_worker.py, dist_front.py, bench.py and the tests import these from here.
from .train_config import (Cancelled, StepError, TrainConfig, bad_request, learning_rate, optimizer_step_plan,  # noqa: F401
                           parse_algorithm, parse_train_config)
from .weight_loading import Held, WeightLoading


class _Forward(torch.nn.Module):
    """The training forward as a module (what DistributedDataParallel wraps): logits at the response positions."""

    def __init__(self, policy):
        super().__init__()
        self.inner = policy.module
        self.__dict__["_policy"] = policy  # not a submodule: the policy is a plain object around self.inner

    def forward(self, ids, rows, cols, positions=None, segments=None):
        pol = self.__dict__["_policy"]
        h = pol.hidden_states(ids) if positions is None else pol.hidden_states(ids, positions, segments)
        return pol.logits(h[rows, cols])


# Elements of one [tokens, vocab] float32 block in logp_entropy: 256 MiB. A 16k-token micro-batch of a
# 152k-vocabulary model (Qwen2) is 2.5e9 elements, ~10 GB per float32 copy, and the log-softmax, its
# exp and their product made four of them (the bench's qwen2 0.5B step ran out of an H100's 80 GB).
LOGITS_CHUNK_ELEMENTS = 1 << 26


def _token_stats(logits: torch.Tensor, tgt: torch.Tensor, temperature: float) -> Tuple[torch.Tensor, torch.Tensor]:
    z = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    return logp_all.gather(1, tgt[:, None])[:, 0], -(torch.exp(logp_all) * logp_all).sum(-1)


def logp_entropy(logits: torch.Tensor, tgt: torch.Tensor, temperature: float, grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each target token and the entropy of its distribution, from [tokens, vocab] logits.

    Row blocks of at most LOGITS_CHUNK_ELEMENTS; with gradients each block runs under
    torch.utils.checkpoint, so only the logits are kept for the backward and the float32 blocks
    are recomputed there, one at a time. Every row is computed alone either way: the same numbers
    as one block (slime's log_probs chunking, verl's entropy_from_logits_with_chunking)."""
    rows = max(1, LOGITS_CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    if logits.shape[0] <= rows:
        return _token_stats(logits, tgt, temperature)
    from torch.utils.checkpoint import checkpoint

    parts = []
    for lo in range(0, logits.shape[0], rows):
        block, t = logits[lo:lo + rows], tgt[lo:lo + rows]
        parts.append(checkpoint(_token_stats, block, t, temperature, use_reentrant=False) if grad and torch.is_grad_enabled()
                     else _token_stats(block, t, temperature))
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


# ------------------------------------------------------------------ the trainer


class TorchTrainer(WeightLoading, CriticSteps, ShardedAdamW):
    """One train step (train_step), on one rank or as one rank of many (``dist``). Loading is in
    weight_loading.py, the critic in critic_step.py, the optimizer in sharded_adamw.py."""

    def __init__(self, device: str = "cpu", defaults: Optional[Dict[str, Any]] = None, bf16: Optional[bool] = None, log: Callable[[str], None] = print,
                 dist: Optional[Dist] = None):
        self.dist = dist or Dist()
        self._ndims: Optional[Dict[str, int]] = None  # fsdp: each parameter's rank before it was sharded flat
        self._ddp_cache: Optional[Tuple[Any, Any]] = None
        self._critic_ddp_cache: Optional[Tuple[Any, Any]] = None
        self.device = torch.device(device)
        self.defaults = defaults or {}
        self.bf16 = (self.device.type == "cuda") if bf16 is None else bf16
        self.held: Optional[Held] = None
        self.ref_cache: Dict[str, Any] = {}
        self.log = log

    @property
    def fsdp(self) -> bool:
        """Parameters sharded with FSDP (--sharding fsdp, many ranks; fsdp.py): FSDP2's fully_shard or FSDP1."""
        return self.dist.active and self.dist.sharding in fsdp_mod.FSDP_IMPLS

    def full_weights(self) -> Optional[List[Tuple[str, torch.Tensor]]]:
        """fsdp: the held weights gathered whole on rank 0 (for trainer_push); every rank must call it. None otherwise."""
        if not self.fsdp or self.held is None or self._ddp_cache is None or self._ddp_cache[0] is not self.held.policy:
            return None
        return fsdp_mod.full_named_params(self._ddp_cache[1], self.held.policy, self.device, self.dist.rank)

    @property
    def weight_version(self) -> Optional[int]:
        return None if self.held is None else self.held.version

    def _autocast(self):
        if self.bf16 and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    # -------------------------------------------------------------- compute

    def token_stats(self, policy, samples: List[Sample], temperature: float, grad: bool, fwd=None, packed: bool = False):
        """Flat per-response-token (logp, entropy), float32 tensors on the device, in sample order.

        ``packed``: the samples are concatenated into one row (positions restart per sample,
        attention stays within a sample) instead of padded rows; the same numbers up to float rounding, no padding.
        ``fwd``: the module to run (the DistributedDataParallel wrapper while training on many ranks)."""
        L = max(len(s.tokens) - 1 for s in samples)
        if L > policy.max_positions:
            raise bad_request(f"a sample has {L + 1} tokens, more than the model's {policy.max_positions} positions")
        rows, cols, targets = [], [], []
        positions = segments = None
        if packed:
            lens = [max(len(s.tokens) - 1, 1) for s in samples]
            starts = np.concatenate([[0], np.cumsum(lens)])
            ids = torch.zeros((1, int(starts[-1])), dtype=torch.long)
            positions = torch.zeros((1, int(starts[-1])), dtype=torch.long)
            segments = torch.zeros((1, int(starts[-1])), dtype=torch.long)
        else:
            ids = torch.zeros((len(samples), max(L, 1)), dtype=torch.long)
        for i, s in enumerate(samples):
            n = len(s.tokens)
            row, base = (0, int(starts[i])) if packed else (i, 0)
            if n > 1:
                ids[row, base:base + n - 1] = torch.from_numpy(s.tokens[:n - 1].astype(np.int64))
            if packed:
                positions[0, base:base + lens[i]] = torch.arange(lens[i])
                segments[0, base:base + lens[i]] = i
            r = s.response_length
            if r > 0:
                if s.prompt_length < 1:
                    raise bad_request("prompt_length must be >= 1 (the first token has no prediction)")
                rows.append(np.full(r, row))
                cols.append(np.arange(base + s.prompt_length - 1, base + s.prompt_length - 1 + r))
                targets.append(s.tokens[s.prompt_length:].astype(np.int64))
        if not rows:
            z = torch.zeros(0, device=self.device)
            return z, z
        tgt = torch.from_numpy(np.concatenate(targets))
        if int(tgt.max()) >= policy.vocab_size or int(tgt.min()) < 0 or int(ids.max()) >= policy.vocab_size:
            raise bad_request(f"token ids outside the model's vocabulary of {policy.vocab_size}")
        ids = ids.to(self.device)
        rows_t = torch.from_numpy(np.concatenate(rows)).to(self.device)
        cols_t = torch.from_numpy(np.concatenate(cols)).to(self.device)
        tgt = tgt.to(self.device)
        if positions is not None:
            positions, segments = positions.to(self.device), segments.to(self.device)
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            with self._autocast():
                if fwd is not None:
                    logits = fwd(ids, rows_t, cols_t, positions, segments)
                else:
                    h = policy.hidden_states(ids) if positions is None else policy.hidden_states(ids, positions, segments)
                    logits = policy.logits(h[rows_t, cols_t])
            return logp_entropy(logits, tgt, temperature, grad)

    def _micro_batches(self, policy, samples: List[Sample], t: "TrainConfig") -> List[Tuple[int, int]]:
        if use_packing(policy, t):
            return packed_micro_batches(samples, t.max_tokens_per_gpu)
        return micro_batches(samples, t.max_tokens_per_gpu)

    def forward_all(self, policy, samples, mbs, temperature, report, phase, check, packed: bool = False, fwd=None):
        """Log-probs and entropies of every response token, micro-batch by micro-batch; on many ranks
        micro-batch k runs on rank k mod world and the results are all-gathered (same numbers as one rank).
        ``fwd``: the FSDP-wrapped forward (fsdp), which every rank runs in every round."""
        d = self.dist
        mine: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        rounds = (len(mbs) + d.world - 1) // d.world
        for rnd in range(rounds):
            d.agree_cancel(check)
            k = rnd * d.world + d.rank
            if k < len(mbs):
                lo, hi = mbs[k]
                lp, en = self.token_stats(policy, samples[lo:hi], temperature, grad=False, fwd=fwd, packed=packed)
                mine[k] = (lp.double().cpu().numpy(), en.double().cpu().numpy())
            elif fwd is not None:
                with torch.no_grad():
                    self._dummy_forward(fwd)
            report(f"{phase} {min((rnd + 1) * d.world, len(mbs))}/{len(mbs)}")
        if d.active:
            for part in d.all_gather(mine):
                mine.update(part)
        lps = [mine[k][0] for k in range(len(mbs))]
        ents = [mine[k][1] for k in range(len(mbs))]
        return np.concatenate(lps) if lps else np.zeros(0), np.concatenate(ents) if ents else np.zeros(0)

    def _ddp(self, policy):
        """The training forward: plain on one rank, inside DistributedDataParallel on many (built once per loaded policy)."""
        if not self.dist.active:
            return None
        if self._ddp_cache is not None and self._ddp_cache[0] is policy:
            return self._ddp_cache[1]
        if self.fsdp:
            policy.packing_unsupported()  # its probe calls the whole module: run (and cache) it before FSDP shards it
            self._ndims = fsdp_mod.ndims(policy)
            wrapped = fsdp_mod.wrap(_Forward(policy), self.device, self.dist.sharding)
            self._ddp_cache = (policy, wrapped)
            return wrapped
        from torch.nn.parallel import DistributedDataParallel

        fwd = _Forward(policy)
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(fwd, device_ids=ids, broadcast_buffers=False)
        self._ddp_cache = (policy, ddp)
        return ddp

    def _dummy_forward(self, fwd):
        """A one-token forward: a rank with no micro-batch left in a round still joins the wrapper's collectives."""
        dev = self.device
        return fwd(torch.zeros((1, 1), dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev),
                   torch.zeros(1, dtype=torch.long, device=dev), None, None)

    # -------------------------------------------------------------- the step

    def train_step(self, req: Dict[str, Any], batch: Batch, t: TrainConfig, o: Dict[str, Any],
                   progress: Callable[[int, int, str], None], check: Callable[[], None]) -> Dict[str, Any]:
        t0 = time.time()
        d = self.dist
        samples = sorted(batch.samples, key=lambda s: (s.group_index, s.sample_index))
        if not samples:
            raise bad_request(f"train step {req['step']} has no samples")
        gbs, num_opt = optimizer_step_plan(t, len(samples))
        state = {"done": 0}
        report = lambda phase: progress(state["done"], num_opt, phase)  # noqa: E731

        start = self._start(req, t, report)
        self.held = None  # the weights below change in place: never hold a half-trained version
        policy = start.policy
        ppo = o["advantage_estimator"] == "ppo"
        if ppo and self.fsdp:
            raise bad_request("advantage_estimator ppo is not supported with --sharding fsdp yet (the critic starts from the policy's full "
                              "weights); use --sharding zero1")
        critic = self._critic_start(req, start, policy) if ppo else None
        train_actor = not ppo or req["step"] >= t.num_critic_only_steps
        validate_samples(policy, samples)  # on every rank, before any collective: a bad batch fails all ranks alike
        sharded_fwd = self._ddp(policy) if self.fsdp else None  # fsdp: shard before the moments are made (shards' shapes)
        params = policy.named_params()
        for _, p in params:
            p.requires_grad_(True)
        policy.set_gradient_checkpointing(t.gradient_checkpointing)
        owner = d.owners(params)
        moments = start.moments or {n: (torch.zeros_like(fsdp_mod.local(p), dtype=torch.float32), torch.zeros_like(fsdp_mod.local(p), dtype=torch.float32))
                                    for n, p in params if owner[n] == d.rank}
        iteration = start.iteration
        temperature = t.rollout_temperature
        packed = use_packing(policy, t)

        shape = A.Ragged(np.zeros(sum(s.response_length for s in samples)),
                         np.concatenate([[0], np.cumsum([s.response_length for s in samples])]))
        loss_mask = np.concatenate([s.loss_mask.astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        # Denominators: the mask before rlq zeroed off-policy / stale tokens (DESIGN §1).
        denom_mask = np.concatenate([(s.loss_mask if s.denom_mask is None else s.denom_mask).astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        rollout = np.concatenate([s.rollout_log_probs.astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        all_mbs = self._micro_batches(policy, samples, t)

        policy.module.eval()
        old, _ = self.forward_all(policy, samples, all_mbs, temperature, report, "old_logprobs", check, packed, fwd=sharded_fwd)
        ref = None
        if o["use_kl_loss"] or o["kl_coef"] != 0:
            ref_policy = self._reference(t, start)
            ref, _ = self.forward_all(ref_policy, samples, all_mbs, temperature, report, "ref_logprobs", check, use_packing(ref_policy, t))
        policy.module.train()

        old_values = None
        if critic is not None:
            old_values = self._critic_values_all(critic[0], samples, micro_batches(samples, t.max_tokens_per_gpu), report, check)

        raw, normalized = A.post_process_rewards([s.reward for s in samples], [s.group_index for s in samples], o)
        try:
            advantages, returns, _ = A.compute_advantages_and_returns(
                normalized, shape.like(loss_mask), o, old_log_probs=shape.like(old), rollout_log_probs=shape.like(rollout),
                ref_log_probs=None if ref is None else shape.like(ref), values=None if old_values is None else shape.like(old_values))
        except A.AlgorithmError as e:
            raise bad_request(f"advantages: {e}") from e

        fwd = self._ddp(policy)
        sums: Dict[str, float] = {}
        grad_norm_sum = 0.0
        lr = 0.0
        decay_iters = t.lr_decay_iters if t.lr_decay_iters is not None else (None if t.num_rollout is None else t.num_rollout * num_opt)
        for j in range(num_opt):
            lo_g, hi_g = j * gbs, (j + 1) * gbs
            gsamples = samples[lo_g:hi_g]
            g_shape = shape.slice(lo_g, hi_g)
            a, b = int(shape.offsets[lo_g]), int(shape.offsets[hi_g])
            g_mask = denom_mask[a:b]
            # The global batch's denominators: each sample's own mask sum (D_i), and R or N.
            own = g_shape.seg_sum(g_mask)
            normalizer = float(sum(max(x, 1.0) for x in own.tolist())) if o["calculate_per_token_loss"] else float(len(gsamples))
            for _, p in params:
                p.grad = None
            if critic is not None:
                sums_c = self._critic_update(critic, gsamples, g_shape, a, old_values, returns, loss_mask, own, normalizer, o, t, lr_of=lambda it: learning_rate(t, decay_iters, it), check=check)
                for key, v in sums_c.items():
                    sums[key] = sums.get(key, 0.0) + v / num_opt
                report(f"critic {j + 1}/{num_opt}")
            if not train_actor:
                state["done"] = j + 1
                continue
            mbs = self._micro_batches(policy, gsamples, t)
            # Micro-batch k runs on rank k mod world; every rank runs `rounds` backward passes (a zero
            # one when it has no micro-batch left), gradients sync only on the last one (DDP no_sync).
            rounds = (len(mbs) + d.world - 1) // d.world
            metrics_by_mb: Dict[int, Dict[str, float]] = {}
            for rnd in range(rounds):
                d.agree_cancel(check)
                k = rnd * d.world + d.rank
                with fsdp_mod.grad_sync(fwd, rnd == rounds - 1):
                    if k >= len(mbs):
                        self._zero_backward(policy, fwd)
                    else:
                        lo, hi = mbs[k]
                        mb_shape = g_shape.slice(lo, hi)
                        ma, mb_ = a + int(g_shape.offsets[lo]), a + int(g_shape.offsets[hi])
                        logp_t, ent_t = self.token_stats(policy, gsamples[lo:hi], temperature, grad=True, fwd=fwd, packed=packed)
                        lp = logp_t.detach().double().cpu().numpy()
                        en = ent_t.detach().double().cpu().numpy()
                        try:
                            terms = A.policy_loss_terms(mb_shape.like(lp), advantages[ma:mb_], loss_mask[ma:mb_], o, old=old[ma:mb_],
                                                        denom_mask=denom_mask[ma:mb_], ref=None if ref is None else ref[ma:mb_],
                                                        rollout=rollout[ma:mb_], entropy=en, sample_denominators=own[lo:hi], normalizer=normalizer)
                        except A.AlgorithmError as e:
                            raise bad_request(f"policy loss: {e}") from e
                        # DDP averages gradients over ranks; the loss is a sum over micro-batches, so scale by world
                        # (exact for a power-of-two world size).
                        scale = float(d.world)
                        if logp_t.numel() > 0:
                            c_lp = torch.from_numpy((terms.dloss_dlogp * scale).astype(np.float32)).to(self.device)
                            surrogate = (logp_t * c_lp).sum()
                            if np.any(terms.dloss_dentropy != 0):
                                surrogate = surrogate + (ent_t * torch.from_numpy((terms.dloss_dentropy * scale).astype(np.float32)).to(self.device)).sum()
                            surrogate.backward()
                        elif fwd is not None:
                            self._zero_backward(policy, fwd)
                        metrics_by_mb[k] = terms.metrics
                report(f"train {j + 1}/{num_opt} micro-batch {min((rnd + 1) * d.world, len(mbs))}/{len(mbs)}")
            if d.active:
                for part in d.all_gather(metrics_by_mb):
                    metrics_by_mb.update(part)
            for k in range(len(mbs)):
                for key, v in metrics_by_mb[k].items():
                    sums[key] = sums.get(key, 0.0) + v / num_opt
            d.agree_cancel(check)
            lr = learning_rate(t, decay_iters, iteration)
            grad_norm_sum += self._adamw(params, moments, owner, iteration, lr, t)
            iteration += 1
            state["done"] = j + 1
            report("optimizer_step")

        version = req["weight_version_in"] + 1
        d.agree_cancel(check)
        report("save")
        out_dir = req["output_dir"]
        os.makedirs(out_dir, exist_ok=True)
        for _, p in params:
            p.grad = None
            if not self.fsdp:  # fsdp: the flags stay as FSDP saw them when it wrapped the parameters
                p.requires_grad_(False)
        # Optimizer first: a weights file present means its state is present too (as rlq's writer).
        # Many ranks: each writes its own shard of the optimizer state, then rank 0 the weights.
        if critic is not None:  # the critic first: a committed step's directory always carries its critic
            c_owner = d.owners(critic[0].named_params())
            critic[0].save_optimizer(out_dir, version, req["run_id"], req["step"], critic[1], critic[2][0], c_owner, d.rank,
                                     (d.rank, d.world) if d.active else None)
            d.barrier()
            if d.rank == 0:
                critic[0].save_weights(out_dir, version, req["run_id"], req["step"])
        if policy.kind == "hf" and t.save_dtype is not None:
            # Every rank, before the masters are taken: policy.save (rank 0 only) would set it too late for
            # this step's fp32 masters, and never on the other ranks.
            policy.save_dtype = SAVE_DTYPES[t.save_dtype]
        masters = self._masters(policy, owner)
        write_optimizer(out_dir, [(n, p) for n, p in params if owner[n] == d.rank], moments, iteration, version, req["run_id"], req["step"], masters,
                        shard=(d.rank, d.world) if d.active else None, sharding=fsdp_mod.OPTIMIZER_SHARDING[d.sharding] if self.fsdp else None)
        d.barrier()
        if self.fsdp:
            with fsdp_mod.full_params(fwd, self.device):  # the whole weights on rank 0, written as one rank writes them
                if d.rank == 0:
                    policy.save(out_dir, version, req["run_id"], req["step"], dtype=t.save_dtype)
        elif d.rank == 0:
            policy.save(out_dir, version, req["run_id"], req["step"], dtype=t.save_dtype)
        d.barrier()
        self.held = Held(policy, moments, iteration, version, os.path.realpath(out_dir))
        if critic is not None:
            self.held.critic, self.held.critic_moments, self.held.critic_iteration = critic[0], critic[1], critic[2][0]

        n_train = int(loss_mask.sum())
        metrics = dict(sums)
        diff = float(np.abs(old - rollout)[loss_mask != 0].sum() / n_train) if n_train > 0 else 0.0
        elapsed = time.time() - t0
        metrics.update({
            "grad_norm": grad_norm_sum / num_opt,
            "lr": lr,
            "train_rollout_logprob_abs_diff": diff,
            "raw_reward": float(raw.sum() / len(samples)),
            "response_length": float(sum(s.response_length for s in samples) / len(samples)),
            "num_optimizer_steps": float(num_opt),
            "train_step_time_s": elapsed,
            "train_tokens_per_s": sum(len(s.tokens) for s in samples) * num_opt / max(elapsed, 1e-9),
            "train_world_size": float(d.world),
        })
        if critic is not None:
            metrics["critic_only"] = 0.0 if train_actor else 1.0
            metrics["values_mean"] = float(old_values[loss_mask != 0].mean()) if n_train > 0 else 0.0
            metrics["returns_mean"] = float(np.asarray(returns)[loss_mask != 0].mean()) if n_train > 0 else 0.0
        return {"weight_version_out": version, "checkpoint_uri": "file://" + quote(os.path.abspath(out_dir)), "num_samples": len(samples),
                "num_tokens": n_train, "metrics": {k: float(v) for k, v in metrics.items() if math.isfinite(v)}}
