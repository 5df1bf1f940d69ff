"""The run-config keys the PyTorch trainer reads (slime/Megatron names), its errors, the optimizer-step plan and the LR schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import algorithms as A
from . import gpt


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
    lr_decay_iters: int | None = None
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    global_batch_size: int | None = None
    num_steps_per_rollout: int = 1
    num_rollout: int | None = None
    rollout_temperature: float = 1.0
    ref_load: str | None = None
    seed: int = 1234
    max_tokens_per_gpu: int | None = None
    model: dict | None = None
    hf_checkpoint: str | None = None
    use_dynamic_batch_size: bool = False
    num_critic_only_steps: int = 0
    critic_lr: float | None = None
    gradient_checkpointing: bool = False
    save_dtype: str | None = None
    parallel: Any = None  # tensor_parallel.ParallelSizes: tensor_model_parallel_size, context_parallel_size, sequence_parallel
    lora: Any = None  # lora.LoraOptions: lora_rank > 0 (lora.py)


def _num(
    c: dict,
    key: str,
    default,
    kind=float,
    lo=None,
    lo_open=False,
    hi=None,
    nullable=False,
):
    v = c.get(key, default)
    if v is None:
        if nullable or default is None:
            return None
        raise bad_request(f"config.{key} must not be null")
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (kind is int and not float(v).is_integer())
    ):
        raise bad_request(
            f"config.{key} = {v!r}: expected {'an integer' if kind is int else 'a number'}"
        )
    v = kind(v)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise bad_request(
            f"config.{key} = {v}: must be {'>' if lo_open else '>='} {lo}"
        )
    if hi is not None and v > hi:
        raise bad_request(f"config.{key} = {v}: must be <= {hi}")
    return v


def parse_train_config(c: dict[str, Any], defaults: dict[str, Any]) -> TrainConfig:
    """The run-config keys the trainer reads (slime/Megatron names, the embedded trainer's defaults).
    ``defaults`` are the server's own (--max-tokens-per-gpu, --model-config, --hf-checkpoint)."""
    t = TrainConfig()
    t.lr = _num(c, "lr", 1e-6, lo=0, lo_open=True)
    t.min_lr = _num(c, "min_lr", 0.0, lo=0)
    t.lr_decay_style = c.get("lr_decay_style", "constant")
    if t.lr_decay_style not in ("constant", "linear", "cosine"):
        raise bad_request(
            f"config.lr_decay_style = {t.lr_decay_style!r}: expected constant | linear | cosine"
        )
    t.lr_warmup_iters = _num(c, "lr_warmup_iters", 0, int, lo=0)
    t.lr_decay_iters = _num(
        c, "lr_decay_iters", None, int, lo=0, lo_open=True, nullable=True
    )
    t.weight_decay = _num(c, "weight_decay", 0.0, lo=0)
    t.adam_beta1 = _num(c, "adam_beta1", 0.9, lo=0, hi=0.999999)
    t.adam_beta2 = _num(c, "adam_beta2", 0.999, lo=0, hi=0.999999)
    t.adam_eps = _num(c, "adam_eps", 1e-8, lo=0, lo_open=True)
    t.clip_grad = _num(c, "clip_grad", 1.0, lo=0, lo_open=True)
    t.global_batch_size = _num(
        c, "global_batch_size", None, int, lo=0, lo_open=True, nullable=True
    )
    t.num_steps_per_rollout = _num(
        c, "num_steps_per_rollout", 1, int, lo=0, lo_open=True
    )
    t.num_rollout = _num(c, "num_rollout", None, int, lo=0, lo_open=True, nullable=True)
    t.rollout_temperature = _num(c, "rollout_temperature", 1.0, lo=0, lo_open=True)
    t.seed = _num(c, "seed", 1234, int, lo=0)
    t.max_tokens_per_gpu = _num(
        c,
        "max_tokens_per_gpu",
        defaults.get("max_tokens_per_gpu"),
        int,
        lo=0,
        lo_open=True,
        nullable=True,
    )
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
    t.use_dynamic_batch_size = _flag(
        c, "use_dynamic_batch_size", bool(defaults.get("use_dynamic_batch_size", False))
    )
    if t.use_dynamic_batch_size and t.max_tokens_per_gpu is None:
        raise bad_request(
            "config.use_dynamic_batch_size needs max_tokens_per_gpu (the token budget of a packed micro-batch)"
        )
    t.num_critic_only_steps = _num(c, "num_critic_only_steps", 0, int, lo=0)
    t.critic_lr = _num(c, "critic_lr", None, lo=0, lo_open=True, nullable=True)
    t.gradient_checkpointing = _flag(
        c, "gradient_checkpointing", bool(defaults.get("gradient_checkpointing", False))
    )
    sd = c.get("hf_save_dtype", defaults.get("hf_save_dtype"))
    if sd is not None and sd not in ("bf16", "fp16", "fp32"):
        raise bad_request(
            f"config.hf_save_dtype = {sd!r}: expected bf16 | fp16 | fp32 (or leave it out: the model's own dtype)"
        )
    t.save_dtype = sd
    t.parallel = _parallel(c, defaults)
    t.lora = _lora(c, t)
    return t


def _lora(c: dict[str, Any], t: TrainConfig):
    from .lora import parse

    try:
        return parse(c, t)
    except ValueError as e:
        raise bad_request(str(e)) from e


def _parallel(c: dict[str, Any], defaults: dict[str, Any]):
    from .tensor_parallel import parse_config

    try:
        return parse_config(c, defaults)
    except ValueError as e:
        raise bad_request(str(e)) from e


def _flag(c: dict[str, Any], key: str, default: bool) -> bool:
    v = c.get(key, default)
    if not isinstance(v, bool):
        raise bad_request(f"config.{key} = {v!r}: expected true or false")
    return v


def parse_algorithm(c: dict[str, Any]) -> dict[str, Any]:
    try:
        o = A.parse_options({k: c[k] for k in A.DEFAULT_OPTIONS if k in c})
        A.validate_options(o)
    except A.AlgorithmError as e:
        raise bad_request(f"config: {e}") from e
    return o


def optimizer_step_plan(t: TrainConfig, num_samples: int) -> tuple[int, int]:
    gbs = (
        t.global_batch_size
        if t.global_batch_size is not None
        else num_samples / t.num_steps_per_rollout
    )
    if not float(gbs).is_integer() or gbs <= 0 or num_samples % int(gbs) != 0:
        raise bad_request(
            f"global_batch_size: {num_samples} samples do not split into whole global batches of {gbs}"
        )
    return int(gbs), num_samples // int(gbs)


def learning_rate(t: TrainConfig, decay_iters: int | None, iteration: int) -> float:
    """Megatron's OptimizerParamScheduler.get_lr (src/trainer/embedded/lr-schedule.ts): linear warmup from 0, then
    constant / linear / cosine to min_lr at ``decay_iters``, min_lr after it.

    ``iteration`` is the number of optimizer steps already taken, and it is the scheduler's num_steps as is:
    Megatron calls step(0) when it builds the scheduler and step() only after each optimizer step, so its
    first optimizer step runs at num_steps 0 (with warmup, at rate 0) and the k-th (from 0) at num_steps k."""
    n = iteration
    if t.lr_warmup_iters > 0 and n <= t.lr_warmup_iters:
        return t.lr * n / t.lr_warmup_iters
    if t.lr_decay_style == "constant":
        return t.lr
    if decay_iters is None:
        raise bad_request(
            f"lr_decay_style {t.lr_decay_style} needs lr_decay_iters (or num_rollout)"
        )
    if n > decay_iters:
        return t.min_lr
    span = decay_iters - t.lr_warmup_iters
    ratio = 1.0 if span <= 0 else (n - t.lr_warmup_iters) / span
    coeff = (
        1 - ratio
        if t.lr_decay_style == "linear"
        else 0.5 * (math.cos(math.pi * ratio) + 1)
    )
    return t.min_lr + (t.lr - t.min_lr) * coeff
