import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { migrate } from "drizzle-orm/node-postgres/migrator";
import { createDb, type Db } from "./db.ts";

export const migrationsFolder = fileURLToPath(new URL("../../migrations", import.meta.url));

/**
 * Apply committed migrations (idempotent; serialised by an advisory lock).
 *
 * Migrations run on a connection of their own that carries `rlq.migrating=on`: the guards of
 * migration 0006 (BEFORE TRUNCATE triggers, the DDL event trigger on fact tables) let only such a
 * session truncate, drop or alter a fact table. Nothing else in rlq sets that flag.
 */
export async function migrateDb(db: Db): Promise<void> {
  const own = createDb(db.url, { max: 1, applicationName: "rlq-migrate", options: "-c rlq.migrating=on" });
  const client = await own.pool.connect();
  try {
    // Two processes migrating at once would race on drizzle's journal table.
    await client.query("SELECT pg_advisory_lock(727001)");
    client.release();
    await migrate(own.db, { migrationsFolder });
  } finally {
    // The lock belongs to the pool's one session: if it cannot be had again or the unlock fails,
    // own.close() ends the session, which releases the lock; the migration's own error is thrown.
    const c = await own.pool.connect().catch(() => null);
    if (c) {
      // As above: the session's end releases the lock.
      await c.query("SELECT pg_advisory_unlock(727001)").catch(() => undefined);
      c.release();
    }
    await own.close();
  }
}

/** How many migrations this build carries (drizzle's journal). */
export function expectedMigrationCount(): number {
  const journal = JSON.parse(readFileSync(`${migrationsFolder}/meta/_journal.json`, "utf8")) as { entries: unknown[] };
  return journal.entries.length;
}

/**
 * How many migrations the database has applied, or null when it has never been migrated. rlq's
 * runtime role may read drizzle's journal (migration 0006) but not write it, so a process checks
 * this instead of migrating.
 */
export async function appliedMigrationCount(db: Db): Promise<number | null> {
  const exists = await db.pool.query<{ ok: boolean }>("SELECT to_regclass('drizzle.__drizzle_migrations') IS NOT NULL AS ok");
  if (!exists.rows[0]?.ok) return null;
  const res = await db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM drizzle.__drizzle_migrations");
  return res.rows[0]?.n ?? 0;
}
