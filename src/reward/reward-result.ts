/**
 * What a reward function returns, built-in or plugin: a number, or a record
 * of named components (slime's dict reward, e.g. dapo's
 * `{score, acc, pred}`). Numeric components are trainable and queryable;
 * string components (`pred`) are kept as metadata only. `reward_key` picks
 * the component that is trained on (`selectRewardValue`).
 *
 * Invariants: numbers are finite; a record has at least one numeric
 * component. Booleans are not part of the stored type: plugin validation
 * turns them into 1/0 first (see plugin-contract.ts).
 */

import { z } from "zod";
import { RlqError } from "../lib/errors.ts";

export const rewardComponentsSchema = z
  .record(z.string().min(1), z.union([z.number(), z.string()]))
  .refine((r) => Object.values(r).some((v) => typeof v === "number"), {
    message: "a dict reward needs at least one numeric component",
  });
export type RewardComponents = z.infer<typeof rewardComponentsSchema>;

export const rewardResultSchema = z.union([z.number(), rewardComponentsSchema]);
export type RewardResult = z.infer<typeof rewardResultSchema>;

/** Stable codes of reward errors; none of them is retriable (a retry gives the same answer). */
export type RewardErrorCode =
  | "reward_key_required"
  | "reward_key_not_found"
  | "reward_key_not_numeric"
  | "unknown_rm_type"
  | "rm_type_not_in_process"
  | "invalid_label"
  | "invalid_reward_input"
  | "plugin_reward_invalid"
  | "plugin_group_reward_invalid";

export class RewardError extends RlqError {
  override readonly code: RewardErrorCode;
  constructor(code: RewardErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(code, message, { ...options, isRetriable: false });
    this.name = "RewardError";
    this.code = code;
  }
}

/** The numeric components of a reward, in insertion order (what gets stored per sample). */
export function numericComponents(result: RewardResult): Record<string, number> {
  if (typeof result === "number") return {};
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(result)) if (typeof v === "number") out[k] = v;
  return out;
}

/**
 * The scalar trained on: slime's `Sample.get_reward_value(args)`.
 *
 * - a number is returned as is (with or without `rewardKey`; slime would raise
 *   on a scalar with a key, rlq tolerates it so that one `reward_key` can serve
 *   datasets whose rm_types differ);
 * - a dict needs `rewardKey`, naming a numeric component.
 *
 * Throws a RewardError whose message names the key and the available
 * components, e.g. `reward_key 'acc' not in the reward; its components are
 * 'score', 'pred'`.
 */
export function selectRewardValue(result: RewardResult, rewardKey: string | null | undefined): number {
  if (typeof result === "number") return result;
  const keys = Object.keys(result);
  const listed = keys.map((k) => `'${k}'`).join(", ");
  if (rewardKey === null || rewardKey === undefined || rewardKey === "") {
    throw new RewardError("reward_key_required", `the reward is a dict with components ${listed}; set reward_key to the one to train on`);
  }
  if (!Object.hasOwn(result, rewardKey)) {
    throw new RewardError("reward_key_not_found", `reward_key '${rewardKey}' is not in the reward; its components are ${listed}`);
  }
  const value = result[rewardKey];
  if (typeof value !== "number") {
    const numeric = keys
      .filter((k) => typeof result[k] === "number")
      .map((k) => `'${k}'`)
      .join(", ");
    throw new RewardError(
      "reward_key_not_numeric",
      `reward_key '${rewardKey}' names a ${typeof value} component (${JSON.stringify(value)}); numeric components are ${numeric}`,
    );
  }
  return value;
}
