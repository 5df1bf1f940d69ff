import type { Db } from "./db.ts";
import type { DrawnPromptRow } from "./run-facts.ts";
import { addCut, roundAbortedSql } from "./rollout-facts.ts";
import { assembleGroupView, type GroupView } from "./group-view.ts";
import type { SampleStatus, SegmentFact } from "../core/sample.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * What a rollout or reward job reads when it starts, in ONE round trip: the
 * checks that refuse a job without a decision behind it, the idempotency
 * marker, and the group as the job sees it (prompt, segments, cuts).
 *
 * Why one statement: at the control-plane bench's rate (an instant engine,
 * bench/control-plane.ts) the rollout job's eight separate reads (findDecisions,
 * hasRound, the four group-view queries, isRoundAborted) and their drizzle
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
function groupColumns(runId: string, groupId: string): string {
  return `
  p.draw_ordinal, p.epoch, p.dataset_index, p.step AS draw_step, p.prompt, p.label, p.metadata, p.prompt_tokens,
  (SELECT json_agg(json_build_array(s.sample_index, s.segment_index, s.round, s.weight_version, s.tokens, s.log_probs,
                                    s.loss_mask, s.finish_reason, s.status, s.engine))
     FROM sample_segments s WHERE s.run_id = ${runId} AND s.group_id = ${groupId}) AS segments,
  (SELECT json_agg(c.payload) FROM decisions c WHERE c.run_id = ${runId} AND c.group_id = ${groupId} AND c.kind = 'group.cut') AS cuts`;
}

/** The keys of a batch as a relation `k` with an ordinal `i` (1-based): one statement serves many jobs. */
function keysFrom(columns: string[]): string {
  const names = columns.map((c) => c.split(" ")[0]).join(", ");
  const arrays = columns.map((c, i) => `$${i + 1}::${c.split(" ")[1]}[]`).join(", ");
  return `unnest(${arrays}) WITH ORDINALITY AS k(${names}, i)
     LEFT JOIN drawn_prompts p ON p.run_id = k.run_id AND p.draw_ordinal = k.group_id`;
}

interface GroupRow {
  draw_ordinal: number | null;
  epoch: number;
  dataset_index: number;
  draw_step: number;
  prompt: string;
  label: string | null;
  metadata: unknown;
  prompt_tokens: number[];
  /** [sample_index, segment_index, round, weight_version, tokens, log_probs, loss_mask, finish_reason, status, engine] */
  segments: Array<[number, number, number, number, number[], Array<number | string>, number[], string, string, string]> | null;
  cuts: unknown[] | null;
}

function groupFromRow(runId: string, groupId: number, row: GroupRow, nSamples: number): GroupView {
  if (row.draw_ordinal === null) throw new RlqError("group_not_found", `run ${runId}: group ${groupId} was never drawn`);
  const prompt: DrawnPromptRow = {
    drawOrdinal: row.draw_ordinal,
    epoch: row.epoch,
    datasetIndex: row.dataset_index,
    step: row.draw_step,
    prompt: row.prompt,
    label: row.label,
    metadata: row.metadata,
    promptTokens: row.prompt_tokens,
  };
  const segments = new Map<number, SegmentFact[]>();
  for (const [sampleIndex, segmentIndex, round, weightVersion, tokens, logProbs, lossMask, finishReason, status, engine] of row.segments ?? []) {
    const list = segments.get(sampleIndex) ?? [];
    segments.set(sampleIndex, list);
    list.push({
      sampleIndex,
      segmentIndex,
      round,
      weightVersion,
      tokens,
      // JSON has no -Infinity/NaN: Postgres quotes them.
      logProbs: logProbs.map((v) => (typeof v === "number" ? v : Number(v))),
      lossMask,
      finishReason,
      status: status as SampleStatus,
      engine,
    });
  }
  const cuts = new Map<number, number>();
  for (const payload of row.cuts ?? []) addCut(cuts, payload);
  return assembleGroupView(groupId, prompt, segments, cuts, nSamples, null);
}

export interface RolloutJobView {
  /** A `group.dispatched` decision for this (group, round, step) exists. */
  isDispatched: boolean;
  /** The round's `group_rounds` marker is already there (a retried or duplicated job). */
  hasRound: boolean;
  /** The round is being aborted (the step's seal or a `group.aborted`; see `isRoundAborted`). */
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
 * The start views of several rollout jobs in one statement (the worker
 * coalesces concurrent jobs, store/job-batch.ts). One entry per key, in order;
 * a group that was never drawn is an `Error` entry for that key alone.
 */
export async function loadRolloutJobViews(db: Db, keys: readonly RolloutJobKey[], nSamples: (runId: string) => number): Promise<Array<RolloutJobView | Error>> {
  if (keys.length === 0) return [];
  const res = await db.pool.query<GroupRow & { i: string; is_dispatched: boolean; has_round: boolean; is_aborted: boolean }>(
    `SELECT k.i,
       EXISTS (SELECT 1 FROM decisions d WHERE d.run_id = k.run_id AND d.group_id = k.group_id AND d.kind = 'group.dispatched'
                 AND d.step = k.step AND (d.payload->>'round')::int = k.round) AS is_dispatched,
       EXISTS (SELECT 1 FROM group_rounds r WHERE r.run_id = k.run_id AND r.group_id = k.group_id AND r.round = k.round) AS has_round,
       ${roundAbortedSql({ runId: "k.run_id", groupId: "k.group_id", round: "k.round", step: "k.step" })} AS is_aborted,
       ${groupColumns("k.run_id", "k.group_id")}
     FROM ${keysFrom(["run_id text", "group_id bigint", "round int", "step int"])}`,
    [keys.map((k) => k.runId), keys.map((k) => k.groupId), keys.map((k) => k.round), keys.map((k) => k.step)],
  );
  return inKeyOrder(keys, res.rows, (key, row) => {
    const isUsable = row.is_dispatched && !row.has_round;
    return {
      isDispatched: row.is_dispatched,
      hasRound: row.has_round,
      isAborted: row.is_aborted,
      view: isUsable ? groupFromRow(key.runId, key.groupId, row, nSamples(key.runId)) : null,
    };
  });
}

/** One job's start view (`loadRolloutJobViews` with one key). */
export async function loadRolloutJobView(db: Db, key: RolloutJobKey, nSamples: number): Promise<RolloutJobView> {
  return unwrap((await loadRolloutJobViews(db, [key], () => nSamples))[0]);
}

function unwrap<T>(r: T | Error | undefined): T {
  if (r === undefined) throw new Error("unreachable: one result per key");
  if (r instanceof Error) throw r;
  return r;
}

/** Rows of a batched statement (ordinal `i`, 1-based) back to one result per key; a failing key gets its Error. */
function inKeyOrder<K, Row extends { i: string }, R>(keys: readonly K[], rows: readonly Row[], build: (key: K, row: Row) => R): Array<R | Error> {
  const byOrdinal = new Map(rows.map((r) => [Number(r.i), r]));
  return keys.map((key, idx) => {
    const row = byOrdinal.get(idx + 1);
    if (!row) return new Error("unreachable: the statement returns one row per key");
    try {
      return build(key, row);
    } catch (e) {
      return e instanceof Error ? e : new Error(String(e));
    }
  });
}

export interface RewardJobView {
  /** The round's marker (its generation facts) is there. */
  hasRound: boolean;
  /** A `group.dispatched` decision for this (group, round) exists, in any step. */
  isDispatched: boolean;
  /** Rewards already stored for this round (the first write wins). */
  rewardCount: number;
  view: GroupView | null;
}

export interface RewardJobKey {
  runId: string;
  groupId: number;
  round: number;
}

/** The start views of several reward jobs in one statement; one entry per key, in order. */
export async function loadRewardJobViews(db: Db, keys: readonly RewardJobKey[], nSamples: (runId: string) => number): Promise<Array<RewardJobView | Error>> {
  if (keys.length === 0) return [];
  const res = await db.pool.query<GroupRow & { i: string; has_round: boolean; is_dispatched: boolean; reward_count: number }>(
    `SELECT k.i,
       EXISTS (SELECT 1 FROM group_rounds r WHERE r.run_id = k.run_id AND r.group_id = k.group_id AND r.round = k.round) AS has_round,
       EXISTS (SELECT 1 FROM decisions d WHERE d.run_id = k.run_id AND d.group_id = k.group_id AND d.kind = 'group.dispatched'
                 AND (d.payload->>'round')::int = k.round) AS is_dispatched,
       (SELECT count(*)::int FROM sample_rewards w WHERE w.run_id = k.run_id AND w.group_id = k.group_id AND w.round = k.round) AS reward_count,
       ${groupColumns("k.run_id", "k.group_id")}
     FROM ${keysFrom(["run_id text", "group_id bigint", "round int"])}`,
    [keys.map((k) => k.runId), keys.map((k) => k.groupId), keys.map((k) => k.round)],
  );
  return inKeyOrder(keys, res.rows, (key, row) => {
    const n = nSamples(key.runId);
    const isUsable = row.has_round && row.is_dispatched && row.reward_count < n;
    return {
      hasRound: row.has_round,
      isDispatched: row.is_dispatched,
      rewardCount: row.reward_count,
      view: isUsable ? groupFromRow(key.runId, key.groupId, row, n) : null,
    };
  });
}

/** One reward job's start view (`loadRewardJobViews` with one key). */
export async function loadRewardJobView(db: Db, key: RewardJobKey, nSamples: number): Promise<RewardJobView> {
  return unwrap((await loadRewardJobViews(db, [key], () => nSamples))[0]);
}
