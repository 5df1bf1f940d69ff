import { and, asc, eq, isNull } from "drizzle-orm";
import type { Db } from "./db.ts";
import { runRequests } from "./schema/index.ts";
import { notifyRuns } from "./notify.ts";

export type RunRequestKind = "pause" | "resume" | "cancel" | "amend";

export async function insertRunRequest(db: Db, runId: string, kind: RunRequestKind, payload: Record<string, unknown> = {}): Promise<number> {
  const rows = await db.db.insert(runRequests).values({ runId, kind, payload }).returning({ id: runRequests.id });
  await notifyRuns(db.pool, "rlq_facts", [runId]); // the run's controller handles it now, not at its next poll
  return rows[0]?.id as number;
}

export async function pendingRunRequests(db: Db, runId: string) {
  return db.db
    .select()
    .from(runRequests)
    .where(and(eq(runRequests.runId, runId), isNull(runRequests.handledSeq)))
    .orderBy(asc(runRequests.id));
}

export async function markRunRequest(db: Db, id: number, handledSeq: number, error: string | null): Promise<void> {
  await db.db.update(runRequests).set({ handledSeq, error }).where(eq(runRequests.id, id));
}

/** One request by id (run-watch.ts `changeOutcome`); null when there is none. */
export async function loadRunRequest(db: Db, id: number) {
  const rows = await db.db.select().from(runRequests).where(eq(runRequests.id, id));
  return rows[0] ?? null;
}
