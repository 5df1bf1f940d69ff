/**
 * Per-token policy-loss primitives (slime/utils/ppo_utils.py:54-171), each with the
 * derivative the embedded trainer backpropagates. Throughout, for one token:
 *
 *   ppo_kl = old − logp,   ratio = exp(−ppo_kl) = exp(logp − old),   d ratio / d logp = ratio.
 *
 * Gradients follow torch's autograd rules exactly, including its tie rules:
 * `clamp` passes the gradient on the closed interval [lo, hi]; `maximum`/`minimum`
 * split it half and half when both arguments are equal; `where` takes the branch.
 */

import { algorithmError, assertLength, assertRaggedLike, at, maskSum, row, type Ragged, type Vec, assertFiniteArgument } from "./ragged.ts";

/** torch.maximum's gradient w.r.t. its two arguments. */
function maxGrad(a: number, b: number, ga: number, gb: number): number {
  if (a > b) return ga;
  if (a < b) return gb;
  return 0.5 * ga + 0.5 * gb;
}

export interface ClipLossToken {
  /** The token's policy loss. */
  loss: number;
  /** 1 when the clipped surrogate is strictly larger (computed before dual clip). */
  clipfrac: number;
  /** d loss / d ratio. */
  dLoss_dRatio: number;
}

/**
 * PPO clip with optional dual clip, for one token (`compute_policy_loss`):
 *
 *   L1 = −ratio·A,  L2 = −clamp(ratio, 1−eps_clip, 1+eps_clip_high)·A,  L = max(L1, L2)
 *   clipfrac = 1[L2 > L1]
 *   dual clip (eps_clip_c = c > 1): for A < 0, L = min(L, −c·A); A ≥ 0 keeps L.
 *
 * Gradient w.r.t. ratio: −A on the unclipped branch, 0 where the clamp saturates,
 * 0 where the dual-clip constant wins.
 */
export function ppoClipToken(ratio: number, advantage: number, epsClip: number, epsClipHigh: number, epsClipC: number | null): ClipLossToken {
  if (typeof epsClip !== "number" || typeof epsClipHigh !== "number" || (epsClipC !== null && typeof epsClipC !== "number")) {
    throw algorithmError(
      "badArgument",
      `ppoClipToken: epsClip, epsClipHigh must be numbers and epsClipC a number or null (got ${String(epsClip)}, ${String(epsClipHigh)}, ${String(epsClipC)})`,
    );
  }
  const lo = 1 - epsClip;
  const hi = 1 + epsClipHigh;
  const l1 = -ratio * advantage;
  const clamped = Math.min(Math.max(ratio, lo), hi);
  const l2 = -clamped * advantage;
  const g1 = -advantage;
  const g2 = ratio >= lo && ratio <= hi ? -advantage : 0;
  const lc = Math.max(l1, l2);
  const gc = maxGrad(l1, l2, g1, g2);
  const clipfrac = l2 > l1 ? 1 : 0;
  if (epsClipC === null || !(advantage < 0)) return { loss: lc, clipfrac, dLoss_dRatio: gc };
  const l3 = -epsClipC * advantage;
  // torch.min(l3, lc): l3 is a constant, so its share of the gradient is 0.
  const loss = Math.min(l3, lc);
  const dLoss_dRatio = l3 < lc ? 0 : l3 > lc ? gc : 0.5 * gc;
  return { loss, clipfrac, dLoss_dRatio };
}

/**
 * `compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)` over
 * a flat token array.
 *
 * @param ppoKl `[N]` old − logp per token (GSPO: the sequence value broadcast).
 * @param advantages `[N]`
 * @returns `loss`, `clipfrac`, `dLoss_dRatio`, each `[N]`, and `ratio` `[N]`.
 */
export function computePolicyLoss(
  ppoKl: Vec,
  advantages: Vec,
  epsClip: number,
  epsClipHigh: number | null = null,
  epsClipC: number | null = null,
): { loss: Float64Array; clipfrac: Float64Array; dLoss_dRatio: Float64Array; ratio: Float64Array } {
  assertFiniteArgument("computePolicyLoss", "epsClip (eps_clip)", epsClip);
  // slime: eps_clip_high None means eps_clip; from plain JS undefined means the same.
  const high = epsClipHigh ?? epsClip;
  assertFiniteArgument("computePolicyLoss", "epsClipHigh (eps_clip_high)", high);
  const dual = epsClipC ?? null;
  assertLength(advantages, ppoKl.length, "advantages");
  if (dual !== null && !(dual > 1)) throw algorithmError("badArgument", `eps_clip_c must be > 1, got ${dual}`);
  const n = ppoKl.length;
  const loss = new Float64Array(n);
  const clipfrac = new Float64Array(n);
  const dLoss_dRatio = new Float64Array(n);
  const ratio = new Float64Array(n);
  for (let t = 0; t < n; t++) {
    const r = Math.exp(-at(ppoKl, t));
    const tok = ppoClipToken(r, at(advantages, t), epsClip, high, dual);
    ratio[t] = r;
    loss[t] = tok.loss;
    clipfrac[t] = tok.clipfrac;
    dLoss_dRatio[t] = tok.dLoss_dRatio;
  }
  return { loss, clipfrac, dLoss_dRatio, ratio };
}

/**
 * CISPO (`compute_cispo_loss`, MiniMax-M1 eq. 4-5):
 *
 *   L = −sg(clamp(ratio, 1−eps_clip, 1+eps_clip_high)) · A · logp,   clipfrac = 1[clamped ≠ ratio]
 *
 * The clipped ratio is a constant (stop-gradient), so d L / d logp = −clamped·A even
 * on clipped tokens. Note the loss VALUE is not a function whose derivative is that
 * gradient: check it with the ratio held fixed.
 *
 * @returns per-token `loss`, `clipfrac`, `dLoss_dLogp`, each `[N]`.
 */
export function computeCispoLoss(
  ppoKl: Vec,
  logProbs: Vec,
  advantages: Vec,
  epsClip: number,
  epsClipHigh: number | null = null,
): { loss: Float64Array; clipfrac: Float64Array; dLoss_dLogp: Float64Array } {
  assertFiniteArgument("computeCispoLoss", "epsClip (eps_clip)", epsClip);
  const high = epsClipHigh ?? epsClip;
  assertFiniteArgument("computeCispoLoss", "epsClipHigh (eps_clip_high)", high);
  assertLength(logProbs, ppoKl.length, "logProbs");
  assertLength(advantages, ppoKl.length, "advantages");
  const n = ppoKl.length;
  const loss = new Float64Array(n);
  const clipfrac = new Float64Array(n);
  const dLoss_dLogp = new Float64Array(n);
  for (let t = 0; t < n; t++) {
    const ratio = Math.exp(-at(ppoKl, t));
    const clamped = Math.min(Math.max(ratio, 1 - epsClip), 1 + high);
    const a = at(advantages, t);
    loss[t] = -clamped * a * at(logProbs, t);
    clipfrac[t] = clamped !== ratio ? 1 : 0;
    dLoss_dLogp[t] = -clamped * a;
  }
  return { loss, clipfrac, dLoss_dLogp };
}

/**
 * GSPO's sequence KL (`compute_gspo_kl`): per sample
 * `ppo_kl_i = Σ_t (old_t − logp_t)·m_t / max(Σ_t m_t, 1)`, broadcast to every token.
 * The PPO ratio becomes `exp(−ppo_kl_i)`, the geometric-mean sequence ratio, and
 * `d ratio_i / d logp_it = ratio_i · m_it / max(Σ_t m_it, 1)`.
 *
 * @returns `[B][T_i]` (constant within each sample).
 */
export function computeGspoKl(logProbs: Ragged, oldLogProbs: Ragged, lossMask: Ragged): Float64Array[] {
  assertRaggedLike(oldLogProbs, logProbs, "oldLogProbs", "logProbs");
  assertRaggedLike(lossMask, logProbs, "lossMask", "logProbs");
  return logProbs.map((lp, i) => {
    const old = row(oldLogProbs, i, "oldLogProbs");
    const m = row(lossMask, i, "lossMask");
    let s = 0;
    for (let t = 0; t < lp.length; t++) s += (at(old, t) - at(lp, t)) * at(m, t);
    return new Float64Array(lp.length).fill(s / Math.max(maskSum(m), 1));
  });
}

/**
 * OPSM, off-policy sequence masking (`compute_opsm_mask`): per sample
 * `seq_kl_i = Σ_t (old − logp)·m / max(Σ m, 1)`; a token's mask is 0 when
 * `A_t < 0 and seq_kl_i > opsm_delta`, else 1. The mask multiplies pg_loss (no gradient).
 *
 * @returns `mask` `[B][T_i]`, and `clipfracSum` = Σ_i (#zeroed tokens of i, masked
 * ones included) / max(Σ m_i, 1), which slime reports divided by its step normaliser.
 */
export function computeOpsmMask(
  logProbs: Ragged,
  oldLogProbs: Ragged,
  advantages: Ragged,
  lossMask: Ragged,
  opsmDelta: number,
): { mask: Float64Array[]; clipfracSum: number } {
  assertRaggedLike(advantages, logProbs, "advantages", "logProbs");
  const seqKl = computeGspoKl(logProbs, oldLogProbs, lossMask);
  let clipfracSum = 0;
  const mask = advantages.map((a, i) => {
    const kl = seqKl[i]?.[0] ?? 0;
    const out = new Float64Array(a.length);
    let zeroed = 0;
    for (let t = 0; t < a.length; t++) {
      const drop = at(a, t) < 0 && kl > opsmDelta;
      out[t] = drop ? 0 : 1;
      if (drop) zeroed++;
    }
    clipfracSum += zeroed / Math.max(maskSum(row(lossMask, i, "lossMask")), 1);
    return out;
  });
  return { mask, clipfracSum };
}
