/**
 * KL approximations (Schulman, http://joschu.net/blog/kl-approx.html): slime's
 * `compute_approx_kl(log_probs, log_probs_base, kl_loss_type, importance_ratio)`
 * (slime/utils/ppo_utils.py:11-51). Let d = logp − base:
 *
 *   k1         = d
 *   k2         = d² / 2
 *   k3         = exp(−d) − 1 + d
 *   low_var_kl = clamp(k3 [· ratio], −10, 10)
 *
 * With an importance ratio (`use_unbiased_kl`: ratio = exp(logp − old)) the
 * estimate is multiplied by it BEFORE the clamp. Only low_var_kl is clamped; k3
 * never is.
 */

import type { KlType } from "./options.ts";
import { algorithmError, assertLength, at, type Vec } from "./ragged.ts";

/** The clamp bound of low_var_kl. */
export const LOW_VAR_KL_BOUND = 10;

/** One token's KL estimate. */
export function approxKlToken(logp: number, base: number, type: KlType, importanceRatio?: number): number {
  return approxKlTokenWithGrad(logp, base, type, importanceRatio === undefined ? undefined : { ratio: importanceRatio, hasGrad: false }).value;
}

export interface KlRatio {
  ratio: number;
  /**
   * Whether the ratio depends on logp (it does in slime's KL loss: the ratio is
   * exp(log_probs − old_log_probs) with the live log_probs, so d ratio / d logp = ratio).
   */
  hasGrad: boolean;
}

/**
 * One token's estimate and its derivative with respect to `logp` (base, old fixed).
 *
 *   d k1 / d logp = 1,   d k2 / d logp = d,   d k3 / d logp = 1 − exp(−d)
 *   with ratio r (hasGrad): d (r·k) / d logp = r·k + r·k'
 *   low_var_kl: gradient 0 where the (ratio-multiplied) value is outside [−10, 10]
 *   (torch's clamp passes the gradient on the closed interval).
 */
export function approxKlTokenWithGrad(logp: number, base: number, type: KlType, ratio?: KlRatio): { value: number; grad: number } {
  const d = logp - base;
  let value: number;
  let grad: number;
  switch (type) {
    case "k1":
      value = d;
      grad = 1;
      break;
    case "k2":
      value = (d * d) / 2;
      grad = d;
      break;
    case "k3":
    case "low_var_kl": {
      const e = Math.exp(-d);
      value = e - 1 + d;
      grad = 1 - e;
      break;
    }
    default:
      throw algorithmError("badArgument", `unknown kl_loss_type "${String(type)}"`);
  }
  if (ratio !== undefined) {
    grad = ratio.hasGrad ? ratio.ratio * value + ratio.ratio * grad : ratio.ratio * grad;
    value = ratio.ratio * value;
  }
  if (type === "low_var_kl") {
    if (value > LOW_VAR_KL_BOUND || value < -LOW_VAR_KL_BOUND) grad = 0;
    value = Math.min(Math.max(value, -LOW_VAR_KL_BOUND), LOW_VAR_KL_BOUND);
  }
  return { value, grad };
}

/**
 * Per-token KL of one sample.
 *
 * @param logProbs `[T]` log π (the distribution the KL is "of").
 * @param baseLogProbs `[T]` log π_base (ref, or old for metrics).
 * @param importanceRatio optional `[T]` multiplier (applied before the low_var_kl clamp).
 * @returns `[T]` float64.
 */
export function computeApproxKl(logProbs: Vec, baseLogProbs: Vec, type: KlType, importanceRatio?: Vec): Float64Array {
  assertLength(baseLogProbs, logProbs.length, "baseLogProbs");
  if (importanceRatio !== undefined) assertLength(importanceRatio, logProbs.length, "importanceRatio");
  const out = new Float64Array(logProbs.length);
  for (let t = 0; t < logProbs.length; t++) {
    out[t] = approxKlToken(at(logProbs, t), at(baseLogProbs, t), type, importanceRatio === undefined ? undefined : at(importanceRatio, t));
  }
  return out;
}

/**
 * The KL-loss term of one sample with its gradient w.r.t. the current log-probs:
 * `kl_t = compute_approx_kl(logp, ref, type, exp(logp − old) if useUnbiasedKl)`.
 *
 * @returns `value` `[T]` and `grad` `[T]` = d kl_t / d logp_t.
 */
export function klLossWithGrad(logProbs: Vec, refLogProbs: Vec, type: KlType, oldLogProbs?: Vec): { value: Float64Array; grad: Float64Array } {
  assertLength(refLogProbs, logProbs.length, "refLogProbs");
  if (oldLogProbs !== undefined) assertLength(oldLogProbs, logProbs.length, "oldLogProbs");
  const value = new Float64Array(logProbs.length);
  const grad = new Float64Array(logProbs.length);
  for (let t = 0; t < logProbs.length; t++) {
    const logp = at(logProbs, t);
    const ratio = oldLogProbs === undefined ? undefined : { ratio: Math.exp(logp - at(oldLogProbs, t)), hasGrad: true };
    const r = approxKlTokenWithGrad(logp, at(refLogProbs, t), type, ratio);
    value[t] = r.value;
    grad[t] = r.grad;
  }
  return { value, grad };
}
