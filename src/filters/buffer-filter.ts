/**
 * Buffer filters (slime `--buffer-filter-path`, default `pop_first`): when
 * the data source is asked for `n` groups, which of the buffered groups
 * (partial rollouts, leftovers of over-sampling) to hand out first. The rest
 * comes fresh from the dataset.
 *
 * rlq's form is pure: a filter gets the buffer (oldest first) and `n`, and
 * returns the ids of the groups to take, in the order they are handed out.
 * `takeFromBuffer` then splits the buffer; nothing is mutated.
 */

import { z } from "zod";
import { FilterError, showValue, type FilterPluginSite } from "./filter-error.ts";

export interface BufferedGroup {
  readonly groupId: string;
}

export type BufferFilter = (buffer: readonly BufferedGroup[], n: number) => readonly string[];

/** slime `pop_first`: the first `min(len(buffer), n)` groups, FIFO. */
export function popFirst(buffer: readonly BufferedGroup[], n: number): string[] {
  return buffer.slice(0, Math.max(0, Math.min(buffer.length, n))).map((g) => g.groupId);
}

/**
 * What a custom buffer filter may return for this buffer and `n`: an array of
 * distinct group ids, each present in the buffer, at most `n` of them.
 */
export function bufferFilterResultSchema(buffer: readonly BufferedGroup[], n: number) {
  const ids = new Set(buffer.map((g) => g.groupId));
  return z
    .array(z.string(), { error: "expected an array of group ids" })
    .max(n, { error: `expected at most n = ${n} group ids` })
    .superRefine((picked, ctx) => {
      const seen = new Set<string>();
      for (const [i, id] of picked.entries()) {
        if (!ids.has(id)) ctx.addIssue({ code: "custom", path: [i], message: `group id '${id}' is not in the buffer` });
        else if (seen.has(id)) ctx.addIssue({ code: "custom", path: [i], message: `group id '${id}' is returned twice` });
        seen.add(id);
      }
    });
}

/**
 * Validates a custom buffer filter's return. Throws FilterError
 * `buffer_filter_invalid` naming the plugin, the value and every problem.
 */
export function validateBufferFilterResult(
  value: unknown,
  buffer: readonly BufferedGroup[],
  n: number,
  where: FilterPluginSite = { option: "buffer_filter_path", path: "(built-in)" },
): string[] {
  const parsed = bufferFilterResultSchema(buffer, n).safeParse(value);
  if (parsed.success) return parsed.data;
  const detail = parsed.error.issues.map((i) => (i.path.length > 0 ? `[${i.path.join(".")}] ${i.message}` : i.message)).join("; ");
  throw new FilterError(
    "buffer_filter_invalid",
    `${where.option} ${where.path} returned ${showValue(value)} for a buffer of ${buffer.length} groups and n = ${n}: ${detail}`,
    { cause: parsed.error },
  );
}

/** Split the buffer into the groups taken (in `ids` order) and the ones left (in buffer order). */
export function takeFromBuffer<G extends BufferedGroup>(buffer: readonly G[], ids: readonly string[]): { taken: G[]; remaining: G[] } {
  const byId = new Map(buffer.map((g) => [g.groupId, g] as const));
  const picked = new Set(ids);
  const taken = ids.map((id) => {
    const g = byId.get(id);
    if (g === undefined) throw new FilterError("buffer_filter_invalid", `group id '${id}' is not in the buffer`);
    return g;
  });
  return { taken, remaining: buffer.filter((g) => !picked.has(g.groupId)) };
}
