/**
 * The statements of the rollout and reward jobs, coalesced across the jobs a
 * worker process runs at once (lib/coalesce.ts): concurrent jobs' starts go
 * as one statement, their writes as another. A job's facts, checks and
 * idempotency are exactly those of the one-job statements (store/job-views.ts,
 * `writeRounds`): the batch is only how they travel. With an instant engine
 * (bench/control-plane.ts) these statements, not Postgres, were most of a
 * worker's CPU per group; batching them is what lets the queue's per-group
 * jobs scale.
 */

import type { Db } from "./db.ts";
import { coalesce } from "../lib/coalesce.ts";
import { loadRewardJobViews, loadRolloutJobViews, type RewardJobKey, type RewardJobView, type RolloutJobKey, type RolloutJobView } from "./job-views.ts";
import { areRoundsAborted, writeRewardsOfRounds, writeRounds, type RewardWrite, type RoundFacts } from "./rollout-facts.ts";

export interface JobStore {
  loadRolloutView(key: RolloutJobKey, nSamples: number): Promise<RolloutJobView>;
  /**
   * Whether this call won the round's marker. Advisory: if a batch committed but
   * its answer was lost, the per-key retry reports false for a round it did write.
   * Callers read the stored facts back either way.
   */
  writeRound(facts: RoundFacts): Promise<boolean>;
  isRoundAborted(key: RolloutJobKey): Promise<boolean>;
  loadRewardView(key: RewardJobKey, nSamples: number): Promise<RewardJobView>;
  writeRewards(write: RewardWrite): Promise<void>;
}

export interface JobStoreOptions {
  /** Most jobs per statement. Default 64. */
  maxBatch?: number;
}

export function createJobStore(db: Db, options: JobStoreOptions = {}): JobStore {
  const maxBatch = options.maxBatch ?? 64;
  // Two batches of a kind in flight: the next one fills while one runs. Writes take
  // the pool's connections; reads and writes of different kinds overlap.
  const opts = { maxBatch, maxInFlight: 2 };
  type Sized<K> = { key: K; nSamples: number };
  const nSamplesOf = <K extends { runId: string }>(keys: ReadonlyArray<Sized<K>>) => {
    const n = new Map(keys.map((k) => [k.key.runId, k.nSamples]));
    return (runId: string) => n.get(runId) ?? 0;
  };
  const rolloutView = coalesce<Sized<RolloutJobKey>, RolloutJobView>(
    (keys) =>
      loadRolloutJobViews(
        db,
        keys.map((k) => k.key),
        nSamplesOf(keys),
      ),
    opts,
  );
  const rewardView = coalesce<Sized<RewardJobKey>, RewardJobView>(
    (keys) =>
      loadRewardJobViews(
        db,
        keys.map((k) => k.key),
        nSamplesOf(keys),
      ),
    opts,
  );
  const round = coalesce<RoundFacts, boolean>((facts) => writeRounds(db, facts), opts);
  const aborted = coalesce<RolloutJobKey, boolean>((keys) => areRoundsAborted(db, keys), opts);
  const rewards = coalesce<RewardWrite, true>(async (writes) => {
    await writeRewardsOfRounds(db, writes);
    return writes.map(() => true as const);
  }, opts);
  return {
    loadRolloutView: (key, nSamples) => rolloutView({ key, nSamples }),
    writeRound: round,
    isRoundAborted: aborted,
    loadRewardView: (key, nSamples) => rewardView({ key, nSamples }),
    writeRewards: async (w) => {
      await rewards(w);
    },
  };
}
