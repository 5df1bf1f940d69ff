/**
 * Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on
 * Code"), as slime's `_estimate_pass_at_k` (slime/observability/metric_utils.py):
 *
 *   pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i),   and 1 when n − c < k
 *
 * The product form never builds a binomial coefficient, so it is stable for any n.
 * Deliberate difference: slime returns 1 for k > n when c = 0 (its n − c < k guard
 * fires); rlq refuses k > n, where the estimator is undefined.
 *
 * @param n samples drawn for the problem (≥ 1).
 * @param c of them correct (0 ≤ c ≤ n).
 * @param k 1 ≤ k ≤ n.
 */

import { algorithmError, at, type Vec } from "./ragged.ts";

export function passAtK(n: number, c: number, k: number): number {
  if (!Number.isInteger(n) || n < 1) throw algorithmError("badArgument", `pass@k: n must be an integer >= 1, got ${n}`);
  if (!Number.isInteger(c) || c < 0 || c > n) throw algorithmError("badArgument", `pass@k: c must be an integer in [0, ${n}], got ${c}`);
  if (!Number.isInteger(k) || k < 1 || k > n) throw algorithmError("badArgument", `pass@k: k must be an integer in [1, ${n}], got ${k}`);
  if (n - c < k) return 1;
  let prod = 1;
  for (let i = n - c + 1; i <= n; i++) prod *= 1 - k / i;
  return 1 - prod;
}

/**
 * Mean pass@k over problems, each given as its samples' rewards; a sample counts as
 * correct when `isCorrect(reward)` (slime: reward == 1).
 *
 * @param rewardsByProblem one `[n_j]` array per problem (problems may differ in n).
 */
export function meanPassAtK(rewardsByProblem: readonly Vec[], k: number, isCorrect: (reward: number) => boolean = (r) => r === 1): number {
  if (rewardsByProblem.length === 0) throw algorithmError("badArgument", "pass@k: no problems");
  let s = 0;
  for (const rewards of rewardsByProblem) {
    let c = 0;
    for (let i = 0; i < rewards.length; i++) if (isCorrect(at(rewards, i))) c++;
    s += passAtK(rewards.length, c, k);
  }
  return s / rewardsByProblem.length;
}
