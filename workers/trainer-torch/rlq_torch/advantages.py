"""Reward post-processing (group normalisation) and advantages/returns per estimator: GRPO, GSPO, CISPO, REINFORCE++, PPO's GAE."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .algo_options import GROUP_STD_EPS, WHITEN_EPS, AlgorithmError
from .kl import compute_approx_kl
from .ragged import Ragged, _assert_like


def group_positions(group_indices: Sequence[Any]) -> list[list[int]]:
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(group_indices):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def group_normalize_rewards(
    rewards: Sequence[float],
    group_indices: Sequence[Any],
    use_std: bool,
    eps: float = GROUP_STD_EPS,
) -> np.ndarray:
    """Per group: r − mean (mean = r_0 + Σ(r_i − r_0)/G, exact for equal values), then / (unbiased std + eps)."""
    r = np.asarray(rewards, dtype=np.float64)
    if len(group_indices) != r.shape[0]:
        raise AlgorithmError("algo_shape_mismatch", "groupIndices has the wrong length")
    out = np.zeros_like(r)
    for members in group_positions(group_indices):
        n = len(members)
        r0 = r[members[0]]
        shift = 0.0
        for i in members:
            shift += r[i] - r0
        mean = r0 + shift / n
        for i in members:
            out[i] = r[i] - mean
        if not use_std or n < 2:
            continue
        c_sum = 0.0
        for i in members:
            c_sum += out[i]
        c_mean = c_sum / n
        sq = 0.0
        for i in members:
            d = out[i] - c_mean
            sq += d * d
        std = math.sqrt(sq / (n - 1))
        for i in members:
            out[i] = out[i] / (std + eps)
    return out


def post_process_rewards(
    rewards: Sequence[float], group_indices: Sequence[Any], o: dict[str, Any]
):
    """(raw, normalized): group centring for grpo/gspo/cispo/rpp_baseline, std for grpo/gspo/cispo."""
    raw = np.asarray(rewards, dtype=np.float64).copy()
    est = o["advantage_estimator"]
    centred = est in ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
    if not centred or not o["rewards_normalization"]:
        return raw, raw.copy()
    use_std = est != "reinforce_plus_plus_baseline" and o["grpo_std_normalization"]
    return raw, group_normalize_rewards(raw, group_indices, use_std)


def discounted_returns(token_rewards: np.ndarray, gamma: float) -> np.ndarray:
    out = np.zeros(len(token_rewards))
    running = 0.0
    for t in range(len(token_rewards) - 1, -1, -1):
        running = float(token_rewards[t]) + gamma * running
        out[t] = running
    return out


def gae(token_rewards: np.ndarray, values: np.ndarray, gamma: float, lambd: float):
    n = len(token_rewards)
    adv = np.zeros(n)
    ret = np.zeros(n)
    last = 0.0
    for t in range(n - 1, -1, -1):
        next_value = float(values[t + 1]) if t < n - 1 else 0.0
        delta = float(token_rewards[t]) + gamma * next_value - float(values[t])
        last = delta + gamma * lambd * last
        adv[t] = last
        ret[t] = last + float(values[t])
    return adv, ret


def masked_whiten(
    values: Ragged, mask: Ragged, shift_mean: bool = True, epsilon: float = WHITEN_EPS
) -> np.ndarray:
    """slime's distributed_masked_whiten over every token of the batch (flat result)."""
    _assert_like(mask, values, "mask", "values")
    a = values.flat
    w = mask.flat
    total = 0.0
    total_sq = 0.0
    count = 0.0
    for x, m in zip(a.tolist(), w.tolist()):
        total += x * m
        total_sq += x * x * m
        count += m
    if count == 0:
        raise AlgorithmError(
            "algo_empty_mask",
            "advantage whitening: the mask of the whole batch sums to 0",
        )
    mean = total / count
    variance = total_sq / count - mean * mean
    if count >= 2:
        variance = variance * (count / (count - 1))
    scale = 1 / math.sqrt(variance + epsilon)
    shift_back = 0.0 if shift_mean else mean
    return (a - mean) * scale + shift_back


def compute_advantages_and_returns(
    rewards: Sequence[float],
    loss_mask: Ragged,
    o: dict[str, Any],
    old_log_probs: Ragged | None = None,
    rollout_log_probs: Ragged | None = None,
    ref_log_probs: Ragged | None = None,
    values: Ragged | None = None,
    teacher_log_probs: Ragged | None = None,
):
    """(advantages, returns, kl) as flat arrays shaped like loss_mask (computeAdvantagesAndReturns)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.shape[0] != loss_mask.num_samples:
        raise AlgorithmError(
            "algo_shape_mismatch", "lossMask and rewards differ in length"
        )
    policy = rollout_log_probs if o["use_rollout_logprobs"] else old_log_probs
    policy_name = "rolloutLogProbs" if o["use_rollout_logprobs"] else "oldLogProbs"
    est = o["advantage_estimator"]
    uses_kl = est in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
    if o["kl_coef"] == 0:
        kl = np.zeros_like(loss_mask.flat)
    else:
        if uses_kl and (policy is None or ref_log_probs is None):
            raise AlgorithmError(
                "algo_missing_input",
                f"kl_coef = {o['kl_coef']} with {est} needs {policy_name} and refLogProbs",
            )
        if policy is None or ref_log_probs is None:
            kl = np.zeros_like(loss_mask.flat)
        else:
            _assert_like(policy, loss_mask, policy_name, "lossMask")
            _assert_like(ref_log_probs, loss_mask, "refLogProbs", "lossMask")
            kl = compute_approx_kl(policy.flat, ref_log_probs.flat, o["kl_loss_type"])
    m = loss_mask.flat
    off = loss_mask.offsets
    B = loss_mask.num_samples
    returns_alias = False
    if est in ("grpo", "gspo", "cispo"):
        returns = loss_mask.broadcast(r)
        advantages = returns.copy()
    elif est == "reinforce_plus_plus":
        returns = np.zeros_like(m)
        for i in range(B):
            a, b = off[i], off[i + 1]
            tr = -o["kl_coef"] * (kl[a:b] * m[a:b])
            nz = np.nonzero(m[a:b] != 0)[0]
            if nz.size > 0:
                tr[nz[-1]] = tr[nz[-1]] + r[i]
            returns[a:b] = discounted_returns(tr, o["gamma"])
        advantages = returns.copy()
    elif est == "reinforce_plus_plus_baseline":
        advantages = loss_mask.broadcast(r) - o["kl_coef"] * kl
        returns = advantages
        returns_alias = True
    elif est == "ppo":
        if values is None:
            raise AlgorithmError(
                "algo_missing_input", "advantage_estimator ppo needs critic values"
            )
        _assert_like(values, loss_mask, "values", "lossMask")
        advantages = np.zeros_like(m)
        returns = np.zeros_like(m)
        for i in range(B):
            a, b = off[i], off[i + 1]
            tr = kl[a:b] * -o["kl_coef"]
            if b > a:
                tr[-1] = tr[-1] + r[i]
            advantages[a:b], returns[a:b] = gae(
                tr, values.flat[a:b], o["gamma"], o["lambd"]
            )
    else:
        raise AlgorithmError(
            "algo_bad_argument", f'unknown advantage_estimator "{est}"'
        )

    if o["use_opd"]:
        if policy is None or teacher_log_probs is None:
            raise AlgorithmError(
                "algo_missing_input", f"use_opd needs {policy_name} and teacherLogProbs"
            )
        opd = advantages - o["opd_kl_coef"] * (policy.flat - teacher_log_probs.flat)
        if returns_alias:
            returns = opd
        advantages = opd
    if o["normalize_advantages"]:
        advantages = masked_whiten(loss_mask.like(advantages), loss_mask)
    return advantages, returns, kl
