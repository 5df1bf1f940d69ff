import { z } from "zod";
import type { RunConfig } from "../config/run-config.ts";
import { loadPluginFunction, parsePluginPath } from "../plugins/load.ts";
import { RlqError } from "../lib/errors.ts";
import { popFirst } from "../core/data-buffer.ts";

/**
 * Dynamic sampling filter (keep a completed group or drop it, with a
 * reason) and buffer filter (which buffered groups to serve first), with
 * slime's contracts (slime-semantics.md §1d). Custom ones come by module path.
 */
export interface FilterGroup {
  groupId: number;
  rewards: number[];
  samples: ReadonlyArray<{ response: string; status: string }>;
}

export interface FilterVerdict {
  keep: boolean;
  reason: string | null;
}

export type DynamicFilter = (group: FilterGroup) => Promise<FilterVerdict>;
export type BufferFilter = (buffer: readonly number[], n: number) => Promise<number[]>;

const verdictSchema = z.union([
  z.boolean().transform((keep) => ({ keep, reason: keep ? null : "filtered" })),
  z.object({ keep: z.boolean(), reason: z.string().nullable().optional() }).transform((v) => ({ keep: v.keep, reason: v.reason ?? (v.keep ? null : "filtered") })),
]);

/** slime's check_reward_nonzero_std: unbiased std in float64 > 1e-6; drop reason zero_std_{round(r0, 1)}. */
export function checkRewardNonzeroStd(rewards: readonly number[]): FilterVerdict {
  const n = rewards.length;
  const mean = rewards.reduce((a, b) => a + b, 0) / n;
  const variance = n > 1 ? rewards.reduce((a, r) => a + (r - mean) ** 2, 0) / (n - 1) : NaN;
  const std = Math.sqrt(variance);
  if (std > 1e-6) return { keep: true, reason: null };
  const r0 = Math.round((rewards[0] ?? 0) * 10) / 10;
  return { keep: false, reason: `zero_std_${Number.isInteger(r0) ? r0.toFixed(1) : String(r0)}` };
}

const builtinDynamic: Record<string, (g: FilterGroup) => FilterVerdict> = {
  check_reward_nonzero_std: (g) => checkRewardNonzeroStd(g.rewards),
};

export async function createDynamicFilter(config: RunConfig, baseDir: string): Promise<DynamicFilter> {
  const path = config.dynamic_sampling_filter_path;
  if (path === null) return async () => ({ keep: true, reason: null });
  const name = path.split(/[.:]/).pop() ?? "";
  const builtin = builtinDynamic[name];
  if (builtin && !path.includes("/")) return async (g) => builtin(g);
  const fn = await loadPluginFunction<(args: RunConfig, g: FilterGroup) => unknown>(parsePluginPath(path, baseDir), ["filter", "dynamicFilter"], "dynamic_sampling_filter_path");
  return async (g) => {
    let out: unknown;
    try {
      out = await fn(config, g);
    } catch (e) {
      throw new RlqError("plugin_threw", `dynamic_sampling_filter_path ${path} threw on group ${g.groupId}: ${(e as Error).message}`, { cause: e });
    }
    const parsed = verdictSchema.safeParse(out);
    if (!parsed.success) {
      throw new RlqError("plugin_bad_return", `dynamic_sampling_filter_path ${path} returned ${JSON.stringify(out)} for group ${g.groupId}; expected a boolean or {keep: boolean, reason?: string}`);
    }
    return parsed.data;
  };
}

export async function createBufferFilter(config: RunConfig, baseDir: string): Promise<BufferFilter> {
  const path = config.buffer_filter_path;
  if (path === null || path === "pop_first") return async (buffer, n) => popFirst(buffer, n);
  const fn = await loadPluginFunction<(args: RunConfig, rolloutId: null, buffer: readonly number[], n: number) => unknown>(parsePluginPath(path, baseDir), ["bufferFilter", "filter"], "buffer_filter_path");
  return async (buffer, n) => {
    const out = await fn(config, null, buffer, n);
    const ok = Array.isArray(out) && out.length <= n && new Set(out).size === out.length && out.every((id) => buffer.includes(id as number));
    if (!ok) {
      throw new RlqError("plugin_bad_return", `buffer_filter_path ${path} returned ${JSON.stringify(out)?.slice(0, 200)}; expected at most ${n} distinct group ids from the buffer`);
    }
    return out as number[];
  };
}
