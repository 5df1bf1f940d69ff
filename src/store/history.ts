import { sql } from "drizzle-orm";
import type { Database } from "./db.ts";
import { rolloutHistory } from "./schema/index.ts";
import type { GroupView } from "./group-view.ts";
import type { RewardFact } from "./rollout-facts.ts";

/**
 * Postgres text cannot hold NUL (U+0000): a byte tokenizer can sample byte 0, and an insert holding
 * it fails ("invalid byte sequence for encoding UTF8: 0x00"), which stopped the controller. The
 * decoded text is a view (the token ids stay exact in `tokens`), so NUL reads as U+FFFD there.
 */
export function pgText(text: string): string {
  return text.includes("\u0000") ? text.replaceAll("\u0000", "\uFFFD") : text;
}

/**
 * The `rollout_history` projection: one row per sample, written when its
 * group reaches a final outcome in a step. `rlq replay` rebuilds it with the
 * same function.
 */
export function historyRows(
  runId: string,
  step: number,
  view: GroupView,
  rewards: Map<number, RewardFact> | null,
  outcome: "kept" | "filtered" | "discarded",
  reason: string | null,
  decode: (ids: readonly number[]) => string,
  trainedStep: number | null,
): Array<typeof rolloutHistory.$inferInsert> {
  return view.samples.map((s) => {
    const r = rewards?.get(s.sampleIndex) ?? null;
    return {
      runId,
      step,
      groupId: view.groupId,
      sampleIndex: s.sampleIndex,
      drawOrdinal: view.prompt.drawOrdinal,
      prompt: pgText(view.prompt.prompt),
      response: pgText(decode(s.responseTokens)),
      tokens: [...view.prompt.promptTokens, ...s.responseTokens],
      promptLength: view.prompt.promptTokens.length,
      responseLength: s.responseTokens.length,
      lossMask: s.lossMask,
      rolloutLogProbs: s.logProbs,
      tokenVersions: s.tokenVersions,
      weightVersions: s.weightVersions,
      numSegments: s.numSegments,
      status: s.status,
      finishReason: s.finishReason || "none",
      reward: r?.reward ?? null,
      rewardComponents: r?.components ?? null,
      isKept: outcome === "kept",
      outcome,
      outcomeReason: reason === null ? null : pgText(reason),
      trainedStep,
    };
  });
}

/**
 * One statement with one parameter per column (unnest), not one per value:
 * the controller writes rollout_batch_size x n_samples_per_prompt rows per step
 * inside its decision transaction, and drizzle's per-value query building was
 * a tenth of `rlq up`'s CPU in the control-plane bench. Per-token columns
 * travel as array literals in a text[] (Postgres arrays cannot be ragged).
 */
export async function insertHistory(tx: Database, rows: Array<typeof rolloutHistory.$inferInsert>): Promise<void> {
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

export async function loadHistory(db: import("./db.ts").Db, runId: string) {
  return db.db
    .select()
    .from(rolloutHistory)
    .where(sql`${rolloutHistory.runId} = ${runId}`)
    .orderBy(rolloutHistory.groupId, rolloutHistory.sampleIndex);
}

/** Replace a run's projections with rebuilt ones, in one transaction (`rlq replay`). */
export async function replaceProjections(
  db: import("./db.ts").Db,
  runId: string,
  rows: Array<typeof rolloutHistory.$inferInsert>,
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
