import { algorithmError, assertRaggedLike, at, row, type Ragged } from "./ragged.ts";

/** The epsilon of `distributed_masked_whiten`, added to the variance. */
export const WHITEN_EPS = 1e-8;

export interface WhitenStats {
  mean: number;
  /** The (Bessel-corrected when n ≥ 2) variance the values were divided by, before adding epsilon. */
  variance: number;
  /** Σ mask. */
  count: number;
}

/**
 * Masked whitening over every token of the batch: slime's
 * `distributed_masked_whiten(values, mask, shift_mean=True, epsilon=1e-8)`
 * (slime/utils/distributed_utils.py:111-171), where the batch is all samples the
 * advantages were computed for (slime: the DP×CP group, i.e. the whole rollout).
 *
 *   n  = Σ m,   μ = Σ A·m / n,   σ² = (Σ A²·m / n − μ²) · n/(n−1)   (the factor only when n ≥ 2)
 *   A ← (A − μ) / sqrt(σ² + 1e-8)                                     applied to EVERY token, masked ones too
 *
 * The variance keeps slime's one-pass form (E[A²] − μ²) so results match it.
 * With `shiftMean: false` the mean is added back.
 *
 * @throws algo_empty_mask when Σ m = 0 (slime raises ValueError).
 */
export function maskedWhiten(
  values: Ragged,
  mask: Ragged,
  options: { shiftMean?: boolean; epsilon?: number } = {},
): { whitened: Float64Array[]; stats: WhitenStats } {
  assertRaggedLike(mask, values, "mask", "values");
  let sum = 0;
  let sumSq = 0;
  let count = 0;
  for (let i = 0; i < values.length; i++) {
    const v = row(values, i, "values");
    const m = row(mask, i, "mask");
    for (let t = 0; t < v.length; t++) {
      const a = at(v, t);
      const w = at(m, t);
      sum += a * w;
      sumSq += a * a * w;
      count += w;
    }
  }
  if (count === 0) throw algorithmError("emptyMask", "advantage whitening: the mask of the whole batch sums to 0");
  const mean = sum / count;
  let variance = sumSq / count - mean * mean;
  if (count >= 2) variance = variance * (count / (count - 1));
  const scale = 1 / Math.sqrt(variance + (options.epsilon ?? WHITEN_EPS));
  const shiftBack = options.shiftMean === false ? mean : 0;
  const whitened = values.map((v) => {
    const out = new Float64Array(v.length);
    for (let t = 0; t < v.length; t++) out[t] = (at(v, t) - mean) * scale + shiftBack;
    return out;
  });
  return { whitened, stats: { mean, variance, count } };
}
