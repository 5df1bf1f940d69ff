import { RlqError } from "../lib/errors.ts";
/**
 * Rows of a batched statement (ordinal `i`, 1-based, as `groupKeysFrom` and
 * WITH ORDINALITY give it) back to one result per key, in key order; a key
 * whose `build` throws gets its Error, the others their results.
 */
export function inKeyOrder<K, Row extends { i: string }, R>(keys: readonly K[], rows: readonly Row[], build: (key: K, row: Row) => R): Array<R | Error> {
  const byOrdinal = new Map(rows.map((r) => [Number(r.i), r]));
  return keys.map((key, idx) => {
    const row = byOrdinal.get(idx + 1);
    if (!row) return new RlqError("invariant_violated", "unreachable: the statement returns one row per key");
    try {
      return build(key, row);
    } catch (e) {
      return e instanceof Error ? e : new Error(String(e));
    }
  });
}
