import { type AggregationOptions, makeAggregator } from "./aggregation.ts";
import { klLossWithGrad } from "./kl.ts";
import { absDiff, reduceTokenMetrics } from "./metrics.ts";
import { computeMisWeights } from "./mis.ts";
import { icepop, resolveOldLogProbs, tisTrainLogProbs, vanillaTis } from "./off-policy.ts";
import { type AlgorithmOptions, type AlgorithmOptionsInput, algorithmOptionsShape, effectiveEpsClipHigh, resolveOptions } from "./options.ts";
import { computeCispoLoss, computeGspoKl, computeOpsmMask, computePolicyLoss } from "./policy-loss.ts";
import { algorithmError, assertRaggedLike, at, maskSum, row, type Ragged, type Vec } from "./ragged.ts";

const allOptionKeys = Object.keys(algorithmOptionsShape) as Array<keyof AlgorithmOptions>;

/**
 * The one entry the trainers call per (micro-)batch: slime's `policy_loss_function`
 * (slime/backends/megatron_utils/loss.py:940-1170) as a pure function, returning
 * the scalar loss, its per-token pieces, the exact gradient of the scalar loss
 * w.r.t. every current log-prob and entropy, and the step metrics.
 *
 * Order of operations (slime's):
 *  1. old = rollout log-probs (use_rollout_logprobs) | recomputed old | detached logp;
 *  2. ppo_kl = old − logp per token, or GSPO's masked sequence mean broadcast;
 *  3. pg = PPO clip (+ dual clip) on ratio = exp(−ppo_kl), or CISPO;
 *  4. pg ·= OPSM mask (use_opsm);
 *  5. pg ·= TIS weight (use_tis; vanilla | icepop | mis); MIS may also reject tokens,
 *     which then drop out of every numerator while the denominators stay put;
 *  6. loss = agg(pg) − entropy_coef·agg(H) + kl_loss_coef·agg(KL(logp‖ref)) (use_kl_loss).
 *
 * Gradients: OPSM masks, TIS/MIS weights and CISPO's clipped ratio are constants;
 * the KL-loss importance ratio (use_unbiased_kl) is not (slime leaves it attached).
 */
export interface PolicyLossInput {
  /** `[B][T_i]` current log π_θ of each response token. */
  logProbs: Ragged;
  /** `[B][T_i]` π_old, recomputed by the trainer at the start of the step. Absent: logProbs, as constants. */
  oldLogProbs?: Ragged;
  /** `[B][T_i]` reference log-probs (use_kl_loss). */
  refLogProbs?: Ragged;
  /** `[B][T_i]` engine log-probs (use_rollout_logprobs, use_tis, get_mismatch_metrics; metrics otherwise). */
  rolloutLogProbs?: Ragged;
  /** `[B][T_i]` from `computeAdvantagesAndReturns`. */
  advantages: Ragged;
  /** `[B][T_i]` 1 = trained token. */
  lossMask: Ragged;
  /** `[B][T_i]` whose sums are the denominators. Default: lossMask. */
  denomMask?: Ragged;
  /** `[B][T_i]` policy entropy at each token (from `logProbsAndEntropyFromLogits`). Needed when entropy_coef ≠ 0. */
  entropy?: Ragged;
  /** `[B]` samples with equal ids share a denominator. Default: all distinct. */
  rolloutIds?: ArrayLike<number | string>;
  /** Micro-batch support, see `AggregationOptions`. */
  sampleDenominators?: Vec;
  normalizer?: number;
}

export interface PolicyLossTerms {
  /** The scalar loss to minimise. */
  loss: number;
  /** `[B][T_i]` x_it with loss = Σ_it x_it · weights_it: c·pg − entropy_coef·H + kl_loss_coef·kl. */
  tokenLoss: Float64Array[];
  /** `[B][T_i]` policy loss after OPSM and TIS/MIS weights. */
  pgLoss: Float64Array[];
  /** `[B][T_i]` KL-loss estimate, or null without use_kl_loss. */
  klLoss: Float64Array[] | null;
  /** `[B][T_i]` d loss / d logp_it (the current log-probs). */
  dLoss_dLogp: Float64Array[];
  /** `[B][T_i]` d loss / d H_it (= −entropy_coef · weights_it). */
  dLoss_dEntropy: Float64Array[];
  /** `[B][T_i]` aggregation weights with the effective (post-rejection) mask. */
  weights: Float64Array[];
  /** `[B][T_i]` the effective loss mask (lossMask, or MIS's rejection mask). */
  effectiveLossMask: Float64Array[];
  /** `[B][T_i]` the TIS/MIS weights applied, or null. */
  tisWeights: Float64Array[] | null;
  /** slime's reported names, see metrics.ts. */
  metrics: Record<string, number>;
}

function need(x: Ragged | undefined, like: Ragged, name: string, why: string): Ragged {
  if (x === undefined) throw algorithmError("missingInput", `${why} needs ${name}`);
  assertRaggedLike(x, like, name, "logProbs");
  return x;
}

/**
 * @param options slime-named options, parsed here (defaults applied). Only the
 * per-field schema runs: config-level rules such as "reinforce_plus_plus needs
 * normalize_advantages" belong to the run config (`refineAlgorithmOptions`), while
 * the rules the math itself needs (eps_clip_c > 1, MIS bound order, no batch
 * normalisation at the geometric level) are checked where they apply.
 */
export function computePolicyLossTerms(input: PolicyLossInput, options: AlgorithmOptionsInput | AlgorithmOptions = {}): PolicyLossTerms {
  const o = resolveOptions("computePolicyLossTerms", options, allOptionKeys);
  const { logProbs, advantages, lossMask } = input;
  assertRaggedLike(advantages, logProbs, "advantages", "logProbs");
  assertRaggedLike(lossMask, logProbs, "lossMask", "logProbs");
  const old = resolveOldLogProbs(input, o.use_rollout_logprobs);
  const isGspo = o.advantage_estimator === "gspo";
  const isCispo = o.advantage_estimator === "cispo";
  const epsHigh = effectiveEpsClipHigh(o);

  // 2. ppo_kl
  const ppoKl: Float64Array[] = isGspo
    ? computeGspoKl(logProbs, old, lossMask)
    : logProbs.map((lp, i) => {
        const od = row(old, i, "old");
        return Float64Array.from({ length: lp.length }, (_, t) => at(od, t) - at(lp, t));
      });

  // 3. per-token pg and its local derivative (w.r.t. the ratio for PPO, w.r.t. logp for CISPO)
  const pg: Float64Array[] = [];
  const clipfrac: Float64Array[] = [];
  const localGrad: Float64Array[] = [];
  const ratio: Float64Array[] = [];
  ppoKl.forEach((kl, i) => {
    const adv = row(advantages, i, "advantages");
    const r = Float64Array.from(kl, (v) => Math.exp(-v));
    ratio.push(r);
    if (isCispo) {
      const c = computeCispoLoss(kl, row(logProbs, i, "logProbs"), adv, o.eps_clip, epsHigh);
      pg.push(c.loss);
      clipfrac.push(c.clipfrac);
      localGrad.push(c.dLoss_dLogp);
    } else {
      const p = computePolicyLoss(kl, adv, o.eps_clip, epsHigh, o.eps_clip_c);
      pg.push(p.loss);
      clipfrac.push(p.clipfrac);
      localGrad.push(p.dLoss_dRatio);
    }
  });
  // c_it: the constant factor pg is multiplied by (OPSM mask × TIS weight).
  const factor = pg.map((p) => new Float64Array(p.length).fill(1));
  const scaleBy = (m: readonly Float64Array[]): void => {
    factor.forEach((f, i) => {
      const mi = m[i] as Float64Array;
      for (let t = 0; t < f.length; t++) f[t] = at(f, t) * at(mi, t);
    });
  };

  // 4. OPSM
  let opsmClipfracSum: number | null = null;
  if (o.use_opsm) {
    const opsm = computeOpsmMask(logProbs, old, advantages, lossMask, o.opsm_delta);
    scaleBy(opsm.mask);
    opsmClipfracSum = opsm.clipfracSum;
  }

  // 5. TIS / MIS
  let effectiveLossMask: Float64Array[] = lossMask.map((m) => Float64Array.from(m));
  let tisWeights: Float64Array[] | null = null;
  const offPolicyMetrics: Record<string, Ragged> = {};
  if (o.use_tis || o.get_mismatch_metrics) {
    const why = o.use_tis ? "use_tis" : "get_mismatch_metrics";
    const rollout = need(input.rolloutLogProbs, logProbs, "rolloutLogProbs", why);
    const train = tisTrainLogProbs(input);
    assertRaggedLike(train, logProbs, "oldLogProbs", "logProbs");
    offPolicyMetrics.ois = ratio;
    if (o.tis_function === "mis") {
      const mis = computeMisWeights(train, rollout, lossMask, o, o.use_tis);
      for (const [k, v] of Object.entries(mis.metrics)) offPolicyMetrics[`mis_${k}`] = v;
      if (mis.weights !== null) {
        tisWeights = mis.weights;
        effectiveLossMask = mis.modifiedMask;
      }
    } else {
      const fn = o.tis_function === "icepop" ? icepop : vanillaTis;
      const tis = fn(train, rollout, { tis_clip: o.tis_clip, tis_clip_low: o.tis_clip_low });
      Object.assign(offPolicyMetrics, { tis: tis.ratio, tis_clipfrac: tis.clipfrac, tis_abs: tis.abs });
      if (o.use_tis) tisWeights = tis.weights;
    }
    if (tisWeights !== null) scaleBy(tisWeights);
  }
  const pgLoss = pg.map((p, i) => {
    const f = factor[i] as Float64Array;
    return Float64Array.from(p, (v, t) => v * at(f, t));
  });

  // Aggregation: numerators with the effective mask, denominators from the original one.
  const aggOptions: AggregationOptions = {
    calculate_per_token_loss: o.calculate_per_token_loss,
    denomMask: input.denomMask ?? lossMask,
    ...(input.rolloutIds !== undefined && { rolloutIds: input.rolloutIds }),
    ...(input.sampleDenominators !== undefined && { sampleDenominators: input.sampleDenominators }),
    ...(input.normalizer !== undefined && { normalizer: input.normalizer }),
  };
  const agg = makeAggregator(effectiveLossMask, aggOptions);
  const aggPre = makeAggregator(lossMask, aggOptions);
  const W = agg.weights;

  // 6. entropy and KL loss
  if (o.entropy_coef !== 0 && input.entropy === undefined) throw algorithmError("missingInput", "entropy_coef ≠ 0 needs entropy");
  const entropy = input.entropy === undefined ? null : need(input.entropy, logProbs, "entropy", "entropy");
  let kl: { value: Float64Array; grad: Float64Array }[] | null = null;
  if (o.use_kl_loss) {
    const ref = need(input.refLogProbs, logProbs, "refLogProbs", "use_kl_loss");
    kl = logProbs.map((lp, i) => klLossWithGrad(lp, row(ref, i, "refLogProbs"), o.kl_loss_type, o.use_unbiased_kl ? row(old, i, "old") : undefined));
  }

  const tokenLoss = pgLoss.map((p, i) => {
    const h = entropy === null ? null : row(entropy, i, "entropy");
    const k = kl === null ? null : (kl[i] as { value: Float64Array }).value;
    return Float64Array.from(p, (v, t) => v - (h === null ? 0 : o.entropy_coef * at(h, t)) + (k === null ? 0 : o.kl_loss_coef * at(k, t)));
  });

  // Gradient w.r.t. logp.
  const dLoss_dLogp = logProbs.map((lp, i) => {
    const w = W[i] as Float64Array;
    const f = factor[i] as Float64Array;
    const g = localGrad[i] as Float64Array;
    const r = ratio[i] as Float64Array;
    const out = new Float64Array(lp.length);
    if (isGspo) {
      // ratio_i is shared by the sample: d ratio_i / d logp_is = ratio_i · m_is / max(Σ m_i, 1).
      const m = row(lossMask, i, "lossMask");
      let s = 0;
      for (let t = 0; t < lp.length; t++) s += at(w, t) * at(f, t) * at(g, t);
      const coef = (s * (lp.length > 0 ? at(r, 0) : 0)) / Math.max(maskSum(m), 1);
      for (let t = 0; t < lp.length; t++) out[t] = coef * at(m, t);
    } else {
      for (let t = 0; t < lp.length; t++) out[t] = at(w, t) * at(f, t) * at(g, t) * (isCispo ? 1 : at(r, t));
    }
    if (kl !== null) {
      const kg = (kl[i] as { grad: Float64Array }).grad;
      for (let t = 0; t < lp.length; t++) out[t] = at(out, t) + o.kl_loss_coef * at(w, t) * at(kg, t);
    }
    return out;
  });
  const dLoss_dEntropy = W.map((w) => Float64Array.from(w, (v) => -o.entropy_coef * v));

  // Metrics.
  const pgLossValue = agg.reduce(pgLoss);
  const metrics: Record<string, number> = {
    pg_loss: pgLossValue,
    pg_clipfrac: agg.reduce(clipfrac),
    ppo_kl: agg.reduce(ppoKl),
  };
  let loss = pgLossValue;
  if (entropy !== null) {
    metrics.entropy_loss = agg.reduce(entropy);
    loss -= o.entropy_coef * metrics.entropy_loss;
  }
  if (kl !== null) {
    metrics.kl_loss = agg.reduce(kl.map((k) => k.value));
    loss += o.kl_loss_coef * metrics.kl_loss;
  }
  metrics.loss = loss;
  if (input.rolloutLogProbs !== undefined) {
    const rollout = need(input.rolloutLogProbs, logProbs, "rolloutLogProbs", "train_rollout_logprob_abs_diff");
    metrics.train_rollout_logprob_abs_diff = agg.reduce(absDiff(o.use_rollout_logprobs ? logProbs : old, rollout));
  }
  Object.assign(metrics, reduceTokenMetrics(offPolicyMetrics, aggPre));
  if (opsmClipfracSum !== null) metrics.opsm_clipfrac = opsmClipfracSum / agg.normalizer;

  return {
    loss,
    tokenLoss,
    pgLoss,
    klLoss: kl === null ? null : kl.map((k) => k.value),
    dLoss_dLogp,
    dLoss_dEntropy,
    weights: W,
    effectiveLossMask,
    tisWeights,
    metrics,
  };
}
