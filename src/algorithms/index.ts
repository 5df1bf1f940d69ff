/**
 * rlq/algorithms: the RL math, exact to slime's semantics, as pure functions on
 * ragged per-sample arrays (float64 inside). The reference a remote trainer must
 * match; see docs/algorithms.md for every formula, option and default.
 *
 * Typical trainer flow per rollout:
 *   postProcessRewards → computeAdvantagesAndReturns            (once, whole batch)
 *   per (micro-)batch: logProbsAndEntropyFromLogits → computePolicyLossTerms
 *                      → logitsGradient(dLoss_dLogp, dLoss_dEntropy) → optimizer
 */
export {
  type AdvantageEstimator,
  type AlgorithmOptions,
  type AlgorithmOptionsInput,
  type KlType,
  type MisBounds,
  type MisLevel,
  type MisMode,
  type TisFunction,
  advantageEstimatorSchema,
  algorithmOptionsSchema,
  algorithmOptionsShape,
  effectiveEpsClipHigh,
  klTypeSchema,
  misLevelSchema,
  misModeSchema,
  parseAlgorithmOptions,
  refineAlgorithmOptions,
  resolvedMisBounds,
  tisFunctionSchema,
  validatedAlgorithmOptionsSchema,
} from "./options.ts";
export { type Ragged, type Vec, algorithmErrorCodes, maskedMean, maskedSum, maskSum, raggedToArrays } from "./ragged.ts";
export {
  type GroupNormalizeOptions,
  type PostProcessedRewards,
  type PostProcessRewardOptions,
  type RewardValue,
  GROUP_STD_EPS,
  getRewardValue,
  groupNormalizeRewards,
  groupPositions,
  postProcessRewards,
} from "./rewards.ts";
export {
  type AdvantageInput,
  type AdvantageOptions,
  type AdvantageOutput,
  computeAdvantagesAndReturns,
  grpoAdvantages,
  ppoAdvantages,
  reinforcePlusPlusBaselineAdvantages,
  reinforcePlusPlusReturns,
} from "./advantages.ts";
export { discountedReturns, gae } from "./returns.ts";
export { type WhitenStats, WHITEN_EPS, maskedWhiten } from "./whiten.ts";
export { type KlRatio, LOW_VAR_KL_BOUND, approxKlToken, approxKlTokenWithGrad, computeApproxKl, klLossWithGrad } from "./kl.ts";
export { type ClipLossToken, computeCispoLoss, computeGspoKl, computeOpsmMask, computePolicyLoss, ppoClipToken } from "./policy-loss.ts";
export { type OldLogProbSources, type TisResult, icepop, resolveOldLogProbs, tisTrainLogProbs, vanillaTis } from "./off-policy.ts";
export { type MisOptions, type MisResult, MIS_LOG_RATIO_BOUND, computeMisWeights } from "./mis.ts";
export { type Logits, logitsGradient, logProbsAndEntropyFromLogits } from "./logprobs.ts";
export { type AggregationOptions, type Aggregator, aggregate, makeAggregator, weightedSum } from "./aggregation.ts";
export { absDiff, policyMetricNames, reduceTokenMetrics } from "./metrics.ts";
export { type PolicyLossInput, type PolicyLossTerms, computePolicyLossTerms } from "./policy-loss-terms.ts";
export { type ValueLossInput, computeValueLoss, computeValueLossTerms } from "./value-loss.ts";
export { meanPassAtK, passAtK } from "./pass-at-k.ts";
export {
  type ParityCase,
  type ParityFunction,
  type ParityRecord,
  type ParityVectors,
  PARITY_DEFAULT_SEED,
  PARITY_VECTORS_VERSION,
  evaluateParityCase,
  makeParityVectors,
} from "./parity-vectors.ts";
export { type Rng, makeRng, mulberry32 } from "./prng.ts";
