/**
 * slime `dynamic_sampling_filters.py`: DAPO's dynamic sampling. A group whose
 * rewards are all equal carries no GRPO signal (every advantage is 0), so it
 * is dropped and replaced by over-sampling.
 */

import { pyFloatRepr, pyRound } from "../reward/python-compat.ts";
import type { DynamicFilterOutput, RewardGroup } from "./dynamic-filter.ts";
import { FilterError } from "./filter-error.ts";

/** The std threshold below which a group counts as "all rewards equal". */
export const NONZERO_STD_EPSILON = 1e-6;

/**
 * `torch.tensor(rewards, dtype=float64).std()`: the UNBIASED sample std
 * (divides by n-1), in float64. One reward gives NaN (0/0), as in torch.
 */
export function unbiasedStd(values: readonly number[]): number {
  const n = values.length;
  if (n < 2) return Number.NaN;
  let sum = 0;
  for (const v of values) sum += v;
  const mean = sum / n;
  let sq = 0;
  for (const v of values) sq += (v - mean) * (v - mean);
  return Math.sqrt(sq / (n - 1));
}

/**
 * The drop reason `zero_std_{round(r0, 1)}` with Python's round (half to
 * even on the exact binary value) and Python's float repr: 1 →
 * `zero_std_1.0`, 0 → `zero_std_0.0`, -1 → `zero_std_-1.0`, 0.25 →
 * `zero_std_0.2`. (slime prints `zero_std_1` when the reward is a Python
 * int, as `math` returns; JSON numbers have no int/float distinction, so rlq
 * always prints the float form.)
 */
export function zeroStdReason(firstReward: number): string {
  return `zero_std_${pyFloatRepr(pyRound(firstReward, 1))}`;
}

/**
 * slime `check_reward_nonzero_std`: keep iff the unbiased std of the group's
 * rewards is > 1e-6. A group of ONE sample has NaN std and is therefore
 * always dropped (so this filter needs n_samples_per_prompt >= 2). NaN
 * rewards also drop. An empty group is a caller bug: FilterError `empty_group`.
 */
export function checkRewardNonzeroStd(group: RewardGroup): DynamicFilterOutput {
  const first = group.rewards[0];
  if (first === undefined) throw new FilterError("empty_group", `group ${group.groupId} has no rewards to filter on`);
  const keep = unbiasedStd(group.rewards) > NONZERO_STD_EPSILON;
  return { keep, reason: keep ? null : zeroStdReason(first), keep_when_insufficient: false };
}

/**
 * slime `check_reward_nonzero_std_with_fallback`: the same verdict, but a
 * zero-std group is still kept when dropping it would force another
 * over-sampling round (`keep_when_insufficient`).
 */
export function checkRewardNonzeroStdWithFallback(group: RewardGroup): DynamicFilterOutput {
  return { ...checkRewardNonzeroStd(group), keep_when_insufficient: true };
}
