/**
 * The MIS family: decoupled importance sampling plus rejection sampling, from
 * slime's examples/train_infer_mismatch_helper/mis.py (`compute_mis_weights`),
 * selected with `tis_function: mis` (slime: `--custom-tis-function-path
 * ...mis.compute_mis_weights_with_cp`). Per sample, with raw log-ratio
 * `δ_t = old_t − rol_t` and its loss mask m:
 *
 *   level   token: δ_t;  sequence: Σ_t δ_t m_t;  geometric: Σ_t δ_t m_t / max(Σ m, 1)
 *   w_t     = exp(clamp(level log-ratio, −20, 20))
 *   mode    truncate: w = clamp(w, 0, U)·m;  clip: w = clamp(w, L, U)·m;
 *           mask: w = w·m and mask ← m·1[L ≤ w ≤ U]          (L defaults to 1/U)
 *   RS      (use_rs) mask ← mask·1[L_rs ≤ w_rs ≤ U_rs], w_rs from rs_level (bounds default to the tis ones)
 *   veto    (rs_veto_threshold τ) mask ← 0 for the whole sample if any m=1 token has δ_t < log τ
 *   batch   (tis_batch_normalize) w ← w / mean, mean over trained tokens (token level) or over
 *           per-sample masked means (sequence level), when mean > 1e-8; geometric is refused
 *
 * The weights multiply pg_loss (constants). The rejection mask replaces the loss mask
 * in every numerator, while every denominator keeps the original mask sums.
 * Batch normalisation is over the batch passed in (slime: over one micro-batch).
 */

import { type AlgorithmOptions, type MisLevel, resolveOptions, resolvedMisBounds } from "./options.ts";
import { algorithmError, assertRaggedLike, at, maskedMean, maskedSum, maskSum, row, type Ragged, type Vec } from "./ragged.ts";

/** Log-ratios are clamped to ±20 before exp (slime's SAFETY_BOUND). */
export const MIS_LOG_RATIO_BOUND = 20;

export type MisOptions = Pick<
  AlgorithmOptions,
  | "tis_level"
  | "tis_mode"
  | "tis_lower_bound"
  | "tis_upper_bound"
  | "use_rs"
  | "rs_level"
  | "rs_lower_bound"
  | "rs_upper_bound"
  | "rs_veto_threshold"
  | "tis_batch_normalize"
>;

export interface MisResult {
  /** `[B][T_i]` IS weights (0 at masked tokens); null when `useTis` is false (metrics only). */
  weights: Float64Array[] | null;
  /** `[B][T_i]` the loss mask after mask-mode rejection, RS and veto. */
  modifiedMask: Float64Array[];
  /** Token-shaped metrics `[B][T_i]`, slime's names without the `mis_` prefix. */
  metrics: Record<string, Float64Array[]>;
}

const clampLog = (x: number): number => Math.min(Math.max(x, -MIS_LOG_RATIO_BOUND), MIS_LOG_RATIO_BOUND);

function levelLogRatio(raw: Float64Array, m: Vec, level: MisLevel): Float64Array {
  if (level === "token") return raw;
  const v = level === "sequence" ? maskedSum(raw, m) : maskedMean(raw, m);
  return new Float64Array(raw.length).fill(v);
}

function filled(n: number, v: number): Float64Array {
  return new Float64Array(n).fill(v);
}

function map(x: Float64Array, f: (v: number, t: number) => number): Float64Array {
  const out = new Float64Array(x.length);
  for (let t = 0; t < x.length; t++) out[t] = f(at(x, t), t);
  return out;
}

/** The mismatch metrics slime logs for every sample (`add_ppl_metrics`). */
function addPplMetrics(train: Vec, rollout: Vec, m: Vec, push: (key: string, v: Float64Array) => void): void {
  const n = train.length;
  const lr = new Float64Array(n);
  for (let t = 0; t < n; t++) lr[t] = at(train, t) - at(rollout, t);
  const meanTrain = maskedMean(train, m);
  const meanRollout = maskedMean(rollout, m);
  push("training_log_ppl", filled(n, -meanTrain));
  push("training_ppl", filled(n, Math.exp(-meanTrain)));
  push("rollout_log_ppl", filled(n, -meanRollout));
  push("rollout_ppl", filled(n, Math.exp(-meanRollout)));
  push(
    "kl",
    map(lr, (v) => -v),
  );
  push(
    "k3_kl",
    map(lr, (v) => Math.exp(v) - v - 1),
  );
  const logPplDiff = meanRollout - meanTrain;
  push("log_ppl_diff", filled(n, logPplDiff));
  push("log_ppl_abs_diff", filled(n, Math.abs(logPplDiff)));
  push("ppl_ratio", filled(n, Math.exp(logPplDiff)));
  push(
    "chi2_token",
    filled(
      n,
      maskedMean(
        map(lr, (v) => Math.exp(clampLog(v)) ** 2),
        m,
      ) - 1,
    ),
  );
  push("chi2_seq", filled(n, Math.exp(2 * clampLog(maskedSum(lr, m))) - 1));
}

/** The MIS options (slime's examples/train_infer_mismatch_helper/mis.yaml); they act only with tis_function: mis. */
export const misKeys = [
  "tis_level",
  "tis_mode",
  "tis_lower_bound",
  "tis_upper_bound",
  "use_rs",
  "rs_level",
  "rs_lower_bound",
  "rs_upper_bound",
  "rs_veto_threshold",
  "tis_batch_normalize",
] as const;

/**
 * `compute_mis_weights` over the batch.
 *
 * @param trainLogProbs `[B][T_i]` π_old (recomputed; the detached current log-probs if none).
 * @param rolloutLogProbs `[B][T_i]` π_rollout.
 * @param lossMask `[B][T_i]`
 * @param useTis false: only the mismatch metrics (slime's `get_mismatch_metrics` without `use_tis`).
 */
export function computeMisWeights(
  trainLogProbs: Ragged,
  rolloutLogProbs: Ragged,
  lossMask: Ragged,
  options: Partial<MisOptions> = {},
  useTis = true,
): MisResult {
  // A key left out takes mis.yaml's default; a bad one is an algo_bad_argument error naming it.
  const o: MisOptions = resolveOptions("computeMisWeights", options, misKeys);
  assertRaggedLike(rolloutLogProbs, trainLogProbs, "rolloutLogProbs", "trainLogProbs");
  assertRaggedLike(lossMask, trainLogProbs, "lossMask", "trainLogProbs");
  const metrics: Record<string, Float64Array[]> = {};
  const push = (key: string, v: Float64Array): void => {
    (metrics[key] ??= []).push(v);
  };
  trainLogProbs.forEach((tr, i) => addPplMetrics(tr, row(rolloutLogProbs, i, "rolloutLogProbs"), row(lossMask, i, "lossMask"), push));
  if (!useTis) return { weights: null, modifiedMask: lossMask.map((m) => Float64Array.from(m)), metrics };

  const b = resolvedMisBounds(o);
  // slime's clip()/mask() assert lower < upper.
  if (o.tis_mode !== "truncate" && !(b.tisLower < b.tisUpper)) {
    throw algorithmError("badArgument", `MIS ${o.tis_mode} mode needs tis_lower_bound (${b.tisLower}) < tis_upper_bound (${b.tisUpper})`);
  }
  if (o.use_rs && !(b.rsLower < b.rsUpper)) {
    throw algorithmError("badArgument", `MIS rejection needs rs_lower_bound (${b.rsLower}) < rs_upper_bound (${b.rsUpper})`);
  }
  if (o.tis_batch_normalize && o.tis_level === "geometric") {
    throw algorithmError("badArgument", "tis_batch_normalize is not defined for tis_level geometric");
  }
  const inRange = (w: number, lo: number, hi: number): number => (w >= lo && w <= hi ? 1 : 0);
  let weights: Float64Array[] = [];
  const modifiedMask: Float64Array[] = [];
  trainLogProbs.forEach((tr, i) => {
    const rol = row(rolloutLogProbs, i, "rolloutLogProbs");
    const m = Float64Array.from(row(lossMask, i, "lossMask"));
    const n = tr.length;
    const raw = new Float64Array(n);
    for (let t = 0; t < n; t++) raw[t] = at(tr, t) - at(rol, t);
    let mod: Float64Array = Float64Array.from(m);

    const lrTis = levelLogRatio(raw, m, o.tis_level);
    let w = map(lrTis, (v) => Math.exp(clampLog(v)));
    push("tis_weight_before_bound", w);
    if (o.tis_mode === "truncate") {
      push(
        "tis_truncate_fraction",
        map(w, (v) => (v > b.tisUpper ? 1 : 0)),
      );
      w = map(w, (v, t) => Math.min(Math.max(v, 0), b.tisUpper) * at(m, t));
    } else if (o.tis_mode === "clip") {
      push(
        "tis_clip_fraction_low",
        map(w, (v) => (v < b.tisLower ? 1 : 0)),
      );
      push(
        "tis_clip_fraction_high",
        map(w, (v) => (v > b.tisUpper ? 1 : 0)),
      );
      w = map(w, (v, t) => Math.min(Math.max(v, b.tisLower), b.tisUpper) * at(m, t));
    } else {
      push(
        "tis_mask_fraction_low",
        map(w, (v) => (v < b.tisLower ? 1 : 0)),
      );
      push(
        "tis_mask_fraction_high",
        map(w, (v) => (v > b.tisUpper ? 1 : 0)),
      );
      const src = w;
      mod = map(m, (mv, t) => mv * inRange(at(src, t), b.tisLower, b.tisUpper));
      w = map(w, (v, t) => v * at(m, t));
    }
    push("tis_weight_after_bound", w);

    if (o.use_rs) {
      const lrRs = o.rs_level === o.tis_level ? lrTis : levelLogRatio(raw, m, o.rs_level);
      const rsW = map(lrRs, (v) => Math.exp(clampLog(v)));
      push(
        "rs_mask_fraction_low",
        map(rsW, (v) => (v < b.rsLower ? 1 : 0)),
      );
      push(
        "rs_mask_fraction_high",
        map(rsW, (v) => (v > b.rsUpper ? 1 : 0)),
      );
      const prev = mod;
      mod = map(prev, (mv, t) => mv * inRange(at(rsW, t), b.rsLower, b.rsUpper));
      if (o.rs_veto_threshold !== null) {
        const logVeto = Math.log(o.rs_veto_threshold);
        const catastrophic = map(raw, (v, t) => (v < logVeto && at(m, t) !== 0 ? 1 : 0));
        const hasCatastrophic = catastrophic.some((v) => v !== 0);
        push("rs_catastrophic_token_fraction", catastrophic);
        push("rs_catastrophic_seq_fraction", filled(n, hasCatastrophic ? 1 : 0));
        if (hasCatastrophic) mod = new Float64Array(n);
      }
    }
    push("is_ratio_mean_after_tis_rs", w);
    weights.push(w);
    modifiedMask.push(mod);
  });

  if (o.tis_batch_normalize) {
    let mean: number;
    if (o.tis_level === "token") {
      let s = 0;
      let c = 0;
      weights.forEach((w, i) => {
        const m = row(lossMask, i, "lossMask");
        s += maskedSum(w, m);
        c += maskSum(m);
      });
      mean = s / Math.max(c, 1);
    } else if (o.tis_level === "sequence") {
      let s = 0;
      weights.forEach((w, i) => (s += maskedMean(w, row(lossMask, i, "lossMask"))));
      mean = weights.length > 0 ? s / weights.length : 0;
    } else {
      throw algorithmError("badArgument", "tis_batch_normalize is not defined for tis_level geometric");
    }
    if (mean > 1e-8) {
      weights = weights.map((w) => map(w, (v) => v / mean));
      for (const w of weights) push("batch_norm_factor", filled(w.length, mean));
    } else {
      for (const w of weights) push("batch_norm_factor", filled(w.length, 1));
    }
  }

  weights.forEach((w, i) => {
    const m = row(lossMask, i, "lossMask");
    // masked_min / masked_max: over tokens with m ≠ 0, and 0 for a fully masked sample.
    let lo = Infinity;
    let hi = -Infinity;
    for (let t = 0; t < w.length; t++) {
      if (at(m, t) === 0) continue;
      lo = Math.min(lo, at(w, t));
      hi = Math.max(hi, at(w, t));
    }
    push("is_ratio_mean_final", filled(w.length, maskedMean(w, m)));
    push("is_ratio_min_final", filled(w.length, lo === Infinity ? 0 : lo));
    push("is_ratio_max_final", filled(w.length, hi === -Infinity ? 0 : hi));
  });
  return { weights, modifiedMask, metrics };
}
