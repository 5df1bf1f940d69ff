/**
 * The staleness bound and its policy (docs/architecture.md "Staleness").
 * Pure: the controller judges a completed group when it joins a step, and the
 * train job and `rlq replay` derive the same masks from the same rule.
 *
 * Staleness of a sample trained in step s = weight_version_in(s) − the oldest
 * version among its tokens with loss mask 1.
 */

import type { RunConfig } from "../config/run-config.ts";
import { effectiveMaxStaleness } from "../config/run-config.ts";
import { sampleStaleness, stepVersionIn, type AssembledSample } from "./sample.ts";

export interface StalenessRule {
  /** The bound k (versions); null: none (slime). */
  maxStaleness: number | null;
  policy: "keep" | "mask" | "drop";
  maxRegenerations: number;
}

export function stalenessRule(c: Pick<RunConfig, "max_staleness" | "train_async" | "staleness_policy" | "max_regenerations">): StalenessRule {
  return { maxStaleness: effectiveMaxStaleness(c), policy: c.staleness_policy, maxRegenerations: c.max_regenerations };
}

/** The oldest version a token trained in `step` may come from (null: no bound). */
export function oldestAllowedVersion(rule: StalenessRule, step: number): number | null {
  return rule.maxStaleness === null ? null : stepVersionIn(step) - rule.maxStaleness;
}

/** The `minVersion` to mask with when training `step` (mask policy only). */
export function maskMinVersion(rule: StalenessRule, step: number): number | null {
  return rule.policy === "mask" ? oldestAllowedVersion(rule, step) : null;
}

export type StalenessVerdict = { kind: "train" } | { kind: "cut"; samples: number[]; reason: string } | { kind: "discard"; reason: string };

/**
 * What happens to a completed group about to join `step`. keep and mask
 * always train (mask zeroes the stale tokens); drop cuts the samples holding
 * stale tokens so they regenerate, at most `maxRegenerations` times, then
 * discards the group. Never an unchanged requeue (docs/architecture.md "Staleness": that biases
 * training toward short problems).
 */
export function judgeStaleness(samples: readonly AssembledSample[], step: number, rule: StalenessRule, regenerations: number): StalenessVerdict {
  const min = oldestAllowedVersion(rule, step);
  if (rule.policy !== "drop" || min === null) return { kind: "train" };
  const stale = samples.filter((s) => s.oldestVersion !== null && s.oldestVersion < min);
  if (stale.length === 0) return { kind: "train" };
  const worst = Math.max(...stale.map((s) => sampleStaleness(s, stepVersionIn(step))));
  const what = `${stale.length} sample(s) up to ${worst} versions stale for step ${step} (max_staleness ${rule.maxStaleness})`;
  if (regenerations >= rule.maxRegenerations) return { kind: "discard", reason: `stale: ${what}, after ${regenerations} regeneration(s)` };
  return { kind: "cut", samples: stale.map((s) => s.sampleIndex), reason: `stale: ${what}` };
}

/** Per-step staleness histogram of the samples a step trains: {staleness: count}. */
export function stalenessHistogram(
  samples: ReadonlyArray<{ tokenVersions: ArrayLike<number>; lossMask: ArrayLike<number> }>,
  versionIn: number,
): Map<number, number> {
  const hist = new Map<number, number>();
  for (const s of samples) {
    let oldest: number | null = null;
    for (let i = 0; i < s.lossMask.length; i++) {
      const v = s.tokenVersions[i] as number;
      if (s.lossMask[i] === 1 && v >= 0 && (oldest === null || v < oldest)) oldest = v;
    }
    const k = oldest === null ? 0 : versionIn - oldest;
    hist.set(k, (hist.get(k) ?? 0) + 1);
  }
  return hist;
}
