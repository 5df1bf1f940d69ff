import { and, eq } from "drizzle-orm";
import type { Db } from "./db.ts";
import { trainLogProbs, trainMetrics, trainSteps } from "./schema/index.ts";
import { projectTrainedStep } from "./projections.ts";
import { notifyInTx } from "./notify.ts";

export interface TrainCommit {
  runId: string;
  step: number;
  attempt: string;
  weightVersionIn: number;
  weightVersionOut: number;
  numSamples: number;
  numTokens: number;
  checkpointUri: string;
  checkpointSha256: string;
  metrics: Record<string, number>;
  groupIds: number[];
  /** Each trained sample's old log-probs as its trainer computed them (TrainResult.oldLogProbs). */
  logProbs?: Array<{ groupId: number; sampleIndex: number; logProbs: number[] }>;
}

export type TrainStepRow = typeof trainSteps.$inferSelect;

/**
 * Commit a train step: the `train_steps` row (one per run and step, ever),
 * its metrics and the trained marks, in one transaction. Returns the row that
 * is committed: this attempt's, or the one that won before it.
 */
export async function commitTrainStep(db: Db, c: TrainCommit): Promise<{ isWinner: boolean; row: TrainStepRow }> {
  return db.db.transaction(async (tx) => {
    const inserted = await tx
      .insert(trainSteps)
      .values({
        runId: c.runId,
        step: c.step,
        attempt: c.attempt,
        weightVersionIn: c.weightVersionIn,
        weightVersionOut: c.weightVersionOut,
        numSamples: c.numSamples,
        numTokens: c.numTokens,
        checkpointUri: c.checkpointUri,
        checkpointSha256: c.checkpointSha256,
      })
      .onConflictDoNothing()
      .returning();
    const row = inserted[0];
    if (!row) {
      const existing = await tx
        .select()
        .from(trainSteps)
        .where(and(eq(trainSteps.runId, c.runId), eq(trainSteps.step, c.step)));
      return { isWinner: false, row: existing[0] as TrainStepRow };
    }
    const entries = Object.entries(c.metrics).filter(([, v]) => Number.isFinite(v));
    if (entries.length > 0) {
      await tx.insert(trainMetrics).values(entries.map(([key, value]) => ({ runId: c.runId, step: c.step, key, value })));
    }
    // Only the winning attempt gets here: a retried step's loser writes no second copy.
    if (c.logProbs && c.logProbs.length > 0) {
      await tx.insert(trainLogProbs).values(c.logProbs.map((l) => ({ runId: c.runId, step: c.step, ...l })));
    }
    await projectTrainedStep(tx, c.runId, c.step, c.groupIds);
    await notifyInTx(tx, "rlq_facts", c.runId);
    return { isWinner: true, row };
  });
}

export async function loadTrainStep(db: Db, runId: string, step: number): Promise<TrainStepRow | null> {
  const rows = await db.db
    .select()
    .from(trainSteps)
    .where(and(eq(trainSteps.runId, runId), eq(trainSteps.step, step)));
  return rows[0] ?? null;
}

export async function listTrainSteps(db: Db, runId: string): Promise<TrainStepRow[]> {
  return db.db.select().from(trainSteps).where(eq(trainSteps.runId, runId)).orderBy(trainSteps.step);
}

/** The metrics step `step` committed, by key (empty when it never committed). */
export async function loadTrainMetrics(db: Db, runId: string, step: number): Promise<Record<string, number>> {
  const rows = await db.db
    .select()
    .from(trainMetrics)
    .where(and(eq(trainMetrics.runId, runId), eq(trainMetrics.step, step)));
  return Object.fromEntries(rows.map((r) => [r.key, r.value]));
}
