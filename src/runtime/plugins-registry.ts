import type { RunConfig } from "../config/run-config.ts";
import type { Tokenizer } from "../data/tokenizer.ts";
import type { RewardInput } from "./reward-scorer.ts";
import { RlqError } from "../lib/errors.ts";
import { getRewardFunction } from "../reward/index.ts";

/**
 * Where the built-in capabilities are looked up by name: reward types from
 * the reward hub, the embedded model's tokenizer. Kept in one place so the
 * rest of the runtime does not import every capability eagerly.
 */
export function resolveRmType(rmType: string): ((s: RewardInput) => unknown) | null {
  const fn = getRewardFunction(rmType);
  return (s) => fn({ response: s.response, label: s.label, metadata: s.metadata });
}

export async function tokenizerFor(config: RunConfig): Promise<Tokenizer> {
  throw new RlqError("config_invalid", `tokenizer '${config.tokenizer}' is not available in this build`);
}
