/**
 * What a rollout or reward job reads when it starts, in ONE round trip: the
 * checks that refuse a job without a decision behind it, the idempotency
 * marker, and the group as the job sees it (prompt, segments, cuts).
 *
 * Why one statement: at the control-plane bench's rate (an instant engine,
 * bench/control-plane.ts) the rollout job's eight separate reads (findDecisions,
 * hasRound, the four group-view queries, the abort check) and their drizzle
 * query building were the largest CPU cost per group in `rlq up`. One
 * statement also reads every check from one snapshot. The group is assembled
 * by `assembleGroupView`, as for the controller's bulk loader, so a job sees
 * exactly what the controller sees. Segments come back as JSON: float4 values
 * print the same shortest text as in the array format the driver parses
 * (non-finite ones come back as strings and are converted).
 *
 * The statements take a batch of keys (of any runs): a worker coalesces the
 * starts of the jobs it runs at once into one statement (store/job-batch.ts).
 */

import type { Db } from "./db.ts";
import { roundAbortedSql } from "./rollout-facts.ts";
import { groupColumns, groupFromRow, groupKeysFrom, inKeyOrder, responsesFromRow, type GroupResponses, type GroupRow, type GroupView } from "./group-view.ts";
import { RlqError } from "../lib/errors.ts";

export interface RolloutJobView {
  /** A `group.dispatched` decision for this (group, round, step) exists. */
  isDispatched: boolean;
  /** The round's `group_rounds` marker is already there (a retried or duplicated job). */
  hasRound: boolean;
  /** The round is being aborted (the step's seal or a `group.aborted`; see `roundAbortedSql`). */
  isAborted: boolean;
  /** Null when the job is refused or already done (the group is then not assembled). */
  view: GroupView | null;
}

export interface RolloutJobKey {
  runId: string;
  groupId: number;
  round: number;
  step: number;
}

/**
 * The round's `group.dispatched`, looked up per key (`step`: the rollout view's, or any step).
 *
 * A LATERAL with LIMIT 1, not an EXISTS: Postgres may run an EXISTS as a hashed subplan, which reads
 * every `group.dispatched` in the table once per statement (all runs'; on a table never analyzed
 * the planner chose it), a cost that grew with the history (docs/performance.md, "Cluster scale"). A
 * LATERAL is always a per-key lookup, which the partial index decisions_group_lookup_idx serves.
 */
function dispatchedLateral(step: string | null): string {
  return `LEFT JOIN LATERAL (SELECT true AS found FROM decisions d
       WHERE d.run_id = k.run_id AND d.group_id = k.group_id AND d.kind = 'group.dispatched'
         AND (d.payload->>'round')::int = k.round${step === null ? "" : ` AND d.step = ${step}`} LIMIT 1) disp ON true`;
}

/** The rollout jobs' start views: keys $1 run_id[], $2 group_id[], $3 round[], $4 step[] (exported for the plan test). */
export const rolloutJobViewsSql = `SELECT k.i,
       disp.found IS NOT NULL AS is_dispatched,
       EXISTS (SELECT 1 FROM group_rounds r WHERE r.run_id = k.run_id AND r.group_id = k.group_id AND r.round = k.round) AS has_round,
       ${roundAbortedSql({ runId: "k.run_id", groupId: "k.group_id", round: "k.round", step: "k.step" })} AS is_aborted,
       ${groupColumns("k.run_id", "k.group_id")}
     FROM ${groupKeysFrom(["run_id text", "group_id bigint", "round int", "step int"])}
     ${dispatchedLateral("k.step")}`;

/** The reward jobs' start views: keys $1 run_id[], $2 group_id[], $3 round[] (exported for the plan test). */
export const rewardJobViewsSql = `SELECT k.i,
       EXISTS (SELECT 1 FROM group_rounds r WHERE r.run_id = k.run_id AND r.group_id = k.group_id AND r.round = k.round) AS has_round,
       disp.found IS NOT NULL AS is_dispatched,
       (SELECT count(*)::int FROM sample_rewards w WHERE w.run_id = k.run_id AND w.group_id = k.group_id AND w.round = k.round) AS reward_count,
       ${groupColumns("k.run_id", "k.group_id", "tokens")}
     FROM ${groupKeysFrom(["run_id text", "group_id bigint", "round int"])}
     ${dispatchedLateral(null)}`;

/**
 * The start views of several rollout jobs in one statement (the worker
 * coalesces concurrent jobs, store/job-batch.ts). One entry per key, in order;
 * a group that was never drawn is an `Error` entry for that key alone.
 */
export async function loadRolloutJobViews(db: Db, keys: readonly RolloutJobKey[], nSamples: (runId: string) => number): Promise<Array<RolloutJobView | Error>> {
  if (keys.length === 0) return [];
  const res = await db.pool.query<GroupRow & { i: string; is_dispatched: boolean; has_round: boolean; is_aborted: boolean }>(rolloutJobViewsSql, [
    keys.map((k) => k.runId),
    keys.map((k) => k.groupId),
    keys.map((k) => k.round),
    keys.map((k) => k.step),
  ]);
  return inKeyOrder(keys, res.rows, (key, row) => {
    const isUsable = row.is_dispatched && !row.has_round;
    return {
      isDispatched: row.is_dispatched,
      hasRound: row.has_round,
      isAborted: row.is_aborted,
      view: isUsable ? groupFromRow(key.runId, key.groupId, row, nSamples(key.runId), null) : null,
    };
  });
}

/** One job's start view (`loadRolloutJobViews` with one key). */
export async function loadRolloutJobView(db: Db, key: RolloutJobKey, nSamples: number): Promise<RolloutJobView> {
  return unwrap((await loadRolloutJobViews(db, [key], () => nSamples))[0]);
}

function unwrap<T>(r: T | Error | undefined): T {
  if (r === undefined) throw new RlqError("invariant_violated", "unreachable: one result per key");
  if (r instanceof Error) throw r;
  return r;
}

export interface RewardJobView {
  /** The round's marker (its generation facts) is there. */
  hasRound: boolean;
  /** A `group.dispatched` decision for this (group, round) exists, in any step. */
  isDispatched: boolean;
  /** Rewards already stored for this round (the first write wins). */
  rewardCount: number;
  /** The responses only: a reward reads no log-probs or loss masks (a quarter of the JSON). */
  view: GroupResponses | null;
}

export interface RewardJobKey {
  runId: string;
  groupId: number;
  round: number;
}

/** The start views of several reward jobs in one statement; one entry per key, in order. */
export async function loadRewardJobViews(db: Db, keys: readonly RewardJobKey[], nSamples: (runId: string) => number): Promise<Array<RewardJobView | Error>> {
  if (keys.length === 0) return [];
  const res = await db.pool.query<GroupRow & { i: string; has_round: boolean; is_dispatched: boolean; reward_count: number }>(rewardJobViewsSql, [
    keys.map((k) => k.runId),
    keys.map((k) => k.groupId),
    keys.map((k) => k.round),
  ]);
  return inKeyOrder(keys, res.rows, (key, row) => {
    const n = nSamples(key.runId);
    const isUsable = row.has_round && row.is_dispatched && row.reward_count < n;
    return {
      hasRound: row.has_round,
      isDispatched: row.is_dispatched,
      rewardCount: row.reward_count,
      view: isUsable ? responsesFromRow(key.runId, key.groupId, row, n) : null,
    };
  });
}

/** One reward job's start view (`loadRewardJobViews` with one key). */
export async function loadRewardJobView(db: Db, key: RewardJobKey, nSamples: number): Promise<RewardJobView> {
  return unwrap((await loadRewardJobViews(db, [key], () => nSamples))[0]);
}
