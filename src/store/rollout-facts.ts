import { and, eq, inArray, sql } from "drizzle-orm";
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
 * Write a round's segments and its `group_rounds` marker in one transaction.
 * Idempotent per (run, group, round): if the marker is already there (a
 * retried or duplicated job), nothing is written and `false` is returned —
 * the caller reads the stored facts back and continues with them.
 */
export async function writeRound(db: Db, facts: RoundFacts): Promise<boolean> {
  // Plain SQL: this runs once per rollout job, and drizzle's per-value query
  // building showed up in its CPU profile (bench/control-plane.ts).
  const client = await db.pool.connect();
  try {
    await client.query("BEGIN");
    const marker = await client.query(
      `INSERT INTO group_rounds (run_id, group_id, round, step, job_id, is_complete, was_aborted)
       VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING round`,
      [facts.runId, facts.groupId, facts.round, facts.step, facts.jobId, facts.isComplete, facts.wasAborted],
    );
    if (marker.rowCount === 0) {
      await client.query("ROLLBACK");
      return false;
    }
    if (facts.segments.length > 0) {
      const values: unknown[] = [];
      const rows = facts.segments.map((seg, i) => {
        values.push(
          facts.runId, facts.groupId, seg.sampleIndex, seg.segmentIndex, seg.round, facts.step, facts.jobId,
          seg.weightVersion, facts.expectedWeightVersion, seg.weightVersion !== facts.expectedWeightVersion,
          seg.tokenStart, seg.tokenStart + seg.tokens.length, seg.tokens, seg.logProbs, seg.lossMask,
          seg.engine, seg.finishReason, seg.status, seg.error,
        );
        const b = i * 19;
        return `(${Array.from({ length: 19 }, (_, k) => `$${b + k + 1}`).join(", ")})`;
      });
      await client.query(
        `INSERT INTO sample_segments (run_id, group_id, sample_index, segment_index, round, step, job_id,
           weight_version, expected_weight_version, is_version_mismatch, token_start, token_end, tokens, log_probs, loss_mask,
           engine, finish_reason, status, error) VALUES ${rows.join(", ")}`,
        values,
      );
    }
    await client.query("COMMIT");
    return true;
  } catch (e) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw e;
  } finally {
    client.release();
  }
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

/** The round markers (and how many rewards landed) for the given (group, round) pairs. */
export async function loadRoundStatuses(
  db: Db,
  runId: string,
  keys: ReadonlyArray<{ groupId: number; round: number }>,
): Promise<Map<number, RoundStatus>> {
  const out = new Map<number, RoundStatus>();
  if (keys.length === 0) return out;
  const groupIds = [...new Set(keys.map((k) => k.groupId))];
  const wanted = new Map(keys.map((k) => [k.groupId, k.round]));
  const rounds = await db.db
    .select()
    .from(groupRounds)
    .where(and(eq(groupRounds.runId, runId), inArray(groupRounds.groupId, groupIds)));
  const rewards = await db.db
    .select({ groupId: sampleRewards.groupId, round: sampleRewards.round, n: sql<number>`count(*)::int` })
    .from(sampleRewards)
    .where(and(eq(sampleRewards.runId, runId), inArray(sampleRewards.groupId, groupIds)))
    .groupBy(sampleRewards.groupId, sampleRewards.round);
  for (const r of rounds) {
    if (wanted.get(r.groupId) !== r.round) continue;
    const n = rewards.find((x) => x.groupId === r.groupId && x.round === r.round)?.n ?? 0;
    out.set(r.groupId, { groupId: r.groupId, round: r.round, isComplete: r.isComplete, wasAborted: r.wasAborted, rewardCount: n });
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
    const p = r.payload as { round: number; samples: number[] };
    const byGroup = out.get(r.groupId as number) ?? new Map<number, number>();
    out.set(r.groupId as number, byGroup);
    for (const i of p.samples) byGroup.set(i, Math.max(byGroup.get(i) ?? 0, p.round));
  }
  return out;
}

/**
 * Whether a rollout job's round is being aborted: listed in its step's seal
 * (sync mode) or by a `group.aborted` decision (a weight sync in async mode).
 * One indexed query: the rollout job's abort watcher polls it.
 */
export async function isRoundAborted(db: Db, key: { runId: string; groupId: number; round: number; step: number }): Promise<boolean> {
  const res = await db.pool.query(
    `SELECT 1 FROM decisions
      WHERE run_id = $1 AND (
        (kind = 'step.sealed' AND step = $2 AND payload->'aborted' @> jsonb_build_array(jsonb_build_object('groupId', $3::bigint, 'round', $4::int)))
        OR (kind = 'group.aborted' AND group_id = $3 AND (payload->>'round')::int = $4))
      LIMIT 1`,
    [key.runId, key.step, key.groupId, key.round],
  );
  return (res.rowCount ?? 0) > 0;
}
