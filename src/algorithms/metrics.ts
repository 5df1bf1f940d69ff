/**
 * Train-step metrics, named as slime reports them (`policy_loss_function`,
 * loss.py:1105-1170). Every metric is a per-token quantity reduced with the same
 * aggregation as the loss (aggregation.ts), so with the default reduction a metric
 * is the mean over rollouts of per-rollout token means, and with
 * `calculate_per_token_loss` the global token mean.
 *
 * Two reducers are in play once TIS/MIS runs: the off-policy metrics (`ois`, `tis*`,
 * `mis_*`) use the PRE-rejection loss mask, everything else uses the post-rejection
 * mask (both with the original denominators).
 */

import type { Aggregator } from "./aggregation.ts";
import { assertRaggedLike, at, row, type Ragged } from "./ragged.ts";

export const policyMetricNames = {
  loss: "total loss: pg_loss − entropy_coef·entropy_loss + kl_loss_coef·kl_loss",
  pg_loss: "policy-gradient loss (after OPSM and TIS/MIS weights)",
  entropy_loss: "mean entropy of the policy at the trained tokens",
  pg_clipfrac: "fraction of tokens whose clipped surrogate was larger (PPO) / whose ratio was clipped (CISPO)",
  ppo_kl: "mean of old − logp (GSPO: the sequence value on every token)",
  kl_loss: "mean KL-loss estimate (use_kl_loss)",
  ois: "mean PPO ratio exp(logp − old) (use_tis / get_mismatch_metrics)",
  tis: "mean TIS ratio ρ = exp(old − rollout) (vanilla / icepop)",
  tis_clipfrac: "fraction of tokens whose TIS weight differs from ρ",
  tis_abs: "mean |ρ − 1|",
  opsm_clipfrac: "per-sample fraction of tokens OPSM zeroed, reduced like the others",
  train_rollout_logprob_abs_diff: "mean |old − rollout| (|logp − rollout| with use_rollout_logprobs)",
  "mis_*": "MIS metrics (tis_function mis), see mis.ts",
} as const;

/** `|a − b|` per token: e.g. train_rollout_logprob_abs_diff before reduction. */
export function absDiff(a: Ragged, b: Ragged): Float64Array[] {
  assertRaggedLike(b, a, "b", "a");
  return a.map((ai, i) => {
    const bi = row(b, i, "b");
    const out = new Float64Array(ai.length);
    for (let t = 0; t < ai.length; t++) out[t] = Math.abs(at(ai, t) - at(bi, t));
    return out;
  });
}

/** Reduces each token-shaped metric with `aggregator`, prefixing its name. */
export function reduceTokenMetrics(metrics: Readonly<Record<string, Ragged>>, aggregator: Aggregator, prefix = ""): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [key, value] of Object.entries(metrics)) out[prefix + key] = aggregator.reduce(value);
  return out;
}
