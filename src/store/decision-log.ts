import pg from "pg";
import { asc, eq, sql } from "drizzle-orm";
import type { Db, Database } from "./db.ts";
import { decisions } from "./schema/index.ts";
import { decisionKeys, parseDecision, type Decision, type LoggedDecision } from "../core/decisions.ts";
import { RlqError } from "../lib/errors.ts";
import { projectLastSeq } from "./projections.ts";
import { notifyInTx } from "./notify.ts";

/**
 * The run's decision log: the controller's lease (advisory lock + epoch
 * fence) and the only writer of `decisions`.
 */
export class LeaseLostError extends RlqError {
  constructor(runId: string, cause?: unknown) {
    super("lease_lost", `run ${runId}: this controller no longer holds the run's lease`, { cause });
  }
}

export interface Lease {
  runId: string;
  epoch: number;
  /** Resolves/rejects when the lease connection dies: the controller must stop deciding. */
  lost: Promise<void>;
  release(): Promise<void>;
}

const LOCK_NAMESPACE = 727_100;

/**
 * Try to take the run's lease. Returns null when another controller holds it
 * (the caller waits as standby). With `waitMs`, the attempt waits that long in
 * Postgres's lock queue (`pg_advisory_lock` under `lock_timeout`), so a standby
 * or a restarted controller gets the lease the moment the holder's backend
 * releases it (a SIGKILLed controller's backend exits at its socket's EOF),
 * not at its next poll. The advisory lock lives on a dedicated
 * connection: if that connection dies the lock is released, another
 * controller bumps the epoch, and this one's decisions are rejected.
 * The connection is its own, outside the pool: one process may hold the
 * leases of many runs without starving its pool (8 runs in one `rlq up`
 * once took all 8 pooled connections and deadlocked).
 */
export async function tryAcquireLease(db: Db, runId: string, holder: string, waitMs = 0): Promise<Lease | null> {
  const client = new pg.Client({ connectionString: db.url, application_name: `rlq-lease-${runId}` });
  // An error on an idle client is reported through "error" (and the lease marked lost below), never thrown.
  client.on("error", () => undefined);
  await client.connect();
  let released = false;
  // An end that fails finds the connection already broken: its backend, and the lock with it, is gone.
  const end = () => client.end().catch(() => undefined);
  try {
    if (!(await takeLock(client, runId, waitMs))) {
      await end();
      return null;
    }
    const res = await client.query<{ epoch: number }>(
      "UPDATE run_leases SET epoch = epoch + 1, holder = $2, acquired_at = now() WHERE run_id = $1 RETURNING epoch",
      [runId, holder],
    );
    const epoch = res.rows[0]?.epoch;
    if (epoch === undefined) throw new RlqError("run_not_found", `run ${runId} does not exist`);
    let markLost: () => void = () => undefined;
    const lost = new Promise<void>((resolve) => {
      markLost = resolve;
    });
    client.on("error", () => markLost());
    client.on("end", () => markLost());
    return {
      runId,
      epoch,
      lost,
      async release() {
        if (released) return;
        released = true;
        try {
          await client.query("SELECT pg_advisory_unlock($1, hashtext($2))", [LOCK_NAMESPACE, runId]);
        } catch {
          // the connection is gone, and with it the lock
        }
        await end();
      },
    };
  } catch (e) {
    if (!released) await end();
    throw e;
  }
}

/** The run's advisory lock on `client`: at once, or waiting up to `waitMs` in the lock queue. */
async function takeLock(client: pg.Client, runId: string, waitMs: number): Promise<boolean> {
  if (waitMs <= 0) {
    const got = await client.query<{ ok: boolean }>("SELECT pg_try_advisory_lock($1, hashtext($2)) AS ok", [LOCK_NAMESPACE, runId]);
    return got.rows[0]?.ok === true;
  }
  await client.query(`SET lock_timeout = ${Math.ceil(waitMs)}`);
  try {
    await client.query("SELECT pg_advisory_lock($1, hashtext($2))", [LOCK_NAMESPACE, runId]);
  } catch (e) {
    if ((e as { code?: string }).code === "55P03") return false; // lock_not_available: lock_timeout passed
    throw e;
  }
  await client.query("SET lock_timeout = 0");
  return true;
}

export async function loadDecisions(db: Db, runId: string): Promise<LoggedDecision[]> {
  const rows = await db.db.select().from(decisions).where(eq(decisions.runId, runId)).orderBy(asc(decisions.seq));
  return rows.map((r) => parseDecision(r.kind, r.payload, r.seq));
}

/** The run's decisions with seq > `afterSeq`, in order (a restart's tail after its snapshot). */
export async function loadDecisionsAfter(db: Db, runId: string, afterSeq: number): Promise<LoggedDecision[]> {
  const res = await db.pool.query<{ seq: string; kind: string; payload: unknown }>(
    "SELECT seq, kind, payload FROM decisions WHERE run_id = $1 AND seq > $2 ORDER BY seq",
    [runId, afterSeq],
  );
  return res.rows.map((r) => parseDecision(r.kind, r.payload, Number(r.seq)));
}

/**
 * Append decisions in one transaction, with `extra` writes (facts and
 * projections that must land with them) in the same transaction.
 * `firstSeq` is the next sequence number; the trigger checks it and the epoch.
 */
export async function appendDecisions(
  db: Db,
  runId: string,
  epoch: number,
  firstSeq: number,
  list: readonly Decision[],
  extra?: (tx: Database) => Promise<void>,
): Promise<LoggedDecision[]> {
  if (list.length === 0 && !extra) return [];
  const logged = list.map((d, i) => ({ ...d, seq: firstSeq + i }));
  try {
    await db.db.transaction(async (tx) => {
      if (logged.length > 0) {
        // One parameter per column (unnest), in seq order: the fence trigger checks each row
        // against the rows before it. Drizzle's per-value insert building was a visible cost of
        // the controller's bulk decisions (bench/control-plane.ts).
        const keys = logged.map((d) => decisionKeys(d));
        await tx.execute(sql`
          INSERT INTO decisions (run_id, seq, lease_epoch, kind, step, group_id, payload)
          SELECT ${runId}::text, d.seq, ${epoch}::int, d.kind, d.step, d.group_id, d.payload::jsonb
            FROM unnest(${sql.param(logged.map((d) => d.seq))}::bigint[], ${sql.param(logged.map((d) => d.kind))}::text[],
                        ${sql.param(keys.map((k) => k.step))}::int[], ${sql.param(keys.map((k) => k.groupId))}::bigint[],
                        ${sql.param(logged.map((d) => JSON.stringify(d.payload)))}::text[]) WITH ORDINALITY AS d(seq, kind, step, group_id, payload, ord)
           ORDER BY d.ord`);
        await projectLastSeq(tx, runId, logged[logged.length - 1]?.seq ?? 0);
        // Rollout jobs watching the rounds these decisions abort look now, not at their next poll.
        if (logged.some(abortsRounds)) await notifyInTx(tx, "rlq_abort", runId);
        // The weight sync's part of the log advanced: rollout workers re-read it (runtime/engines.ts
        // RunRouter), to hold new requests while a sync aborts every round and to learn the new version
        // before the next step's jobs reach them.
        if (logged.some((d) => d.kind === "weights.syncing" || d.kind === "weights.synced")) await notifyInTx(tx, "rlq_weights", runId);
        // The train worker reads kept groups while their step still collects.
        if (logged.some((d) => d.kind === "group.outcome" && d.payload.outcome === "kept")) await notifyInTx(tx, "rlq_kept", runId);
      }
      if (extra) await extra(tx);
    });
  } catch (e) {
    const code = (e as { code?: string; cause?: { code?: string } }).code ?? (e as { cause?: { code?: string } }).cause?.code;
    if (code === "RLQ01" || code === "RLQ02") throw new LeaseLostError(runId, e);
    throw e;
  }
  return logged;
}

/**
 * A new run's first decisions (run.created, run.status running) under epoch 0,
 * in the transaction that creates the run (store/run-facts.ts `insertRun`):
 * before any lease exists, so no fence applies yet.
 */
export async function insertFirstDecisions(tx: Database, runId: string, list: readonly Decision[]): Promise<void> {
  await tx.insert(decisions).values(list.map((d, seq) => ({ runId, seq, leaseEpoch: 0, kind: d.kind, payload: d.payload })));
}

/** Decisions that abort in-flight rounds (store/rollout-facts.ts `roundAbortedSql` reads the same two). */
function abortsRounds(d: Decision): boolean {
  return d.kind === "group.aborted" || (d.kind === "step.sealed" && d.payload.aborted.length > 0);
}
