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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import numpy as np
import torch

from . import algorithms as A
from . import device_loss, sft, tensor_parallel, trainer_checkpoint
from . import fsdp as fsdp_mod
from .batch import Batch, Sample
from .critic_step import CriticSteps
from .dist import Dist
from .efficiency import (
    StepClock,
    device_peak_flops,
    efficiency_metrics,
    model_flops,
    model_shape,
)
from .micro_batching import (
    micro_batches,
    packed_micro_batches,
    use_packing,
    validate_samples,
)
from .models import SAVE_DTYPES, write_optimizer
from .offload import MemoryMoves, should_offload
from .opd import opd_teacher_log_probs
from .sharded_adamw import ShardedAdamW

# Re-exported: server.py, dist_worker.py, dist_front.py, bench.py and the tests import these from here.
from .train_config import (  # noqa: F401
    Cancelled,
    StepError,
    TrainConfig,
    bad_request,
    learning_rate,
    optimizer_step_plan,
    parse_algorithm,
    parse_train_config,
)
from .vlm import expand_samples, micro_batch_vision, response_values
from .weight_loading import Held, WeightLoading


class _Forward(torch.nn.Module):
    """The training forward as a module (what DistributedDataParallel wraps): logits at the response positions."""

    def __init__(self, policy):
        super().__init__()
        self.inner = policy.module
        self.__dict__["_policy"] = (
            policy  # not a submodule: the policy is a plain object around self.inner
        )

    def forward(self, ids, rows, cols, positions=None, segments=None):
        pol = self.__dict__["_policy"]
        h = (
            pol.hidden_states(ids)
            if positions is None
            else pol.hidden_states(ids, positions, segments)
        )
        return pol.logits(h[rows, cols])


# Elements of one [tokens, vocab] float32 block in logp_entropy: 256 MiB. A 16k-token micro-batch of a
# 152k-vocabulary model (Qwen2) is 2.5e9 elements, ~10 GB per float32 copy, and the log-softmax, its
# exp and their product made four of them (the bench's qwen2 0.5B step ran out of an H100's 80 GB).
LOGITS_CHUNK_ELEMENTS = 1 << 26


def _token_stats(
    logits: torch.Tensor, tgt: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    z = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    return logp_all.gather(1, tgt[:, None])[:, 0], -(
        torch.exp(logp_all) * logp_all
    ).sum(-1)


def logp_entropy(
    logits: torch.Tensor, tgt: torch.Tensor, temperature: float, grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
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
        block, t = logits[lo : lo + rows], tgt[lo : lo + rows]
        parts.append(
            checkpoint(_token_stats, block, t, temperature, use_reentrant=False)
            if grad and torch.is_grad_enabled()
            else _token_stats(block, t, temperature)
        )
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _hidden_token_stats(
    logits_fn, hidden: torch.Tensor, tgt: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _token_stats(logits_fn(hidden), tgt, temperature)


def logp_entropy_from_hidden(
    logits_fn,
    hidden: torch.Tensor,
    tgt: torch.Tensor,
    temperature: float,
    grad: bool,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logp_entropy from the final hidden states ([tokens, d]) instead of logits: the lm_head runs per row block.

    A block's logits ([rows, vocab], bf16 under autocast) and their float32 copies live only while the block
    is computed; with gradients each block runs under torch.utils.checkpoint, so the backward keeps only the
    hidden states and recomputes one block's logits at a time. [tokens, vocab] is never held whole, in any
    dtype: a 16k-token micro-batch of a 152k vocabulary is 5 GB in bf16 and 10 GB per float32 copy.
    Blocks of LOGITS_CHUNK_ELEMENTS logits, as logp_entropy."""
    rows = max(1, LOGITS_CHUNK_ELEMENTS // max(1, vocab_size))
    checkpointed = grad and torch.is_grad_enabled()
    if hidden.shape[0] <= rows and not checkpointed:
        return _hidden_token_stats(logits_fn, hidden, tgt, temperature)
    from torch.utils.checkpoint import checkpoint

    parts = []
    for lo in range(0, hidden.shape[0], rows):
        block, t = hidden[lo : lo + rows], tgt[lo : lo + rows]
        parts.append(
            checkpoint(
                _hidden_token_stats,
                logits_fn,
                block,
                t,
                temperature,
                use_reentrant=False,
            )
            if checkpointed
            else _hidden_token_stats(logits_fn, block, t, temperature)
        )
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


# ------------------------------------------------------------------ the trainer


class TorchTrainer(WeightLoading, CriticSteps, ShardedAdamW):
    """One train step (train_step), on one rank or as one rank of many (``dist``). Loading is in
    weight_loading.py, the critic in critic_step.py, the optimizer in sharded_adamw.py."""

    def __init__(
        self,
        device: str = "cpu",
        defaults: dict[str, Any] | None = None,
        bf16: bool | None = None,
        log: Callable[[str], None] = print,
        dist: Dist | None = None,
        checkpoint_format: str = "safetensors",
        dcp_executor: str = "thread",
    ):
        self.dist = dist or Dist()
        self._ndims: dict[str, int] | None = (
            None  # fsdp: each parameter's rank before it was sharded flat
        )
        self._ddp_cache: tuple[Any, Any] | None = None
        self._critic_ddp_cache: tuple[Any, Any] | None = None
        self.device = torch.device(device)
        self.defaults = defaults or {}
        self.bf16 = (self.device.type == "cuda") if bf16 is None else bf16
        self.held: Held | None = None
        self.ref_cache: dict[str, Any] = {}
        self.log = log
        if checkpoint_format not in trainer_checkpoint.CHECKPOINT_FORMATS:
            raise ValueError(
                f"checkpoint_format {checkpoint_format!r}: expected one of {', '.join(trainer_checkpoint.CHECKPOINT_FORMATS)}"
            )
        self.checkpoint_format = checkpoint_format
        self.async_ckpt = trainer_checkpoint.AsyncCheckpoints(dcp_executor)
        # The overlapped save's parts (seconds) for the step's metrics; empty when the step saved the files.
        self.save_detail: dict[str, float] = {}
        # Colocated mode: what the trainer holds moves off its device between steps (offload.py).
        self.memory = MemoryMoves()

    @property
    def fsdp(self) -> bool:
        """Parameters sharded with FSDP (--sharding fsdp, many ranks; fsdp.py): FSDP2's fully_shard or FSDP1."""
        return self.dist.active and self.dist.sharding in fsdp_mod.FSDP_IMPLS

    def full_weights(self) -> list[tuple[str, torch.Tensor]] | None:
        """fsdp: the held weights gathered whole on rank 0 (for trainer_push); every rank must call it. None otherwise."""
        if (
            not self.fsdp
            or self.held is None
            or self._ddp_cache is None
            or self._ddp_cache[0] is not self.held.policy
        ):
            return None
        return fsdp_mod.full_named_params(
            self._ddp_cache[1], self.held.policy, self.device, self.dist.rank
        )

    @property
    def weight_version(self) -> int | None:
        return None if self.held is None else self.held.version

    def _autocast(self):
        if self.bf16 and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    # -------------------------------------------------------------- compute

    def token_stats(
        self,
        policy,
        samples: list[Sample],
        temperature: float,
        grad: bool,
        fwd=None,
        packed: bool = False,
    ):
        """Flat per-response-token (logp, entropy), float32 tensors on the device, in sample order.

        ``packed``: the samples are concatenated into one row (positions restart per sample,
        attention stays within a sample) instead of padded rows; the same numbers up to float rounding, no padding.
        ``fwd``: the module to run (the DistributedDataParallel wrapper while training on many ranks)."""
        L = max(len(s.tokens) - 1 for s in samples)
        if L > policy.max_positions:
            raise bad_request(
                f"a sample has {L + 1} tokens, more than the model's {policy.max_positions} positions"
            )
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
                ids[row, base : base + n - 1] = torch.from_numpy(
                    s.tokens[: n - 1].astype(np.int64)
                )
            if packed:
                positions[0, base : base + lens[i]] = torch.arange(lens[i])
                segments[0, base : base + lens[i]] = i
            r = s.response_length
            if r > 0:
                if s.prompt_length < 1:
                    raise bad_request(
                        "prompt_length must be >= 1 (the first token has no prediction)"
                    )
                rows.append(np.full(r, row))
                cols.append(
                    np.arange(
                        base + s.prompt_length - 1, base + s.prompt_length - 1 + r
                    )
                )
                targets.append(s.tokens[s.prompt_length :].astype(np.int64))
        if not rows:
            z = torch.zeros(0, device=self.device)
            return z, z
        tgt = torch.from_numpy(np.concatenate(targets))
        if (
            int(tgt.max()) >= policy.vocab_size
            or int(tgt.min()) < 0
            or int(ids.max()) >= policy.vocab_size
        ):
            raise bad_request(
                f"token ids outside the model's vocabulary of {policy.vocab_size}"
            )
        ids = self._to_device(ids)
        rows_t = self._to_device(torch.from_numpy(np.concatenate(rows)))
        cols_t = self._to_device(torch.from_numpy(np.concatenate(cols)))
        tgt = self._to_device(tgt)
        if positions is not None:
            positions, segments = self._to_device(positions), self._to_device(segments)
        vision = micro_batch_vision(samples, self.device)
        if vision is not None and (fwd is not None or positions is not None):
            raise bad_request(
                "samples with images train on one rank in padded micro-batches for now (no DDP/FSDP wrapper, no packing)"
            )
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            if (
                fwd is not None
            ):  # many ranks: the wrapper's forward gives the logits (its gradient hooks cover every parameter use)
                with self._autocast():
                    logits = fwd(ids, rows_t, cols_t, positions, segments)
                return logp_entropy(logits, tgt, temperature, grad)
            with self._autocast():
                if vision is not None:
                    h = policy.hidden_states(ids, vision=vision)
                elif positions is None:
                    h = policy.hidden_states(ids)
                else:
                    h = policy.hidden_states(ids, positions, segments)
                return logp_entropy_from_hidden(
                    policy.logits,
                    h[rows_t, cols_t],
                    tgt,
                    temperature,
                    grad,
                    policy.vocab_size,
                )

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device without waiting for the device: pinned and copied asynchronously on cuda
        (a pageable copy synchronises the stream, i.e. waits for every kernel queued before it)."""
        if self.device.type != "cuda":
            return x.to(self.device)
        return x.pin_memory().to(self.device, non_blocking=True)

    def _micro_batches(
        self, policy, samples: list[Sample], t: TrainConfig
    ) -> list[tuple[int, int]]:
        if use_packing(policy, t):
            return packed_micro_batches(samples, t.max_tokens_per_gpu)
        return micro_batches(samples, t.max_tokens_per_gpu)

    def forward_all(
        self,
        policy,
        samples,
        mbs,
        temperature,
        report,
        phase,
        check,
        packed: bool = False,
        fwd=None,
    ):
        """Log-probs and entropies of every response token, micro-batch by micro-batch; on many ranks
        micro-batch k runs on rank k mod world and the results are all-gathered (same numbers as one rank).
        ``fwd``: the FSDP-wrapped forward (fsdp), which every rank runs in every round."""
        d = self.dist
        mine: dict[int, tuple[Any, Any]] = {}
        rounds = (len(mbs) + d.slots - 1) // d.slots
        for rnd in range(rounds):
            d.agree_cancel(check)
            k = rnd * d.slots + d.slot
            if k < len(mbs):
                lo, hi = mbs[k]
                lp, en = self.token_stats(
                    policy,
                    samples[lo:hi],
                    temperature,
                    grad=False,
                    fwd=fwd,
                    packed=packed,
                )
                # One rank: kept on the device, copied to the host once below (no wait per micro-batch).
                mine[k] = (
                    (lp.double().cpu().numpy(), en.double().cpu().numpy())
                    if d.active
                    else (lp, en)
                )
            elif fwd is not None:
                with torch.no_grad():
                    self._dummy_forward(fwd)
            report(f"{phase} {min((rnd + 1) * d.slots, len(mbs))}/{len(mbs)}")
        if d.active:
            for part in d.all_gather(mine):
                mine.update(part)
        lps = [mine[k][0] for k in range(len(mbs))]
        ents = [mine[k][1] for k in range(len(mbs))]
        if not lps:
            return np.zeros(0), np.zeros(0)
        if not d.active:
            return torch.cat(lps).double().cpu().numpy(), torch.cat(
                ents
            ).double().cpu().numpy()
        return np.concatenate(lps), np.concatenate(ents)

    def _ddp(self, policy):
        """The training forward: plain on one rank, inside DistributedDataParallel on many (built once per loaded policy)."""
        if not self.dist.active:
            return None
        if self._ddp_cache is not None and self._ddp_cache[0] is policy:
            return self._ddp_cache[1]
        if self.fsdp:
            policy.packing_unsupported()  # its probe calls the whole module: run (and cache) it before FSDP shards it
            self._ndims = fsdp_mod.ndims(policy)
            wrapped = fsdp_mod.wrap(
                _Forward(policy), self.device, self.dist.sharding, tp=self.dist.tp
            )
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
        return fwd(
            torch.zeros((1, 1), dtype=torch.long, device=dev),
            torch.zeros(1, dtype=torch.long, device=dev),
            torch.zeros(1, dtype=torch.long, device=dev),
            None,
            None,
        )

    # -------------------------------------------------------------- the step

    def train_step(
        self,
        req: dict[str, Any],
        batch: Batch,
        t: TrainConfig,
        o: dict[str, Any],
        progress: Callable[[int, int, str], None],
        check: Callable[[], None],
    ) -> dict[str, Any]:
        clock = StepClock(self.device)
        samples = sorted(batch.samples, key=lambda s: (s.group_index, s.sample_index))
        if not samples:
            raise bad_request(f"train step {req['step']} has no samples")
        # Colocated mode: the engines released the GPUs before this step was dispatched. Only weights the
        # step starts from come back; others (another run's, a version the request does not name) would
        # cross to the device only for _start to drop them, so they are dropped on the host.
        if self.held_serves(req):
            self.memory.onload(self.held, self.device, self._fsdp2_root())
        else:
            self.memory.onload(None, self.device)
        gbs, num_opt = optimizer_step_plan(t, len(samples))
        state = {"done": 0}
        report = lambda phase: progress(state["done"], num_opt, phase)
        c = self._step_start(req, t, o, samples, num_opt, report)
        clock.mark("load_s")
        self._loss_inputs(c, samples)
        self._start_log_probs(c, samples, t, report, check, clock)
        raw, normalized = A.post_process_rewards(
            [s.reward for s in samples], [s.group_index for s in samples], o
        )
        shape = c.shape
        try:
            c.advantages, c.returns, _ = A.compute_advantages_and_returns(
                normalized,
                shape.like(c.loss_mask),
                o,
                old_log_probs=None if c.on_policy else shape.like(c.old),
                rollout_log_probs=shape.like(c.rollout),
                ref_log_probs=None if c.ref is None else shape.like(c.ref),
                values=None if c.old_values is None else shape.like(c.old_values),
                teacher_log_probs=opd_teacher_log_probs(o, samples, shape),
            )
        except A.AlgorithmError as e:
            raise bad_request(f"advantages: {e}") from e
        self._device_inputs(c)
        clock.mark("prepare_s")

        sums, grad_norm_sum, lr = self._optimizer_steps(
            c, samples, gbs, num_opt, t, state, report, check, clock
        )
        if c.on_policy and c.old_parts:
            # The micro-batches, in order, cover the batch.
            c.old = (
                torch.cat([c.old_parts[k] for k in sorted(c.old_parts)]).cpu().numpy()
            )

        version = req["weight_version_in"] + 1
        self.dist.agree_cancel(check)
        report("save")
        out_dir = req["output_dir"]
        self._save(
            c.policy,
            c.critic,
            c.params,
            c.moments,
            c.owner,
            c.iteration,
            version,
            out_dir,
            req,
            t,
            c.fwd,
        )
        clock.mark("save_s")
        metrics = self._step_metrics(
            c, samples, raw, sums, grad_norm_sum / num_opt, lr, num_opt, clock
        )
        if should_offload(req["config"]):
            # The engines resume once this step commits: the GPUs are theirs until the next step.
            self.memory.offload(
                self.held, self._fsdp2_root(), list(self.ref_cache.values())
            )
            metrics.update(self._memory_move_metrics())
        return {
            "weight_version_out": version,
            "checkpoint_uri": "file://" + quote(os.path.abspath(out_dir)),
            "num_samples": len(samples),
            "num_tokens": int(c.loss_mask.sum()),
            "metrics": {k: float(v) for k, v in metrics.items() if math.isfinite(v)},
            "old_log_probs": self._old_log_probs_in_request_order(c, samples, batch),
        }

    def _fsdp2_root(self) -> torch.nn.Module | None:
        """fsdp2: the held policy's sharded training forward, which offload.py moves whole; None otherwise."""
        if (
            self.fsdp
            and self.dist.sharding == "fsdp2"
            and self.held is not None
            and self._ddp_cache is not None
            and self._ddp_cache[0] is self.held.policy
        ):
            return self._ddp_cache[1]
        return None

    def _memory_move_metrics(self) -> dict[str, float]:
        """Colocated mode: this step's onload (before it: 0 bytes when nothing was held, as in a fresh
        process) and offload (after it), bytes summed over the ranks, seconds the slowest rank's. A
        collective on many ranks: every rank reaches it, as should_offload reads the step's config."""
        moves = self.dist.all_gather(
            {k: (m.nbytes, m.seconds) for k, m in self.memory.last.items()}
        )
        out: dict[str, float] = {}
        for kind in ("onload", "offload"):
            out[f"{kind}_bytes"] = float(sum(m[kind][0] for m in moves))
            out[f"{kind}_s"] = max(m[kind][1] for m in moves)
        return out

    @staticmethod
    def _old_log_probs_in_request_order(c, samples, batch: Batch) -> list[list[float]]:
        """Each sample's old log-probs (its response tokens', under the start weights) in the request's order: the step works on `samples` sorted by group and index."""
        offsets = c.shape.offsets
        # A sample with images trained expanded (vlm.py): its values are read back at its own response positions.
        by_id = {
            id(s.unexpanded or s): response_values(
                s, c.old[int(offsets[i]) : int(offsets[i + 1])].tolist()
            )
            for i, s in enumerate(samples)
        }
        return [by_id[id(s)] for s in batch.samples]

    def _step_start(
        self, req, t: TrainConfig, o: dict[str, Any], samples, num_opt: int, report
    ) -> SimpleNamespace:
        """The step's state: start weights (and critic), gradient flags, moments, packing, the on-policy decision."""
        d = self.dist
        if (why := tensor_parallel.step_refusal(t.parallel, d)) is not None:
            raise bad_request(why)
        d.tp = t.parallel.tp if t.parallel is not None else 1
        start = self._start(req, t, report)
        # The weights below change in place: never hold a half-trained version.
        self.held = None
        policy = start.policy
        ppo = o["advantage_estimator"] == "ppo"
        if ppo and self.fsdp:
            raise bad_request(
                "advantage_estimator ppo is not supported with --sharding fsdp yet (the critic starts from the policy's full "
                "weights); use --sharding zero1"
            )
        c = SimpleNamespace(o=o, start=start, policy=policy, scale=float(d.slots))
        c.critic = self._critic_start(req, start, policy) if ppo else None
        c.train_actor = not ppo or req["step"] >= t.num_critic_only_steps
        # Images: placeholders expanded by the model's processor, vision inputs attached (in place: the
        # caller's list is the step's samples from here on).
        samples[:] = expand_samples(policy, samples)
        # On every rank, before any collective: a bad batch fails all ranks alike.
        validate_samples(policy, samples)
        # fsdp: shard before the moments are made (shards' shapes).
        c.sharded_fwd = self._ddp(policy) if self.fsdp else None
        c.params = policy.named_params()
        for _, p in c.params:
            p.requires_grad_(True)
        policy.set_gradient_checkpointing(t.gradient_checkpointing)
        c.owner = d.owners(c.params)
        c.moments = start.moments or {
            n: (
                torch.zeros_like(fsdp_mod.local(p), dtype=torch.float32),
                torch.zeros_like(fsdp_mod.local(p), dtype=torch.float32),
            )
            for n, p in c.params
            if c.owner[n] == d.rank
        }
        c.iteration = start.iteration
        c.temperature = t.rollout_temperature
        c.packed = use_packing(policy, t)
        # On-policy (one optimizer step, nothing before it needs the old log-probs): the training forward runs at
        # the start weights, so its detached log-probs are the old ones and a separate forward would repeat it.
        c.on_policy = self._old_from_train_forward(o, num_opt, c.critic)
        return c

    def _loss_inputs(self, c: SimpleNamespace, samples) -> None:
        """The batch's per-token arrays (flat, float64): loss mask, denominators' mask, rollout log-probs."""
        lengths = [s.response_length for s in samples]
        c.shape = A.Ragged(
            np.zeros(sum(lengths)), np.concatenate([[0], np.cumsum(lengths)])
        )
        flat = lambda arrays: (
            np.concatenate([x.astype(np.float64) for x in arrays])
            if c.shape.flat.size
            else np.zeros(0)
        )
        c.loss_mask = flat([s.loss_mask for s in samples])
        # Denominators: the mask before rlq zeroed off-policy / stale tokens (DESIGN §1).
        c.denom_mask = flat(
            [s.loss_mask if s.denom_mask is None else s.denom_mask for s in samples]
        )
        c.rollout = flat([s.rollout_log_probs for s in samples])

    def _start_log_probs(
        self,
        c: SimpleNamespace,
        samples,
        t: TrainConfig,
        report,
        check,
        clock: StepClock,
    ) -> None:
        """Under the start weights: old log-probs (unless on-policy), reference log-probs (KL), the critic's values (ppo)."""
        o = c.o
        policy = c.policy
        all_mbs = self._micro_batches(policy, samples, t)
        c.forwards = 0
        if c.on_policy:
            c.old = np.zeros(c.shape.flat.size)
            c.old_parts = {}
        else:
            policy.module.eval()
            c.old, _ = self.forward_all(
                policy,
                samples,
                all_mbs,
                c.temperature,
                report,
                "old_logprobs",
                check,
                c.packed,
                fwd=c.sharded_fwd,
            )
            policy.module.train()
            c.forwards += 1
            clock.mark("old_logprobs_s")
        c.ref = None
        if o["use_kl_loss"] or o["kl_coef"] != 0:
            ref_policy = self._reference(t, c.start)
            c.ref, _ = self.forward_all(
                ref_policy,
                samples,
                all_mbs,
                c.temperature,
                report,
                "ref_logprobs",
                check,
                use_packing(ref_policy, t),
            )
            c.forwards += 1
            clock.mark("ref_logprobs_s")
        c.old_values = None
        if c.critic is not None:
            c.old_values = self._critic_values_all(
                c.critic[0],
                samples,
                micro_batches(samples, t.max_tokens_per_gpu),
                report,
                check,
            )
            clock.mark("critic_s")

    def _optimizer_steps(
        self,
        c: SimpleNamespace,
        samples,
        gbs: int,
        num_opt: int,
        t: TrainConfig,
        state,
        report,
        check,
        clock: StepClock,
    ):
        """One optimizer step per global batch (the critic's first, ppo); (metric sums, summed grad norms, last lr)."""
        d = self.dist
        o = c.o
        shape = c.shape
        c.fwd = self._ddp(c.policy)
        sums: dict[str, float] = {}
        grad_norm_sum = 0.0
        lr = 0.0
        decay_iters = (
            t.lr_decay_iters
            if t.lr_decay_iters is not None
            else (None if t.num_rollout is None else t.num_rollout * num_opt)
        )
        for j in range(num_opt):
            lo_g, hi_g = j * gbs, (j + 1) * gbs
            gsamples = samples[lo_g:hi_g]
            g_shape = shape.slice(lo_g, hi_g)
            a, b = int(shape.offsets[lo_g]), int(shape.offsets[hi_g])
            # The global batch's denominators: each sample's own mask sum (D_i), and R or N.
            own = g_shape.seg_sum(c.denom_mask[a:b])
            normalizer = (
                float(sum(max(x, 1.0) for x in own.tolist()))
                if o["calculate_per_token_loss"]
                else float(len(gsamples))
            )
            for _, p in c.params:
                p.grad = None
            if c.critic is not None:
                sums_c = self._critic_update(
                    c.critic,
                    gsamples,
                    g_shape,
                    a,
                    c.old_values,
                    c.returns,
                    c.loss_mask,
                    own,
                    normalizer,
                    o,
                    t,
                    lr_of=lambda it: learning_rate(t, decay_iters, it),
                    check=check,
                )
                for key, v in sums_c.items():
                    sums[key] = sums.get(key, 0.0) + v / num_opt
                report(f"critic {j + 1}/{num_opt}")
                clock.mark("critic_s")
            if not c.train_actor:
                state["done"] = j + 1
                continue
            mbs = self._micro_batches(c.policy, gsamples, t)
            metrics_by_mb = self._actor_global_batch(
                c.policy,
                c.fwd,
                gsamples,
                g_shape,
                a,
                mbs,
                own,
                normalizer,
                c,
                report,
                check,
                f"train {j + 1}/{num_opt}",
            )
            for k in range(len(mbs)):
                for key, v in metrics_by_mb[k].items():
                    sums[key] = sums.get(key, 0.0) + v / num_opt
            clock.mark("fwd_bwd_s")
            d.agree_cancel(check)
            lr = learning_rate(t, decay_iters, c.iteration)
            grad_norm_sum += self._adamw(
                c.params, c.moments, c.owner, c.iteration, lr, t
            )
            c.iteration += 1
            state["done"] = j + 1
            report("optimizer_step")
            clock.mark("optimizer_s")
        return sums, grad_norm_sum, lr

    def _step_metrics(
        self,
        c: SimpleNamespace,
        samples,
        raw,
        sums,
        grad_norm: float,
        lr: float,
        num_opt: int,
        clock: StepClock,
    ) -> dict[str, float]:
        """The step's metrics: the loss's (averaged over optimizer steps), the run's, and the efficiency ones (efficiency.py)."""
        loss_mask = c.loss_mask
        n_train = int(loss_mask.sum())
        metrics = dict(sums)
        metrics.update(self.save_detail)
        diff = (
            float(np.abs(c.old - c.rollout)[loss_mask != 0].sum() / n_train)
            if n_train > 0
            else 0.0
        )
        lengths = [max(len(s.tokens) - 1, 1) for s in samples]
        shape_m = model_shape(c.policy)
        flops = (
            model_flops(shape_m, lengths) * (1 if c.train_actor else 0)
            + model_flops(shape_m, lengths, forward_only=True) * c.forwards
        )
        tokens = sum(len(s.tokens) for s in samples)
        clock.mark("other_s")
        eff = efficiency_metrics(clock, tokens, flops, device_peak_flops(self.device))
        elapsed = eff["step_s"]
        metrics.update(
            {
                "grad_norm": grad_norm,
                "lr": lr,
                "train_rollout_logprob_abs_diff": diff,
                "raw_reward": float(raw.sum() / len(samples)),
                "response_length": float(
                    sum(s.response_length for s in samples) / len(samples)
                ),
                "num_optimizer_steps": float(num_opt),
                "train_step_time_s": elapsed,
                "train_tokens_per_s": tokens * num_opt / max(elapsed, 1e-9),
                "train_world_size": float(self.dist.world),
                "train_tensor_parallel_size": float(self.dist.tp),
                "model_flops_per_step": flops,
            }
        )
        # mfu is left out where the device's peak is unknown (the metrics are numbers only).
        metrics.update({k: v for k, v in eff.items() if v is not None})
        if c.critic is not None:
            metrics["critic_only"] = 0.0 if c.train_actor else 1.0
            metrics["values_mean"] = (
                float(c.old_values[loss_mask != 0].mean()) if n_train > 0 else 0.0
            )
            metrics["returns_mean"] = (
                float(np.asarray(c.returns)[loss_mask != 0].mean())
                if n_train > 0
                else 0.0
            )
        return metrics

    # Tests set it to compare the on-policy shortcut with the separate old-log-prob forward.
    ALWAYS_RECOMPUTE_OLD = False

    def _old_from_train_forward(self, o: dict[str, Any], num_opt: int, critic) -> bool:
        """True when the training forward may give the old log-probs: one optimizer step (it runs at the start
        weights), one rank (every micro-batch's old log-probs are needed here for the metrics), and nothing
        before the training forward reads them (no critic, no KL in the reward, no on-policy distillation)."""
        return (
            not self.ALWAYS_RECOMPUTE_OLD
            and num_opt == 1
            and not self.dist.active
            and critic is None
            and o["kl_coef"] == 0
            and not o["use_opd"]
        )

    def _device_inputs(self, c: SimpleNamespace) -> None:
        """The device loss (device_loss.py) where it covers the algorithm: the batch's per-token inputs on the device once."""
        c.sft = c.o["loss_type"] == "sft_loss"
        c.device_loss = device_loss.unsupported(c.o) is None
        if not c.device_loss and not c.sft:
            return
        dev = lambda x: (
            None
            if x is None
            else self._to_device(
                torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
            )
        )
        c.adv_d, c.roll_d, c.ref_d = dev(c.advantages), dev(c.rollout), dev(c.ref)
        c.old_d = None if c.on_policy else dev(c.old)
        c.metric_names = device_loss.metric_names(c.o)

    def _actor_global_batch(
        self,
        policy,
        fwd,
        gsamples,
        g_shape,
        a: int,
        mbs,
        own,
        normalizer: float,
        c: SimpleNamespace,
        report,
        check,
        phase: str,
    ) -> dict[int, dict[str, float]]:
        """Forward, loss and backward of one global batch's micro-batches; their metrics by micro-batch index.

        Micro-batch k runs on rank k mod world; every rank runs `rounds` backward passes (a zero one when it has
        no micro-batch left), gradients sync only on the last one (DDP no_sync). The device loss keeps each
        micro-batch's metrics on the device; they are read once, after the last backward."""
        d = self.dist
        o = c.o
        w_d = None
        if c.device_loss or c.sft:
            b = a + int(g_shape.offsets[-1])
            w_d = self._to_device(
                torch.from_numpy(
                    device_loss.aggregation_weights(
                        g_shape,
                        c.loss_mask[a:b],
                        c.denom_mask[a:b],
                        o,
                        mbs,
                        own,
                        normalizer,
                    )
                )
            )
        rounds = (len(mbs) + d.slots - 1) // d.slots
        metrics_by_mb: dict[int, Any] = {}
        for rnd in range(rounds):
            d.agree_cancel(check)
            k = rnd * d.slots + d.slot
            with fsdp_mod.grad_sync(fwd, rnd == rounds - 1):
                if k >= len(mbs):
                    self._zero_backward(policy, fwd)
                else:
                    lo, hi = mbs[k]
                    ga, gb = int(g_shape.offsets[lo]), int(g_shape.offsets[hi])
                    logp_t, ent_t = self.token_stats(
                        policy,
                        gsamples[lo:hi],
                        c.temperature,
                        grad=True,
                        fwd=fwd,
                        packed=c.packed,
                    )
                    if c.sft:
                        if c.on_policy:
                            c.old_parts[k] = logp_t.detach().double()
                        dlp, dent, metrics_by_mb[k] = sft.loss_terms(logp_t, w_d[ga:gb])
                        with_entropy = False
                    elif c.device_loss:
                        old = (
                            logp_t.detach().double()
                            if c.on_policy
                            else c.old_d[a + ga : a + gb]
                        )
                        if c.on_policy:
                            c.old_parts[k] = old
                        ref = None if c.ref_d is None else c.ref_d[a + ga : a + gb]
                        dlp, dent, metrics_by_mb[k] = device_loss.loss_terms(
                            logp_t,
                            ent_t,
                            w_d[ga:gb],
                            c.adv_d[a + ga : a + gb],
                            old,
                            c.roll_d[a + ga : a + gb],
                            ref,
                            o,
                        )
                        with_entropy = o["entropy_coef"] != 0
                    else:
                        dlp, dent, metrics_by_mb[k], with_entropy = self._host_loss(
                            logp_t,
                            ent_t,
                            g_shape.slice(lo, hi),
                            a + ga,
                            a + gb,
                            own[lo:hi],
                            normalizer,
                            c,
                        )
                    if logp_t.numel() > 0:
                        # DDP/FSDP average gradients over the data-parallel ranks (slots: world, or world / tp); the
                        # loss is a sum over micro-batches, so scale by slots (exact for a power-of-two count).
                        surrogate = (logp_t * (dlp * c.scale).float()).sum()
                        if with_entropy:
                            surrogate = (
                                surrogate + (ent_t * (dent * c.scale).float()).sum()
                            )
                        surrogate.backward()
                    elif fwd is not None:
                        self._zero_backward(policy, fwd)
            report(
                f"{phase} micro-batch {min((rnd + 1) * d.slots, len(mbs))}/{len(mbs)}"
            )
        on_device = [k for k, v in metrics_by_mb.items() if torch.is_tensor(v)]
        if on_device:
            rows = torch.stack([metrics_by_mb[k] for k in on_device]).cpu().tolist()
            for k, row in zip(on_device, rows):
                metrics_by_mb[k] = dict(zip(c.metric_names, row))
        if d.active:
            for part in d.all_gather(metrics_by_mb):
                metrics_by_mb.update(part)
        return metrics_by_mb

    def _host_loss(
        self,
        logp_t,
        ent_t,
        mb_shape,
        ma: int,
        mb_: int,
        own,
        normalizer: float,
        c: SimpleNamespace,
    ):
        """policy_loss_terms on the host (the options device_loss does not cover): the micro-batch's log-probs are copied there."""
        lp = logp_t.detach().double().cpu().numpy()
        en = ent_t.detach().double().cpu().numpy()
        if c.on_policy:
            c.old[ma:mb_] = lp
        try:
            terms = A.policy_loss_terms(
                mb_shape.like(lp),
                c.advantages[ma:mb_],
                c.loss_mask[ma:mb_],
                c.o,
                old=c.old[ma:mb_],
                denom_mask=c.denom_mask[ma:mb_],
                ref=None if c.ref is None else c.ref[ma:mb_],
                rollout=c.rollout[ma:mb_],
                entropy=en,
                sample_denominators=own,
                normalizer=normalizer,
            )
        except A.AlgorithmError as e:
            raise bad_request(f"policy loss: {e}") from e
        dev = lambda x: self._to_device(
            torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
        )
        return (
            dev(terms.dloss_dlogp),
            dev(terms.dloss_dentropy),
            terms.metrics,
            bool(np.any(terms.dloss_dentropy != 0)),
        )

    def _save(
        self,
        policy,
        critic,
        params,
        moments,
        owner,
        iteration: int,
        version: int,
        out_dir: str,
        req: dict[str, Any],
        t: TrainConfig,
        fwd,
    ) -> None:
        """The step's directory: the critic (ppo), the optimizer state, then the weights (a weights file present means the rest is)."""
        d = self.dist
        os.makedirs(out_dir, exist_ok=True)
        for _, p in params:
            p.grad = None
            if (
                not self.fsdp
            ):  # fsdp: the flags stay as FSDP saw them when it wrapped the parameters
                p.requires_grad_(False)
        # Optimizer first: a weights file present means its state is present too (as rlq's writer).
        # Many ranks: each writes its own shard of the optimizer state, then rank 0 the weights.
        if (
            critic is not None
        ):  # the critic first: a committed step's directory always carries its critic
            c_owner = d.owners(critic[0].named_params())
            critic[0].save_optimizer(
                out_dir,
                version,
                req["run_id"],
                req["step"],
                critic[1],
                critic[2][0],
                c_owner,
                d.rank,
                (d.rank, d.world) if d.active else None,
            )
            d.barrier()
            if d.rank == 0:
                critic[0].save_weights(out_dir, version, req["run_id"], req["step"])
        if policy.kind == "hf" and t.save_dtype is not None:
            # Every rank, before the masters are taken: policy.save (rank 0 only) would set it too late for
            # this step's fp32 masters, and never on the other ranks.
            policy.save_dtype = SAVE_DTYPES[t.save_dtype]
        masters = self._masters(policy, owner)
        self.save_detail = {}
        if self._dcp_checkpoint(req):
            self._save_overlapped(
                policy, moments, masters, iteration, version, out_dir, req, t
            )
        else:
            self._save_files(
                policy,
                params,
                moments,
                owner,
                masters,
                iteration,
                version,
                out_dir,
                req,
                t,
                fwd,
            )
        self.held = Held(policy, moments, iteration, version, os.path.realpath(out_dir))
        if critic is not None:
            self.held.critic, self.held.critic_moments, self.held.critic_iteration = (
                critic[0],
                critic[1],
                critic[2][0],
            )

    def _dcp_checkpoint(self, req: dict[str, Any]) -> bool:
        """--trainer-checkpoint dcp applies: one rank, and not a checkpoints: fetch step (its transfer moves optimizer.safetensors)."""
        return (
            self.checkpoint_format == "dcp"
            and not self.dist.active
            and req.get("checkpoint_transfer") != "fetch"
        )

    def _save_overlapped(
        self,
        policy,
        moments,
        masters,
        iteration: int,
        version: int,
        out_dir: str,
        req: dict[str, Any],
        t: TrainConfig,
    ) -> None:
        """The weights file written by a second thread while this one copies the optimizer state to host memory for
        its asynchronous DCP save (trainer_checkpoint.py); returns once the weights file is complete and fsync'd, the
        optimizer state's write just started."""
        extra = {trainer_checkpoint.OPTIMIZER_META_KEY: "dcp"}

        def save_weights() -> float:
            began = time.perf_counter()
            policy.save(
                out_dir,
                version,
                req["run_id"],
                req["step"],
                dtype=t.save_dtype,
                extra_meta=extra,
            )
            return time.perf_counter() - began

        with ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rlq-weights"
        ) as pool:
            weights = pool.submit(save_weights)
            try:
                self.async_ckpt.stage(moments, masters, iteration)
            finally:
                weights_s = weights.result()
        # The optimizer state's write starts once the weights file is on disk: the step waits for that file only.
        self.async_ckpt.start(out_dir)
        self.save_detail = {**self.async_ckpt.timing, "save_weights_s": weights_s}

    def _save_files(
        self,
        policy,
        params,
        moments,
        owner,
        masters,
        iteration: int,
        version: int,
        out_dir: str,
        req: dict[str, Any],
        t: TrainConfig,
        fwd,
    ) -> None:
        """optimizer.safetensors (or this rank's shard), then the weights file: present only once the state beside it is."""
        d = self.dist
        write_optimizer(
            out_dir,
            [(n, p) for n, p in params if owner[n] == d.rank],
            moments,
            iteration,
            version,
            req["run_id"],
            req["step"],
            masters,
            shard=(d.rank, d.world) if d.active else None,
            sharding=fsdp_mod.optimizer_sharding(d) if self.fsdp else None,
        )
        d.barrier()
        if self.fsdp:
            with fsdp_mod.full_params(
                fwd, self.device
            ):  # the whole weights on rank 0, written as one rank writes them
                if d.rank == 0:
                    policy.save(
                        out_dir, version, req["run_id"], req["step"], dtype=t.save_dtype
                    )
        elif d.rank == 0:
            policy.save(
                out_dir, version, req["run_id"], req["step"], dtype=t.save_dtype
            )
        d.barrier()
