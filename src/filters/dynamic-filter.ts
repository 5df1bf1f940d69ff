/**
 * Dynamic sampling filters (slime `filter_hub/base_types.py`): after a whole
 * group is generated and scored, decide whether it enters the rollout batch.
 * Pure functions over plain objects; the rollout loop owns the counters.
 */

import { z } from "zod";
import { FilterError, showValue, type FilterPluginSite } from "./filter-error.ts";

/** A scored group as filters see it: `rewards[i]` is sample i's trained-on reward (after reward_key). */
export interface RewardGroup {
  readonly groupId: string;
  readonly rewards: readonly number[];
}

/**
 * slime `DynamicFilterOutput`. `reason` names why a group is dropped (it
 * becomes the metric `rollout/dynamic_filter/drop_{reason}`);
 * `keep_when_insufficient` keeps a rejected group when dropping it would
 * force another over-sampling round (see `shouldDropDynamicFilterOutput`).
 * Snake_case keys as in slime; unknown keys are rejected so that a typo
 * (`keepWhenInsufficient`) is not silently ignored.
 */
export const dynamicFilterOutputSchema = z.strictObject({
  keep: z.boolean(),
  reason: z.string().nullable().default(null),
  keep_when_insufficient: z.boolean().default(false),
});
export type DynamicFilterOutput = z.infer<typeof dynamicFilterOutputSchema>;

/** What a filter function may return: the output record, or a legacy bare boolean (= keep). */
export type DynamicFilterReturn = z.input<typeof dynamicFilterOutputSchema> | boolean;
export type DynamicFilter = (group: RewardGroup) => DynamicFilterReturn;

/**
 * slime `call_dynamic_filter`: no filter keeps everything; a legacy boolean
 * is wrapped as `{keep: value}`. A plugin's return is validated here (throws
 * FilterError `plugin_filter_invalid` naming the plugin and the value).
 */
export function toDynamicFilterOutput(value: unknown, where?: FilterPluginSite): DynamicFilterOutput {
  if (typeof value === "boolean") return { keep: value, reason: null, keep_when_insufficient: false };
  const parsed = dynamicFilterOutputSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  const site = where === undefined ? "the dynamic filter" : `${where.option} ${where.path}`;
  const detail = parsed.error.issues.map((i) => `${i.path.join(".") || "(value)"}: ${i.message}`).join("; ");
  throw new FilterError(
    "plugin_filter_invalid",
    `${site} returned ${showValue(value)}; expected a boolean or {keep: boolean, reason?: string | null, keep_when_insufficient?: boolean} (${detail})`,
    { cause: parsed.error },
  );
}

/** Run a filter (or none) on a group, as slime's `call_dynamic_filter`. */
export function callDynamicFilter(filter: DynamicFilter | null | undefined, group: RewardGroup, where?: FilterPluginSite): DynamicFilterOutput {
  if (filter === null || filter === undefined) return { keep: true, reason: null, keep_when_insufficient: false };
  return toDynamicFilterOutput(filter(group), where);
}

/**
 * slime `should_drop_dynamic_filter_output`: drop iff not kept, unless the
 * filter allows keeping when short of data and `remainingBatchSize <=
 * targetDataSize` (dropping would trigger another over-sampling round).
 * `remainingBatchSize` is the number of groups still expected (submitted and
 * not yet dropped); a drop decrements it.
 */
export function shouldDropDynamicFilterOutput(output: DynamicFilterOutput, counts: { remainingBatchSize: number; targetDataSize: number }): boolean {
  if (output.keep) return false;
  if (output.keep_when_insufficient && counts.remainingBatchSize <= counts.targetDataSize) return false;
  return true;
}

/** The metric a drop is counted under (slime `MetricGatherer`). */
export function dropMetricName(reason: string): string {
  return `rollout/dynamic_filter/drop_${reason}`;
}

/**
 * slime `MetricGatherer.collect()` over the reasons of the dropped groups:
 * a count per `rollout/dynamic_filter/drop_{reason}`. Drops without a reason
 * (null or "") are not counted, as in slime.
 */
export function collectDropMetrics(reasons: Iterable<string | null>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const reason of reasons) {
    if (!reason) continue;
    const key = dropMetricName(reason);
    out[key] = (out[key] ?? 0) + 1;
  }
  return out;
}
