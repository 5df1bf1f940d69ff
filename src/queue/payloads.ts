import { z } from "zod";

/**
 * Queue names, job payloads and deterministic job ids. Payloads carry ids,
 * never per-token data (that lives in Postgres). Ids use '-' separators:
 * BullMQ refuses most ids containing ':'.
 */
export const queueKinds = ["rollout", "reward", "train", "eval"] as const;
export type QueueKind = (typeof queueKinds)[number];

export const rolloutJobSchema = z.object({
  runId: z.string(),
  groupId: z.number().int().nonnegative(),
  round: z.number().int().nonnegative(),
  step: z.number().int().nonnegative(),
  weightVersion: z.number().int().nonnegative(),
});
export type RolloutJob = z.infer<typeof rolloutJobSchema>;

export const rewardJobSchema = z.object({
  runId: z.string(),
  groupId: z.number().int().nonnegative(),
  round: z.number().int().nonnegative(),
  step: z.number().int().nonnegative(),
});
export type RewardJob = z.infer<typeof rewardJobSchema>;

export const trainJobSchema = z.object({
  runId: z.string(),
  step: z.number().int().nonnegative(),
});
export type TrainJob = z.infer<typeof trainJobSchema>;

export const evalJobSchema = z.object({ runId: z.string(), step: z.number().int().nonnegative() });
export type EvalJob = z.infer<typeof evalJobSchema>;

export const jobSchemas = { rollout: rolloutJobSchema, reward: rewardJobSchema, train: trainJobSchema, eval: evalJobSchema } as const;
export type JobData<K extends QueueKind> = z.infer<(typeof jobSchemas)[K]>;

export const jobIds = {
  rollout: (j: { runId: string; groupId: number; round: number }) => `gen-${j.runId}-${j.groupId}-${j.round}`,
  reward: (j: { runId: string; groupId: number; round: number }) => `rwd-${j.runId}-${j.groupId}-${j.round}`,
  train: (j: { runId: string; step: number }) => `train-${j.runId}-${j.step}`,
  eval: (j: { runId: string; step: number }) => `eval-${j.runId}-${j.step}`,
} as const;

/** Request id of one sample's generation call: what `abort` refers to. */
export function requestId(runId: string, groupId: number, sampleIndex: number, segmentIndex: number): string {
  return `${runId}-${groupId}-${sampleIndex}-${segmentIndex}`;
}

/** A failed job's reason starts with this when retrying cannot help (bad plugin, bad data). */
export const UNRECOVERABLE_PREFIX = "[unrecoverable] ";
