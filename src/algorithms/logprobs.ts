/**
 * Log-probs and entropy from logits, and their backward pass: slime's
 * `_VocabParallelLogProbEntropy` (slime/utils/ppo_utils.py:187-336) without tensor
 * parallelism, after the logits are divided by the rollout temperature
 * (loss.py `get_log_probs_and_entropy`).
 *
 * For one position with logits z (`[V]`), temperature τ and target token y:
 *
 *   z' = z / τ,   p = softmax(z') over the FULL vocabulary (no top-p / top-k)
 *   logp = z'_y − logsumexp(z')
 *   H    = logsumexp(z') − Σ_v p_v z'_v
 *
 * This is also what an engine must report as rollout log-probs. The caller aligns
 * positions: row t of `logits` is the distribution that produced `tokens[t]`
 * (for a causal LM, the logits at position promptLength + t − 1).
 */

import { algorithmError, assertLength, at, type Vec } from "./ragged.ts";

export type Logits = Float32Array | Float64Array;

function checkShape(logits: Logits, tokens: Vec, vocabSize: number, temperature: number): number {
  if (!Number.isInteger(vocabSize) || vocabSize <= 0) throw algorithmError("badArgument", `vocabSize must be a positive integer, got ${vocabSize}`);
  if (!(temperature > 0)) throw algorithmError("badArgument", `temperature must be > 0, got ${temperature}`);
  const n = tokens.length;
  assertLength(logits, n * vocabSize, "logits ([T, V] row-major)");
  for (let t = 0; t < n; t++) {
    const y = at(tokens, t);
    if (!Number.isInteger(y) || y < 0 || y >= vocabSize) throw algorithmError("badArgument", `tokens[${t}] = ${y} is outside [0, ${vocabSize})`);
  }
  return n;
}

interface RowStats {
  /** max_v z'_v */
  max: number;
  /** Σ_v exp(z'_v − max) */
  sumExp: number;
  /** Σ_v p_v z'_v */
  meanLogit: number;
}

function rowStats(logits: Logits, offset: number, vocabSize: number, invTemp: number): RowStats {
  let max = -Infinity;
  for (let v = 0; v < vocabSize; v++) max = Math.max(max, at(logits, offset + v) * invTemp);
  let sumExp = 0;
  let weighted = 0;
  for (let v = 0; v < vocabSize; v++) {
    const z = at(logits, offset + v) * invTemp;
    const e = Math.exp(z - max);
    sumExp += e;
    // A −∞ logit (a banned token) has p = 0 and adds nothing; 0·(−∞) would be NaN.
    if (e > 0) weighted += e * z;
  }
  return { max, sumExp, meanLogit: weighted / sumExp };
}

/**
 * @param logits `[T, V]` row-major.
 * @param tokens `[T]` target token ids.
 * @param temperature τ > 0 (slime's `rollout_temperature`, default 1).
 * @returns `logProbs` `[T]` and `entropy` `[T]`, float64.
 */
export function logProbsAndEntropyFromLogits(
  logits: Logits,
  tokens: Vec,
  vocabSize: number,
  temperature = 1,
): { logProbs: Float64Array; entropy: Float64Array } {
  const n = checkShape(logits, tokens, vocabSize, temperature);
  const invTemp = 1 / temperature;
  const logProbs = new Float64Array(n);
  const entropy = new Float64Array(n);
  for (let t = 0; t < n; t++) {
    const off = t * vocabSize;
    const s = rowStats(logits, off, vocabSize, invTemp);
    const lse = s.max + Math.log(s.sumExp);
    logProbs[t] = at(logits, off + at(tokens, t)) * invTemp - lse;
    entropy[t] = lse - s.meanLogit;
  }
  return { logProbs, entropy };
}

/**
 * Backward pass to the raw logits, given d loss / d logp_t and d loss / d H_t
 * (both from `computePolicyLossTerms`):
 *
 *   d logp_t / d z_v = (1[v = y_t] − p_v) / τ
 *   d H_t    / d z_v = p_v · (Σ_u p_u z'_u − z'_v) / τ
 *
 * @returns `[T, V]` row-major d loss / d logits, float64.
 */
export function logitsGradient(logits: Logits, tokens: Vec, vocabSize: number, temperature: number, dLoss_dLogp: Vec, dLoss_dEntropy?: Vec): Float64Array {
  const n = checkShape(logits, tokens, vocabSize, temperature);
  assertLength(dLoss_dLogp, n, "dLoss_dLogp");
  if (dLoss_dEntropy !== undefined) assertLength(dLoss_dEntropy, n, "dLoss_dEntropy");
  const invTemp = 1 / temperature;
  const grad = new Float64Array(n * vocabSize);
  for (let t = 0; t < n; t++) {
    const gLogp = at(dLoss_dLogp, t);
    const gEnt = dLoss_dEntropy === undefined ? 0 : at(dLoss_dEntropy, t);
    if (gLogp === 0 && gEnt === 0) continue;
    const off = t * vocabSize;
    const s = rowStats(logits, off, vocabSize, invTemp);
    for (let v = 0; v < vocabSize; v++) {
      const z = at(logits, off + v) * invTemp;
      const p = Math.exp(z - s.max) / s.sumExp;
      grad[off + v] = p > 0 ? (-gLogp * p + gEnt * p * (s.meanLogit - z)) * invTemp : 0;
    }
    const y = off + at(tokens, t);
    grad[y] = at(grad, y) + gLogp * invTemp;
  }
  return grad;
}
