/**
 * SFT as a run mode (docs/sft.md). slime trains SFT with `--loss-type sft_loss` and its
 * `slime.rollout.sft_rollout.generate_rollout`, which turns each dataset row into a sample
 * without an engine. rlq keeps the same run (draws, steps, epochs, evals, history, resume) and
 * swaps the collect phase: the controller writes each drawn row's response as the group's
 * round (src/controller/sft-collect.ts) and the trainer minimises its negative log-likelihood.
 */

import { z } from "zod";

export const sftKeys = {
  /**
   * slime's --loss-type. policy_loss: RL (the default). sft_loss: supervised fine-tuning on the
   * rows' responses (the row's label_key field), no rollouts.
   */
  loss_type: z.enum(["policy_loss", "sft_loss"]).default("policy_loss"),
};

/** The parts of a run config the SFT rules read. */
interface SftRuleInput {
  loss_type: "policy_loss" | "sft_loss";
  label_key: string | null;
  n_samples_per_prompt: number;
  train_async: boolean;
  partial_rollout: boolean;
  rollout_function_path: string | null;
  custom_generate_function_path: string | null;
  dynamic_sampling_filter_path: string | null;
  over_sampling_batch_size: number | null;
  rollout_batch_size: number;
  eval_prompt_data: Record<string, string | { label_key?: string | null }> | null;
  eval_label_key: string | null;
}

/**
 * What SFT runs refuse: everything that only means something for sampled responses. Each
 * message names the key, the value, and what to write instead.
 */
export function refineSft(c: SftRuleInput, ctx: z.RefinementCtx): void {
  if (c.loss_type !== "sft_loss") return;
  const issue = (path: string, message: string) => ctx.addIssue({ code: "custom", path: [path], message });
  if (c.label_key === null) issue("label_key", "loss_type sft_loss trains on each row's response, read from label_key: set label_key to the field holding it");
  if (c.n_samples_per_prompt !== 1)
    issue("n_samples_per_prompt", `loss_type sft_loss has one response per row: set n_samples_per_prompt: 1 (got ${c.n_samples_per_prompt})`);
  if (c.train_async) issue("train_async", "loss_type sft_loss has no rollouts to overlap: set train_async: false");
  if (c.partial_rollout) issue("partial_rollout", "loss_type sft_loss has no rollouts to continue: set partial_rollout: false");
  if (c.rollout_function_path !== null)
    issue(
      "rollout_function_path",
      "loss_type sft_loss feeds dataset rows to the trainer itself (slime's sft_rollout is built in): remove rollout_function_path",
    );
  if (c.custom_generate_function_path !== null)
    issue("custom_generate_function_path", "loss_type sft_loss generates nothing: remove custom_generate_function_path");
  // An eval dataset without a label key of its own would grade against label_key: the training response.
  const unlabelled = Object.entries(c.eval_prompt_data ?? {})
    .filter(([, e]) => c.eval_label_key === null && (typeof e === "string" || e.label_key === undefined))
    .map(([name]) => name);
  if (unlabelled.length > 0)
    issue(
      "eval_label_key",
      `loss_type sft_loss reads the training response from label_key, which the evals (${unlabelled.join(", ")}) would grade against: set eval_label_key (or the dataset's label_key) to the eval rows' answer field (e.g. label)`,
    );
  if (c.dynamic_sampling_filter_path !== null)
    issue("dynamic_sampling_filter_path", "loss_type sft_loss trains every drawn row (there are no rewards to filter on): remove dynamic_sampling_filter_path");
  if (c.over_sampling_batch_size !== null && c.over_sampling_batch_size !== c.rollout_batch_size)
    issue(
      "over_sampling_batch_size",
      `loss_type sft_loss draws exactly the rows it trains: leave over_sampling_batch_size out (got ${c.over_sampling_batch_size}, rollout_batch_size ${c.rollout_batch_size})`,
    );
}

/** True for an SFT run (the controller's collect phase and reconcile read it). */
export function isSftRun(c: { loss_type?: string }): boolean {
  return c.loss_type === "sft_loss";
}
