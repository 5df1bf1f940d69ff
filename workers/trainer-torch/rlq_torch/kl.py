"""KL estimators (k1, k2, k3, low_var_kl) with their gradients (src/algorithms/kl.ts)."""

from __future__ import annotations

import numpy as np

from .algo_options import LOW_VAR_KL_BOUND, AlgorithmError


def approx_kl_with_grad(
    logp: np.ndarray,
    base: np.ndarray,
    kl_type: str,
    ratio: np.ndarray | None = None,
    ratio_has_grad: bool = False,
):
    """Per-token KL estimate and d/d logp (k1, k2, k3, low_var_kl; optional importance ratio)."""
    d = np.asarray(logp, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    if kl_type == "k1":
        value = d.copy()
        grad = np.ones_like(d)
    elif kl_type == "k2":
        value = (d * d) / 2
        grad = d.copy()
    elif kl_type in ("k3", "low_var_kl"):
        e = np.exp(-d)
        value = e - 1 + d
        grad = 1 - e
    else:
        raise AlgorithmError("algo_bad_argument", f'unknown kl_loss_type "{kl_type}"')
    if ratio is not None:
        r = np.asarray(ratio, dtype=np.float64)
        grad = r * value + r * grad if ratio_has_grad else r * grad
        value = r * value
    if kl_type == "low_var_kl":
        grad = np.where(
            (value > LOW_VAR_KL_BOUND) | (value < -LOW_VAR_KL_BOUND), 0.0, grad
        )
        value = np.minimum(np.maximum(value, -LOW_VAR_KL_BOUND), LOW_VAR_KL_BOUND)
    return value, grad


def compute_approx_kl(
    logp: np.ndarray,
    base: np.ndarray,
    kl_type: str,
    importance_ratio: np.ndarray | None = None,
) -> np.ndarray:
    return approx_kl_with_grad(logp, base, kl_type, importance_ratio, False)[0]


def kl_loss_with_grad(
    logp: np.ndarray, ref: np.ndarray, kl_type: str, old: np.ndarray | None = None
):
    """KL-loss term; with `old` (use_unbiased_kl) times exp(logp − old), which carries gradient."""
    ratio = (
        None
        if old is None
        else np.exp(
            np.asarray(logp, dtype=np.float64) - np.asarray(old, dtype=np.float64)
        )
    )
    return approx_kl_with_grad(logp, ref, kl_type, ratio, True)
