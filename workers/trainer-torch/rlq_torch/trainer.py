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
    return t


def parse_algorithm(c: Dict[str, Any]) -> Dict[str, Any]:
    try:
        o = A.parse_options({k: c[k] for k in A.DEFAULT_OPTIONS if k in c})
        A.validate_options(o)
    except A.AlgorithmError as e:
        raise bad_request(f"config: {e}") from e
    if o["advantage_estimator"] == "ppo":
        raise bad_request("advantage_estimator ppo needs a critic, which this trainer does not have")
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


# ------------------------------------------------------------------ the trainer


@dataclass
class Held:
    policy: Any
    moments: Dict[str, Tuple[torch.Tensor, torch.Tensor]]
    iteration: int
    version: int
    path: Optional[str]


class TorchTrainer:
    def __init__(self, device: str = "cpu", defaults: Optional[Dict[str, Any]] = None, bf16: Optional[bool] = None, log: Callable[[str], None] = print):
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
            return Held(self._init_policy(t), {}, 0, 0, None)
        path = os.path.realpath(path_from_uri(uri))
        h = self.held
        if h is not None and h.path == path and h.version == v_in:
            return h
        self.held = None
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
        names = [n for n, _ in policy.named_params()]
        opt = read_optimizer(dir_, names)
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

    def token_stats(self, policy, samples: List[Sample], temperature: float, grad: bool):
        """Flat per-response-token (logp, entropy), float32 tensors on the device, in sample order."""
        L = max(len(s.tokens) - 1 for s in samples)
        if L > policy.max_positions:
            raise bad_request(f"a sample has {L + 1} tokens, more than the model's {policy.max_positions} positions")
        ids = torch.zeros((len(samples), max(L, 1)), dtype=torch.long)
        rows, cols, targets = [], [], []
        for i, s in enumerate(samples):
            n = len(s.tokens)
            if n > 1:
                ids[i, :n - 1] = torch.from_numpy(s.tokens[:n - 1].astype(np.int64))
            r = s.response_length
            if r > 0:
                if s.prompt_length < 1:
                    raise bad_request("prompt_length must be >= 1 (the first token has no prediction)")
                rows.append(np.full(r, i))
                cols.append(np.arange(s.prompt_length - 1, s.prompt_length - 1 + r))
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
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            with self._autocast():
                h = policy.hidden_states(ids)
                hs = h[rows_t, cols_t]
                logits = policy.logits(hs)
            z = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
            logp_all = torch.log_softmax(z, dim=-1)
            logp = logp_all.gather(1, tgt[:, None])[:, 0]
            ent = -(torch.exp(logp_all) * logp_all).sum(-1)
        return logp, ent

    def forward_all(self, policy, samples, mbs, temperature, report, phase, check):
        lps, ents = [], []
        for k, (lo, hi) in enumerate(mbs):
            check()
            lp, en = self.token_stats(policy, samples[lo:hi], temperature, grad=False)
            lps.append(lp.double().cpu().numpy())
            ents.append(en.double().cpu().numpy())
            report(f"{phase} {k + 1}/{len(mbs)}")
        return np.concatenate(lps) if lps else np.zeros(0), np.concatenate(ents) if ents else np.zeros(0)

    # -------------------------------------------------------------- the step

    def train_step(self, req: Dict[str, Any], batch: Batch, t: TrainConfig, o: Dict[str, Any],
                   progress: Callable[[int, int, str], None], check: Callable[[], None]) -> Dict[str, Any]:
        t0 = time.time()
        samples = sorted(batch.samples, key=lambda s: (s.group_index, s.sample_index))
        if not samples:
            raise bad_request(f"train step {req['step']} has no samples")
        gbs, num_opt = optimizer_step_plan(t, len(samples))
        state = {"done": 0}
        report = lambda phase: progress(state["done"], num_opt, phase)  # noqa: E731

        start = self._start(req, t, report)
        self.held = None  # the weights below change in place: never hold a half-trained version
        policy = start.policy
        params = policy.named_params()
        for _, p in params:
            p.requires_grad_(True)
        moments = start.moments or {n: (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32)) for n, p in params}
        iteration = start.iteration
        temperature = t.rollout_temperature
        max_tok = t.max_tokens_per_gpu

        shape = A.Ragged(np.zeros(sum(s.response_length for s in samples)),
                         np.concatenate([[0], np.cumsum([s.response_length for s in samples])]))
        loss_mask = np.concatenate([s.loss_mask.astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        # Denominators: the mask before rlq zeroed off-policy / stale tokens (DESIGN §1).
        denom_mask = np.concatenate([(s.loss_mask if s.denom_mask is None else s.denom_mask).astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        rollout = np.concatenate([s.rollout_log_probs.astype(np.float64) for s in samples]) if shape.flat.size else np.zeros(0)
        all_mbs = micro_batches(samples, max_tok)

        policy.module.eval()
        old, _ = self.forward_all(policy, samples, all_mbs, temperature, report, "old_logprobs", check)
        ref = None
        if o["use_kl_loss"] or o["kl_coef"] != 0:
            ref_policy = self._reference(t, start)
            ref, _ = self.forward_all(ref_policy, samples, all_mbs, temperature, report, "ref_logprobs", check)
        policy.module.train()

        raw, normalized = A.post_process_rewards([s.reward for s in samples], [s.group_index for s in samples], o)
        try:
            advantages, _, _ = A.compute_advantages_and_returns(
                normalized, shape.like(loss_mask), o, old_log_probs=shape.like(old), rollout_log_probs=shape.like(rollout),
                ref_log_probs=None if ref is None else shape.like(ref))
        except A.AlgorithmError as e:
            raise bad_request(f"advantages: {e}") from e

        sums: Dict[str, float] = {}
        grad_norm_sum = 0.0
        lr = 0.0
        decay_iters = t.lr_decay_iters if t.lr_decay_iters is not None else (None if t.num_rollout is None else t.num_rollout * num_opt)
        trained_tokens = 0
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
            mbs = micro_batches(gsamples, max_tok)
            for k, (lo, hi) in enumerate(mbs):
                check()
                mb_shape = g_shape.slice(lo, hi)
                ma, mb_ = a + int(g_shape.offsets[lo]), a + int(g_shape.offsets[hi])
                logp_t, ent_t = self.token_stats(policy, gsamples[lo:hi], temperature, grad=True)
                lp = logp_t.detach().double().cpu().numpy()
                en = ent_t.detach().double().cpu().numpy()
                try:
                    terms = A.policy_loss_terms(mb_shape.like(lp), advantages[ma:mb_], loss_mask[ma:mb_], o, old=old[ma:mb_], denom_mask=denom_mask[ma:mb_],
                                                ref=None if ref is None else ref[ma:mb_], rollout=rollout[ma:mb_], entropy=en,
                                                sample_denominators=own[lo:hi], normalizer=normalizer)
                except A.AlgorithmError as e:
                    raise bad_request(f"policy loss: {e}") from e
                if logp_t.numel() > 0:
                    c_lp = torch.from_numpy(terms.dloss_dlogp.astype(np.float32)).to(self.device)
                    surrogate = (logp_t * c_lp).sum()
                    if np.any(terms.dloss_dentropy != 0):
                        surrogate = surrogate + (ent_t * torch.from_numpy(terms.dloss_dentropy.astype(np.float32)).to(self.device)).sum()
                    surrogate.backward()
                for key, v in terms.metrics.items():
                    sums[key] = sums.get(key, 0.0) + v / num_opt
                trained_tokens += int(loss_mask[ma:mb_].sum())
                report(f"train {j + 1}/{num_opt} micro-batch {k + 1}/{len(mbs)}")
            check()
            lr = learning_rate(t, decay_iters, iteration)
            grad_norm_sum += self._adamw(params, moments, iteration, lr, t)
            iteration += 1
            state["done"] = j + 1
            report("optimizer_step")

        version = req["weight_version_in"] + 1
        check()
        report("save")
        out_dir = req["output_dir"]
        os.makedirs(out_dir, exist_ok=True)
        for _, p in params:
            p.grad = None
            p.requires_grad_(False)
        # Optimizer first: a weights file present means its state is present too (as rlq's writer).
        masters = self._masters(policy)
        write_optimizer(out_dir, params, moments, iteration, version, req["run_id"], req["step"], masters)
        policy.save(out_dir, version, req["run_id"], req["step"])
        self.held = Held(policy, moments, iteration, version, os.path.realpath(out_dir))

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
        })
        return {"weight_version_out": version, "checkpoint_uri": "file://" + quote(os.path.abspath(out_dir)), "num_samples": len(samples),
                "num_tokens": n_train, "metrics": {k: float(v) for k, v in metrics.items() if math.isfinite(v)}}

    def _masters(self, policy) -> Dict[str, torch.Tensor]:
        if policy.kind != "hf" or policy.save_dtype == torch.float32:
            return {}
        return {n: p.detach() for n, p in policy.named_params()}

    def _adamw(self, params, moments, iteration: int, lr: float, t: TrainConfig) -> float:
        """Megatron clip (clip_grad / (norm + 1e-6) when < 1) then AdamW; returns the pre-clip norm."""
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
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                g = g.float() * scale if scale != 1.0 else g.float()
                m, v = moments[name]
                m.mul_(t.adam_beta1).add_(g, alpha=1 - t.adam_beta1)
                v.mul_(t.adam_beta2).addcmul_(g, g, value=1 - t.adam_beta2)
                update = (m / bias1) / ((v / bias2).sqrt() + t.adam_eps)
                if p.dim() > 1 and t.weight_decay != 0:
                    p.mul_(1 - lr * t.weight_decay)
                p.sub_(lr * update)
        return norm
