import { sql } from "drizzle-orm";
import type { Database } from "./db.ts";
import { rolloutHistory } from "./schema/index.ts";
import type { GroupView } from "./group-view.ts";
import type { RewardFact } from "./rollout-facts.ts";

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
      prompt: view.prompt.prompt,
      response: decode(s.responseTokens),
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
      outcomeReason: reason,
      trainedStep,
    };
  });
}

export async function insertHistory(tx: Database, rows: Array<typeof rolloutHistory.$inferInsert>): Promise<void> {
  // A re-run of the same outcome (controller restarted mid-write) is a no-op.
  for (let i = 0; i < rows.length; i += 500) await tx.insert(rolloutHistory).values(rows.slice(i, i + 500)).onConflictDoNothing();
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
    await tx.execute(sql`UPDATE runs SET status = ${runRow.status}, step = ${runRow.step}, weight_version = ${runRow.weightVersion}, last_seq = ${runRow.lastSeq}, updated_at = now() WHERE id = ${runId}`);
  });
}
