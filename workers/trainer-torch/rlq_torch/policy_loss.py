"""Loss aggregation (slime's denominators) and the policy loss with its exact per-token gradients, plus the critic's value loss."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .algo_options import (
    MIS_LOG_RATIO_BOUND,
    AlgorithmError,
    effective_eps_clip_high,
    resolved_mis_bounds,
)
from .kl import kl_loss_with_grad
from .ragged import Ragged, _assert_like, masked_mean_per_sample


class Aggregator:
    """agg(x) = Σ_it x_it · weights_it (slime's get_sum_of_sample_mean and friends)."""

    def __init__(
        self, weights: np.ndarray, normalizer: float, sample_denominators: np.ndarray
    ):
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


def make_aggregator(
    loss_mask: Ragged,
    calculate_per_token_loss: bool = False,
    denom_mask: Ragged | None = None,
    rollout_ids: Sequence[Any] | None = None,
    sample_denominators: np.ndarray | None = None,
    normalizer: float | None = None,
) -> Aggregator:
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
            raise AlgorithmError(
                "algo_shape_mismatch",
                f"rolloutIds has length {len(rollout_ids)}, expected {B}",
            )
        keys = list(range(B)) if rollout_ids is None else list(rollout_ids)
        totals: dict[Any, float] = {}
        for i in range(B):
            totals[keys[i]] = totals.get(keys[i], 0.0) + float(own[i])
        if sample_denominators is not None:
            sample_den = np.asarray(sample_denominators, dtype=np.float64).copy()
            if sample_den.shape[0] != B:
                raise AlgorithmError(
                    "algo_shape_mismatch", "sampleDenominators has the wrong length"
                )
        else:
            sample_den = np.array([totals[keys[i]] for i in range(B)], dtype=np.float64)
        if normalizer is None:
            normalizer = float(len(totals))
    if not (normalizer >= 0) or not math.isfinite(normalizer):
        raise AlgorithmError(
            "algo_bad_argument",
            f"aggregation normalizer must be a finite number >= 0, got {normalizer}",
        )
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


def ppo_clip(
    ratio: np.ndarray,
    adv: np.ndarray,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None,
):
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
        raise AlgorithmError(
            "algo_bad_argument", f"eps_clip_c must be > 1, got {eps_clip_c}"
        )
    neg = adv < 0
    l3 = -eps_clip_c * adv
    loss = np.where(neg, np.minimum(l3, lc), lc)
    dr = np.where(neg, np.where(l3 < lc, 0.0, np.where(l3 > lc, gc, 0.5 * gc)), gc)
    return loss, clipfrac, dr


def cispo_loss(
    ppo_kl: np.ndarray,
    logp: np.ndarray,
    adv: np.ndarray,
    eps_clip: float,
    eps_clip_high: float,
):
    ratio = np.exp(-ppo_kl)
    clamped = np.minimum(np.maximum(ratio, 1 - eps_clip), 1 + eps_clip_high)
    loss = -clamped * adv * logp
    clipfrac = (clamped != ratio).astype(np.float64)
    return loss, clipfrac, -clamped * adv


def gspo_kl(
    shape: Ragged, logp: np.ndarray, old: np.ndarray, m: np.ndarray
) -> np.ndarray:
    s = shape.seg_sum((old - logp) * m)
    return shape.broadcast(s / np.maximum(shape.seg_sum(m), 1.0))


def opsm_mask(
    shape: Ragged,
    logp: np.ndarray,
    old: np.ndarray,
    adv: np.ndarray,
    m: np.ndarray,
    delta: float,
):
    seq_kl = gspo_kl(shape, logp, old, m)
    drop = (adv < 0) & (seq_kl > delta)
    zeroed = shape.seg_sum(drop.astype(np.float64))
    per = zeroed / np.maximum(shape.seg_sum(m), 1.0)
    s = 0.0
    for v in per.tolist():
        s += v
    return np.where(drop, 0.0, 1.0), s


def tis_per_token(
    train: np.ndarray,
    rollout: np.ndarray,
    tis_clip_low: float,
    tis_clip: float,
    icepop: bool,
):
    rho = np.exp(train - rollout)
    if icepop:
        w = np.where((rho >= tis_clip_low) & (rho <= tis_clip), rho, 0.0)
    else:
        w = np.minimum(np.maximum(rho, tis_clip_low), tis_clip)
    return {
        "weights": w,
        "ratio": rho,
        "clipfrac": (w != rho).astype(np.float64),
        "abs": np.abs(rho - 1),
    }


def _clamp_log(x: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, -MIS_LOG_RATIO_BOUND), MIS_LOG_RATIO_BOUND)


def compute_mis_weights(
    shape: Ragged,
    train: np.ndarray,
    rollout: np.ndarray,
    m: np.ndarray,
    o: dict[str, Any],
    use_tis: bool = True,
):
    """(weights or None, modified mask, metrics name → flat array): compute_mis_weights."""
    metrics: dict[str, np.ndarray] = {}
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
    metrics["chi2_token"] = b(
        masked_mean_per_sample(shape, np.exp(_clamp_log(lr)) ** 2, m) - 1
    )
    metrics["chi2_seq"] = b(np.exp(2 * _clamp_log(shape.seg_sum(lr * m))) - 1)
    if not use_tis:
        return None, m.copy(), metrics

    tis_lower, tis_upper, rs_lower, rs_upper = resolved_mis_bounds(o)
    if o["tis_mode"] != "truncate" and not (tis_lower < tis_upper):
        raise AlgorithmError(
            "algo_bad_argument",
            f"MIS {o['tis_mode']} mode needs tis_lower_bound ({tis_lower}) < tis_upper_bound ({tis_upper})",
        )
    if o["use_rs"] and not (rs_lower < rs_upper):
        raise AlgorithmError(
            "algo_bad_argument",
            f"MIS rejection needs rs_lower_bound ({rs_lower}) < rs_upper_bound ({rs_upper})",
        )
    if o["tis_batch_normalize"] and o["tis_level"] == "geometric":
        raise AlgorithmError(
            "algo_bad_argument",
            "tis_batch_normalize is not defined for tis_level geometric",
        )

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
        lr_rs = (
            lr_tis
            if o["rs_level"] == o["tis_level"]
            else level_log_ratio(o["rs_level"])
        )
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
            raise AlgorithmError(
                "algo_bad_argument",
                "tis_batch_normalize is not defined for tis_level geometric",
            )
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
    __slots__ = (
        "loss",
        "token_loss",
        "pg_loss",
        "kl_loss",
        "dloss_dlogp",
        "dloss_dentropy",
        "weights",
        "effective_loss_mask",
        "tis_weights",
        "metrics",
    )


def policy_loss_terms(
    logp: Ragged,
    advantages: np.ndarray,
    loss_mask: np.ndarray,
    o: dict[str, Any],
    old: np.ndarray | None = None,
    ref: np.ndarray | None = None,
    rollout: np.ndarray | None = None,
    entropy: np.ndarray | None = None,
    denom_mask: np.ndarray | None = None,
    rollout_ids: Sequence[Any] | None = None,
    sample_denominators: np.ndarray | None = None,
    normalizer: float | None = None,
) -> PolicyLossTerms:
    """computePolicyLossTerms: every array is flat, shaped like ``logp`` (a Ragged)."""
    shape = logp
    lp = logp.flat
    m = np.asarray(loss_mask, dtype=np.float64)
    adv = np.asarray(advantages, dtype=np.float64)
    if o["use_rollout_logprobs"]:
        if rollout is None:
            raise AlgorithmError(
                "algo_missing_input", "use_rollout_logprobs needs rolloutLogProbs"
            )
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
        pg, clipfrac, local_grad = ppo_clip(
            ratio, adv, o["eps_clip"], eps_high, o["eps_clip_c"]
        )
    factor = np.ones_like(pg)

    opsm_sum = None
    if o["use_opsm"]:
        mask, opsm_sum = opsm_mask(shape, lp, od, adv, m, o["opsm_delta"])
        factor = factor * mask

    effective = m.copy()
    tis_weights = None
    off_metrics: dict[str, np.ndarray] = {}
    if o["use_tis"] or o["get_mismatch_metrics"]:
        if rollout is None:
            raise AlgorithmError(
                "algo_missing_input",
                f"{'use_tis' if o['use_tis'] else 'get_mismatch_metrics'} needs rolloutLogProbs",
            )
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
            t = tis_per_token(
                train,
                rol,
                o["tis_clip_low"],
                o["tis_clip"],
                o["tis_function"] == "icepop",
            )
            off_metrics["tis"] = t["ratio"]
            off_metrics["tis_clipfrac"] = t["clipfrac"]
            off_metrics["tis_abs"] = t["abs"]
            if o["use_tis"]:
                tis_weights = t["weights"]
        if tis_weights is not None:
            factor = factor * tis_weights
    pg_loss = pg * factor

    dmask = shape.like(
        m if denom_mask is None else np.asarray(denom_mask, dtype=np.float64)
    )
    agg_kw = dict(
        calculate_per_token_loss=bool(o["calculate_per_token_loss"]),
        denom_mask=dmask,
        rollout_ids=rollout_ids,
        sample_denominators=sample_denominators,
        normalizer=normalizer,
    )
    agg = make_aggregator(shape.like(effective), **agg_kw)
    agg_pre = make_aggregator(shape.like(m), **agg_kw)
    W = agg.weights

    if o["entropy_coef"] != 0 and entropy is None:
        raise AlgorithmError("algo_missing_input", "entropy_coef ≠ 0 needs entropy")
    ent = None if entropy is None else np.asarray(entropy, dtype=np.float64)
    kl_value = kl_grad = None
    if o["use_kl_loss"]:
        if ref is None:
            raise AlgorithmError("algo_missing_input", "use_kl_loss needs refLogProbs")
        kl_value, kl_grad = kl_loss_with_grad(
            lp,
            np.asarray(ref, dtype=np.float64),
            o["kl_loss_type"],
            od if o["use_unbiased_kl"] else None,
        )

    token_loss = (
        pg_loss
        - (0.0 if ent is None else o["entropy_coef"] * ent)
        + (0.0 if kl_value is None else o["kl_loss_coef"] * kl_value)
    )

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
    metrics: dict[str, float] = {
        "pg_loss": pg_value,
        "pg_clipfrac": agg.reduce(clipfrac),
        "ppo_kl": agg.reduce(ppo_kl),
    }
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
        metrics["train_rollout_logprob_abs_diff"] = agg.reduce(
            np.abs((lp if o["use_rollout_logprobs"] else od) - rol)
        )
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


def value_loss_terms(
    values: Ragged,
    old_values: np.ndarray,
    returns: np.ndarray,
    loss_mask: np.ndarray,
    value_clip: float,
    calculate_per_token_loss: bool = False,
    sample_denominators: np.ndarray | None = None,
    normalizer: float | None = None,
):
    """valueLossTerms; ``sample_denominators`` / ``normalizer``: a micro-batch's share of the global batch's loss (as policy_loss_terms)."""
    v = values.flat
    diff = v - old_values
    clipped = old_values + np.minimum(np.maximum(diff, -value_clip), value_clip)
    s1 = (clipped - returns) ** 2
    s2 = (v - returns) ** 2
    g1 = np.where(
        (diff >= -value_clip) & (diff <= value_clip), 2 * (clipped - returns), 0.0
    )
    g2 = 2 * (v - returns)
    loss_t = np.maximum(s1, s2)
    grad = np.where(s1 > s2, g1, np.where(s1 < s2, g2, 0.5 * g1 + 0.5 * g2))
    clipfrac = (np.abs(diff) > value_clip).astype(np.float64)
    agg = make_aggregator(
        values.like(np.asarray(loss_mask, dtype=np.float64)),
        calculate_per_token_loss=calculate_per_token_loss,
        sample_denominators=sample_denominators,
        normalizer=normalizer,
    )
    loss = agg.reduce(loss_t)
    return (
        loss,
        grad * agg.weights,
        {"value_loss": loss, "value_clipfrac": agg.reduce(clipfrac)},
    )
