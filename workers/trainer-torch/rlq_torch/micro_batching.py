"""Micro-batches within a global batch: padded rows bounded by max_tokens_per_gpu, or packed rows (use_dynamic_batch_size) where the model packs."""

from __future__ import annotations

from .batch import Sample
from .train_config import TrainConfig, bad_request


def micro_batches(
    samples: list[Sample], max_tokens: int | None
) -> list[tuple[int, int]]:
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


def packed_micro_batches(
    samples: list[Sample], max_tokens: int | None
) -> list[tuple[int, int]]:
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


def use_packing(policy, t: TrainConfig) -> bool:
    """use_dynamic_batch_size: packed rows, or bad_request saying why this model cannot pack them (never padding instead)."""
    if not t.use_dynamic_batch_size:
        return False
    why = policy.packing_unsupported()
    if why is not None:
        raise bad_request(
            f"use_dynamic_batch_size: true needs packed rows, and this model cannot pack them: {why}. "
            "Set use_dynamic_batch_size: false to train it in padded micro-batches (bounded by max_tokens_per_gpu)"
        )
    return True


def validate_samples(policy, samples: list[Sample]) -> None:
    """The checks token_stats makes per micro-batch, over the whole batch up front."""
    for i, s in enumerate(samples):
        if len(s.tokens) - 1 > policy.max_positions:
            raise bad_request(
                f"sample {i} has {len(s.tokens)} tokens, more than the model's {policy.max_positions} positions"
            )
        if s.response_length > 0 and s.prompt_length < 1:
            raise bad_request(
                "prompt_length must be >= 1 (the first token has no prediction)"
            )
        if len(s.tokens) and (
            int(s.tokens.max()) >= policy.vocab_size or int(s.tokens.min()) < 0
        ):
            raise bad_request(
                f"sample {i}: token ids outside the model's vocabulary of {policy.vocab_size}"
            )
