/**
 * The in-process reward hub (slime's rm_hub): rule-based graders by
 * `rm_type`, the reward result type, and the custom plugin contract.
 * See docs/rewards.md.
 */
export { extractAnswer, extractBoxedAnswer, lastBoxedOnlyString, removeBoxed } from "./boxed.ts";
export { dapoComputeScore, dapoReward, normalizeFinalAnswer, type DapoOptions } from "./dapo.ts";
export { deepscalerReward } from "./deepscaler.ts";
export { exactMatchReward } from "./exact-match.ts";
export { f1Reward, f1Score, normalizeAnswer, type F1Score } from "./f1.ts";
export { computeGpqaReward, extractLetterFromResponse, gpqaReward } from "./gpqa.ts";
export { loadOnnxRewardModel, type OnnxRewardModel, type OnnxRewardModelOptions } from "./learned.ts";
export { gradeAnswerVerl, mathReward } from "./math.ts";
export { gradeAnswerMathd, mathdNormalizeAnswer } from "./mathd-normalize.ts";
export {
  pluginGroupRewardSchema,
  pluginRewardComponentsSchema,
  pluginRewardSchema,
  validatePluginGroupReward,
  validatePluginReward,
  type PluginSite,
} from "./plugin-contract.ts";
export { getRewardFunction, IN_PROCESS_RM_TYPES, resolveRmType, type InProcessRmType, type RewardHubOptions } from "./registry.ts";
export { rewardInputSchema, type RewardFunction, type RewardInput } from "./reward-input.ts";
export {
  numericComponents,
  RewardError,
  rewardComponentsSchema,
  rewardResultSchema,
  selectRewardValue,
  type RewardComponents,
  type RewardErrorCode,
  type RewardResult,
} from "./reward-result.ts";
export { DEFAULT_SYMBOLIC_TIME_LIMIT_MS, type SymbolicOptions, type SymbolicOutcome } from "./symbolic-equal.ts";
export { gradeAnswerSympy, normalizeSympy } from "./sympy-normalize.ts";
