/**
 * The one writer of the projections (docs/architecture.md "The fact model"): the `runs` row and
 * `rollout_history`. Facts are insert-only and written by their own modules;
 * what changes over time is written here and nowhere else, so `rlq replay`
 * (which rebuilds both) and the live writers (the controller's decision
 * transactions, the train step's commit) cannot disagree on what a column
 * means. Every function takes the transaction its facts commit in, except the
 * few that stand alone (`setRunProjection`, `replaceProjections`).
 */

import { and, eq, inArray, isNull, sql } from "drizzle-orm";
import type { Db, Database } from "./db.ts";
import { rolloutHistory, runs } from "./schema/index.ts";
import { STEP_AGGREGATE_COLUMNS, STEP_AGGREGATES } from "./step-aggregates.ts";

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
  let touched: number[] = [];
  if (groupIds.length > 0) {
    const marked = await tx
      .update(rolloutHistory)
      .set({ trainedStep: step })
      .where(and(eq(rolloutHistory.runId, runId), inArray(rolloutHistory.groupId, [...groupIds]), isNull(rolloutHistory.trainedStep)))
      .returning({ step: rolloutHistory.step });
    touched = marked.map((r) => r.step);
  }
  // The step's own summary, and those of the earlier steps whose samples it trained (their
  // reward_trained and response_length_mean change with the marks).
  await summarizeRolloutSides(tx, runId, [step, ...touched]);
  await summarizeTrainedSide(tx, runId, step, groupIds);
  await tx.execute(sql`UPDATE runs SET step = ${step + 1}, updated_at = now() WHERE id = ${runId} AND step < ${step + 1}`);
}

const rolloutColumns = STEP_AGGREGATE_COLUMNS.join(", ");
const rolloutUpdates = STEP_AGGREGATE_COLUMNS.map((c) => `${c} = excluded.${c}`).join(", ");

/** `step_summaries`' rollout side of `steps`, from their history rows (a step without rows gets none). */
async function summarizeRolloutSides(tx: Database, runId: string, steps: readonly number[]): Promise<void> {
  const distinct = [...new Set(steps)];
  if (distinct.length === 0) return;
  await tx.execute(sql`
    INSERT INTO step_summaries (run_id, step, ${sql.raw(rolloutColumns)})
    SELECT ${runId}, h.step, ${sql.raw(STEP_AGGREGATES)}
    FROM rollout_history h WHERE h.run_id = ${runId} AND h.step = ANY(${sql.param(distinct)}::int[]) GROUP BY h.step
    ON CONFLICT (run_id, step) DO UPDATE SET ${sql.raw(rolloutUpdates)}`);
}

/**
 * `step_summaries`' trained side of train step `step`: the tokens it trained and its samples by
 * staleness (read through the `staleness` view, so the chart and `rlq sql` agree on its meaning).
 * Final when written: trained marks are set only by the step's own commit.
 */
async function summarizeTrainedSide(tx: Database, runId: string, step: number, groupIds: readonly number[]): Promise<void> {
  const groups = sql.param([...groupIds]);
  await tx.execute(sql`
    INSERT INTO step_summaries (run_id, step, trained_response_tokens, staleness)
    SELECT ${runId}, ${step},
      (SELECT sum(h.response_length) FROM rollout_history h WHERE h.run_id = ${runId} AND h.group_id = ANY(${groups}::bigint[]) AND h.trained_step = ${step}),
      coalesce((SELECT jsonb_object_agg(x.staleness, x.n) FROM (
         SELECT s.staleness, count(*) AS n FROM staleness s
         WHERE s.run_id = ${runId} AND s.group_id = ANY(${groups}::bigint[]) AND s.step = ${step} AND s.staleness IS NOT NULL GROUP BY 1) x), '{}'::jsonb)
    ON CONFLICT (run_id, step) DO UPDATE SET trained_response_tokens = excluded.trained_response_tokens, staleness = excluded.staleness`);
}

type SummaryRow = Record<string, unknown>;

async function readStepSummaries(tx: Database, runId: string): Promise<Map<number, SummaryRow>> {
  const res = await tx.execute<SummaryRow>(sql`SELECT * FROM step_summaries WHERE run_id = ${runId} ORDER BY step`);
  return new Map(res.rows.map((r) => [Number(r.step), r]));
}

/** Two reads of a summary column agree: jsonb by content, numbers up to the order a sum added them in. */
function sameValue(a: unknown, b: unknown): boolean {
  if (typeof a === "object" && a !== null && typeof b === "object" && b !== null) return show(a) === show(b);
  const x = Number(a);
  const y = Number(b);
  if (a !== null && b !== null && Number.isFinite(x) && Number.isFinite(y)) return Math.abs(x - y) <= 1e-9 * Math.max(1, Math.abs(x));
  return show(a) === show(b);
}

const show = (v: unknown): string =>
  typeof v === "object" && v !== null ? JSON.stringify(Object.fromEntries(Object.entries(v).sort())) : (JSON.stringify(v) ?? "undefined");

/**
 * `rlq replay --check` of `step_summaries`: the stored summaries against those rebuilt from the
 * run's history now (in a transaction rolled back), one line per difference.
 */
export async function diffStepSummaries(db: Db, runId: string): Promise<string[]> {
  const stored = await readStepSummaries(db.db, runId);
  let rebuilt = new Map<number, SummaryRow>();
  const rollback = new Error("step summaries compared");
  try {
    await db.db.transaction(async (tx) => {
      await rebuildStepSummaries(tx, runId);
      rebuilt = await readStepSummaries(tx, runId);
      throw rollback;
    });
  } catch (e) {
    if (e !== rollback) throw e;
  }
  const out: string[] = [];
  for (const [step, want] of rebuilt) {
    const have = stored.get(step);
    if (!have) {
      out.push(`step_summaries step ${step}: missing from the live projection`);
      continue;
    }
    for (const col of Object.keys(want))
      if (!sameValue(want[col], have[col])) out.push(`step_summaries step ${step}.${col}: live ${show(have[col])} != rebuilt ${show(want[col])}`);
  }
  for (const step of stored.keys()) if (!rebuilt.has(step)) out.push(`step_summaries step ${step}: in the live projection but not rebuilt`);
  return out;
}

/** A run's summaries rebuilt from its history (`rlq replay`), as the commits of its train steps wrote them. */
async function rebuildStepSummaries(tx: Database, runId: string): Promise<void> {
  await tx.execute(sql`DELETE FROM step_summaries WHERE run_id = ${runId}`);
  const steps = await tx.execute<{ step: number }>(sql`SELECT step FROM train_steps WHERE run_id = ${runId} ORDER BY step`);
  const trained = await tx.execute<{ step: number; groups: string[] }>(
    sql`SELECT trained_step AS step, array_agg(DISTINCT group_id)::text[] AS groups FROM rollout_history WHERE run_id = ${runId} AND trained_step IS NOT NULL GROUP BY 1`,
  );
  const groupsByStep = new Map(trained.rows.map((r) => [Number(r.step), r.groups.map(Number)]));
  const all = steps.rows.map((r) => Number(r.step));
  await summarizeRolloutSides(tx, runId, all);
  for (const step of all) await summarizeTrainedSide(tx, runId, step, groupsByStep.get(step) ?? []);
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
      reward_components, kept, outcome, outcome_reason, trained_step, teacher_log_probs)
    SELECT run_id, step, group_id, sample_index, draw_ordinal, prompt, response, tokens::int4[], prompt_length,
      response_length, loss_mask::int2[], rollout_log_probs::float4[], token_versions::int4[], weight_versions::int4[], num_segments, status,
      finish_reason, reward, reward_components::jsonb, kept, outcome, outcome_reason, trained_step, teacher_log_probs::float4[]
    FROM unnest(
      ${col((r) => r.runId)}::text[], ${col((r) => r.step)}::int[], ${col((r) => r.groupId)}::bigint[], ${col((r) => r.sampleIndex)}::int[],
      ${col((r) => r.drawOrdinal)}::bigint[], ${col((r) => r.prompt)}::text[], ${col((r) => r.response)}::text[], ${arr((r) => r.tokens)}::text[],
      ${col((r) => r.promptLength)}::int[], ${col((r) => r.responseLength)}::int[], ${arr((r) => r.lossMask)}::text[],
      ${arr((r) => r.rolloutLogProbs)}::text[], ${arr((r) => r.tokenVersions)}::text[], ${arr((r) => r.weightVersions)}::text[],
      ${col((r) => r.numSegments)}::int[], ${col((r) => r.status)}::text[], ${col((r) => r.finishReason)}::text[],
      ${col((r) => r.reward ?? null)}::float8[], ${col((r) => (r.rewardComponents == null ? null : JSON.stringify(r.rewardComponents)))}::text[],
      ${col((r) => r.isKept)}::boolean[], ${col((r) => r.outcome)}::text[], ${col((r) => r.outcomeReason ?? null)}::text[],
      ${col((r) => r.trainedStep ?? null)}::int[], ${col((r) => (r.teacherLogProbs == null ? null : `{${r.teacherLogProbs.join(",")}}`))}::text[]
    ) AS t(run_id, step, group_id, sample_index, draw_ordinal, prompt, response, tokens, prompt_length, response_length, loss_mask,
           rollout_log_probs, token_versions, weight_versions, num_segments, status, finish_reason, reward, reward_components, kept,
           outcome, outcome_reason, trained_step, teacher_log_probs)
    ON CONFLICT DO NOTHING`);
  // Rows recorded for a step that has trained already (aborted groups that land after its commit):
  // its summary follows them.
  const byRun = new Map<string, Set<number>>();
  for (const r of rows) byRun.set(r.runId, (byRun.get(r.runId) ?? new Set()).add(r.step));
  for (const [runId, steps] of byRun) {
    const summarized = await tx.execute<{ step: number }>(
      sql`SELECT step FROM step_summaries WHERE run_id = ${runId} AND step = ANY(${sql.param([...steps])}::int[])`,
    );
    await summarizeRolloutSides(
      tx,
      runId,
      summarized.rows.map((r) => Number(r.step)),
    );
  }
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
    await tx.execute(sql`DELETE FROM step_summaries WHERE run_id = ${runId}`);
    await insertHistory(tx, rows);
    await rebuildStepSummaries(tx, runId);
    await tx.execute(
      sql`UPDATE runs SET status = ${runRow.status}, step = ${runRow.step}, weight_version = ${runRow.weightVersion}, last_seq = ${runRow.lastSeq}, updated_at = now() WHERE id = ${runId}`,
    );
  });
}
