import type { Db } from "./db.ts";

/** Run a user's query in a read-only transaction with a statement timeout (`rlq sql`). */
export async function readOnlyQuery(db: Db, query: string, timeoutMs = 30_000): Promise<{ fields: string[]; rows: Record<string, unknown>[] }> {
  const client = await db.pool.connect();
  try {
    await client.query("BEGIN READ ONLY");
    await client.query(`SET LOCAL statement_timeout = ${Math.floor(timeoutMs)}`);
    const res = await client.query(query);
    await client.query("COMMIT");
    const last = Array.isArray(res) ? res[res.length - 1] : res;
    return { fields: (last.fields ?? []).map((f: { name: string }) => f.name), rows: last.rows ?? [] };
  } catch (e) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw e;
  } finally {
    client.release();
  }
}
