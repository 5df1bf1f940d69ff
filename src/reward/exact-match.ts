/**
 * rm_type `exact_match` (rlq's own; slime has no such type): 1 if the
 * response, trimmed of surrounding whitespace, equals `str(label)` trimmed,
 * else 0. Case, inner whitespace and punctuation all count. A missing or
 * empty label (`null`, `""`) never matches. Combine with the `boxed_` prefix
 * (`boxed_exact_match`) to compare only the last `\boxed{}` content.
 */

import { pyStr } from "./python-compat.ts";
import type { RewardInput } from "./reward-input.ts";

export function exactMatchReward(input: RewardInput): number {
  const { label } = input;
  if (label === null || label === undefined || label === "") return 0;
  return input.response.trim() === pyStr(label).trim() ? 1 : 0;
}
