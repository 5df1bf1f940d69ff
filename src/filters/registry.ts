/**
 * Built-in filters by name. slime configs name them by Python path
 * (`slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std`);
 * both that path and the bare function name resolve here, so a slime config
 * works unchanged. Anything else is a user plugin path for the plugin loader.
 */

import type { DynamicFilter } from "./dynamic-filter.ts";
import { FilterError } from "./filter-error.ts";
import { checkRewardNonzeroStd, checkRewardNonzeroStdWithFallback } from "./reward-std.ts";
import { popFirst, type BufferFilter } from "./buffer-filter.ts";

const DYNAMIC: ReadonlyMap<string, DynamicFilter> = new Map([
  ["check_reward_nonzero_std", checkRewardNonzeroStd],
  ["check_reward_nonzero_std_with_fallback", checkRewardNonzeroStdWithFallback],
]);
const DYNAMIC_PREFIX = "slime.rollout.filter_hub.dynamic_sampling_filters.";

const BUFFER: ReadonlyMap<string, BufferFilter> = new Map([["pop_first", popFirst]]);
const BUFFER_PREFIX = "slime.rollout.data_source.";

function bareName(path: string, prefix: string): string {
  const p = path.trim();
  return p.startsWith(prefix) ? p.slice(prefix.length) : p;
}

/** The built-in dynamic filter named by `path`, or null if `path` is not a built-in (then it is a plugin). */
export function builtinDynamicFilter(path: string): DynamicFilter | null {
  return DYNAMIC.get(bareName(path, DYNAMIC_PREFIX)) ?? null;
}

/** The built-in buffer filter named by `path` (null path → `pop_first`), or null for a plugin path. */
export function builtinBufferFilter(path: string | null): BufferFilter | null {
  if (path === null) return popFirst;
  return BUFFER.get(bareName(path, BUFFER_PREFIX)) ?? null;
}

/** Like `builtinDynamicFilter`, but a non-built-in name is an error listing the built-ins. */
export function getDynamicFilter(name: string): DynamicFilter {
  const f = builtinDynamicFilter(name);
  if (f !== null) return f;
  throw new FilterError(
    "unknown_filter",
    `'${name}' is not a built-in dynamic sampling filter; built-ins are ${[...DYNAMIC.keys()].map((k) => `'${k}'`).join(", ")}`,
  );
}
