import type { SamplingParams } from "../engines/engine.ts";
import type { RunConfig } from "../config/run-config.ts";

/** A call's sampling params without its token budget and seed (those are per call). */
export type RunSampling = Omit<SamplingParams, "maxNewTokens" | "seed">;

/**
 * The one place a run config becomes sampling params: slime's
 * `rollout_temperature`, `rollout_top_p`, `rollout_top_k` (`eval_*` override
 * them for evals when set) and `rollout_stop_token_ids`, which default to the
 * tokenizer's EOS when the list is empty. Used by rollout rounds, custom
 * generate functions and both eval paths, so they cannot drift apart.
 */
export function runSampling(c: RunConfig, use: "rollout" | "eval", eosId: number): RunSampling {
  const isEval = use === "eval";
  return {
    temperature: (isEval ? c.eval_temperature : null) ?? c.rollout_temperature,
    topP: (isEval ? c.eval_top_p : null) ?? c.rollout_top_p,
    topK: (isEval ? c.eval_top_k : null) ?? c.rollout_top_k,
    stopTokenIds: c.rollout_stop_token_ids.length > 0 ? c.rollout_stop_token_ids : [eosId],
  };
}

/** How many tokens an eval sample may generate: `eval_max_response_len`, else `rollout_max_response_len`. */
export function evalMaxNewTokens(c: RunConfig): number {
  return c.eval_max_response_len ?? c.rollout_max_response_len;
}
