import { fileURLToPath } from "node:url";
import { migrate } from "drizzle-orm/node-postgres/migrator";
import type { Db } from "./db.ts";

export const migrationsFolder = fileURLToPath(new URL("../../migrations", import.meta.url));

/** Apply committed migrations (idempotent; serialised by drizzle's own table lock). */
export async function migrateDb(db: Db): Promise<void> {
  // Two processes migrating at once would race on drizzle's journal table.
  const client = await db.pool.connect();
  try {
    await client.query("SELECT pg_advisory_lock(727001)");
    await migrate(db.db, { migrationsFolder });
  } finally {
    await client.query("SELECT pg_advisory_unlock(727001)").catch(() => undefined);
    client.release();
  }
}
