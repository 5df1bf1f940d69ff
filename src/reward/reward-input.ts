/**
 * What an in-process reward function sees of a sample: the response text,
 * the dataset label (any JSON value: slime labels are str, int, float or
 * None, and some rm_types read a dict) and the sample's metadata
 * (`rm_type`, gpqa's `choices`, ...).
 */

import { z } from "zod";
import type { RewardResult } from "./reward-result.ts";

export const rewardInputSchema = z.object({
  response: z.string(),
  label: z.unknown(),
  metadata: z.record(z.string(), z.unknown()).default({}),
});
export type RewardInput = z.input<typeof rewardInputSchema>;

/** A rule-based reward: pure, synchronous, deterministic for a given input and options. */
export type RewardFunction = (input: RewardInput) => RewardResult;
