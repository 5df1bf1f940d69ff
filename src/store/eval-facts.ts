import { and, desc, eq } from "drizzle-orm";
import type { Db } from "./db.ts";
import { evalResults, evalSamples } from "./schema/index.ts";
import { pgText } from "./history.ts";
import { notifyInTx } from "./notify.ts";

export type EvalResultRow = typeof evalResults.$inferInsert;
export type EvalSampleRow = typeof evalSamples.$inferInsert;

/**
 * Write an eval's results and samples in one transaction, idempotently per
 * (run, step): a retried eval job that finds results already there writes
 * nothing.
 */
export async function writeEval(db: Db, results: readonly EvalResultRow[], samples: readonly EvalSampleRow[]): Promise<boolean> {
  return db.db.transaction(async (tx) => {
    const inserted = await tx
      .insert(evalResults)
      .values([...results])
      .onConflictDoNothing()
      .returning({ d: evalResults.dataset });
    if (inserted.length === 0) return false;
    // NUL cannot be stored in text (history.ts pgText): the decoded text is a view of the tokens.
    const clean = samples.map((x) => ({ ...x, prompt: pgText(x.prompt), response: pgText(x.response), label: x.label == null ? x.label : pgText(x.label) }));
    for (let i = 0; i < clean.length; i += 500)
      await tx
        .insert(evalSamples)
        .values(clean.slice(i, i + 500))
        .onConflictDoNothing();
    const runId = results[0]?.runId;
    if (runId !== undefined) await notifyInTx(tx, "rlq_facts", runId);
    return true;
  });
}

export async function loadEvalResults(db: Db, runId: string, step?: number) {
  const cond = step === undefined ? eq(evalResults.runId, runId) : and(eq(evalResults.runId, runId), eq(evalResults.step, step));
  return db.db.select().from(evalResults).where(cond).orderBy(desc(evalResults.step), evalResults.dataset);
}
