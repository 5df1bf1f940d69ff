import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import pg from "pg";
import { migrationsFolder } from "../../src/store/migrate.ts";

/**
 * Test databases: each integration test file gets its own database, cloned
 * from a migrated template, and its own queue prefix.
 */
export const adminUrl = process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
export const redisUrl = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379";

export function templateName(): string {
  const h = createHash("sha256");
  for (const f of readdirSync(migrationsFolder).filter((f) => f.endsWith(".sql")).sort()) h.update(readFileSync(`${migrationsFolder}/${f}`));
  return `rlq_tpl_${h.digest("hex").slice(0, 10)}`;
}

export function dbUrl(name: string): string {
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  return u.toString();
}

export async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/** A fresh database cloned from the migrated template. */
export async function createTestDatabase(prefix: string): Promise<{ name: string; url: string; drop(): Promise<void> }> {
  const name = `${prefix}_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6)}`;
  await admin((c) => c.query(`CREATE DATABASE ${name} TEMPLATE ${templateName()}`));
  return {
    name,
    url: dbUrl(name),
    async drop() {
      await admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    },
  };
}
