/**
 * @file Colocated mode: whose turn it is on the shared GPUs (core/colocate.ts `ColocateTurn`), for
 * the processes that send the engines generations of their own, and the lock that keeps those
 * generations and the controller's release apart (docs/engines.md, "Colocated mode").
 *
 * A rollout worker's engine pool checks its engines (`/health_generate`) and probes each one it
 * admits (three log-prob generations). No drain waits for those, and a generation that reaches an
 * engine after its release runs on memory it no longer holds (SGLang's release also asserts that no
 * request runs). So each batch of checks in a worker runs inside `enterEnginesTurn`: a shared
 * advisory lock on the run, then the turn read from the log, and nothing is sent unless the log
 * says `engines`. The controller's release runs inside `holdForRelease`: the same lock,
 * exclusive, taken after `step.sealed` is committed. Either a worker's read came before the seal,
 * and the controller waits for that worker's checks to end; or it came after, and the worker finds
 * `release_due` and sends nothing. The lock is Postgres's, per session: a worker or a controller
 * that dies loses its connection and with it its hold, so a crash on either side neither blocks
 * the release for good nor lets a check through.
 *
 * Why a lock and not a decision the workers read before the release: the controller cannot know
 * that every worker read it (a worker may be mid-check, stalled, or not yet started), and a time
 * allowance is only as good as the slowest check. The lock makes the release wait for exactly the
 * checks under way.
 */
import pg from "pg";
import type { Db } from "./db.ts";
import { parseDecision } from "../core/decisions.ts";
import { colocateTurnKinds, foldColocateTurn, type ColocateTurn } from "../core/colocate.ts";

/** The lock's first key (the second is the run id's hash); store/decision-log.ts's lease uses 727_100. */
const TURN_LOCK_NAMESPACE = 727_101;

type Queryable = Pick<pg.ClientBase, "query">;

/**
 * The run's turn from its log: the turn's decisions from the last `step.started` on, folded by
 * core/colocate.ts `foldColocateTurn`. Two index reads (decisions_run_kind_step_idx, then the
 * primary key from that seq), whatever the length of the run.
 */
export async function loadColocateTurn(q: Queryable, runId: string): Promise<ColocateTurn> {
  const res = await q.query<{ seq: number; kind: string; payload: unknown }>(
    `SELECT seq, kind, payload FROM decisions
      WHERE run_id = $1 AND kind = ANY($2::text[])
        AND seq >= COALESCE((SELECT seq FROM decisions WHERE run_id = $1 AND kind = 'step.started' ORDER BY step DESC LIMIT 1), 0)
      ORDER BY seq`,
    [runId, colocateTurnKinds],
  );
  return foldColocateTurn(res.rows.map((r) => parseDecision(r.kind, r.payload, Number(r.seq))));
}

/** A worker's hold on the engines' turn: `leave` once the checks it covers have ended. */
export interface EnginesTurnHold {
  leave(): Promise<void>;
}

/**
 * A rollout worker, before it sends its engines a generation of its own: the hold when the log
 * says it is the engines' turn, null when it is not (or the controller is releasing now: its
 * exclusive hold, held or awaited, refuses the shared one). Never waits for the lock. The hold is
 * a pooled connection until `leave`.
 */
export async function enterEnginesTurn(db: Db, runId: string): Promise<EnginesTurnHold | null> {
  const client = await db.pool.connect();
  try {
    const got = await client.query<{ ok: boolean }>("SELECT pg_try_advisory_lock_shared($1, hashtext($2)) AS ok", [TURN_LOCK_NAMESPACE, runId]);
    const isLocked = got.rows[0]?.ok === true;
    if (isLocked && (await loadColocateTurn(client, runId)) === "engines") return { leave: () => unlockShared(client, runId) };
    if (isLocked) await client.query("SELECT pg_advisory_unlock_shared($1, hashtext($2))", [TURN_LOCK_NAMESPACE, runId]);
    client.release();
    return null;
  } catch (e) {
    // A connection whose unlock may not have run must not go back to the pool holding the lock:
    // releasing it with the error destroys it, and the lock goes with its session.
    client.release(e instanceof Error ? e : new Error(String(e)));
    throw e;
  }
}

async function unlockShared(client: pg.PoolClient, runId: string): Promise<void> {
  try {
    await client.query("SELECT pg_advisory_unlock_shared($1, hashtext($2))", [TURN_LOCK_NAMESPACE, runId]);
    client.release();
  } catch (e) {
    // Nothing held on: the connection is destroyed, and its session's lock with it.
    client.release(e instanceof Error ? e : new Error(String(e)));
  }
}

/**
 * The controller's release of the engines' memory: `release` runs once no worker's check is under
 * way and none can start (see the file comment); call it only once `step.sealed` is in the log.
 * Waits as long as the checks under way take (each is bounded by its own timeout). The lock
 * lives on a connection of its own, outside the pool, as the lease's does: a wait must not hold a
 * pooled connection the controller's commits need.
 */
export async function holdForRelease<T>(db: Db, runId: string, release: () => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: db.url, application_name: `rlq-colocate-${runId}` });
  // An error on the idle client is reported by the next query on it, never thrown as an event.
  client.on("error", () => undefined);
  await client.connect();
  try {
    await client.query("SELECT pg_advisory_lock($1, hashtext($2))", [TURN_LOCK_NAMESPACE, runId]);
    return await release();
  } finally {
    // Ending the session releases the lock whether or not the unlock below ran.
    await client.query("SELECT pg_advisory_unlock($1, hashtext($2))", [TURN_LOCK_NAMESPACE, runId]).catch(() => undefined);
    // Nothing lost: an end that fails finds the session already gone, and the lock with it.
    await client.end().catch(() => undefined);
  }
}
