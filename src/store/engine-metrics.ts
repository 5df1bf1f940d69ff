import { desc, eq, sql } from "drizzle-orm";
import type { Db } from "./db.ts";
import { engineMetrics } from "./schema/index.ts";

export async function upsertEngineMetrics(db: Db, runId: string, worker: string, snapshot: unknown): Promise<void> {
  await db.db
    .insert(engineMetrics)
    .values({ runId, worker, snapshot })
    .onConflictDoUpdate({ target: [engineMetrics.runId, engineMetrics.worker], set: { snapshot, at: sql`now()` } });
}

export async function loadEngineMetrics(db: Db, runId: string) {
  return db.db.select().from(engineMetrics).where(eq(engineMetrics.runId, runId)).orderBy(desc(engineMetrics.at));
}
