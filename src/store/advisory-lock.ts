/**
 * A session advisory lock on a dedicated connection, taken without waiting.
 * The metric sinks use it so that only one process per run appends to a run's
 * TensorBoard files and W&B history (two `rlq up` processes, a standby and an
 * active one, would otherwise both write). A process that dies loses its
 * connection and with it the lock, so the next one takes over.
 */

import type { Db } from "./db.ts";

export async function tryAdvisoryLock(db: Db, name: string): Promise<{ release(): Promise<void> } | null> {
  const client = await db.pool.connect();
  try {
    const res = await client.query<{ ok: boolean }>("SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS ok", [name]);
    if (res.rows[0]?.ok !== true) {
      client.release();
      return null;
    }
  } catch (e) {
    client.release(e as Error);
    throw e;
  }
  let released = false;
  return {
    async release() {
      if (released) return;
      released = true;
      try {
        await client.query("SELECT pg_advisory_unlock(hashtextextended($1, 0))", [name]);
        client.release();
      } catch (e) {
        client.release(e as Error);
      }
    },
  };
}
