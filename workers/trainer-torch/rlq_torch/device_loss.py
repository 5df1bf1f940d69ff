"""The policy loss on the training device: policy_loss_terms' token-level losses as torch float64 ops, no host sync.

policy_loss_terms (policy_loss.py) is the reference: numpy on the host, every option. Calling it per
micro-batch copies the micro-batch's log-probs to the host and waits for the device each time. This
module computes the same d loss / d logp, d loss / d H and metrics on the device for the options whose
loss is per token given the aggregation weights (DEVICE_LOSS_UNSUPPORTED names the others, which stay on
the host). The aggregation weights depend on the masks and denominators only, never on the log-probs,
so the host computes them for the whole batch once (``aggregation_weights``) and ships them with the
advantages; the metrics stay on the device as one vector per micro-batch, read once per optimizer step.

Float64 throughout, as the host path: the gradients agree with it to float64 rounding (tests/test_device_loss.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .algo_options import LOW_VAR_KL_BOUND, effective_eps_clip_high
from .policy_loss import make_aggregator
from .ragged import Ragged


def unsupported(o: dict[str, Any]) -> str | None:
    """None when the device path computes this algorithm's loss, else the option that keeps it on the host."""
    if o["advantage_estimator"] == "gspo":
        return "advantage_estimator gspo (a per-sample ratio)"
    for key in ("use_opsm", "use_tis", "get_mismatch_metrics"):
        if o[key]:
            return key
    return None


def metric_names(o: dict[str, Any]) -> list[str]:
    """The keys policy_loss_terms reports for these options (entropy and rollout log-probs are always passed), in vector order."""
    names = ["pg_loss", "pg_clipfrac", "ppo_kl", "entropy_loss"]
    if o["use_kl_loss"]:
        names.append("kl_loss")
    return names + ["loss", "train_rollout_logprob_abs_diff"]


def aggregation_weights(
    shape: Ragged,
    loss_mask: np.ndarray,
    denom_mask: np.ndarray,
    o: dict[str, Any],
    mbs,
    own: np.ndarray,
    normalizer: float,
) -> np.ndarray:
    """The flat aggregation weights W of every micro-batch of one global batch (make_aggregator as policy_loss_terms calls it)."""
    out = np.zeros(shape.flat.shape[0])
    for lo, hi in mbs:
        mb = shape.slice(lo, hi)
        a, b = int(shape.offsets[lo]), int(shape.offsets[hi])
        agg = make_aggregator(
            mb.like(loss_mask[a:b]),
            calculate_per_token_loss=bool(o["calculate_per_token_loss"]),
            denom_mask=mb.like(denom_mask[a:b]),
            sample_denominators=own[lo:hi],
            normalizer=normalizer,
        )
        out[a:b] = agg.weights
    return out


def _ppo_clip(ratio, adv, eps_clip: float, eps_high: float, eps_clip_c: float | None):
    """policy_loss.ppo_clip in torch: (loss, clipfrac, d loss / d ratio), the same tie rules."""
    lo, hi = 1 - eps_clip, 1 + eps_high
    l1 = -ratio * adv
    l2 = -torch.clamp(ratio, lo, hi) * adv
    g1 = -adv
    g2 = torch.where((ratio >= lo) & (ratio <= hi), -adv, torch.zeros_like(adv))
    lc = torch.maximum(l1, l2)
    gc = torch.where(l1 > l2, g1, torch.where(l1 < l2, g2, 0.5 * g1 + 0.5 * g2))
    clipfrac = (l2 > l1).to(ratio.dtype)
    if eps_clip_c is None:
        return lc, clipfrac, gc
    neg = adv < 0
    l3 = -eps_clip_c * adv
    loss = torch.where(neg, torch.minimum(l3, lc), lc)
    dr = torch.where(
        neg,
        torch.where(l3 < lc, torch.zeros_like(gc), torch.where(l3 > lc, gc, 0.5 * gc)),
        gc,
    )
    return loss, clipfrac, dr


def _kl(lp, ref, kl_type: str, old):
    """kl.kl_loss_with_grad in torch (use_unbiased_kl: ``old`` given, the ratio carries gradient)."""
    d = lp - ref
    if kl_type == "k1":
        value, grad = d, torch.ones_like(d)
    elif kl_type == "k2":
        value, grad = d * d / 2, d
    else:  # k3, low_var_kl (parse_options refuses any other name)
        e = torch.exp(-d)
        value, grad = e - 1 + d, 1 - e
    if old is not None:
        r = torch.exp(lp - old)
        grad = r * value + r * grad
        value = r * value
    if kl_type == "low_var_kl":
        grad = torch.where(
            (value > LOW_VAR_KL_BOUND) | (value < -LOW_VAR_KL_BOUND),
            torch.zeros_like(grad),
            grad,
        )
        value = torch.clamp(value, -LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)
    return value, grad


def loss_terms(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    w: torch.Tensor,
    adv: torch.Tensor,
    old: torch.Tensor,
    rollout: torch.Tensor,
    ref: torch.Tensor | None,
    o: dict[str, Any],
):
    """(d loss / d logp, d loss / d H, metrics vector in metric_names order), float64 on logp's device.

    ``logp`` / ``entropy``: one micro-batch's tokens (detached); the rest are the same tokens' float64
    aggregation weights, advantages, old (or rollout, with use_rollout_logprobs), rollout and reference log-probs."""
    lp = logp.detach().double()
    ent = entropy.detach().double()
    od = rollout if o["use_rollout_logprobs"] else old
    eps_high = effective_eps_clip_high(o)
    ppo_kl = od - lp
    ratio = torch.exp(-ppo_kl)
    if o["advantage_estimator"] == "cispo":
        clamped = torch.clamp(ratio, 1 - o["eps_clip"], 1 + eps_high)
        pg = -clamped * adv * lp
        clipfrac = (clamped != ratio).to(lp.dtype)
        dlogp = w * (-clamped * adv)
    else:
        pg, clipfrac, local_grad = _ppo_clip(
            ratio, adv, o["eps_clip"], eps_high, o["eps_clip_c"]
        )
        dlogp = w * local_grad * ratio
    nz = w != 0

    def reduce(
        x,
    ):  # Aggregator.reduce: masked tokens never poison the sum (a NaN there is skipped)
        return torch.where(nz, x * w, torch.zeros_like(w)).sum()

    vals = [reduce(pg), reduce(clipfrac), reduce(ppo_kl), reduce(ent)]
    loss = vals[0] - o["entropy_coef"] * vals[3]
    if o["use_kl_loss"]:
        kl_value, kl_grad = _kl(
            lp, ref, o["kl_loss_type"], od if o["use_unbiased_kl"] else None
        )
        dlogp = dlogp + o["kl_loss_coef"] * w * kl_grad
        vals.append(reduce(kl_value))
        loss = loss + o["kl_loss_coef"] * vals[-1]
    vals.append(loss)
    vals.append(reduce(torch.abs((lp if o["use_rollout_logprobs"] else od) - rollout)))
    return dlogp, -o["entropy_coef"] * w, torch.stack(vals)
