/**
 * Early group completion (run config `group_extra_samples`, docs/architecture.md "Early group
 * completion"): a group's first round draws n_samples_per_prompt + extra candidates and completes
 * with the first n that finish; the rest are aborted and dropped, so a group no longer ends with its
 * slowest sample. `chooseGroupSamples` says which candidates become the group's n samples, also for
 * a round that ended before n finished (a weight sync aborted it). Pure: no I/O, no clock.
 */

/** One candidate sample of a group's first round, as the rollout job sees it when the round ends. */
export interface GroupCandidate {
  /** The candidate's index among the n + extra drawn (its request id and seed come from it). */
  index: number;
  /** Response tokens generated so far. */
  tokens: number;
  /** The order in which it reached a terminal status (finished, truncated or failed); null: it did not. */
  finishedOrder: number | null;
}

/** Whether a group with `finished` terminal candidates out of its n + extra may stop the others now. */
export function isGroupSettled(finished: number, n: number): boolean {
  return finished >= n;
}

/**
 * The candidates that become the group's n samples, as their indices in ascending order (sample
 * index i is the i-th of them): the first n to finish; if fewer finished (the round ended early),
 * those that did, then the unfinished ones with the most tokens (the least work lost), ties by index.
 * The others are dropped.
 */
export function chooseGroupSamples(candidates: readonly GroupCandidate[], n: number): number[] {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`chooseGroupSamples: n must be a positive integer, got ${n}`);
  if (candidates.length < n) throw new RangeError(`chooseGroupSamples: ${candidates.length} candidates for ${n} samples`);
  const finished = candidates.filter((c) => c.finishedOrder !== null).sort((a, b) => (a.finishedOrder as number) - (b.finishedOrder as number));
  const rest = candidates.filter((c) => c.finishedOrder === null).sort((a, b) => b.tokens - a.tokens || a.index - b.index);
  return [...finished, ...rest]
    .slice(0, n)
    .map((c) => c.index)
    .sort((a, b) => a - b);
}
