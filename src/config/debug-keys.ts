/**
 * slime's debug replay (slime/utils/arguments.py: --save-debug-rollout-data,
 * --load-debug-rollout-data, --debug-train-only, --debug-rollout-only; used in
 * slime/ray/rollout.py and train.py). slime saves each rollout to a file and loads it back in a
 * train-only run; rlq keeps every rollout in Postgres already, so the source of a train-only run
 * is another run's history (src/controller/recorded-collect.ts), and a rollout-only run is a run
 * whose steps end at the seal (src/controller/sync-step.ts).
 */

import { z } from "zod";

export const debugKeys = {
  /**
   * Train only (slime's --debug-train-only with --load-debug-rollout-data): the id of a recorded
   * run whose samples (tokens, loss masks, rollout log-probs, token versions, rewards) this run
   * trains on, draw ordinal for draw ordinal, with no engine. The source must have the same
   * dataset, seed-driven draws, rollout_batch_size and n_samples_per_prompt (checked at start).
   */
  debug_rollouts_from: z.string().min(1).nullable().default(null),
  /** Rollout only (slime's --debug-rollout-only): generate and score, record history, never train. */
  debug_rollout_only: z.boolean().default(false),
};

interface DebugRuleInput {
  debug_rollouts_from: string | null;
  debug_rollout_only: boolean;
  loss_type: string;
  train_async: boolean;
  partial_rollout: boolean;
  rollout_function_path: string | null;
}

/** What the debug modes refuse: each message names the key, the value, and what to write instead. */
export function refineDebug(c: DebugRuleInput, ctx: z.RefinementCtx): void {
  const issue = (path: string, message: string) => ctx.addIssue({ code: "custom", path: [path], message });
  if (c.debug_rollout_only && c.debug_rollouts_from !== null)
    issue("debug_rollout_only", "debug_rollout_only trains nothing and debug_rollouts_from generates nothing: set one of them");
  const mode = c.debug_rollouts_from !== null ? "debug_rollouts_from" : c.debug_rollout_only ? "debug_rollout_only" : null;
  if (mode === null) return;
  if (c.train_async) issue("train_async", `${mode} runs in sync mode only: set train_async: false`);
  if (c.loss_type !== "policy_loss") issue("loss_type", `${mode} replays or records RL rollouts: set loss_type: policy_loss`);
  if (c.debug_rollouts_from !== null) {
    if (c.partial_rollout) issue("partial_rollout", "debug_rollouts_from trains recorded groups whole: set partial_rollout: false");
    if (c.rollout_function_path !== null)
      issue("rollout_function_path", "debug_rollouts_from takes its rollouts from the recorded run: remove rollout_function_path");
  }
}

/** A train-only run: its rounds are a recorded run's (controller/recorded-collect.ts). */
export function isReplayRun(c: { debug_rollouts_from?: string | null }): boolean {
  return c.debug_rollouts_from !== undefined && c.debug_rollouts_from !== null;
}

/** A rollout-only run: each step ends at its seal, no train job (controller/sync-step.ts). */
export function isRolloutOnly(c: { debug_rollout_only?: boolean }): boolean {
  return c.debug_rollout_only === true;
}
