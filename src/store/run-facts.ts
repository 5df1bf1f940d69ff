import { and, asc, eq, gt, gte, inArray, sql } from "drizzle-orm";
import type { Db } from "./db.ts";
import type { PromptImage } from "../data/images.ts";
import { decisions, drawnPrompts, runLeases, runs } from "./schema/index.ts";
import { insertFirstDecisions } from "./decision-log.ts";
import { insertRunProjection } from "./projections.ts";
import { parseDecision, type Decision, type DecisionKind, type DecisionPayload, type LoggedDecision } from "../core/decisions.ts";

/** Create a run: its projection row, its lease row (epoch 0) and decisions 0 and 1, in one transaction. */
export async function insertRun(
  db: Db,
  input: {
    runId: string;
    name: string;
    config: Record<string, unknown>;
    datasetFingerprint: string;
    datasetSize: number;
    datasetErrors: string[];
    pluginFingerprints: Record<string, string>;
  },
): Promise<void> {
  const created: Decision = {
    kind: "run.created",
    payload: {
      config: input.config,
      datasetFingerprint: input.datasetFingerprint,
      datasetSize: input.datasetSize,
      datasetErrors: input.datasetErrors,
      pluginFingerprints: input.pluginFingerprints,
      name: input.name,
    },
  };
  const running: Decision = { kind: "run.status", payload: { status: "running", reason: null } };
  await db.db.transaction(async (tx) => {
    await insertRunProjection(tx, {
      id: input.runId,
      name: input.name,
      config: input.config,
      datasetFingerprint: input.datasetFingerprint,
      pluginFingerprints: input.pluginFingerprints,
      lastSeq: 1,
    });
    await tx.insert(runLeases).values({ runId: input.runId, epoch: 0, holder: "rlq run start" });
    await insertFirstDecisions(tx, input.runId, [created, running]);
  });
}

/** Find the decisions of one kind for a run, optionally for one step or group (workers check "a decision behind the job"). */
export async function findDecisions<K extends DecisionKind>(
  db: Db,
  runId: string,
  kind: K,
  where: { step?: number; groupId?: number } = {},
): Promise<Array<DecisionPayload<K> & { seq: number }>> {
  const conds = [eq(decisions.runId, runId), eq(decisions.kind, kind)];
  if (where.step !== undefined) conds.push(eq(decisions.step, where.step));
  if (where.groupId !== undefined) conds.push(eq(decisions.groupId, where.groupId));
  const rows = await db.db
    .select()
    .from(decisions)
    .where(and(...conds))
    .orderBy(asc(decisions.seq));
  return rows.map((r) => {
    const d = parseDecision(r.kind, r.payload, r.seq);
    return { ...(d.payload as DecisionPayload<K>), seq: r.seq };
  });
}

/**
 * A run's group verdicts and outcomes (`group.filtered`, `group.outcome`) in log order: those after
 * decision `since.afterSeq`, or those of steps from `since.fromStep` on (one index range each).
 */
export async function findGroupOutcomes(db: Db, runId: string, since: { afterSeq: number } | { fromStep: number }): Promise<LoggedDecision[]> {
  const kinds = ["group.filtered", "group.outcome"];
  const bound = "afterSeq" in since ? gt(decisions.seq, since.afterSeq) : gte(decisions.step, since.fromStep);
  const rows = await db.db
    .select({ seq: decisions.seq, kind: decisions.kind, payload: decisions.payload })
    .from(decisions)
    .where(and(eq(decisions.runId, runId), inArray(decisions.kind, kinds), bound))
    .orderBy(asc(decisions.seq));
  return rows.map((r) => parseDecision(r.kind, r.payload, r.seq));
}

export async function loadRunRow(db: Db, runId: string) {
  const rows = await db.db.select().from(runs).where(eq(runs.id, runId));
  return rows[0] ?? null;
}

/** The run's synced weight version (runs.weight_version, projected with weights.synced); null for no such run. */
export async function loadRunWeightVersion(db: Db, runId: string): Promise<number | null> {
  const rows = await db.db.select({ v: runs.weightVersion }).from(runs).where(eq(runs.id, runId));
  return rows[0]?.v ?? null;
}

/**
 * The weight version a sync in progress loads (its `weights.syncing` has no `weights.synced` after
 * it) when that sync aborts every round in flight (mode abort); null otherwise.
 */
export async function loadAbortingSyncTarget(db: Db, runId: string): Promise<number | null> {
  const res = await db.pool.query<{ kind: string; payload: { weightVersion: number; mode?: string } }>(
    `SELECT kind, payload FROM decisions WHERE run_id = $1 AND kind IN ('weights.syncing', 'weights.synced') ORDER BY seq DESC LIMIT 1`,
    [runId],
  );
  const last = res.rows[0];
  return last?.kind === "weights.syncing" && last.payload.mode === "abort" ? last.payload.weightVersion : null;
}

export async function listRuns(db: Db, status?: string) {
  const q = db.db.select().from(runs);
  const rows = status ? await q.where(eq(runs.status, status)) : await q;
  return rows;
}

export interface DrawnPromptRow {
  drawOrdinal: number;
  epoch: number;
  datasetIndex: number;
  step: number;
  prompt: string;
  label: string | null;
  metadata: unknown;
  promptTokens: number[];
  /** The prompt's images (multimodal_keys); absent or empty for a text prompt. */
  images?: PromptImage[];
}

export async function loadDrawnPrompts(db: Db, runId: string, groupIds: readonly number[]): Promise<Map<number, DrawnPromptRow>> {
  const rows = await db.db
    .select()
    .from(drawnPrompts)
    .where(and(eq(drawnPrompts.runId, runId), inArray(drawnPrompts.drawOrdinal, [...groupIds])));
  return new Map(rows.map((r) => [r.drawOrdinal, r]));
}

/**
 * Insert a draw's `drawn_prompts` rows in the controller's decision
 * transaction: one parameter per column (unnest), not one per value. A step
 * starts with a draw of over_sampling_batch_size rows and no rollout job can
 * start before it commits; drizzle's per-value insert building was most of
 * that commit's CPU in the control-plane bench.
 */
export async function insertDrawnPrompts(tx: import("./db.ts").Database, rows: ReadonlyArray<typeof drawnPrompts.$inferInsert>): Promise<void> {
  if (rows.length === 0) return;
  const col = (f: (r: (typeof rows)[number]) => unknown) => sql.param(rows.map(f));
  await tx.execute(sql`
    INSERT INTO drawn_prompts (run_id, draw_ordinal, epoch, dataset_index, step, prompt, label, metadata, prompt_tokens, images)
    SELECT run_id, draw_ordinal, epoch, dataset_index, step, prompt, label, metadata::jsonb, prompt_tokens::int4[], images::jsonb
      FROM unnest(${col((r) => r.runId)}::text[], ${col((r) => r.drawOrdinal)}::bigint[], ${col((r) => r.epoch)}::int[],
                  ${col((r) => r.datasetIndex)}::int[], ${col((r) => r.step)}::int[], ${col((r) => r.prompt)}::text[],
                  ${col((r) => r.label ?? null)}::text[], ${col((r) => JSON.stringify(r.metadata))}::text[],
                  ${col((r) => `{${r.promptTokens.join(",")}}`)}::text[], ${col((r) => JSON.stringify(r.images ?? []))}::text[])
        AS t(run_id, draw_ordinal, epoch, dataset_index, step, prompt, label, metadata, prompt_tokens, images)`);
}
