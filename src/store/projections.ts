import { and, eq, inArray, isNull, sql } from "drizzle-orm";
import type { Db, Database } from "./db.ts";
import { rolloutHistory, runs } from "./schema/index.ts";

/**
 * The one writer of the projections (docs/architecture.md "The fact model"): the `runs` row and
 * `rollout_history`. Facts are insert-only and written by their own modules;
 * what changes over time is written here and nowhere else, so `rlq replay`
 * (which rebuilds both) and the live writers (the controller's decision
 * transactions, the train step's commit) cannot disagree on what a column
 * means. Every function takes the transaction its facts commit in, except the
 * few that stand alone (`setRunProjection`, `replaceProjections`).
 */
export type HistoryRow = typeof rolloutHistory.$inferInsert;

/** A new run's projection row (created with its first decisions, `insertRun`). */
export async function insertRunProjection(
  tx: Database,
  row: { id: string; name: string; config: Record<string, unknown>; datasetFingerprint: string; pluginFingerprints: Record<string, string>; lastSeq: number },
): Promise<void> {
  await tx.insert(runs).values({ ...row, status: "running" });
}

/** The last decision's seq, in the transaction that appends it (store/decision-log.ts). */
export async function projectLastSeq(tx: Database, runId: string, seq: number): Promise<void> {
  await tx.execute(sql`UPDATE runs SET last_seq = ${seq}, updated_at = now() WHERE id = ${runId}`);
}

/** Projection updates that must land in the controller's decision transaction. */
export async function projectRunInTx(
  tx: Database,
  runId: string,
  fields: { status?: string; lastError?: string | null; weightVersion?: number; config?: Record<string, unknown> },
): Promise<void> {
  if (Object.keys(fields).length === 0) return;
  await tx
    .update(runs)
    .set({ ...fields, updatedAt: sql`now()` })
    .where(eq(runs.id, runId));
}

/** Update the run projection's status fields outside a decision (an error to show in `rlq run status`). */
export async function setRunProjection(
  db: Db,
  runId: string,
  fields: { status?: string; step?: number; weightVersion?: number; lastError?: string | null },
): Promise<void> {
  await db.db
    .update(runs)
    .set({ ...fields, updatedAt: sql`now()` })
    .where(eq(runs.id, runId));
}

/**
 * A committed train step, in its commit transaction (store/train-facts.ts):
 * the history rows of its groups are marked trained, and the run's step
 * counts it (never backwards: steps may commit out of order after a retry).
 */
export async function projectTrainedStep(tx: Database, runId: string, step: number, groupIds: readonly number[]): Promise<void> {
  if (groupIds.length > 0) {
    await tx
      .update(rolloutHistory)
      .set({ trainedStep: step })
      .where(and(eq(rolloutHistory.runId, runId), inArray(rolloutHistory.groupId, [...groupIds]), isNull(rolloutHistory.trainedStep)));
  }
  await tx.execute(sql`UPDATE runs SET step = ${step + 1}, updated_at = now() WHERE id = ${runId} AND step < ${step + 1}`);
}

/**
 * One statement with one parameter per column (unnest), not one per value:
 * the controller writes rollout_batch_size x n_samples_per_prompt rows per step
 * inside its decision transaction, and drizzle's per-value query building was
 * a tenth of `rlq up`'s CPU in the control-plane bench. Per-token columns
 * travel as array literals in a text[] (Postgres arrays cannot be ragged).
 */
export async function insertHistory(tx: Database, rows: HistoryRow[]): Promise<void> {
  if (rows.length === 0) return;
  const col = (f: (r: (typeof rows)[number]) => unknown) => sql.param(rows.map(f));
  const arr = (f: (r: (typeof rows)[number]) => readonly number[]) => sql.param(rows.map((r) => `{${f(r).join(",")}}`));
  // A re-run of the same outcome (controller restarted mid-write) is a no-op.
  await tx.execute(sql`
    INSERT INTO rollout_history (run_id, step, group_id, sample_index, draw_ordinal, prompt, response, tokens, prompt_length,
      response_length, loss_mask, rollout_log_probs, token_versions, weight_versions, num_segments, status, finish_reason, reward,
      reward_components, kept, outcome, outcome_reason, trained_step)
    SELECT run_id, step, group_id, sample_index, draw_ordinal, prompt, response, tokens::int4[], prompt_length,
      response_length, loss_mask::int2[], rollout_log_probs::float4[], token_versions::int4[], weight_versions::int4[], num_segments, status,
      finish_reason, reward, reward_components::jsonb, kept, outcome, outcome_reason, trained_step
    FROM unnest(
      ${col((r) => r.runId)}::text[], ${col((r) => r.step)}::int[], ${col((r) => r.groupId)}::bigint[], ${col((r) => r.sampleIndex)}::int[],
      ${col((r) => r.drawOrdinal)}::bigint[], ${col((r) => r.prompt)}::text[], ${col((r) => r.response)}::text[], ${arr((r) => r.tokens)}::text[],
      ${col((r) => r.promptLength)}::int[], ${col((r) => r.responseLength)}::int[], ${arr((r) => r.lossMask)}::text[],
      ${arr((r) => r.rolloutLogProbs)}::text[], ${arr((r) => r.tokenVersions)}::text[], ${arr((r) => r.weightVersions)}::text[],
      ${col((r) => r.numSegments)}::int[], ${col((r) => r.status)}::text[], ${col((r) => r.finishReason)}::text[],
      ${col((r) => r.reward ?? null)}::float8[], ${col((r) => (r.rewardComponents == null ? null : JSON.stringify(r.rewardComponents)))}::text[],
      ${col((r) => r.isKept)}::boolean[], ${col((r) => r.outcome)}::text[], ${col((r) => r.outcomeReason ?? null)}::text[],
      ${col((r) => r.trainedStep ?? null)}::int[]
    ) AS t(run_id, step, group_id, sample_index, draw_ordinal, prompt, response, tokens, prompt_length, response_length, loss_mask,
           rollout_log_probs, token_versions, weight_versions, num_segments, status, finish_reason, reward, reward_components, kept,
           outcome, outcome_reason, trained_step)
    ON CONFLICT DO NOTHING`);
}

export async function clearHistory(tx: Database, runId: string): Promise<void> {
  await tx.execute(sql`DELETE FROM rollout_history WHERE run_id = ${runId}`);
}

/** Replace a run's projections with rebuilt ones, in one transaction (`rlq replay`). */
export async function replaceProjections(
  db: Db,
  runId: string,
  rows: HistoryRow[],
  runRow: { status: string; step: number; weightVersion: number; lastSeq: number },
): Promise<void> {
  await db.db.transaction(async (tx) => {
    await clearHistory(tx, runId);
    await insertHistory(tx, rows);
    await tx.execute(
      sql`UPDATE runs SET status = ${runRow.status}, step = ${runRow.step}, weight_version = ${runRow.weightVersion}, last_seq = ${runRow.lastSeq}, updated_at = now() WHERE id = ${runId}`,
    );
  });
}
