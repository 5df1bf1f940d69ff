/**
 * Filter hub (slime's filter_hub and buffer filters): which generated groups
 * enter a rollout batch, and which buffered groups are handed out first.
 * Pure; see docs/rewards.md ("Filters").
 */
export { bufferFilterResultSchema, popFirst, takeFromBuffer, validateBufferFilterResult, type BufferedGroup, type BufferFilter } from "./buffer-filter.ts";
export {
  callDynamicFilter,
  collectDropMetrics,
  dropMetricName,
  dynamicFilterOutputSchema,
  shouldDropDynamicFilterOutput,
  toDynamicFilterOutput,
  type DynamicFilter,
  type DynamicFilterOutput,
  type DynamicFilterReturn,
  type RewardGroup,
} from "./dynamic-filter.ts";
export { FilterError, type FilterErrorCode, type FilterPluginSite } from "./filter-error.ts";
export { builtinBufferFilter, builtinDynamicFilter, getDynamicFilter } from "./registry.ts";
export { checkRewardNonzeroStd, checkRewardNonzeroStdWithFallback, NONZERO_STD_EPSILON, unbiasedStd, zeroStdReason } from "./reward-std.ts";
