/**
 * Advantage estimators: slime's `compute_advantages_and_returns`
 * (slime/backends/megatron_utils/loss.py:704-881). Run once per rollout over the
 * whole batch (whitening statistics span every sample), before any train step.
 *
 * | estimator                        | A_t                                                         | returns |
 * |----------------------------------|-------------------------------------------------------------|---------|
 * | grpo, gspo, cispo                | the sample's (normalised) reward on every token; KL ignored | A       |
 * | reinforce_plus_plus              | discounted Σ of r_t = −kl_coef·kl_t·m_t (+ reward at the last m=1 token) | A |
 * | reinforce_plus_plus_baseline     | reward − kl_coef·kl_t (reward already group-centred)        | A       |
 * | ppo                              | GAE over r_t = −kl_coef·kl_t (+ reward at the LAST token)   | A + V   |
 */

import { computeApproxKl } from "./kl.ts";
import { type AlgorithmOptions, resolveOptions } from "./options.ts";
import { algorithmError, assertLength, assertRaggedLike, at, row, type Ragged, type Vec, zerosLike, assertFiniteArgument } from "./ragged.ts";
import { discountedReturns, gae } from "./returns.ts";
import { maskedWhiten } from "./whiten.ts";

export type AdvantageOptions = Pick<
  AlgorithmOptions,
  "advantage_estimator" | "kl_coef" | "kl_loss_type" | "gamma" | "lambd" | "normalize_advantages" | "use_rollout_logprobs" | "use_opd" | "opd_kl_coef"
>;

export interface AdvantageInput {
  /** `[B]` rewards after `postProcessRewards` (normalised for grpo-family, raw for rpp/ppo). */
  rewards: Vec;
  /** `[B][T_i]` loss masks; their lengths are the response lengths. */
  lossMask: Ragged;
  /** `[B][T_i]` old (trainer-recomputed) log-probs. Needed for the shaping KL (kl_coef ≠ 0) and OPD. */
  oldLogProbs?: Ragged;
  /** `[B][T_i]` engine log-probs; replace `oldLogProbs` when `use_rollout_logprobs`. */
  rolloutLogProbs?: Ragged;
  /** `[B][T_i]` reference-model log-probs (kl_coef ≠ 0). */
  refLogProbs?: Ragged;
  /** `[B][T_i]` critic values (ppo). */
  values?: Ragged;
  /** `[B][T_i]` teacher log-probs (use_opd). */
  teacherLogProbs?: Ragged;
}

export interface AdvantageOutput {
  /** `[B][T_i]` after OPD and whitening. */
  advantages: Float64Array[];
  /** `[B][T_i]` the critic's regression target (ppo); for the others the un-whitened advantages. */
  returns: Float64Array[];
  /** `[B][T_i]` the reward-shaping KL (zeros when kl_coef = 0). */
  kl: Float64Array[];
}

/** grpo/gspo/cispo: `A_t = reward_i` on every response token. */
export function grpoAdvantages(rewards: Vec, responseLengths: ArrayLike<number>): Float64Array[] {
  assertLength(responseLengths, rewards.length, "responseLengths");
  return Array.from({ length: rewards.length }, (_, i) => new Float64Array(at(responseLengths, i)).fill(at(rewards, i)));
}

/**
 * reinforce_plus_plus (`get_reinforce_plus_plus_returns`): token rewards
 * `r_t = −kl_coef·kl_t·m_t`, plus the raw reward at the LAST index with m = 1,
 * then `G_t = r_t + γ G_{t+1}` over the whole response (masked tokens included).
 *
 * Deliberate difference: slime asserts that no sample is fully masked. rlq allows it
 * (a resumed partial sample can be masked entirely) and adds the reward nowhere, so
 * the sample's returns are all 0 and it contributes nothing.
 */
export function reinforcePlusPlusReturns(rewards: Vec, kl: Ragged, lossMask: Ragged, klCoef: number, gamma: number): Float64Array[] {
  assertFiniteArgument("reinforcePlusPlusReturns", "klCoef (kl_coef)", klCoef);
  assertFiniteArgument("reinforcePlusPlusReturns", "gamma", gamma);
  assertLength(kl, rewards.length, "kl");
  assertRaggedLike(lossMask, kl, "lossMask", "kl");
  return kl.map((k, i) => {
    const m = row(lossMask, i, "lossMask");
    const tokenRewards = new Float64Array(k.length);
    let last = -1;
    for (let t = 0; t < k.length; t++) {
      tokenRewards[t] = -klCoef * (at(k, t) * at(m, t));
      if (at(m, t) !== 0) last = t;
    }
    if (last >= 0) tokenRewards[last] = at(tokenRewards, last) + at(rewards, i);
    return discountedReturns(tokenRewards, gamma);
  });
}

/** reinforce_plus_plus_baseline: `A_t = reward_i − kl_coef·kl_t` (not masked). */
export function reinforcePlusPlusBaselineAdvantages(rewards: Vec, kl: Ragged, klCoef: number): Float64Array[] {
  assertFiniteArgument("reinforcePlusPlusBaselineAdvantages", "klCoef (kl_coef)", klCoef);
  assertLength(kl, rewards.length, "kl");
  return kl.map((k, i) => {
    const out = new Float64Array(k.length);
    for (let t = 0; t < k.length; t++) out[t] = at(rewards, i) - klCoef * at(k, t);
    return out;
  });
}

/**
 * ppo: token rewards `r_t = −kl_coef·kl_t` (not masked) plus the reward at index
 * T−1 (the last token, masked or not), then GAE with the critic's values.
 * An empty response gives empty arrays (slime would index [-1] of nothing).
 */
export function ppoAdvantages(
  rewards: Vec,
  kl: Ragged,
  values: Ragged,
  klCoef: number,
  gamma: number,
  lambd: number,
): { advantages: Float64Array[]; returns: Float64Array[] } {
  assertFiniteArgument("ppoAdvantages", "klCoef (kl_coef)", klCoef);
  assertLength(kl, rewards.length, "kl");
  assertRaggedLike(values, kl, "values", "kl");
  const advantages: Float64Array[] = [];
  const returns: Float64Array[] = [];
  kl.forEach((k, i) => {
    const tokenRewards = new Float64Array(k.length);
    for (let t = 0; t < k.length; t++) tokenRewards[t] = at(k, t) * -klCoef;
    if (k.length > 0) tokenRewards[k.length - 1] = at(tokenRewards, k.length - 1) + at(rewards, i);
    const r = gae(tokenRewards, row(values, i, "values"), gamma, lambd);
    advantages.push(r.advantages);
    returns.push(r.returns);
  });
  return { advantages, returns };
}

const advantageKeys = [
  "advantage_estimator",
  "kl_coef",
  "kl_loss_type",
  "gamma",
  "lambd",
  "normalize_advantages",
  "use_rollout_logprobs",
  "use_opd",
  "opd_kl_coef",
] as const;

/**
 * Computes advantages and returns for the batch, then (optionally) OPD and masked
 * whitening, in slime's order. See the table above. `options` are slime-named; a
 * key left out takes slime's default, a bad one is an algo_bad_argument error naming it.
 */
export function computeAdvantagesAndReturns(input: AdvantageInput, partialOptions: Partial<AdvantageOptions> = {}): AdvantageOutput {
  const options: AdvantageOptions = resolveOptions("computeAdvantagesAndReturns", partialOptions, advantageKeys);
  const { rewards, lossMask } = input;
  assertLength(lossMask, rewards.length, "lossMask");
  const policyLogProbs = options.use_rollout_logprobs ? input.rolloutLogProbs : input.oldLogProbs;
  const policyName = options.use_rollout_logprobs ? "rolloutLogProbs" : "oldLogProbs";
  const est = options.advantage_estimator;
  const usesKl = est === "reinforce_plus_plus" || est === "reinforce_plus_plus_baseline" || est === "ppo";

  let kl: Float64Array[];
  if (options.kl_coef === 0) {
    kl = zerosLike(lossMask);
  } else {
    // slime silently uses zero KL when it has no log-probs; rlq refuses instead.
    if (usesKl && (policyLogProbs === undefined || input.refLogProbs === undefined)) {
      throw algorithmError("missingInput", `kl_coef = ${options.kl_coef} with ${est} needs ${policyName} and refLogProbs`);
    }
    if (policyLogProbs === undefined || input.refLogProbs === undefined) {
      kl = zerosLike(lossMask);
    } else {
      assertRaggedLike(policyLogProbs, lossMask, policyName, "lossMask");
      assertRaggedLike(input.refLogProbs, lossMask, "refLogProbs", "lossMask");
      const ref = input.refLogProbs;
      kl = policyLogProbs.map((lp, i) => computeApproxKl(lp, row(ref, i, "refLogProbs"), options.kl_loss_type));
    }
  }

  let advantages: Float64Array[];
  let returns: Float64Array[];
  switch (est) {
    case "grpo":
    case "gspo":
    case "cispo":
      returns = grpoAdvantages(
        rewards,
        lossMask.map((m) => m.length),
      );
      advantages = returns.map((r) => Float64Array.from(r));
      break;
    case "reinforce_plus_plus":
      returns = reinforcePlusPlusReturns(rewards, kl, lossMask, options.kl_coef, options.gamma);
      advantages = returns.map((r) => Float64Array.from(r));
      break;
    case "reinforce_plus_plus_baseline":
      advantages = reinforcePlusPlusBaselineAdvantages(rewards, kl, options.kl_coef);
      returns = advantages; // slime: `returns = advantages` aliases the list, so OPD below shows in returns too
      break;
    case "ppo": {
      if (input.values === undefined) throw algorithmError("missingInput", "advantage_estimator ppo needs critic values");
      assertRaggedLike(input.values, lossMask, "values", "lossMask");
      ({ advantages, returns } = ppoAdvantages(rewards, kl, input.values, options.kl_coef, options.gamma, options.lambd));
      break;
    }
    default:
      throw algorithmError("badArgument", `unknown advantage_estimator "${String(est)}"`);
  }

  if (options.use_opd) {
    // A_t −= opd_kl_coef · (log π_student − log π_teacher), student = the policy log-probs above.
    const teacher = input.teacherLogProbs;
    if (policyLogProbs === undefined || teacher === undefined) {
      throw algorithmError("missingInput", `use_opd needs ${policyName} and teacherLogProbs`);
    }
    assertRaggedLike(teacher, lossMask, "teacherLogProbs", "lossMask");
    const opd = advantages.map((a, i) => {
      const s = row(policyLogProbs, i, policyName);
      const te = row(teacher, i, "teacherLogProbs");
      const out = new Float64Array(a.length);
      for (let t = 0; t < a.length; t++) out[t] = at(a, t) - options.opd_kl_coef * (at(s, t) - at(te, t));
      return out;
    });
    if (returns === advantages) returns = opd;
    advantages = opd;
  }

  if (options.normalize_advantages) advantages = maskedWhiten(advantages, lossMask).whitened;
  return { advantages, returns, kl };
}
