"""rlq's RL math (src/algorithms, docs/algorithms.md) ported to numpy, float64.

This is the loss math the PyTorch trainer trains with, and it is checked against the
TypeScript reference by tests/test_parity.py (every number within 1e-6 * max(1, |x|)).
It mirrors rlq/algorithms function by function, with the same names in snake_case.

Ragged per-sample arrays (one response per sample, lengths may be 0) are held as a
``Ragged``: one flat float64 array plus offsets, so every formula is vectorised over the
whole batch. Per-sample reductions add tokens in order (np.bincount), as the TypeScript
loops do.

The trainer uses ``policy_loss_terms``: given the current per-token log-probs and
entropies of a micro-batch, it returns the scalar loss, the exact d loss / d logp and
d loss / d H per token (torch's tie rules, as src/algorithms), and the metrics. The model
then backpropagates the surrogate sum(dlogp * logp) + sum(dH * H), exactly as the
embedded trainer does, so both trainers optimise the same objective.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

GROUP_STD_EPS = 1e-6
WHITEN_EPS = 1e-8
LOW_VAR_KL_BOUND = 10.0
MIS_LOG_RATIO_BOUND = 20.0

ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")

# slime's defaults (src/algorithms/options.ts algorithmOptionsShape).
DEFAULT_OPTIONS: Dict[str, Any] = {
    "advantage_estimator": "grpo",
    "rewards_normalization": True,
    "grpo_std_normalization": True,
    "reward_key": None,
    "kl_coef": 0.0,
    "gamma": 1.0,
    "lambd": 1.0,
    "normalize_advantages": False,
    "use_opd": False,
    "opd_kl_coef": 1.0,
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,
    "value_clip": 0.2,
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "k1",
    "use_unbiased_kl": False,
    "entropy_coef": 0.0,
    "calculate_per_token_loss": False,
    "use_opsm": False,
    "opsm_delta": 1e-4,
    "use_rollout_logprobs": False,
    "use_tis": False,
    "get_mismatch_metrics": False,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "tis_function": "vanilla",
    "tis_level": "token",
    "tis_mode": "truncate",
    "tis_lower_bound": 0.5,
    "tis_upper_bound": 2.0,
    "use_rs": True,
    "rs_level": "token",
    "rs_lower_bound": None,
    "rs_upper_bound": None,
    "rs_veto_threshold": 1e-4,
    "tis_batch_normalize": True,
}


class AlgorithmError(ValueError):
    """A user or programming error in the inputs (never retried): ALGO_* codes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


def parse_options(options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Defaults applied; keys the math does not know are kept (a run config carries many)."""
    o = dict(DEFAULT_OPTIONS)
    o.update(options or {})
    if o["advantage_estimator"] not in ESTIMATORS:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f'unknown advantage_estimator "{o["advantage_estimator"]}"')
    if o["kl_loss_type"] not in KL_TYPES:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f'unknown kl_loss_type "{o["kl_loss_type"]}"')
    if o["tis_function"] not in ("vanilla", "icepop", "mis"):
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f'unknown tis_function "{o["tis_function"]}"')
    return o


def validate_options(o: Dict[str, Any]) -> None:
    """slime's cross-field asserts (refineAlgorithmOptions)."""
    if o["eps_clip_c"] is not None and not (o["eps_clip_c"] > 1):
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"eps_clip_c must be > 1, got {o['eps_clip_c']}")
    if o["kl_coef"] != 0 and o["kl_loss_coef"] != 0:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", "only one of kl_coef and kl_loss_coef can be non-zero (slime)")
    if o["advantage_estimator"] in ("reinforce_plus_plus", "reinforce_plus_plus_baseline") and not o["normalize_advantages"]:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"{o['advantage_estimator']} requires normalize_advantages: true (slime)")
    if o["use_rollout_logprobs"] and o["use_tis"]:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", "use_tis cannot be combined with use_rollout_logprobs (slime)")


def effective_eps_clip_high(o: Dict[str, Any]) -> float:
    return o["eps_clip"] if o["eps_clip_high"] is None else o["eps_clip_high"]


def resolved_mis_bounds(o: Dict[str, Any]):
    tis_lower = o["tis_lower_bound"] if o["tis_lower_bound"] is not None else 1.0 / o["tis_upper_bound"]
    rs_lower = o["rs_lower_bound"] if o["rs_lower_bound"] is not None else tis_lower
    rs_upper = o["rs_upper_bound"] if o["rs_upper_bound"] is not None else o["tis_upper_bound"]
    return tis_lower, o["tis_upper_bound"], rs_lower, rs_upper


# --------------------------------------------------------------------------- ragged


class Ragged:
    """[B][T_i] as one flat float64 array and offsets (B + 1)."""

    __slots__ = ("flat", "offsets", "_seg")

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat = np.asarray(flat, dtype=np.float64)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self._seg: Optional[np.ndarray] = None
        if self.flat.shape[0] != int(self.offsets[-1]):
            raise AlgorithmError("ALGO_SHAPE_MISMATCH", f"ragged: {self.flat.shape[0]} values for offsets ending at {int(self.offsets[-1])}")

    @staticmethod
    def from_lists(rows: Sequence[Sequence[float]]) -> "Ragged":
        lengths = [len(r) for r in rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(lengths) if rows else []
        flat = np.array([x for r in rows for x in r], dtype=np.float64) if offsets[-1] > 0 else np.zeros(0)
        return Ragged(flat, offsets)

    def like(self, flat: np.ndarray) -> "Ragged":
        r = Ragged(flat, self.offsets)
        r._seg = self._seg
        return r

    @property
    def num_samples(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def seg(self) -> np.ndarray:
        """Sample index of every token."""
        if self._seg is None:
            self._seg = np.repeat(np.arange(self.num_samples), self.lengths)
        return self._seg

    def seg_sum(self, x: Optional[np.ndarray] = None) -> np.ndarray:
        """[B] per-sample sums of a flat array (tokens added in order)."""
        v = self.flat if x is None else x
        return np.bincount(self.seg, weights=v, minlength=self.num_samples).astype(np.float64)

    def broadcast(self, per_sample: np.ndarray) -> np.ndarray:
        """[B] → flat [R], each sample's value on each of its tokens."""
        return np.asarray(per_sample, dtype=np.float64)[self.seg]

    def first(self, x: np.ndarray) -> np.ndarray:
        """[B] the first token's value per sample (0 for an empty sample)."""
        out = np.zeros(self.num_samples)
        nonempty = self.lengths > 0
        out[nonempty] = x[self.offsets[:-1][nonempty]]
        return out

    def tolist(self, x: Optional[np.ndarray] = None) -> List[List[float]]:
        v = self.flat if x is None else x
        return [[float(t) for t in v[self.offsets[i]:self.offsets[i + 1]]] for i in range(self.num_samples)]

    def slice(self, lo: int, hi: int) -> "Ragged":
        """Samples [lo, hi)."""
        a, b = int(self.offsets[lo]), int(self.offsets[hi])
        return Ragged(self.flat[a:b].copy(), self.offsets[lo:hi + 1] - a)


def _assert_like(x: Ragged, like: Ragged, name: str, like_name: str) -> None:
    if x.num_samples != like.num_samples or not np.array_equal(x.offsets, like.offsets):
        raise AlgorithmError("ALGO_SHAPE_MISMATCH", f"{name} is not shaped like {like_name}")


def masked_mean_per_sample(r: Ragged, x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[B] Σ x m / max(Σ m, 1) (slime's masked_mean; a fully masked row gives 0)."""
    return r.seg_sum(x * m) / np.maximum(r.seg_sum(m), 1.0)


# --------------------------------------------------------------------------- rewards


def group_positions(group_indices: Sequence[Any]) -> List[List[int]]:
    groups: Dict[Any, List[int]] = {}
    for i, g in enumerate(group_indices):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def group_normalize_rewards(rewards: Sequence[float], group_indices: Sequence[Any], use_std: bool, eps: float = GROUP_STD_EPS) -> np.ndarray:
    """Per group: r − mean (mean = r_0 + Σ(r_i − r_0)/G, exact for equal values), then / (unbiased std + eps)."""
    r = np.asarray(rewards, dtype=np.float64)
    if len(group_indices) != r.shape[0]:
        raise AlgorithmError("ALGO_SHAPE_MISMATCH", "groupIndices has the wrong length")
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


def post_process_rewards(rewards: Sequence[float], group_indices: Sequence[Any], o: Dict[str, Any]):
    """(raw, normalized): group centring for grpo/gspo/cispo/rpp_baseline, std for grpo/gspo/cispo."""
    raw = np.asarray(rewards, dtype=np.float64).copy()
    est = o["advantage_estimator"]
    centred = est in ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
    if not centred or not o["rewards_normalization"]:
        return raw, raw.copy()
    use_std = est != "reinforce_plus_plus_baseline" and o["grpo_std_normalization"]
    return raw, group_normalize_rewards(raw, group_indices, use_std)


# --------------------------------------------------------------------------- KL


def approx_kl_with_grad(logp: np.ndarray, base: np.ndarray, kl_type: str, ratio: Optional[np.ndarray] = None, ratio_has_grad: bool = False):
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
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f'unknown kl_loss_type "{kl_type}"')
    if ratio is not None:
        r = np.asarray(ratio, dtype=np.float64)
        grad = r * value + r * grad if ratio_has_grad else r * grad
        value = r * value
    if kl_type == "low_var_kl":
        grad = np.where((value > LOW_VAR_KL_BOUND) | (value < -LOW_VAR_KL_BOUND), 0.0, grad)
        value = np.minimum(np.maximum(value, -LOW_VAR_KL_BOUND), LOW_VAR_KL_BOUND)
    return value, grad


def compute_approx_kl(logp: np.ndarray, base: np.ndarray, kl_type: str, importance_ratio: Optional[np.ndarray] = None) -> np.ndarray:
    return approx_kl_with_grad(logp, base, kl_type, importance_ratio, False)[0]


def kl_loss_with_grad(logp: np.ndarray, ref: np.ndarray, kl_type: str, old: Optional[np.ndarray] = None):
    """KL-loss term; with `old` (use_unbiased_kl) times exp(logp − old), which carries gradient."""
    ratio = None if old is None else np.exp(np.asarray(logp, dtype=np.float64) - np.asarray(old, dtype=np.float64))
    return approx_kl_with_grad(logp, ref, kl_type, ratio, True)


# --------------------------------------------------------------------------- advantages


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


def masked_whiten(values: Ragged, mask: Ragged, shift_mean: bool = True, epsilon: float = WHITEN_EPS) -> np.ndarray:
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
        raise AlgorithmError("ALGO_EMPTY_MASK", "advantage whitening: the mask of the whole batch sums to 0")
    mean = total / count
    variance = total_sq / count - mean * mean
    if count >= 2:
        variance = variance * (count / (count - 1))
    scale = 1 / math.sqrt(variance + epsilon)
    shift_back = 0.0 if shift_mean else mean
    return (a - mean) * scale + shift_back


def compute_advantages_and_returns(rewards: Sequence[float], loss_mask: Ragged, o: Dict[str, Any], old_log_probs: Optional[Ragged] = None,
                                   rollout_log_probs: Optional[Ragged] = None, ref_log_probs: Optional[Ragged] = None,
                                   values: Optional[Ragged] = None, teacher_log_probs: Optional[Ragged] = None):
    """(advantages, returns, kl) as flat arrays shaped like loss_mask (computeAdvantagesAndReturns)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.shape[0] != loss_mask.num_samples:
        raise AlgorithmError("ALGO_SHAPE_MISMATCH", "lossMask and rewards differ in length")
    policy = rollout_log_probs if o["use_rollout_logprobs"] else old_log_probs
    policy_name = "rolloutLogProbs" if o["use_rollout_logprobs"] else "oldLogProbs"
    est = o["advantage_estimator"]
    uses_kl = est in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
    if o["kl_coef"] == 0:
        kl = np.zeros_like(loss_mask.flat)
    else:
        if uses_kl and (policy is None or ref_log_probs is None):
            raise AlgorithmError("ALGO_MISSING_INPUT", f"kl_coef = {o['kl_coef']} with {est} needs {policy_name} and refLogProbs")
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
            raise AlgorithmError("ALGO_MISSING_INPUT", "advantage_estimator ppo needs critic values")
        _assert_like(values, loss_mask, "values", "lossMask")
        advantages = np.zeros_like(m)
        returns = np.zeros_like(m)
        for i in range(B):
            a, b = off[i], off[i + 1]
            tr = kl[a:b] * -o["kl_coef"]
            if b > a:
                tr[-1] = tr[-1] + r[i]
            advantages[a:b], returns[a:b] = gae(tr, values.flat[a:b], o["gamma"], o["lambd"])
    else:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f'unknown advantage_estimator "{est}"')

    if o["use_opd"]:
        if policy is None or teacher_log_probs is None:
            raise AlgorithmError("ALGO_MISSING_INPUT", f"use_opd needs {policy_name} and teacherLogProbs")
        opd = advantages - o["opd_kl_coef"] * (policy.flat - teacher_log_probs.flat)
        if returns_alias:
            returns = opd
        advantages = opd
    if o["normalize_advantages"]:
        advantages = masked_whiten(loss_mask.like(advantages), loss_mask)
    return advantages, returns, kl


# --------------------------------------------------------------------------- aggregation


class Aggregator:
    """agg(x) = Σ_it x_it · weights_it (slime's get_sum_of_sample_mean and friends)."""

    def __init__(self, weights: np.ndarray, normalizer: float, sample_denominators: np.ndarray):
        self.weights = weights
        self.normalizer = normalizer
        self.sample_denominators = sample_denominators

    def reduce(self, x: np.ndarray) -> float:
        w = self.weights
        nz = w != 0
        # Masked tokens never poison a reduction (a NaN at a masked position is skipped).
        s = 0.0
        for v in (np.asarray(x, dtype=np.float64)[nz] * w[nz]).tolist():
            s += v
        return s


def make_aggregator(loss_mask: Ragged, calculate_per_token_loss: bool = False, denom_mask: Optional[Ragged] = None,
                    rollout_ids: Optional[Sequence[Any]] = None, sample_denominators: Optional[np.ndarray] = None,
                    normalizer: Optional[float] = None) -> Aggregator:
    dm = loss_mask if denom_mask is None else denom_mask
    _assert_like(dm, loss_mask, "denomMask", "lossMask")
    B = loss_mask.num_samples
    own = loss_mask.seg_sum(dm.flat)
    if calculate_per_token_loss:
        sample_den = own
        if normalizer is None:
            # sequential sum, as the TypeScript reduce
            acc = 0.0
            for v in own.tolist():
                acc += max(v, 1.0)
            normalizer = acc
    else:
        if rollout_ids is not None and len(rollout_ids) != B:
            raise AlgorithmError("ALGO_SHAPE_MISMATCH", f"rolloutIds has length {len(rollout_ids)}, expected {B}")
        keys = list(range(B)) if rollout_ids is None else list(rollout_ids)
        totals: Dict[Any, float] = {}
        for i in range(B):
            totals[keys[i]] = totals.get(keys[i], 0.0) + float(own[i])
        if sample_denominators is not None:
            sample_den = np.asarray(sample_denominators, dtype=np.float64).copy()
            if sample_den.shape[0] != B:
                raise AlgorithmError("ALGO_SHAPE_MISMATCH", "sampleDenominators has the wrong length")
        else:
            sample_den = np.array([totals[keys[i]] for i in range(B)], dtype=np.float64)
        if normalizer is None:
            normalizer = float(len(totals))
    if not (normalizer >= 0) or not math.isfinite(normalizer):
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"aggregation normalizer must be a finite number >= 0, got {normalizer}")
    normalizer = max(normalizer, 1.0)
    if calculate_per_token_loss:
        scale = np.full(B, 1 / normalizer)
    else:
        scale = 1 / np.maximum(sample_den, 1.0) / normalizer
    weights = loss_mask.flat * loss_mask.broadcast(scale)
    return Aggregator(weights, normalizer, sample_den)


def aggregate(x: Ragged, loss_mask: Ragged, **kw) -> float:
    return make_aggregator(loss_mask, **kw).reduce(x.flat)


# --------------------------------------------------------------------------- policy loss


def ppo_clip(ratio: np.ndarray, adv: np.ndarray, eps_clip: float, eps_clip_high: float, eps_clip_c: Optional[float]):
    """(loss, clipfrac, dloss/dratio) per token, torch's tie rules."""
    lo = 1 - eps_clip
    hi = 1 + eps_clip_high
    l1 = -ratio * adv
    clamped = np.minimum(np.maximum(ratio, lo), hi)
    l2 = -clamped * adv
    g1 = -adv
    g2 = np.where((ratio >= lo) & (ratio <= hi), -adv, 0.0)
    lc = np.maximum(l1, l2)
    gc = np.where(l1 > l2, g1, np.where(l1 < l2, g2, 0.5 * g1 + 0.5 * g2))
    clipfrac = (l2 > l1).astype(np.float64)
    if eps_clip_c is None:
        return lc, clipfrac, gc
    if not (eps_clip_c > 1):
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"eps_clip_c must be > 1, got {eps_clip_c}")
    neg = adv < 0
    l3 = -eps_clip_c * adv
    loss = np.where(neg, np.minimum(l3, lc), lc)
    dr = np.where(neg, np.where(l3 < lc, 0.0, np.where(l3 > lc, gc, 0.5 * gc)), gc)
    return loss, clipfrac, dr


def cispo_loss(ppo_kl: np.ndarray, logp: np.ndarray, adv: np.ndarray, eps_clip: float, eps_clip_high: float):
    ratio = np.exp(-ppo_kl)
    clamped = np.minimum(np.maximum(ratio, 1 - eps_clip), 1 + eps_clip_high)
    loss = -clamped * adv * logp
    clipfrac = (clamped != ratio).astype(np.float64)
    return loss, clipfrac, -clamped * adv


def gspo_kl(shape: Ragged, logp: np.ndarray, old: np.ndarray, m: np.ndarray) -> np.ndarray:
    s = shape.seg_sum((old - logp) * m)
    return shape.broadcast(s / np.maximum(shape.seg_sum(m), 1.0))


def opsm_mask(shape: Ragged, logp: np.ndarray, old: np.ndarray, adv: np.ndarray, m: np.ndarray, delta: float):
    seq_kl = gspo_kl(shape, logp, old, m)
    drop = (adv < 0) & (seq_kl > delta)
    zeroed = shape.seg_sum(drop.astype(np.float64))
    per = zeroed / np.maximum(shape.seg_sum(m), 1.0)
    s = 0.0
    for v in per.tolist():
        s += v
    return np.where(drop, 0.0, 1.0), s


def tis_per_token(train: np.ndarray, rollout: np.ndarray, tis_clip_low: float, tis_clip: float, icepop: bool):
    rho = np.exp(train - rollout)
    if icepop:
        w = np.where((rho >= tis_clip_low) & (rho <= tis_clip), rho, 0.0)
    else:
        w = np.minimum(np.maximum(rho, tis_clip_low), tis_clip)
    return {"weights": w, "ratio": rho, "clipfrac": (w != rho).astype(np.float64), "abs": np.abs(rho - 1)}


def _clamp_log(x: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, -MIS_LOG_RATIO_BOUND), MIS_LOG_RATIO_BOUND)


def compute_mis_weights(shape: Ragged, train: np.ndarray, rollout: np.ndarray, m: np.ndarray, o: Dict[str, Any], use_tis: bool = True):
    """(weights or None, modified mask, metrics name → flat array): compute_mis_weights."""
    metrics: Dict[str, np.ndarray] = {}
    lr = train - rollout
    mean_train = masked_mean_per_sample(shape, train, m)
    mean_rollout = masked_mean_per_sample(shape, rollout, m)
    b = shape.broadcast
    metrics["training_log_ppl"] = b(-mean_train)
    metrics["training_ppl"] = b(np.exp(-mean_train))
    metrics["rollout_log_ppl"] = b(-mean_rollout)
    metrics["rollout_ppl"] = b(np.exp(-mean_rollout))
    metrics["kl"] = -lr
    metrics["k3_kl"] = np.exp(lr) - lr - 1
    log_ppl_diff = mean_rollout - mean_train
    metrics["log_ppl_diff"] = b(log_ppl_diff)
    metrics["log_ppl_abs_diff"] = b(np.abs(log_ppl_diff))
    metrics["ppl_ratio"] = b(np.exp(log_ppl_diff))
    metrics["chi2_token"] = b(masked_mean_per_sample(shape, np.exp(_clamp_log(lr)) ** 2, m) - 1)
    metrics["chi2_seq"] = b(np.exp(2 * _clamp_log(shape.seg_sum(lr * m))) - 1)
    if not use_tis:
        return None, m.copy(), metrics

    tis_lower, tis_upper, rs_lower, rs_upper = resolved_mis_bounds(o)
    if o["tis_mode"] != "truncate" and not (tis_lower < tis_upper):
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"MIS {o['tis_mode']} mode needs tis_lower_bound ({tis_lower}) < tis_upper_bound ({tis_upper})")
    if o["use_rs"] and not (rs_lower < rs_upper):
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"MIS rejection needs rs_lower_bound ({rs_lower}) < rs_upper_bound ({rs_upper})")
    if o["tis_batch_normalize"] and o["tis_level"] == "geometric":
        raise AlgorithmError("ALGO_BAD_ARGUMENT", "tis_batch_normalize is not defined for tis_level geometric")

    def level_log_ratio(level: str) -> np.ndarray:
        if level == "token":
            return lr
        s = shape.seg_sum(lr * m)
        return b(s if level == "sequence" else s / np.maximum(shape.seg_sum(m), 1.0))

    def in_range(w: np.ndarray, lo: float, hi: float) -> np.ndarray:
        return ((w >= lo) & (w <= hi)).astype(np.float64)

    mod = m.copy()
    lr_tis = level_log_ratio(o["tis_level"])
    w = np.exp(_clamp_log(lr_tis))
    metrics["tis_weight_before_bound"] = w
    if o["tis_mode"] == "truncate":
        metrics["tis_truncate_fraction"] = (w > tis_upper).astype(np.float64)
        w = np.minimum(np.maximum(w, 0.0), tis_upper) * m
    elif o["tis_mode"] == "clip":
        metrics["tis_clip_fraction_low"] = (w < tis_lower).astype(np.float64)
        metrics["tis_clip_fraction_high"] = (w > tis_upper).astype(np.float64)
        w = np.minimum(np.maximum(w, tis_lower), tis_upper) * m
    else:
        metrics["tis_mask_fraction_low"] = (w < tis_lower).astype(np.float64)
        metrics["tis_mask_fraction_high"] = (w > tis_upper).astype(np.float64)
        mod = m * in_range(w, tis_lower, tis_upper)
        w = w * m
    metrics["tis_weight_after_bound"] = w
    if o["use_rs"]:
        lr_rs = lr_tis if o["rs_level"] == o["tis_level"] else level_log_ratio(o["rs_level"])
        rs_w = np.exp(_clamp_log(lr_rs))
        metrics["rs_mask_fraction_low"] = (rs_w < rs_lower).astype(np.float64)
        metrics["rs_mask_fraction_high"] = (rs_w > rs_upper).astype(np.float64)
        mod = mod * in_range(rs_w, rs_lower, rs_upper)
        if o["rs_veto_threshold"] is not None:
            log_veto = math.log(o["rs_veto_threshold"])
            catastrophic = ((lr < log_veto) & (m != 0)).astype(np.float64)
            has = shape.seg_sum(catastrophic) > 0
            metrics["rs_catastrophic_token_fraction"] = catastrophic
            metrics["rs_catastrophic_seq_fraction"] = b(has.astype(np.float64))
            mod = np.where(b(has.astype(np.float64)) != 0, 0.0, mod)
    metrics["is_ratio_mean_after_tis_rs"] = w
    if o["tis_batch_normalize"]:
        if o["tis_level"] == "token":
            s = 0.0
            c = 0.0
            for x in shape.seg_sum(w * m).tolist():
                s += x
            for x in shape.seg_sum(m).tolist():
                c += x
            mean = s / max(c, 1.0)
        elif o["tis_level"] == "sequence":
            s = 0.0
            for x in masked_mean_per_sample(shape, w, m).tolist():
                s += x
            mean = s / shape.num_samples if shape.num_samples > 0 else 0.0
        else:
            raise AlgorithmError("ALGO_BAD_ARGUMENT", "tis_batch_normalize is not defined for tis_level geometric")
        if mean > 1e-8:
            w = w / mean
            metrics["batch_norm_factor"] = np.full_like(w, mean)
        else:
            metrics["batch_norm_factor"] = np.ones_like(w)
    metrics["is_ratio_mean_final"] = b(masked_mean_per_sample(shape, w, m))
    lo = np.full(shape.num_samples, np.inf)
    hi = np.full(shape.num_samples, -np.inf)
    trained = m != 0
    np.minimum.at(lo, shape.seg[trained], w[trained])
    np.maximum.at(hi, shape.seg[trained], w[trained])
    metrics["is_ratio_min_final"] = b(np.where(np.isinf(lo), 0.0, lo))
    metrics["is_ratio_max_final"] = b(np.where(np.isinf(hi), 0.0, hi))
    return w, mod, metrics


class PolicyLossTerms:
    __slots__ = ("loss", "token_loss", "pg_loss", "kl_loss", "dloss_dlogp", "dloss_dentropy", "weights", "effective_loss_mask", "tis_weights", "metrics")


def policy_loss_terms(logp: Ragged, advantages: np.ndarray, loss_mask: np.ndarray, o: Dict[str, Any], old: Optional[np.ndarray] = None,
                      ref: Optional[np.ndarray] = None, rollout: Optional[np.ndarray] = None, entropy: Optional[np.ndarray] = None,
                      denom_mask: Optional[np.ndarray] = None, rollout_ids: Optional[Sequence[Any]] = None,
                      sample_denominators: Optional[np.ndarray] = None, normalizer: Optional[float] = None) -> PolicyLossTerms:
    """computePolicyLossTerms: every array is flat, shaped like ``logp`` (a Ragged)."""
    shape = logp
    lp = logp.flat
    m = np.asarray(loss_mask, dtype=np.float64)
    adv = np.asarray(advantages, dtype=np.float64)
    if o["use_rollout_logprobs"]:
        if rollout is None:
            raise AlgorithmError("ALGO_MISSING_INPUT", "use_rollout_logprobs needs rolloutLogProbs")
        od = np.asarray(rollout, dtype=np.float64)
    elif old is not None:
        od = np.asarray(old, dtype=np.float64)
    else:
        od = lp
    is_gspo = o["advantage_estimator"] == "gspo"
    is_cispo = o["advantage_estimator"] == "cispo"
    eps_high = effective_eps_clip_high(o)

    ppo_kl = gspo_kl(shape, lp, od, m) if is_gspo else od - lp
    ratio = np.exp(-ppo_kl)
    if is_cispo:
        pg, clipfrac, local_grad = cispo_loss(ppo_kl, lp, adv, o["eps_clip"], eps_high)
    else:
        # computePolicyLoss recomputes the ratio from ppo_kl, as here.
        pg, clipfrac, local_grad = ppo_clip(ratio, adv, o["eps_clip"], eps_high, o["eps_clip_c"])
    factor = np.ones_like(pg)

    opsm_sum = None
    if o["use_opsm"]:
        mask, opsm_sum = opsm_mask(shape, lp, od, adv, m, o["opsm_delta"])
        factor = factor * mask

    effective = m.copy()
    tis_weights = None
    off_metrics: Dict[str, np.ndarray] = {}
    if o["use_tis"] or o["get_mismatch_metrics"]:
        if rollout is None:
            raise AlgorithmError("ALGO_MISSING_INPUT", f"{'use_tis' if o['use_tis'] else 'get_mismatch_metrics'} needs rolloutLogProbs")
        rol = np.asarray(rollout, dtype=np.float64)
        train = np.asarray(old, dtype=np.float64) if old is not None else lp
        off_metrics["ois"] = ratio
        if o["tis_function"] == "mis":
            w, mod, mm = compute_mis_weights(shape, train, rol, m, o, o["use_tis"])
            for k, v in mm.items():
                off_metrics[f"mis_{k}"] = v
            if w is not None:
                tis_weights = w
                effective = mod
        else:
            t = tis_per_token(train, rol, o["tis_clip_low"], o["tis_clip"], o["tis_function"] == "icepop")
            off_metrics["tis"] = t["ratio"]
            off_metrics["tis_clipfrac"] = t["clipfrac"]
            off_metrics["tis_abs"] = t["abs"]
            if o["use_tis"]:
                tis_weights = t["weights"]
        if tis_weights is not None:
            factor = factor * tis_weights
    pg_loss = pg * factor

    dmask = shape.like(m if denom_mask is None else np.asarray(denom_mask, dtype=np.float64))
    agg_kw = dict(calculate_per_token_loss=bool(o["calculate_per_token_loss"]), denom_mask=dmask, rollout_ids=rollout_ids,
                  sample_denominators=sample_denominators, normalizer=normalizer)
    agg = make_aggregator(shape.like(effective), **agg_kw)
    agg_pre = make_aggregator(shape.like(m), **agg_kw)
    W = agg.weights

    if o["entropy_coef"] != 0 and entropy is None:
        raise AlgorithmError("ALGO_MISSING_INPUT", "entropy_coef ≠ 0 needs entropy")
    ent = None if entropy is None else np.asarray(entropy, dtype=np.float64)
    kl_value = kl_grad = None
    if o["use_kl_loss"]:
        if ref is None:
            raise AlgorithmError("ALGO_MISSING_INPUT", "use_kl_loss needs refLogProbs")
        kl_value, kl_grad = kl_loss_with_grad(lp, np.asarray(ref, dtype=np.float64), o["kl_loss_type"], od if o["use_unbiased_kl"] else None)

    token_loss = pg_loss - (0.0 if ent is None else o["entropy_coef"] * ent) + (0.0 if kl_value is None else o["kl_loss_coef"] * kl_value)

    if is_gspo:
        s = shape.seg_sum(W * factor * local_grad)
        r0 = shape.first(ratio)
        coef = (s * r0) / np.maximum(shape.seg_sum(m), 1.0)
        dlogp = shape.broadcast(coef) * m
    else:
        dlogp = W * factor * local_grad * (1.0 if is_cispo else ratio)
    if kl_grad is not None:
        dlogp = dlogp + o["kl_loss_coef"] * W * kl_grad
    dent = -o["entropy_coef"] * W

    pg_value = agg.reduce(pg_loss)
    metrics: Dict[str, float] = {"pg_loss": pg_value, "pg_clipfrac": agg.reduce(clipfrac), "ppo_kl": agg.reduce(ppo_kl)}
    loss = pg_value
    if ent is not None:
        metrics["entropy_loss"] = agg.reduce(ent)
        loss -= o["entropy_coef"] * metrics["entropy_loss"]
    if kl_value is not None:
        metrics["kl_loss"] = agg.reduce(kl_value)
        loss += o["kl_loss_coef"] * metrics["kl_loss"]
    metrics["loss"] = loss
    if rollout is not None:
        rol = np.asarray(rollout, dtype=np.float64)
        metrics["train_rollout_logprob_abs_diff"] = agg.reduce(np.abs((lp if o["use_rollout_logprobs"] else od) - rol))
    for k, v in off_metrics.items():
        metrics[k] = agg_pre.reduce(v)
    if opsm_sum is not None:
        metrics["opsm_clipfrac"] = opsm_sum / agg.normalizer

    out = PolicyLossTerms()
    out.loss = loss
    out.token_loss = token_loss
    out.pg_loss = pg_loss
    out.kl_loss = kl_value
    out.dloss_dlogp = dlogp
    out.dloss_dentropy = dent
    out.weights = W
    out.effective_loss_mask = effective
    out.tis_weights = tis_weights
    out.metrics = metrics
    return out


# --------------------------------------------------------------------------- log-probs from logits


def log_probs_and_entropy_from_logits(logits: np.ndarray, tokens: Sequence[int], vocab_size: int, temperature: float = 1.0):
    """logp = z'_y − logsumexp(z'), H = logsumexp(z') − Σ p z', z' = z / τ, over the full vocabulary."""
    z = np.asarray(logits, dtype=np.float64).reshape(len(tokens), vocab_size) * (1 / temperature)
    mx = z.max(axis=1, keepdims=True)
    e = np.exp(z - mx)
    sum_exp = e.sum(axis=1)
    weighted = np.where(e > 0, e * np.where(e > 0, z, 0.0), 0.0).sum(axis=1)
    mean_logit = weighted / sum_exp
    lse = mx[:, 0] + np.log(sum_exp)
    idx = np.asarray(tokens, dtype=np.int64)
    logp = z[np.arange(len(tokens)), idx] - lse
    return logp, lse - mean_logit


def logits_gradient(logits: np.ndarray, tokens: Sequence[int], vocab_size: int, temperature: float, dloss_dlogp: Sequence[float],
                    dloss_dentropy: Optional[Sequence[float]] = None) -> np.ndarray:
    n = len(tokens)
    inv = 1 / temperature
    z = np.asarray(logits, dtype=np.float64).reshape(n, vocab_size) * inv
    g_lp = np.asarray(dloss_dlogp, dtype=np.float64)[:, None]
    g_h = np.zeros((n, 1)) if dloss_dentropy is None else np.asarray(dloss_dentropy, dtype=np.float64)[:, None]
    mx = z.max(axis=1, keepdims=True)
    e = np.exp(z - mx)
    sum_exp = e.sum(axis=1, keepdims=True)
    mean_logit = np.where(e > 0, e * np.where(e > 0, z, 0.0), 0.0).sum(axis=1, keepdims=True) / sum_exp
    p = e / sum_exp
    grad = np.where(p > 0, (-g_lp * p + g_h * p * (mean_logit - np.where(p > 0, z, 0.0))) * inv, 0.0)
    grad[np.arange(n), np.asarray(tokens, dtype=np.int64)] += g_lp[:, 0] * inv
    skip = (g_lp[:, 0] == 0) & (g_h[:, 0] == 0)
    grad[skip] = 0.0
    return grad.reshape(-1)


# --------------------------------------------------------------------------- pass@k, value loss


def pass_at_k(n: int, c: int, k: int) -> float:
    if not isinstance(n, int) or n < 1:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"pass@k: n must be an integer >= 1, got {n}")
    if not isinstance(c, int) or c < 0 or c > n:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"pass@k: c must be an integer in [0, {n}], got {c}")
    if not isinstance(k, int) or k < 1 or k > n:
        raise AlgorithmError("ALGO_BAD_ARGUMENT", f"pass@k: k must be an integer in [1, {n}], got {k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1 - k / i
    return 1 - prod


def value_loss_terms(values: Ragged, old_values: np.ndarray, returns: np.ndarray, loss_mask: np.ndarray, value_clip: float,
                     calculate_per_token_loss: bool = False, sample_denominators: Optional[np.ndarray] = None, normalizer: Optional[float] = None):
    """valueLossTerms; ``sample_denominators`` / ``normalizer``: a micro-batch's share of the global batch's loss (as policy_loss_terms)."""
    v = values.flat
    diff = v - old_values
    clipped = old_values + np.minimum(np.maximum(diff, -value_clip), value_clip)
    s1 = (clipped - returns) ** 2
    s2 = (v - returns) ** 2
    g1 = np.where((diff >= -value_clip) & (diff <= value_clip), 2 * (clipped - returns), 0.0)
    g2 = 2 * (v - returns)
    loss_t = np.maximum(s1, s2)
    grad = np.where(s1 > s2, g1, np.where(s1 < s2, g2, 0.5 * g1 + 0.5 * g2))
    clipfrac = (np.abs(diff) > value_clip).astype(np.float64)
    agg = make_aggregator(values.like(np.asarray(loss_mask, dtype=np.float64)), calculate_per_token_loss=calculate_per_token_loss,
                          sample_denominators=sample_denominators, normalizer=normalizer)
    loss = agg.reduce(loss_t)
    return loss, grad * agg.weights, {"value_loss": loss, "value_clipfrac": agg.reduce(clipfrac)}
