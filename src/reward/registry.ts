import { extractAnswer } from "./boxed.ts";
import { dapoReward } from "./dapo.ts";
import { deepscalerReward } from "./deepscaler.ts";
import { exactMatchReward } from "./exact-match.ts";
import { f1Reward } from "./f1.ts";
import { gpqaReward } from "./gpqa.ts";
import { mathReward } from "./math.ts";
import type { RewardFunction } from "./reward-input.ts";
import { RewardError } from "./reward-result.ts";
import type { SymbolicOptions } from "./symbolic-equal.ts";

/**
 * The in-process reward hub, by slime's `rm_type` names. `remote_rm` (HTTP)
 * and `custom_rm_path` (a user module) are dispatched elsewhere; asking this
 * registry for `remote_rm` is an error that says so.
 */
export const IN_PROCESS_RM_TYPES = ["math", "deepscaler", "dapo", "f1", "gpqa", "exact_match"] as const;
export type InProcessRmType = (typeof IN_PROCESS_RM_TYPES)[number];

/** rm_types that exist in slime but are not served by this registry. */
const ELSEWHERE: Readonly<Record<string, string>> = {
  remote_rm: "it is an HTTP reward server, scored by the remote reward client",
  onnx_rm: "it is a learned reward model, scored a group at a time by the reward scorer from rm_model_path",
  ifbench: "it is not implemented in rlq; use custom_rm_path",
  random: "it is not implemented in rlq (a random reward trains nothing); use custom_rm_path",
};

/** Options of the in-process hub; today only the symbolic step's time limit (math, deepscaler). */
export type RewardHubOptions = SymbolicOptions;

const BOXED_PREFIX = "boxed_";

function baseFunction(rmType: InProcessRmType, options: RewardHubOptions): RewardFunction {
  switch (rmType) {
    case "math":
      return (input) => mathReward(input, options);
    case "deepscaler":
      return (input) => deepscalerReward(input, options);
    case "dapo":
      return dapoReward;
    case "f1":
      return f1Reward;
    case "gpqa":
      return gpqaReward;
    case "exact_match":
      return exactMatchReward;
  }
}

function isInProcess(name: string): name is InProcessRmType {
  return (IN_PROCESS_RM_TYPES as readonly string[]).includes(name);
}

/**
 * The reward function for an `rm_type` (surrounding whitespace ignored, as
 * slime's `.strip()`). A `boxed_` prefix first replaces the response by the
 * content of its last `\boxed{}` (or `""`), then applies the rest:
 * `boxed_f1`, `boxed_exact_match`, ...
 *
 * Throws RewardError `unknown_rm_type` (listing the known ones) or
 * `rm_type_not_in_process` (for `remote_rm` & co.).
 */
export function getRewardFunction(rmType: string, options: RewardHubOptions = {}): RewardFunction {
  const name = rmType.trim();
  const isBoxed = name.startsWith(BOXED_PREFIX);
  const base = isBoxed ? name.slice(BOXED_PREFIX.length) : name;
  if (!isInProcess(base)) {
    const why = ELSEWHERE[base];
    if (why !== undefined) throw new RewardError("rm_type_not_in_process", `rm_type '${name}' is not an in-process reward: ${why}`);
    const known = IN_PROCESS_RM_TYPES.map((t) => `'${t}'`).join(", ");
    throw new RewardError(
      "unknown_rm_type",
      name === ""
        ? `no rm_type given; set rm_type (one of ${known}, optionally prefixed 'boxed_') or custom_rm_path`
        : `unknown rm_type '${name}'; expected one of ${known} (optionally prefixed 'boxed_'), 'remote_rm' or a custom_rm_path`,
    );
  }
  const fn = baseFunction(base, options);
  if (!isBoxed) return fn;
  return (input) => fn({ ...input, response: extractAnswer(input.response) ?? "" });
}

/**
 * slime's choice of rm_type for one sample: `metadata.rm_type` if set and
 * non-empty, else the run's `rm_type`, stripped. (A per-sample or run-level
 * custom_rm_path takes precedence over both; that is the caller's dispatch.)
 */
export function resolveRmType(metadata: Record<string, unknown> | null | undefined, runRmType: string | null | undefined): string {
  const fromSample = metadata?.rm_type;
  const chosen = typeof fromSample === "string" && fromSample !== "" ? fromSample : (runRmType ?? "");
  return chosen.trim();
}
