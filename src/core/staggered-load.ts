/**
 * Staggered weight loads (run config `weight_load_max_engines`, docs/architecture.md "Weight sync"):
 * at most that many engines pause in place and load at once while the others keep decoding their
 * requests at the old version. `nextEnginesToLoad` says which engines start now; `mayServeAtVersion`
 * is the rule that keeps the per-token staleness bound exact: an engine still on the old version is
 * refused the new version's work. Pure: no I/O, no clock.
 */

/**
 * Staggered loads: the engines (in the pool's order) that start loading now, given those loading
 * and those done. `maxLoading` null: every engine at once (today's sync).
 */
export function nextEnginesToLoad(engines: readonly string[], loading: ReadonlySet<string>, done: ReadonlySet<string>, maxLoading: number | null): string[] {
  if (maxLoading !== null && (!Number.isInteger(maxLoading) || maxLoading < 1)) {
    throw new RangeError(`nextEnginesToLoad: maxLoading must be a positive integer or null, got ${maxLoading}`);
  }
  const waiting = engines.filter((e) => !loading.has(e) && !done.has(e));
  const free = maxLoading === null ? waiting.length : Math.max(0, maxLoading - loading.size);
  return waiting.slice(0, free);
}

/**
 * Whether an engine on `engineVersion` may take a new request of a group admitted at
 * `admittedAtVersion` under staleness bound `maxStaleness`. Admission lets a group admitted at version
 * a train no later than step a + k (core/pipeline.ts `admission`), which uses weights a + k, so a
 * token sampled at version u is at most a + k − u stale: within k exactly when u ≥ a. An engine still
 * on an older version than the group's admission is refused; no bound (null): any engine may serve.
 */
export function mayServeAtVersion(engineVersion: number, admittedAtVersion: number, maxStaleness: number | null): boolean {
  if (maxStaleness === null) return true;
  return engineVersion >= admittedAtVersion;
}
