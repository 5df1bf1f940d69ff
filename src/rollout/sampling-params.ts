import type { SamplingParams } from "../engines/engine.ts";
import type { RunConfig } from "../config/run-config.ts";
import type { EvalDataset } from "../config/eval-datasets.ts";

/** A call's sampling params without its token budget and seed (those are per call). */
export type RunSampling = Omit<SamplingParams, "maxNewTokens" | "seed">;

/** `rollout_stop_token_ids`, or the tokenizer's EOS when the list is empty. */
const stopTokens = (c: RunConfig, eosId: number): number[] => (c.rollout_stop_token_ids.length > 0 ? c.rollout_stop_token_ids : [eosId]);

/**
 * The one place a run config becomes rollout sampling params: slime's `rollout_temperature`,
 * `rollout_top_p`, `rollout_top_k` and `rollout_stop_token_ids`. Used by rollout rounds and custom
 * generate functions, so they cannot drift apart.
 */
export function runSampling(c: RunConfig, eosId: number): RunSampling {
  return { temperature: c.rollout_temperature, topP: c.rollout_top_p, topK: c.rollout_top_k, stopTokenIds: stopTokens(c, eosId) };
}

/**
 * An eval dataset's sampling params, token budget included: its settings as config/eval-datasets.ts
 * resolved them (the dataset's own, else the eval_* keys, else the rollout_* ones), for both eval
 * paths (the built-in eval and a rollout function's).
 */
export function evalSampling(
  d: Pick<EvalDataset, "temperature" | "topP" | "topK" | "maxResponseLen">,
  c: RunConfig,
  eosId: number,
): Omit<SamplingParams, "seed"> {
  return { temperature: d.temperature, topP: d.topP, topK: d.topK, stopTokenIds: stopTokens(c, eosId), maxNewTokens: d.maxResponseLen };
}
