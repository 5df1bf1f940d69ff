/**
 * How per-token values become one number: slime's `get_sum_of_sample_mean`
 * (slime/backends/megatron_utils/cp_utils.py:47-124) together with the scaling in
 * `loss_function` and `reduce_train_step_metrics`. The same reduction is used for
 * the loss and for every metric.
 *
 * Default (per-rollout mean of token means):
 *
 *   agg(x) = (1/R) · Σ_i Σ_t x_it · m_it / max(D_i, 1)
 *   D_i    = Σ over the samples j sharing sample i's rollout id of Σ_t d_jt   (slime: rollout_mask_sums)
 *   R      = the number of distinct rollout ids in the step (every sample is its own rollout by default)
 *
 * `calculate_per_token_loss` (global token mean):
 *
 *   agg(x) = Σ_i Σ_t x_it · m_it / N,   N = Σ_i max(Σ_t d_it, 1)
 *
 * so a fully masked sample still adds 1 to N. Rollout ids do not matter here.
 *
 * m is the loss mask (numerators), d the denominator mask (defaults to m). They
 * differ when tokens are zeroed after the denominators were fixed: MIS rejection
 * (slime rebuilds the reducer with the rejection masks but keeps `rollout_mask_sums`
 * and `num_tokens` from the original masks), and, in rlq's design,
 * `mask_offpolicy_in_partial_rollout` (see docs/algorithms.md: slime itself zeroes
 * that mask before the sums are taken, so to match slime pass d = m there).
 *
 * The loss is linear in x, so d agg / d x_it = weights[i][t]: the trainer's gradient.
 */

import { algorithmError, assertLength, assertRaggedLike, at, maskSum, row, type Ragged, type Vec } from "./ragged.ts";

export interface AggregationOptions {
  /** Default false (slime default). */
  calculate_per_token_loss?: boolean;
  /** `[B][T_i]` mask whose sums are the denominators. Default: the loss mask. */
  denomMask?: Ragged;
  /** `[B]` samples with equal ids share one denominator (agent fan-out). Default: all distinct. */
  rolloutIds?: ArrayLike<number | string>;
  /**
   * `[B]` D_i given directly, for a call that sees one micro-batch of a larger step
   * (the whole rollout's mask sum, as slime precomputes at the step level).
   */
  sampleDenominators?: Vec;
  /**
   * R (default mode) or N (per-token mode) given directly, for a micro-batch of a
   * larger step: the count for the whole step. Default: computed from this batch.
   */
  normalizer?: number;
}

export interface Aggregator {
  /** `[B][T_i]` d agg(x) / d x_it. Zero on masked tokens. */
  weights: Float64Array[];
  /** R or N as used (never below 1). */
  normalizer: number;
  /** `[B]` D_i (default mode; per-token mode reports Σ_t d_it). */
  sampleDenominators: Float64Array;
  /** agg(x) = Σ_it x_it · weights_it. */
  reduce(x: Ragged): number;
}

/** `Σ_it x_it · w_it`. */
export function weightedSum(x: Ragged, weights: readonly Float64Array[]): number {
  assertRaggedLike(x, weights, "x", "weights");
  let s = 0;
  for (let i = 0; i < x.length; i++) {
    const xi = row(x, i, "x");
    const wi = weights[i] as Float64Array;
    for (let t = 0; t < xi.length; t++) {
      const w = at(wi, t);
      if (w !== 0) s += at(xi, t) * w;
    }
  }
  return s;
}

/**
 * Builds the reduction for a batch with loss mask `lossMask` (`[B][T_i]`).
 */
export function makeAggregator(lossMask: Ragged, options: AggregationOptions = {}): Aggregator {
  if (options.calculate_per_token_loss !== undefined && typeof options.calculate_per_token_loss !== "boolean") {
    throw algorithmError("badArgument", `aggregation: calculate_per_token_loss must be true or false, got ${JSON.stringify(options.calculate_per_token_loss)}`);
  }
  if (options.normalizer !== undefined && !(typeof options.normalizer === "number" && options.normalizer > 0 && Number.isFinite(options.normalizer))) {
    throw algorithmError(
      "badArgument",
      `aggregation: normalizer must be a positive number (the step's sample or token count), got ${JSON.stringify(options.normalizer)}`,
    );
  }
  const denomMask = options.denomMask ?? lossMask;
  assertRaggedLike(denomMask, lossMask, "denomMask", "lossMask");
  const b = lossMask.length;
  const ownSums = Float64Array.from({ length: b }, (_, i) => maskSum(row(denomMask, i, "denomMask")));
  const perToken = options.calculate_per_token_loss ?? false;

  let sampleDenominators: Float64Array;
  let normalizer: number;
  if (perToken) {
    sampleDenominators = ownSums;
    normalizer = options.normalizer ?? ownSums.reduce((s, v) => s + Math.max(v, 1), 0);
  } else {
    const ids = options.rolloutIds;
    if (ids !== undefined) assertLength(ids, b, "rolloutIds");
    const key = (i: number): number | string => (ids === undefined ? i : (ids[i] as number | string));
    const totals = new Map<number | string, number>();
    for (let i = 0; i < b; i++) totals.set(key(i), (totals.get(key(i)) ?? 0) + at(ownSums, i));
    if (options.sampleDenominators !== undefined) {
      assertLength(options.sampleDenominators, b, "sampleDenominators");
      sampleDenominators = Float64Array.from(options.sampleDenominators);
    } else {
      sampleDenominators = Float64Array.from({ length: b }, (_, i) => totals.get(key(i)) ?? 0);
    }
    normalizer = options.normalizer ?? totals.size;
  }
  if (!(normalizer >= 0) || !Number.isFinite(normalizer)) {
    throw algorithmError("badArgument", `aggregation normalizer must be a finite number >= 0, got ${normalizer}`);
  }
  normalizer = Math.max(normalizer, 1);

  const weights = lossMask.map((m, i) => {
    const scale = perToken ? 1 / normalizer : 1 / Math.max(at(sampleDenominators, i), 1) / normalizer;
    const w = new Float64Array(m.length);
    for (let t = 0; t < m.length; t++) w[t] = at(m, t) * scale;
    return w;
  });
  return { weights, normalizer, sampleDenominators, reduce: (x) => weightedSum(x, weights) };
}

/** One-shot: agg(x) with loss mask `lossMask`. */
export function aggregate(x: Ragged, lossMask: Ragged, options: AggregationOptions = {}): number {
  return makeAggregator(lossMask, options).reduce(x);
}
