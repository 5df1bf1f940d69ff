/**
 * The PPO critic's clipped value loss (slime `value_loss_function`,
 * slime/backends/megatron_utils/loss.py:1176-1230), per token:
 *
 *   V_clip   = V_old + clamp(V − V_old, −value_clip, value_clip)
 *   loss     = max((V_clip − R)², (V − R)²)
 *   clipfrac = 1[|V − V_old| > value_clip]
 *
 * Aggregated like every other loss (see aggregation.ts). `dLoss_dValue` follows
 * torch: the clamp passes the gradient on the closed interval, max splits ties.
 *
 * @param values `[T]` current critic values.
 * @param oldValues `[T]` the values the returns were computed with.
 * @param returns `[T]` regression targets (advantages + old values for ppo).
 */

import { type AggregationOptions, makeAggregator } from "./aggregation.ts";
import { assertLength, assertRaggedLike, row, at, type Ragged, type Vec, assertFiniteArgument } from "./ragged.ts";

export function computeValueLoss(
  values: Vec,
  oldValues: Vec,
  returns: Vec,
  valueClip: number,
): { loss: Float64Array; clipfrac: Float64Array; dLoss_dValue: Float64Array } {
  assertFiniteArgument("computeValueLoss", "valueClip (value_clip)", valueClip);
  assertLength(oldValues, values.length, "oldValues");
  assertLength(returns, values.length, "returns");
  const n = values.length;
  const loss = new Float64Array(n);
  const clipfrac = new Float64Array(n);
  const dLoss_dValue = new Float64Array(n);
  for (let t = 0; t < n; t++) {
    const v = at(values, t);
    const vOld = at(oldValues, t);
    const r = at(returns, t);
    const diff = v - vOld;
    const clipped = vOld + Math.min(Math.max(diff, -valueClip), valueClip);
    const s1 = (clipped - r) ** 2;
    const s2 = (v - r) ** 2;
    const g1 = diff >= -valueClip && diff <= valueClip ? 2 * (clipped - r) : 0;
    const g2 = 2 * (v - r);
    loss[t] = Math.max(s1, s2);
    dLoss_dValue[t] = s1 > s2 ? g1 : s1 < s2 ? g2 : 0.5 * g1 + 0.5 * g2;
    clipfrac[t] = Math.abs(diff) > valueClip ? 1 : 0;
  }
  return { loss, clipfrac, dLoss_dValue };
}

export interface ValueLossInput {
  /** `[B][T_i]` current critic values. */
  values: Ragged;
  /** `[B][T_i]` critic values at rollout time. */
  oldValues: Ragged;
  /** `[B][T_i]` from `computeAdvantagesAndReturns` (ppo). */
  returns: Ragged;
  lossMask: Ragged;
}

/**
 * The critic's scalar loss, d loss / d V per token, and slime's metrics
 * `value_loss`, `value_clipfrac`, aggregated like the policy loss.
 */
export function computeValueLossTerms(
  input: ValueLossInput,
  valueClip = 0.2,
  aggregation: AggregationOptions = {},
): { loss: number; dLoss_dValue: Float64Array[]; metrics: { value_loss: number; value_clipfrac: number } } {
  const { values, lossMask } = input;
  assertRaggedLike(input.oldValues, values, "oldValues", "values");
  assertRaggedLike(input.returns, values, "returns", "values");
  assertRaggedLike(lossMask, values, "lossMask", "values");
  const agg = makeAggregator(lossMask, aggregation);
  const parts = values.map((v, i) => computeValueLoss(v, row(input.oldValues, i, "oldValues"), row(input.returns, i, "returns"), valueClip));
  const loss = agg.reduce(parts.map((p) => p.loss));
  const dLoss_dValue = parts.map((p, i) => {
    const w = agg.weights[i] as Float64Array;
    return Float64Array.from(p.dLoss_dValue, (g, t) => g * at(w, t));
  });
  return { loss, dLoss_dValue, metrics: { value_loss: loss, value_clipfrac: agg.reduce(parts.map((p) => p.clipfrac)) } };
}
