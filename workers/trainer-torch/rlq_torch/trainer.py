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
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote

import numpy as np
import torch

from . import algorithms as A
from . import gpt
from .batch import Batch, Sample
from .dist import Dist
from .models import (CheckpointError, EmbeddedPolicy, checkpoint_kind, checkpoint_version, load_hf_dir, load_policy, path_from_uri,
                     read_optimizer, write_optimizer)


class StepError(Exception):
    """A failure with a protocol error code."""

    def __init__(self, code: str, message: str, retryable: bool):
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class Cancelled(Exception):
    pass


def bad_request(msg: str) -> StepError:
    return StepError("bad_request", msg, False)


# ------------------------------------------------------------------ config


@dataclass
class TrainConfig:
    lr: float = 1e-6
    min_lr: float = 0.0
    lr_decay_style: str = "constant"
    lr_warmup_iters: int = 0
    lr_decay_iters: Optional[int] = None
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    global_batch_size: Optional[int] = None
    num_steps_per_rollout: int = 1
    num_rollout: Optional[int] = None
    rollout_temperature: float = 1.0
    ref_load: Optional[str] = None
    seed: int = 1234
    max_tokens_per_gpu: Optional[int] = None
    model: Optional[Dict] = None
    hf_checkpoint: Optional[str] = None
    use_dynamic_batch_size: bool = False
    num_critic_only_steps: int = 0
    critic_lr: Optional[float] = None
    gradient_checkpointing: bool = False
    save_dtype: Optional[str] = None


def _num(c: Dict, key: str, default, kind=float, lo=None, lo_open=False, hi=None, nullable=False):
    v = c.get(key, default)
    if v is None:
        if nullable or default is None:
            return None
        raise bad_request(f"config.{key} must not be null")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise bad_request(f"config.{key} = {v!r}: expected {'an integer' if kind is int else 'a number'}")
    v = kind(v)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise bad_request(f"config.{key} = {v}: must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and v > hi:
        raise bad_request(f"config.{key} = {v}: must be <= {hi}")
    return v


def parse_train_config(c: Dict[str, Any], defaults: Dict[str, Any]) -> TrainConfig:
    """The run-config keys the trainer reads (slime/Megatron names, the embedded trainer's defaults).
    ``defaults`` are the server's own (--max-tokens-per-gpu, --model-config, --hf-checkpoint)."""
    t = TrainConfig()
    t.lr = _num(c, "lr", 1e-6, lo=0, lo_open=True)
    t.min_lr = _num(c, "min_lr", 0.0, lo=0)
    t.lr_decay_style = c.get("lr_decay_style", "constant")
    if t.lr_decay_style not in ("constant", "linear", "cosine"):
        raise bad_request(f"config.lr_decay_style = {t.lr_decay_style!r}: expected constant | linear | cosine")
    t.lr_warmup_iters = _num(c, "lr_warmup_iters", 0, int, lo=0)
    t.lr_decay_iters = _num(c, "lr_decay_iters", None, int, lo=0, lo_open=True, nullable=True)
    t.weight_decay = _num(c, "weight_decay", 0.0, lo=0)
    t.adam_beta1 = _num(c, "adam_beta1", 0.9, lo=0, hi=0.999999)
    t.adam_beta2 = _num(c, "adam_beta2", 0.999, lo=0, hi=0.999999)
    t.adam_eps = _num(c, "adam_eps", 1e-8, lo=0, lo_open=True)
    t.clip_grad = _num(c, "clip_grad", 1.0, lo=0, lo_open=True)
    t.global_batch_size = _num(c, "global_batch_size", None, int, lo=0, lo_open=True, nullable=True)
    t.num_steps_per_rollout = _num(c, "num_steps_per_rollout", 1, int, lo=0, lo_open=True)
    t.num_rollout = _num(c, "num_rollout", None, int, lo=0, lo_open=True, nullable=True)
    t.rollout_temperature = _num(c, "rollout_temperature", 1.0, lo=0, lo_open=True)
    t.seed = _num(c, "seed", 1234, int, lo=0)
    t.max_tokens_per_gpu = _num(c, "max_tokens_per_gpu", defaults.get("max_tokens_per_gpu"), int, lo=0, lo_open=True, nullable=True)
    ref = c.get("ref_load")
    if ref is not None and not isinstance(ref, str):
        raise bad_request("config.ref_load must be a path or null")
    t.ref_load = ref
    hf = c.get("hf_checkpoint", defaults.get("hf_checkpoint"))
    if hf is not None and not isinstance(hf, str):
        raise bad_request("config.hf_checkpoint must be a path or null")
    t.hf_checkpoint = hf
    model = c.get("model", defaults.get("model"))
    if model is not None:
        try:
            model = gpt.parse_model_config(model)
        except ValueError as e:
            raise bad_request(f"config.model: {e}") from e
    t.model = model
    t.use_dynamic_batch_size = _flag(c, "use_dynamic_batch_size", bool(defaults.get("use_dynamic_batch_size", False)))
    if t.use_dynamic_batch_size and t.max_tokens_per_gpu is None:
        raise bad_request("config.use_dynamic_batch_size needs max_tokens_per_gpu (the token budget of a packed micro-batch)")
    t.num_critic_only_steps = _num(c, "num_critic_only_steps", 0, int, lo=0)
    t.critic_lr = _num(c, "critic_lr", None, lo=0, lo_open=True, nullable=True)
    t.gradient_checkpointing = _flag(c, "gradient_checkpointing", bool(defaults.get("gradient_checkpointing", False)))
    sd = c.get("hf_save_dtype", defaults.get("hf_save_dtype"))
    if sd is not None and sd not in ("bf16", "fp16", "fp32"):
        raise bad_request(f"config.hf_save_dtype = {sd!r}: expected bf16 | fp16 | fp32 (or leave it out: the model's own torch_dtype)")
    t.save_dtype = sd
    return t


def _flag(c: Dict[str, Any], key: str, default: bool) -> bool:
    v = c.get(key, default)
    if not isinstance(v, bool):
        raise bad_request(f"config.{key} = {v!r}: expected true or false")
    return v


def parse_algorithm(c: Dict[str, Any]) -> Dict[str, Any]:
    try:
        o = A.parse_options({k: c[k] for k in A.DEFAULT_OPTIONS if k in c})
        A.validate_options(o)
    except A.AlgorithmError as e:
        raise bad_request(f"config: {e}") from e
    if o["use_opd"]:
        raise bad_request("use_opd needs teacher log-probs, which the batch format does not carry")
    return o


def optimizer_step_plan(t: TrainConfig, num_samples: int) -> Tuple[int, int]:
    gbs = t.global_batch_size if t.global_batch_size is not None else num_samples / t.num_steps_per_rollout
    if not float(gbs).is_integer() or gbs <= 0 or num_samples % int(gbs) != 0:
        raise bad_request(f"global_batch_size: {num_samples} samples do not split into whole global batches of {gbs}")
    return int(gbs), num_samples // int(gbs)


def learning_rate(t: TrainConfig, decay_iters: Optional[int], iteration: int) -> float:
    """Megatron's get_lr (src/trainer/embedded/lr-schedule.ts): warmup, then constant / linear / cosine to min_lr."""
    n = iteration + 1
    if t.lr_warmup_iters > 0 and n <= t.lr_warmup_iters:
        return t.lr * n / t.lr_warmup_iters
    if t.lr_decay_style == "constant":
        return t.lr
    if decay_iters is None:
        raise bad_request(f"lr_decay_style {t.lr_decay_style} needs lr_decay_iters (or num_rollout)")
    if n > decay_iters:
        return t.min_lr
    span = decay_iters - t.lr_warmup_iters
    ratio = 1.0 if span <= 0 else (n - t.lr_warmup_iters) / span
    coeff = 1 - ratio if t.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1)
    return t.min_lr + (t.lr - t.min_lr) * coeff


def micro_batches(samples: List[Sample], max_tokens: Optional[int]) -> List[Tuple[int, int]]:
    """Consecutive [lo, hi) runs whose padded size (count × longest input) fits max_tokens (a longer sample runs alone)."""
    if max_tokens is None:
        return [(0, len(samples))] if samples else []
    out = []
    lo = 0
    longest = 0
    for i, s in enumerate(samples):
        n = max(len(s.tokens) - 1, 1)
        if i > lo and max(longest, n) * (i - lo + 1) > max_tokens:
            out.append((lo, i))
            lo, longest = i, 0
        longest = max(longest, n)
    if lo < len(samples):
        out.append((lo, len(samples)))
    return out


def packed_micro_batches(samples: List[Sample], max_tokens: Optional[int]) -> List[Tuple[int, int]]:
    """Dynamic micro-batches for packed rows (slime's use_dynamic_batch_size): consecutive [lo, hi) runs
    whose total (unpadded) input tokens fit max_tokens; a longer sample runs alone."""
    if max_tokens is None:
        return [(0, len(samples))] if samples else []
    out = []
    lo = 0
    total = 0
    for i, s in enumerate(samples):
        n = max(len(s.tokens) - 1, 1)
        if i > lo and total + n > max_tokens:
            out.append((lo, i))
            lo, total = i, 0
        total += n
    if lo < len(samples):
        out.append((lo, len(samples)))
    return out


def validate_samples(policy, samples: List[Sample]) -> None:
    """The checks token_stats makes per micro-batch, over the whole batch up front."""
    for i, s in enumerate(samples):
        if len(s.tokens) - 1 > policy.max_positions:
            raise bad_request(f"sample {i} has {len(s.tokens)} tokens, more than the model's {policy.max_positions} positions")
        if s.response_length > 0 and s.prompt_length < 1:
            raise bad_request("prompt_length must be >= 1 (the first token has no prediction)")
        if len(s.tokens) and (int(s.tokens.max()) >= policy.vocab_size or int(s.tokens.min()) < 0):
            raise bad_request(f"sample {i}: token ids outside the model's vocabulary of {policy.vocab_size}")


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


# ------------------------------------------------------------------ the trainer


@dataclass
class Held:
    policy: Any
    moments: Dict[str, Tuple[torch.Tensor, torch.Tensor]]
    iteration: int
    version: int
    path: Optional[str]
    critic: Any = None  # ppo: the value model, its Adam moments and iteration (critic.py)
    critic_moments: Optional[Dict[str, Tuple[torch.Tensor, torch.Tensor]]] = None
    critic_iteration: int = 0


class TorchTrainer:
    def __init__(self, device: str = "cpu", defaults: Optional[Dict[str, Any]] = None, bf16: Optional[bool] = None, log: Callable[[str], None] = print,
                 dist: Optional[Dist] = None):
        self.dist = dist or Dist()
        self._ddp_cache: Optional[Tuple[Any, Any]] = None
        self._critic_ddp_cache: Optional[Tuple[Any, Any]] = None
        self.device = torch.device(device)
        self.defaults = defaults or {}
        self.bf16 = (self.device.type == "cuda") if bf16 is None else bf16
        self.held: Optional[Held] = None
        self.ref_cache: Dict[str, Any] = {}
        self.log = log

    @property
    def weight_version(self) -> Optional[int]:
        return None if self.held is None else self.held.version

    def _autocast(self):
        if self.bf16 and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    # -------------------------------------------------------------- loading

    def _init_policy(self, t: TrainConfig):
        """Version 0 without a checkpoint: hf_checkpoint, else the embedded model from seed."""
        if t.hf_checkpoint:
            return load_hf_dir(path_from_uri(t.hf_checkpoint), self.device)
        if t.model is None:
            raise bad_request("checkpoint_uri_in is null and the config has no model to initialise (set model: {...}, hf_checkpoint or ref_load, "
                              "or start the server with --model-config / --hf-checkpoint)")
        return EmbeddedPolicy(t.model, gpt.init_weights(t.model, t.seed), self.device)

    def _start(self, req: Dict[str, Any], t: TrainConfig, report) -> Held:
        uri = req["checkpoint_uri_in"]
        v_in = req["weight_version_in"]
        if uri is None:
            report("init")
            self.held = None
            self._ddp_cache = None
            self._critic_ddp_cache = None
            return Held(self._init_policy(t), {}, 0, 0, None)
        path = os.path.realpath(path_from_uri(uri))
        h = self.held
        if h is not None and h.path == path and h.version == v_in:
            return h
        self.held = None
        self._ddp_cache = None
        self._critic_ddp_cache = None
        if h is not None:
            del h
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        report("load_checkpoint")
        kind, dir_ = checkpoint_kind(uri)
        stored = checkpoint_version(kind, dir_)
        if stored is not None and stored != v_in:
            raise bad_request(f"checkpoint {uri} holds weight version {stored}, the request says weight_version_in {v_in}")
        policy = load_policy(dir_, self.device)
        owner = self.dist.owners(policy.named_params())
        names = [n for n, _ in policy.named_params() if owner[n] == self.dist.rank]  # sharded: this rank's moments only
        opt = read_optimizer(dir_, names, shard=(self.dist.rank, self.dist.world))
        moments: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
        iteration = 0
        if opt is not None:
            iteration, raw, masters = opt
            params = dict(policy.named_params())
            for n in names:
                m, v = raw[n]
                if list(m.shape) != list(params[n].shape):
                    raise CheckpointError(f"optimizer state for {n} has shape {list(m.shape)}, the weights {list(params[n].shape)}")
                moments[n] = (m.to(self.device, torch.float32), v.to(self.device, torch.float32))
            policy.load_masters(masters)
        return Held(policy, moments, iteration, v_in, path)

    def _reference(self, t: TrainConfig, start: Held):
        """The frozen reference policy for KL terms: ref_load, else hf_checkpoint, else the seed initialisation."""
        if t.ref_load:
            key = f"path:{os.path.realpath(path_from_uri(t.ref_load))}"
        elif t.hf_checkpoint:
            key = f"path:{os.path.realpath(path_from_uri(t.hf_checkpoint))}"
        elif t.model is not None:
            key = f"seed:{t.seed}:{gpt.config_json(t.model)}"
        else:
            raise bad_request("use_kl_loss / kl_coef need a reference model: set ref_load")
        ref = self.ref_cache.get(key)
        if ref is None:
            if key.startswith("path:"):
                ref = load_policy(key[5:], self.device)
            else:
                ref = EmbeddedPolicy(t.model, gpt.init_weights(t.model, t.seed), self.device)
            for _, p in ref.named_params():
                p.requires_grad_(False)
            self.ref_cache.clear()
            self.ref_cache[key] = ref
        return ref

    # -------------------------------------------------------------- compute

    def token_stats(self, policy, samples: List[Sample], temperature: float, grad: bool, fwd=None, packed: bool = False):
        """Flat per-response-token (logp, entropy), float32 tensors on the device, in sample order.

        ``packed``: the samples are concatenated into one row (positions restart per sample,
        attention stays within a sample) instead of padded rows; the same numbers, no padding.
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
            z = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
            logp_all = torch.log_softmax(z, dim=-1)
            logp = logp_all.gather(1, tgt[:, None])[:, 0]
            ent = -(torch.exp(logp_all) * logp_all).sum(-1)
        return logp, ent

    def _packed(self, policy, t: "TrainConfig") -> bool:
        return bool(t.use_dynamic_batch_size and getattr(policy, "supports_packing", False))

    def _micro_batches(self, policy, samples: List[Sample], t: "TrainConfig") -> List[Tuple[int, int]]:
        if self._packed(policy, t):
            return packed_micro_batches(samples, t.max_tokens_per_gpu)
        return micro_batches(samples, t.max_tokens_per_gpu)

    def forward_all(self, policy, samples, mbs, temperature, report, phase, check, packed: bool = False):
        """Log-probs and entropies of every response token, micro-batch by micro-batch; on many ranks
        micro-batch k runs on rank k mod world and the results are all-gathered (same numbers as one rank)."""
        d = self.dist
        mine: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        rounds = (len(mbs) + d.world - 1) // d.world
        for rnd in range(rounds):
            d.agree_cancel(check)
            k = rnd * d.world + d.rank
            if k < len(mbs):
                lo, hi = mbs[k]
                lp, en = self.token_stats(policy, samples[lo:hi], temperature, grad=False, packed=packed)
                mine[k] = (lp.double().cpu().numpy(), en.double().cpu().numpy())
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
        from torch.nn.parallel import DistributedDataParallel

        fwd = _Forward(policy)
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(fwd, device_ids=ids, broadcast_buffers=False)
        self._ddp_cache = (policy, ddp)
        return ddp

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
        critic = self._critic_start(req, start, policy) if ppo else None
        train_actor = not ppo or req["step"] >= t.num_critic_only_steps
        validate_samples(policy, samples)  # on every rank, before any collective: a bad batch fails all ranks alike
        params = policy.named_params()
        for _, p in params:
            p.requires_grad_(True)
        policy.set_gradient_checkpointing(t.gradient_checkpointing)
        owner = d.owners(params)
        moments = start.moments or {n: (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32))
                                    for n, p in params if owner[n] == d.rank}
        iteration = start.iteration
        temperature = t.rollout_temperature
        packed = self._packed(policy, t)

        shape = A.Ragged(np.zeros(sum(s.response_length for s in samples)),
                         np.concatenate([[0], np.cumsum([s.response_length for s in samples])]))
        loss_mask = np.concatenate([s.loss_mask.astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        # Denominators: the mask before rlq zeroed off-policy / stale tokens (DESIGN §1).
        denom_mask = np.concatenate([(s.loss_mask if s.denom_mask is None else s.denom_mask).astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        rollout = np.concatenate([s.rollout_log_probs.astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        all_mbs = self._micro_batches(policy, samples, t)

        policy.module.eval()
        old, _ = self.forward_all(policy, samples, all_mbs, temperature, report, "old_logprobs", check, packed)
        ref = None
        if o["use_kl_loss"] or o["kl_coef"] != 0:
            ref_policy = self._reference(t, start)
            ref, _ = self.forward_all(ref_policy, samples, all_mbs, temperature, report, "ref_logprobs", check, self._packed(ref_policy, t))
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
                sync = nullcontext() if (fwd is None or rnd == rounds - 1) else fwd.no_sync()
                with sync:
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
        masters = self._masters(policy, owner)
        write_optimizer(out_dir, [(n, p) for n, p in params if owner[n] == d.rank], moments, iteration, version, req["run_id"], req["step"], masters,
                        shard=(d.rank, d.world) if d.active else None)
        d.barrier()
        if d.rank == 0:
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

    def _critic_start(self, req: Dict[str, Any], start: "Held", policy):
        """(critic, moments, [iteration]): held with the policy, else from checkpoint_uri_in/critic, else from the policy's weights."""
        from .critic import Critic, CriticError, load_critic

        d = self.dist
        if start.critic is not None:
            return start.critic, start.critic_moments, [start.critic_iteration]
        loaded = None
        if req["checkpoint_uri_in"] is not None:
            try:
                mine = lambda c: [n for n, r in d.owners(c.named_params()).items() if r == d.rank]  # noqa: E731  (sharded: own moments only)
                loaded = load_critic(os.path.realpath(path_from_uri(req["checkpoint_uri_in"])), self.device, names_for=mine, shard=(d.rank, d.world))
            except CriticError as e:
                raise CheckpointError(str(e)) from e
        try:
            critic = loaded[0] if loaded is not None else Critic.from_policy(policy, self.device)
        except CriticError as e:
            raise bad_request(f"advantage_estimator ppo: {e}") from e
        moments, iteration = {}, 0
        if loaded is not None and loaded[1] is not None:
            iteration, moments = loaded[1]
        owner = d.owners(critic.named_params())
        for n, p in critic.named_params():
            p.requires_grad_(True)
            if n not in moments and owner[n] == d.rank:
                moments[n] = (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32))
        return critic, moments, [iteration]

    def _critic_ddp(self, critic):
        if not self.dist.active:
            return None
        if self._critic_ddp_cache is not None and self._critic_ddp_cache[0] is critic:
            return self._critic_ddp_cache[1]
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(critic.net, device_ids=ids, broadcast_buffers=False)
        self._critic_ddp_cache = (critic, ddp)
        return ddp

    def _critic_values_all(self, critic, samples, mbs, report, check) -> np.ndarray:
        """The critic's values for every response token before any update (micro-batch k on rank k mod world, all-gathered)."""
        d = self.dist
        mine: Dict[int, np.ndarray] = {}
        rounds = (len(mbs) + d.world - 1) // d.world
        for rnd in range(rounds):
            d.agree_cancel(check)
            k = rnd * d.world + d.rank
            if k < len(mbs):
                lo, hi = mbs[k]
                mine[k] = critic.values(samples[lo:hi], grad=False).double().cpu().numpy()
            report(f"old_values {min((rnd + 1) * d.world, len(mbs))}/{len(mbs)}")
        for part in d.all_gather(mine) if d.active else []:
            mine.update(part)
        parts = [mine[k] for k in range(len(mbs))]
        return np.concatenate(parts) if parts else np.zeros(0)

    def _critic_update(self, critic, gsamples, g_shape, a, old_values, returns, loss_mask, own, normalizer, o, t, lr_of, check) -> Dict[str, float]:
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
        by_mb: Dict[int, Dict[str, float]] = {}
        for rnd in range(rounds):  # as the policy: micro-batch k on rank k mod world, gradients synced on the last round
            d.agree_cancel(check)
            k = rnd * d.world + d.rank
            with (nullcontext() if (fwd is None or rnd == rounds - 1) else fwd.no_sync()):
                if k >= len(mbs):
                    if fwd is not None:
                        model.zero_backward(fwd)
                    continue
                lo, hi = mbs[k]
                v_t = model.values(gsamples[lo:hi], grad=True, fwd=fwd)
                mb_shape = g_shape.slice(lo, hi)
                ma, mb_ = a + int(g_shape.offsets[lo]), a + int(g_shape.offsets[hi])
                loss, dv, m = A.value_loss_terms(mb_shape.like(v_t.detach().double().cpu().numpy()), old_values[ma:mb_], np.asarray(returns)[ma:mb_],
                                                 loss_mask[ma:mb_], o["value_clip"], o["calculate_per_token_loss"],
                                                 sample_denominators=own[lo:hi], normalizer=normalizer)
                if v_t.numel() > 0:
                    (v_t * torch.from_numpy((dv * d.world).astype(np.float32)).to(self.device)).sum().backward()  # DDP averages
                elif fwd is not None:
                    model.zero_backward(fwd)
                by_mb[k] = m
        for part in d.all_gather(by_mb) if d.active else []:
            by_mb.update(part)
        metrics: Dict[str, float] = {}
        for k in range(len(mbs)):
            for key, v in by_mb[k].items():
                metrics[key] = metrics.get(key, 0.0) + v
        d.agree_cancel(check)
        lr = t.critic_lr if t.critic_lr is not None else lr_of(it[0])
        metrics["critic_grad_norm"] = self._adamw(params, moments, owner, it[0], lr, t)
        metrics["critic_lr"] = lr
        it[0] += 1
        return metrics

    def _zero_backward(self, policy, fwd) -> None:
        """A backward with zero gradients, so a rank with no micro-batch left still joins DDP's all-reduce."""
        if fwd is None:
            return
        dev = self.device
        z = fwd(torch.zeros((1, 1), dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev),
                torch.zeros(1, dtype=torch.long, device=dev), None, None)
        (z.float().sum() * 0.0).backward()

    def _masters(self, policy, owner: Dict[str, int]) -> Dict[str, torch.Tensor]:
        if policy.kind != "hf" or policy.save_dtype == torch.float32:
            return {}
        return {n: p.detach() for n, p in policy.named_params() if owner[n] == self.dist.rank}

    def _adamw(self, params, moments, owner: Dict[str, int], iteration: int, lr: float, t: TrainConfig) -> float:
        """Megatron clip (clip_grad / (norm + 1e-6) when < 1) then AdamW; returns the pre-clip norm.

        Many ranks: the gradients are already all-reduced (every rank computes the same norm); each
        parameter is updated by its owner (the only rank holding its moments) and broadcast from it."""
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for _, p in params:
            if p.grad is not None:
                sq = sq + p.grad.double().pow(2).sum()
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
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                g = g.float() * scale if scale != 1.0 else g.float()
                m, v = moments[name]
                m.mul_(t.adam_beta1).add_(g, alpha=1 - t.adam_beta1)
                v.mul_(t.adam_beta2).addcmul_(g, g, value=1 - t.adam_beta2)
                update = (m / bias1) / ((v / bias2).sqrt() + t.adam_eps)
                if p.dim() > 1 and t.weight_decay != 0:
                    p.mul_(1 - lr * t.weight_decay)
                p.sub_(lr * update)
            if self.dist.active:
                for name, p in params:
                    self.dist.broadcast_from(p.data, owner[name])
        return norm
