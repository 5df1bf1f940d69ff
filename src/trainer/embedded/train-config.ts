/**
 * The run-config keys the embedded trainer reads (slime/Megatron names, same
 * defaults as src/config/run-config.ts). Not strict: the trainer receives the
 * whole run config and ignores what it does not use. Keys that the run config
 * does not (yet) expose fall back to Megatron's defaults.
 */

import { z } from "zod";
import { parseAlgorithmOptions, type AlgorithmOptions } from "../../algorithms/options.ts";
import { RlqError } from "../../lib/errors.ts";

export const embeddedTrainConfigSchema = z.object({
  lr: z.number().positive().default(1e-6),
  min_lr: z.number().nonnegative().default(0),
  lr_decay_style: z.enum(["constant", "linear", "cosine"]).default("constant"),
  lr_warmup_iters: z.number().int().nonnegative().default(0),
  /** Optimizer steps over which linear/cosine decay to min_lr. null: num_rollout × steps per rollout. */
  lr_decay_iters: z.number().int().positive().nullable().default(null),
  weight_decay: z.number().nonnegative().default(0),
  adam_beta1: z.number().min(0).lt(1).default(0.9),
  adam_beta2: z.number().min(0).lt(1).default(0.999),
  adam_eps: z.number().positive().default(1e-8),
  clip_grad: z.number().positive().default(1.0),
  global_batch_size: z.number().int().positive().nullable().default(null),
  num_steps_per_rollout: z.number().int().positive().default(1),
  num_rollout: z.number().int().positive().nullable().default(null),
  /** Logits are divided by it before log-probs, as the engine does when sampling. */
  rollout_temperature: z.number().positive().default(1.0),
  /** Initial and reference checkpoint (directory, weights file or file:// URI). */
  ref_load: z.string().min(1).nullable().default(null),
  /** Seeds initialisation when there is no checkpoint at all. */
  seed: z.number().int().nonnegative().default(1234),
  /**
   * Micro-batch budget in padded tokens (rows × the step's bucketed length): a global batch's
   * forward and gradient run in micro-batches of at most this many tokens, gradients summed
   * (the loss and its denominators stay the global batch's). null: one micro-batch.
   */
  max_tokens_per_gpu: z.number().int().positive().nullable().default(null),
});
export type EmbeddedTrainConfig = z.infer<typeof embeddedTrainConfigSchema>;

export interface ParsedTrainConfig {
  train: EmbeddedTrainConfig;
  algorithm: AlgorithmOptions;
}

/** Throws a ZodError naming the field on a bad value. */
export function parseTrainConfig(config: Record<string, unknown>): ParsedTrainConfig {
  return { train: embeddedTrainConfigSchema.parse(config), algorithm: parseAlgorithmOptions(config) };
}

/**
 * Samples per optimizer step and the number of optimizer steps for `numSamples`
 * (slime: global_batch_size, else rollout samples / num_steps_per_rollout).
 */
export function optimizerStepPlan(train: EmbeddedTrainConfig, numSamples: number): { globalBatchSize: number; numOptimizerSteps: number } {
  const globalBatchSize = train.global_batch_size ?? numSamples / train.num_steps_per_rollout;
  if (!Number.isInteger(globalBatchSize) || globalBatchSize <= 0 || numSamples % globalBatchSize !== 0) {
    throw new RlqError("config_invalid", `global_batch_size: ${numSamples} samples do not split into whole global batches of ${globalBatchSize}`);
  }
  return { globalBatchSize, numOptimizerSteps: numSamples / globalBatchSize };
}
