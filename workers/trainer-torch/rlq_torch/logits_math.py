"""Log-probs, entropies and their gradient from raw logits, and pass@k (the parity vectors' reference helpers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .algo_options import AlgorithmError


def log_probs_and_entropy_from_logits(
    logits: np.ndarray, tokens: Sequence[int], vocab_size: int, temperature: float = 1.0
):
    """logp = z'_y − logsumexp(z'), H = logsumexp(z') − Σ p z', z' = z / τ, over the full vocabulary."""
    z = np.asarray(logits, dtype=np.float64).reshape(len(tokens), vocab_size) * (
        1 / temperature
    )
    mx = z.max(axis=1, keepdims=True)
    e = np.exp(z - mx)
    sum_exp = e.sum(axis=1)
    weighted = np.where(e > 0, e * np.where(e > 0, z, 0.0), 0.0).sum(axis=1)
    mean_logit = weighted / sum_exp
    lse = mx[:, 0] + np.log(sum_exp)
    idx = np.asarray(tokens, dtype=np.int64)
    logp = z[np.arange(len(tokens)), idx] - lse
    return logp, lse - mean_logit


def logits_gradient(
    logits: np.ndarray,
    tokens: Sequence[int],
    vocab_size: int,
    temperature: float,
    dloss_dlogp: Sequence[float],
    dloss_dentropy: Sequence[float] | None = None,
) -> np.ndarray:
    n = len(tokens)
    inv = 1 / temperature
    z = np.asarray(logits, dtype=np.float64).reshape(n, vocab_size) * inv
    g_lp = np.asarray(dloss_dlogp, dtype=np.float64)[:, None]
    g_h = (
        np.zeros((n, 1))
        if dloss_dentropy is None
        else np.asarray(dloss_dentropy, dtype=np.float64)[:, None]
    )
    mx = z.max(axis=1, keepdims=True)
    e = np.exp(z - mx)
    sum_exp = e.sum(axis=1, keepdims=True)
    mean_logit = (
        np.where(e > 0, e * np.where(e > 0, z, 0.0), 0.0).sum(axis=1, keepdims=True)
        / sum_exp
    )
    p = e / sum_exp
    grad = np.where(
        p > 0, (-g_lp * p + g_h * p * (mean_logit - np.where(p > 0, z, 0.0))) * inv, 0.0
    )
    grad[np.arange(n), np.asarray(tokens, dtype=np.int64)] += g_lp[:, 0] * inv
    skip = (g_lp[:, 0] == 0) & (g_h[:, 0] == 0)
    grad[skip] = 0.0
    return grad.reshape(-1)


# --------------------------------------------------------------------------- pass@k, value loss


def pass_at_k(n: int, c: int, k: int) -> float:
    if not isinstance(n, int) or n < 1:
        raise AlgorithmError(
            "algo_bad_argument", f"pass@k: n must be an integer >= 1, got {n}"
        )
    if not isinstance(c, int) or c < 0 or c > n:
        raise AlgorithmError(
            "algo_bad_argument", f"pass@k: c must be an integer in [0, {n}], got {c}"
        )
    if not isinstance(k, int) or k < 1 or k > n:
        raise AlgorithmError(
            "algo_bad_argument", f"pass@k: k must be an integer in [1, {n}], got {k}"
        )
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1 - k / i
    return 1 - prod
