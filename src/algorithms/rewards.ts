/**
 * Reward post-processing before advantages: slime's
 * `RolloutManager._post_process_rewards` (slime/ray/rollout.py:608-632).
 *
 * Deliberate difference: slime reshapes the flat reward list to
 * `[-1, n_samples_per_prompt]` (or treats the whole batch as one group when the
 * length does not divide), which silently mixes prompts when a batch holds groups
 * of different sizes. rlq groups by each sample's group index, so any group sizes
 * and any order work; for full, contiguous groups the result is identical.
 */

import { type AdvantageEstimator, resolveOptions } from "./options.ts";
import { algorithmError, assertFiniteArgument, assertLength, at, type Vec } from "./ragged.ts";

/** The epsilon slime adds to the group std (not the variance). */
export const GROUP_STD_EPS = 1e-6;

/** A reward as a reward function returns it: a scalar, or named components. */
export type RewardValue = number | Readonly<Record<string, number>>;

/**
 * `Sample.get_reward_value`: the scalar to train on. With `rewardKey` the reward
 * must be a dict holding that key; without it, a scalar.
 */
export function getRewardValue(reward: RewardValue, rewardKey: string | null = null): number {
  if (rewardKey === null) {
    if (typeof reward !== "number") {
      throw algorithmError("badArgument", `reward is a dict (keys ${Object.keys(reward).join(", ")}) but reward_key is not set`);
    }
    return reward;
  }
  if (typeof reward === "number") {
    throw algorithmError("badArgument", `reward_key is "${rewardKey}" but the reward is the scalar ${reward}`);
  }
  const value = reward[rewardKey];
  if (typeof value !== "number") {
    throw algorithmError("badArgument", `reward has no numeric key "${rewardKey}" (keys ${Object.keys(reward).join(", ")})`);
  }
  return value;
}

/** Sample positions of each group, in first-seen order of group index. */
export function groupPositions(groupIndices: ArrayLike<number | string>): number[][] {
  const groups = new Map<number | string, number[]>();
  for (let i = 0; i < groupIndices.length; i++) {
    const g = groupIndices[i] as number | string;
    const members = groups.get(g);
    if (members === undefined) groups.set(g, [i]);
    else members.push(i);
  }
  return [...groups.values()];
}

export interface GroupNormalizeOptions {
  /** Divide the centred rewards by (unbiased std + eps). */
  useStd: boolean;
  /** Default 1e-6, added to the std. */
  eps?: number;
}

/**
 * Per group g: `r − mean_g(r)`, and with `useStd` then `/ (std_g + eps)` where
 * std is the unbiased (÷(G−1)) std of the centred rewards, as torch's `.std()`.
 *
 * Exactness: the mean is `r_0 + Σ(r_i − r_0)/G`, so an all-equal group centres to
 * exact zeros (a plain Σr/G can miss by an ulp, e.g. three 0.1s), and its std is
 * then exactly 0, giving exact zeros after the division too.
 *
 * A single-sample group centres to 0 and skips the division (torch's unbiased std
 * of one element is NaN; slime avoids it only by forcing std normalisation off
 * when n_samples_per_prompt = 1, which a by-index grouping cannot rely on).
 *
 * @param rewards `[numSamples]` scalar rewards.
 * @param groupIndices `[numSamples]` the group (prompt) each sample belongs to.
 * @returns `[numSamples]` in input order.
 */
export function groupNormalizeRewards(rewards: Vec, groupIndices: ArrayLike<number | string>, options: GroupNormalizeOptions): Float64Array {
  assertLength(groupIndices, rewards.length, "groupIndices");
  if (typeof options?.useStd !== "boolean")
    throw algorithmError(
      "badArgument",
      `groupNormalizeRewards: options.useStd must be true or false (grpo_std_normalization), got ${JSON.stringify(options?.useStd)}`,
    );
  const eps = options.eps ?? GROUP_STD_EPS;
  assertFiniteArgument("groupNormalizeRewards", "options.eps", eps);
  const out = new Float64Array(rewards.length);
  for (const members of groupPositions(groupIndices)) {
    const n = members.length;
    const r0 = at(rewards, members[0] as number);
    let shift = 0;
    for (const i of members) shift += at(rewards, i) - r0;
    const mean = r0 + shift / n;
    for (const i of members) out[i] = at(rewards, i) - mean;
    if (!options.useStd || n < 2) continue;
    // torch: rewards = rewards - mean; std = rewards.std() (recentres the centred values).
    let cSum = 0;
    for (const i of members) cSum += at(out, i);
    const cMean = cSum / n;
    let sq = 0;
    for (const i of members) {
      const d = at(out, i) - cMean;
      sq += d * d;
    }
    const std = Math.sqrt(sq / (n - 1));
    for (const i of members) out[i] = at(out, i) / (std + eps);
  }
  return out;
}

export interface PostProcessRewardOptions {
  advantage_estimator: AdvantageEstimator;
  rewards_normalization: boolean;
  grpo_std_normalization: boolean;
}

export interface PostProcessedRewards {
  /** `[numSamples]` the rewards as scored (slime's `raw_reward`, for logging and pass@k). */
  raw: Float64Array;
  /** `[numSamples]` what the advantage estimator consumes. */
  normalized: Float64Array;
}

/**
 * Applies group normalisation when slime would:
 * - estimator ∈ {grpo, gspo, cispo, reinforce_plus_plus_baseline} and `rewards_normalization`: centre per group;
 * - additionally for grpo/gspo/cispo with `grpo_std_normalization`: divide by (std + 1e-6).
 * reinforce_plus_plus and ppo get the raw rewards.
 */
export function postProcessRewards(
  rewards: Vec,
  groupIndices: ArrayLike<number | string>,
  partialOptions: Partial<PostProcessRewardOptions> = {},
): PostProcessedRewards {
  const options = resolveOptions("postProcessRewards", partialOptions, ["advantage_estimator", "rewards_normalization", "grpo_std_normalization"]);
  const raw = Float64Array.from(rewards);
  const est = options.advantage_estimator;
  const centred = est === "grpo" || est === "gspo" || est === "cispo" || est === "reinforce_plus_plus_baseline";
  if (!centred || !options.rewards_normalization) return { raw, normalized: Float64Array.from(raw) };
  const useStd = est !== "reinforce_plus_plus_baseline" && options.grpo_std_normalization;
  return { raw, normalized: groupNormalizeRewards(raw, groupIndices, { useStd }) };
}
