import { and, eq, inArray } from "drizzle-orm";
import type { Db } from "./db.ts";
import { decisions, groupRounds, sampleRewards, sampleSegments } from "./schema/index.ts";
import type { SampleStatus, SegmentFact } from "../core/sample.ts";

/** What one rollout job (a group's round) produced. */
export interface RoundFacts {
  runId: string;
  groupId: number;
  round: number;
  step: number;
  jobId: string;
  expectedWeightVersion: number;
  segments: Array<SegmentFact & { tokenStart: number; error: string | null }>;
  isComplete: boolean;
  wasAborted: boolean;
}

/**
 * Write a round's segments and its `group_rounds` marker atomically.
 * Idempotent per (run, group, round): if the marker is already there (a
 * retried or duplicated job), nothing is written and `false` is returned —
 * the caller reads the stored facts back and continues with them.
 *
 * One statement, one round trip: the marker insert and the segment insert are
 * data-modifying CTEs of one statement (so one implicit transaction), and the
 * segments are inserted only if the marker was won. A concurrent writer of
 * the same marker makes ON CONFLICT wait for it and then do nothing, so the
 * loser writes no segment. Plain SQL: this runs once per rollout job, and
 * drizzle's per-value query building showed up in its CPU profile
 * (bench/control-plane.ts).
 */
export async function writeRound(db: Db, facts: RoundFacts): Promise<boolean> {
  const values: unknown[] = [facts.runId, facts.groupId, facts.round, facts.step, facts.jobId, facts.isComplete, facts.wasAborted];
  // $8, the expected version, only where segments use it: Postgres refuses a parameter the statement never references.
  if (facts.segments.length > 0) values.push(facts.expectedWeightVersion);
  // Every parameter is cast: inside INSERT ... SELECT FROM (VALUES ...) Postgres cannot infer them from the target columns.
  const rows = facts.segments.map((seg) => {
    const b = values.length;
    values.push(
      seg.sampleIndex, seg.segmentIndex, seg.round, seg.weightVersion, seg.weightVersion !== facts.expectedWeightVersion,
      // Array literals built here (join is native): pg's per-element array serialisation showed in the profile.
      seg.tokenStart, seg.tokenStart + seg.tokens.length, `{${seg.tokens.join(",")}}`, `{${seg.logProbs.join(",")}}`, `{${seg.lossMask.join(",")}}`,
      seg.engine, seg.finishReason, seg.status, seg.error,
    );
    return `($${b + 1}::int, $${b + 2}::int, $${b + 3}::int, $${b + 4}::int, $${b + 5}::boolean, $${b + 6}::int, $${b + 7}::int, ` +
      `$${b + 8}::int4[], $${b + 9}::float4[], $${b + 10}::int2[], $${b + 11}::text, $${b + 12}::text, $${b + 13}::text, $${b + 14}::text)`;
  });
  const segmentInsert = rows.length === 0
    ? ""
    : `, segments AS (
         INSERT INTO sample_segments (run_id, group_id, sample_index, segment_index, round, step, job_id,
           weight_version, expected_weight_version, is_version_mismatch, token_start, token_end, tokens, log_probs, loss_mask,
           engine, finish_reason, status, error)
         SELECT $1, $2::bigint, v.sample_index, v.segment_index, v.round, $4::int, $5, v.weight_version, $8::int, v.is_version_mismatch,
                v.token_start, v.token_end, v.tokens, v.log_probs, v.loss_mask, v.engine, v.finish_reason, v.status, v.error
           FROM (VALUES ${rows.join(", ")}) AS v(sample_index, segment_index, round, weight_version, is_version_mismatch,
                  token_start, token_end, tokens, log_probs, loss_mask, engine, finish_reason, status, error)
          WHERE EXISTS (SELECT 1 FROM marker)
         RETURNING 1)`;
  const res = await db.pool.query<{ won: number }>(
    `WITH marker AS (
       INSERT INTO group_rounds (run_id, group_id, round, step, job_id, is_complete, was_aborted)
       VALUES ($1, $2::bigint, $3::int, $4::int, $5, $6::boolean, $7::boolean) ON CONFLICT DO NOTHING RETURNING round)${segmentInsert}
     SELECT (SELECT count(*) FROM marker)::int AS won`,
    values,
  );
  return (res.rows[0]?.won ?? 0) > 0;
}

/** Segments of several groups: group id → sample index → segments. */
export async function loadSegmentsOfGroups(db: Db, runId: string, groupIds: readonly number[]): Promise<Map<number, Map<number, SegmentFact[]>>> {
  const rows = await db.db
    .select()
    .from(sampleSegments)
    .where(and(eq(sampleSegments.runId, runId), inArray(sampleSegments.groupId, [...groupIds])));
  const out = new Map<number, Map<number, SegmentFact[]>>();
  for (const r of rows) {
    const group = out.get(r.groupId) ?? new Map<number, SegmentFact[]>();
    out.set(r.groupId, group);
    const list = group.get(r.sampleIndex) ?? [];
    group.set(r.sampleIndex, list);
    list.push({
      sampleIndex: r.sampleIndex,
      segmentIndex: r.segmentIndex,
      round: r.round,
      weightVersion: r.weightVersion,
      tokens: r.tokens,
      logProbs: r.logProbs,
      lossMask: r.lossMask,
      finishReason: r.finishReason,
      status: r.status as SampleStatus,
      engine: r.engine,
    });
  }
  return out;
}

export interface RoundStatus {
  groupId: number;
  round: number;
  isComplete: boolean;
  wasAborted: boolean;
  rewardCount: number;
}

/**
 * The round markers (and how many rewards landed) for the given (group, round)
 * pairs. The controller polls this for every live group each tick: one plain
 * statement, no query building per id.
 */
export async function loadRoundStatuses(
  db: Db,
  runId: string,
  keys: ReadonlyArray<{ groupId: number; round: number }>,
): Promise<Map<number, RoundStatus>> {
  const out = new Map<number, RoundStatus>();
  if (keys.length === 0) return out;
  const wanted = new Map(keys.map((k) => [k.groupId, k.round]));
  const res = await db.pool.query<{ group_id: number; round: number; is_complete: boolean; was_aborted: boolean; reward_count: number }>(
    `SELECT r.group_id, r.round, r.is_complete, r.was_aborted,
            (SELECT count(*)::int FROM sample_rewards w WHERE w.run_id = r.run_id AND w.group_id = r.group_id AND w.round = r.round) AS reward_count
       FROM unnest($2::bigint[], $3::int[]) AS k(group_id, round)
       JOIN group_rounds r ON r.run_id = $1 AND r.group_id = k.group_id AND r.round = k.round`,
    [runId, [...wanted.keys()], [...wanted.values()]],
  );
  for (const r of res.rows) {
    if (wanted.get(r.group_id) !== r.round) continue;
    out.set(r.group_id, { groupId: r.group_id, round: r.round, isComplete: r.is_complete, wasAborted: r.was_aborted, rewardCount: r.reward_count });
  }
  return out;
}

export interface RewardFact {
  sampleIndex: number;
  reward: number;
  components: Record<string, unknown>;
}

/** Write a round's rewards (idempotent per sample and round; the first write wins). */
export async function writeRewards(
  db: Db,
  key: { runId: string; groupId: number; round: number; step: number; jobId: string },
  rewards: readonly RewardFact[],
): Promise<void> {
  if (rewards.length === 0) return;
  const values: unknown[] = [];
  const rows = rewards.map((r, i) => {
    values.push(key.runId, key.groupId, r.sampleIndex, key.round, key.step, key.jobId, r.reward, JSON.stringify(r.components));
    const b = i * 8;
    return `($${b + 1}, $${b + 2}, $${b + 3}, $${b + 4}, $${b + 5}, $${b + 6}, $${b + 7}, $${b + 8}::jsonb)`;
  });
  await db.pool.query(
    `INSERT INTO sample_rewards (run_id, group_id, sample_index, round, step, job_id, reward, components) VALUES ${rows.join(", ")} ON CONFLICT DO NOTHING`,
    values,
  );
}

export async function loadRewards(db: Db, runId: string, groupId: number, round: number): Promise<Map<number, RewardFact>> {
  const rows = await db.db
    .select()
    .from(sampleRewards)
    .where(and(eq(sampleRewards.runId, runId), eq(sampleRewards.groupId, groupId), eq(sampleRewards.round, round)));
  return new Map(rows.map((r) => [r.sampleIndex, { sampleIndex: r.sampleIndex, reward: r.reward, components: r.components as Record<string, unknown> }]));
}

export async function loadRewardsOfGroups(db: Db, runId: string, groupIds: readonly number[]): Promise<Map<number, Array<RewardFact & { round: number }>>> {
  const rows = await db.db
    .select()
    .from(sampleRewards)
    .where(and(eq(sampleRewards.runId, runId), inArray(sampleRewards.groupId, [...groupIds])));
  const out = new Map<number, Array<RewardFact & { round: number }>>();
  for (const r of rows) {
    const list = out.get(r.groupId) ?? [];
    list.push({ sampleIndex: r.sampleIndex, round: r.round, reward: r.reward, components: r.components as Record<string, unknown> });
    out.set(r.groupId, list);
  }
  return out;
}

export async function hasRound(db: Db, runId: string, groupId: number, round: number): Promise<boolean> {
  const rows = await db.db
    .select({ r: groupRounds.round })
    .from(groupRounds)
    .where(and(eq(groupRounds.runId, runId), eq(groupRounds.groupId, groupId), eq(groupRounds.round, round)));
  return rows.length > 0;
}

/**
 * The drop policy's cuts (`group.cut` decisions): group id → sample index →
 * the round from which the sample's segments count (the latest cut wins).
 */
export async function loadCutsOfGroups(db: Db, runId: string, groupIds: readonly number[]): Promise<Map<number, Map<number, number>>> {
  const out = new Map<number, Map<number, number>>();
  if (groupIds.length === 0) return out;
  const rows = await db.db
    .select({ groupId: decisions.groupId, payload: decisions.payload })
    .from(decisions)
    .where(and(eq(decisions.runId, runId), eq(decisions.kind, "group.cut"), inArray(decisions.groupId, [...groupIds])));
  for (const r of rows) {
    const byGroup = out.get(r.groupId as number) ?? new Map<number, number>();
    out.set(r.groupId as number, byGroup);
    addCut(byGroup, r.payload);
  }
  return out;
}

/** Fold one `group.cut` payload into sample index → cut round (the latest cut wins). */
export function addCut(byGroup: Map<number, number>, payload: unknown): void {
  const p = payload as { round: number; samples: number[] };
  for (const i of p.samples) byGroup.set(i, Math.max(byGroup.get(i) ?? 0, p.round));
}

/**
 * SQL: "this round is being aborted": listed in its step's seal (sync mode)
 * or by a `group.aborted` decision (a weight sync in async mode), written with
 * the caller's placeholders. Indexed on (run_id, kind, step) and (run_id, group_id).
 */
export function roundAbortedSql(p: { runId: string; groupId: string; round: string; step: string }): string {
  return `EXISTS (SELECT 1 FROM decisions WHERE run_id = ${p.runId} AND (
    (kind = 'step.sealed' AND step = ${p.step}::int
      AND payload->'aborted' @> jsonb_build_array(jsonb_build_object('groupId', ${p.groupId}::bigint, 'round', ${p.round}::int)))
    OR (kind = 'group.aborted' AND group_id = ${p.groupId}::bigint AND (payload->>'round')::int = ${p.round}::int)))`;
}

/** Whether a rollout job's round is being aborted (`roundAbortedSql`): the abort watcher polls it. */
export async function isRoundAborted(db: Db, key: { runId: string; groupId: number; round: number; step: number }): Promise<boolean> {
  const res = await db.pool.query<{ is_aborted: boolean }>(`SELECT ${roundAbortedSql({ runId: "$1", groupId: "$2", round: "$3", step: "$4" })} AS is_aborted`, [
    key.runId,
    key.groupId,
    key.round,
    key.step,
  ]);
  return res.rows[0]?.is_aborted === true;
}
