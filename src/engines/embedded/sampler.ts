/**
 * Token sampling for one request, in float64 on the host.
 *
 * The reported log-prob is log softmax(logits / temperature)[token] over the
 * FULL vocabulary, before top-k/top-p truncation: that is what the trainer
 * recomputes (docs/algorithms.md), so truncation shows up as a measured mismatch, not a
 * silent bias. Randomness comes only from the request's own stream (one uniform
 * per token), so a request's tokens do not depend on what else is batched.
 */

import type { Prng } from "../../model/prng.ts";

export interface SamplingConfig {
  temperature: number;
  topP: number;
  /** <= 0 disables (slime's default is -1). */
  topK: number;
}

export interface SampledToken {
  token: number;
  logProb: number;
}

/**
 * @param logits float32 logits holding one row: [vocab] at `offset` (the whole array by default;
 *   an offset into a batch's logits saves a view per row; give `vocab` with it)
 * @param u uniform draw in [0, 1) from the request's stream
 * @param noise optional [vocab] additive logit noise (the injected-mismatch option)
 */
export function sampleToken(
  logits: ArrayLike<number>,
  config: SamplingConfig,
  u: number,
  noise?: ArrayLike<number>,
  offset = 0,
  vocab = logits.length,
): SampledToken {
  if (offset + vocab > logits.length) throw new RangeError(`sampleToken: row [${offset}, ${offset + vocab}) outside ${logits.length} logits`);
  const n = vocab;
  // Scratch rows reused across calls: one allocation per call was a visible share of a small
  // model's decode tick (bench/embedded-model.ts). Same arithmetic, in the same order, as before.
  if (scratchZ.length < n) {
    scratchZ = new Float64Array(n);
    scratchP = new Float64Array(n);
  }
  const z = scratchZ;
  const p = scratchP;
  let max = -Infinity;
  for (let i = 0; i < n; i++) {
    const v = (logits[offset + i]! + (noise ? noise[i]! : 0)) / config.temperature;
    z[i] = v;
    if (v > max) max = v;
  }
  let sum = 0;
  for (let i = 0; i < n; i++) sum += p[i] = Math.exp(z[i]! - max);
  const lse = max + Math.log(sum);
  for (let i = 0; i < n; i++) p[i] = p[i]! / sum;

  const truncate = (config.topK > 0 && config.topK < n) || config.topP < 1;
  if (!truncate) {
    // The whole vocabulary in id order, mass 1.
    let target = u;
    let token = n - 1;
    for (let i = 0; i < n; i++) {
      target -= p[i]!;
      if (target < 0) {
        token = i;
        break;
      }
    }
    return { token, logProb: z[token]! - lse };
  }
  // Descending probability, ties by lower id: a total order, so the kept set is deterministic.
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => p[b]! - p[a]! || a - b);
  if (config.topK > 0 && config.topK < n) order.length = config.topK;
  let kept = 0;
  for (const i of order) kept += p[i]!;
  if (config.topP < 1) {
    // top-p over the top-k-renormalised distribution (SGLang/HF order): smallest prefix reaching topP.
    let cum = 0;
    let cut = order.length;
    for (let j = 0; j < order.length; j++) {
      cum += p[order[j]!]! / kept;
      if (cum >= config.topP) {
        cut = j + 1;
        break;
      }
    }
    order.length = cut;
  }
  let mass = 0;
  for (const i of order) mass += p[i]!;

  let target = u * mass;
  let token = order[order.length - 1]!;
  for (const i of order) {
    target -= p[i]!;
    if (target < 0) {
      token = i;
      break;
    }
  }
  return { token, logProb: z[token]! - lse };
}

let scratchZ = new Float64Array(0);
let scratchP = new Float64Array(0);

/** [vocab] Gaussian logit noise from the request's noise stream (std 0 → undefined). */
export function logitNoise(rng: Prng | null, vocab: number, std: number): Float64Array | undefined {
  if (!rng || std <= 0) return undefined;
  const out = new Float64Array(vocab);
  for (let i = 0; i < vocab; i++) out[i] = rng.nextNormal() * std;
  return out;
}
