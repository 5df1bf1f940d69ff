/**
 * The one door through which the dashboard, the metric sinks and the
 * Prometheus collectors read the store: a single parameterised SELECT in a
 * READ ONLY transaction with a statement timeout. Keeping every read here
 * is what lets it run as the restricted reader role (docs/security.md), set
 * in this function only. Values always travel as parameters ($1...),
 * never spliced into the text.
 */

import type { Db } from "./db.ts";
import { RlqError } from "../lib/errors.ts";

export async function readSelect<Row = Record<string, unknown>>(db: Db, text: string, params: readonly unknown[] = [], timeoutMs = 10_000): Promise<Row[]> {
  if (!/^\s*(SELECT|WITH)\b/i.test(text) || text.replace(/;\s*$/, "").includes(";")) {
    throw new RlqError("dashboard_bad_query", `dashboard query must be one SELECT statement, got: ${text.slice(0, 80)}`, { isRetriable: false });
  }
  const client = await db.pool.connect();
  let broken: Error | undefined;
  try {
    await client.query("BEGIN READ ONLY");
    await client.query(`SET LOCAL statement_timeout = ${Math.max(1, Math.floor(timeoutMs))}`);
    const res = await client.query(text, params as unknown[]);
    await client.query("COMMIT");
    return res.rows as Row[];
  } catch (e) {
    // A read-only transaction has nothing to undo: a ROLLBACK that fails finds the connection
    // broken, which release() then drops from the pool; `e` says what failed.
    await client.query("ROLLBACK").catch((rollbackError: Error) => (broken = rollbackError));
    throw e;
  } finally {
    client.release(broken);
  }
}
