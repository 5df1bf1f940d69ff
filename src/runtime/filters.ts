/**
 * The run's dynamic sampling filter and buffer filter, from the filter hub
 * (src/filters, slime's semantics) or from a user module path. The filter's
 * verdict and reason are recorded as a decision; plugins are never called
 * again on replay.
 */

import type { RunConfig } from "../config/run-config.ts";
import { resolvePluginFunction } from "../plugins/http.ts";
import { pluginHttpOptions } from "./http-auth.ts";
import { RlqError } from "../lib/errors.ts";
import { builtinBufferFilter, builtinDynamicFilter, toDynamicFilterOutput, validateBufferFilterResult, type DynamicFilterOutput } from "../filters/index.ts";

export interface FilterGroup {
  groupId: number;
  rewards: number[];
  samples: ReadonlyArray<{ response: string; status: string }>;
}

export type DynamicFilter = (group: FilterGroup) => Promise<DynamicFilterOutput>;
export type BufferFilter = (buffer: readonly number[], n: number) => Promise<number[]>;

export async function createDynamicFilter(config: RunConfig, baseDir: string): Promise<DynamicFilter> {
  const path = config.dynamic_sampling_filter_path;
  if (path === null) return async () => ({ keep: true, reason: null, keep_when_insufficient: false });
  const builtin = builtinDynamicFilter(path);
  if (builtin)
    return async (g) => toDynamicFilterOutput(builtin({ groupId: String(g.groupId), rewards: g.rewards }), { option: "dynamic_sampling_filter_path", path });
  const fn = await resolvePluginFunction<(args: RunConfig, g: FilterGroup) => unknown>(
    path,
    baseDir,
    "dynamic_filter",
    "dynamic_sampling_filter_path",
    pluginHttpOptions(config),
  );
  return async (g) => {
    let out: unknown;
    try {
      out = await fn(config, g);
    } catch (e) {
      if (e instanceof RlqError) throw e;
      throw new RlqError("plugin_threw", `dynamic_sampling_filter_path ${path} threw on group ${g.groupId}: ${(e as Error).message}`, { cause: e });
    }
    return toDynamicFilterOutput(out, { option: "dynamic_sampling_filter_path", path });
  };
}

export async function createBufferFilter(config: RunConfig, baseDir: string): Promise<BufferFilter> {
  const path = config.buffer_filter_path;
  const builtin = builtinBufferFilter(path);
  const where = { option: "buffer_filter_path" as const, path: path ?? "pop_first" };
  const toIds = (buffer: readonly number[]) => buffer.map((id) => ({ groupId: String(id) }));
  if (builtin) return async (buffer, n) => builtin(toIds(buffer), n).map(Number);
  const fn = await resolvePluginFunction<(args: RunConfig, rolloutId: null, buffer: readonly { groupId: string }[], n: number) => unknown>(
    path as string,
    baseDir,
    "buffer_filter",
    "buffer_filter_path",
    pluginHttpOptions(config),
  );
  return async (buffer, n) => {
    const out = await fn(config, null, toIds(buffer), n);
    return validateBufferFilterResult(out, toIds(buffer), n, where).map(Number);
  };
}
