import { sql } from "drizzle-orm";
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
      teacherLogProbs: r?.teacherLogProbs == null ? null : [...r.teacherLogProbs],
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

export async function loadHistory(db: import("./db.ts").Db, runId: string) {
  return db.db
    .select()
    .from(rolloutHistory)
    .where(sql`${rolloutHistory.runId} = ${runId}`)
    .orderBy(rolloutHistory.groupId, rolloutHistory.sampleIndex);
}
