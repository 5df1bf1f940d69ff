import { Redis } from "ioredis";
import { createDb } from "../../src/store/db.ts";
import { migrateDb } from "../../src/store/migrate.ts";
import { ensurePythonEnv } from "./python.ts";
import { admin, dbUrl, redisUrl, templateName } from "./services.ts";

/** Once per `vitest run`: check the services, build the migrated template database and rlq's Python environment. */
export default async function setup(): Promise<void> {
  // The torch, Hugging Face and vLLM tests run in it; built once (a few minutes), reused while python/requirements.lock is unchanged.
  ensurePythonEnv();
  try {
    await admin((c) => c.query("SELECT 1"));
  } catch (e) {
    throw new Error(`integration tests need Postgres at ${process.env.TEST_DATABASE_URL ?? "127.0.0.1:5432"} (run .ci/services.sh): ${(e as Error).message}`, {
      cause: e,
    });
  }
  const r = new Redis(redisUrl, { maxRetriesPerRequest: 1, lazyConnect: true });
  try {
    await r.connect();
    await r.ping();
  } catch (e) {
    throw new Error(`integration tests need Redis at ${redisUrl} (run .ci/services.sh): ${(e as Error).message}`, { cause: e });
  } finally {
    r.disconnect();
  }
  const tpl = templateName();
  // Each test project runs this setup; an advisory lock makes the second wait for the first's template.
  await admin(async (c) => {
    await c.query("SELECT pg_advisory_lock(hashtext($1))", [tpl]);
    try {
      const exists = await c.query("SELECT 1 FROM pg_database WHERE datname = $1", [tpl]);
      if (exists.rowCount !== 0) return;
      await c.query(`CREATE DATABASE ${tpl}`);
      const db = createDb(dbUrl(tpl));
      try {
        await migrateDb(db);
      } finally {
        await db.close();
      }
    } finally {
      await c.query("SELECT pg_advisory_unlock(hashtext($1))", [tpl]);
    }
  });
}
