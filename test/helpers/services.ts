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
  for (const f of readdirSync(migrationsFolder)
    .filter((f) => f.endsWith(".sql"))
    .sort())
    h.update(readFileSync(`${migrationsFolder}/${f}`));
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

/** `url` with another login (trust auth on the test server: no password). */
export function asRole(url: string, role: string): string {
  const u = new URL(url);
  u.username = role;
  u.password = "";
  return u.toString();
}

/**
 * A fresh database cloned from the migrated template. `url` logs in as rlq_runtime, as rlq's
 * processes do in a least-privilege deployment (docs/security.md); `adminUrl` as the superuser,
 * for what a test does behind rlq's back (faults, catalog checks); `readerUrl` as rlq_reader.
 */
export async function createTestDatabase(prefix: string): Promise<{ name: string; url: string; adminUrl: string; readerUrl: string; drop(): Promise<void> }> {
  const name = `${prefix}_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6)}`;
  await admin(async (c) => {
    await c.query(`CREATE DATABASE ${name} TEMPLATE ${templateName()}`);
    // Database-level grants are not copied from a template (migration 0006 made them on it).
    await c.query(`GRANT CONNECT, CREATE ON DATABASE ${name} TO rlq_runtime`);
    await c.query(`GRANT CONNECT ON DATABASE ${name} TO rlq_reader`);
  });
  return {
    name,
    url: asRole(dbUrl(name), "rlq_runtime"),
    adminUrl: dbUrl(name),
    readerUrl: asRole(dbUrl(name), "rlq_reader"),
    async drop() {
      await admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    },
  };
}
