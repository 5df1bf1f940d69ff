import { hostname } from "node:os";
import { resolve } from "node:path";
import type { Env } from "../config/env.ts";
import { createDb, type Db } from "../store/db.ts";
import { appliedMigrationCount, expectedMigrationCount, migrateDb } from "../store/migrate.ts";
import { embeddedRolePasswords, isSuperuser, roles, urlAs } from "../store/roles.ts";
import { RlqError } from "../lib/errors.ts";
import { redactUrl } from "../lib/redact.ts";
import { ensureEmbeddedPostgres, type EmbeddedPostgresHandle } from "../store/embedded-postgres.ts";
import { createQueueBackend, type QueueBackend } from "../queue/backend.ts";
import { createQueues, type Queues } from "../queue/queues.ts";
import { createRunContextCache, type RunContextCache } from "./run-context.ts";
import { resolveRmType, tokenizerFor } from "./plugins-registry.ts";
import { createLogger, type Logger } from "../observability/logger.ts";
import { createCrashPoints } from "../lib/crash-points.ts";

/** Everything a process needs, built from the environment. Nothing connects at import time. */
export interface Services {
  env: Env;
  db: Db;
  backend: QueueBackend;
  queues: Queues;
  contexts: RunContextCache;
  log: Logger;
  holder: string;
  checkpointRoot: string;
  /** Where each role reaches the database: `db` is the runtime's; `rlq sql` and `rlq db url` use the others. */
  urls: { runtime: string; reader: string; owner: string | null };
  crashPoint(name: string): void;
  close(): Promise<void>;
}

/**
 * Migrations and roles (docs/security.md). `migrate: true` (rlq migrate) applies migrations with the
 * owner's URL. Any other process connects as whoever DATABASE_URL names (rlq_runtime in a
 * least-privilege deployment) and only checks that the database is migrated; when it is not, it
 * migrates with RLQ_OWNER_DATABASE_URL if one is set, else with its own URL if that user may, else
 * stops with what to run. The embedded Postgres is set up completely: migrated as its superuser,
 * then every process logs in as rlq_runtime.
 */
export async function createServices(env: Env, options: { applicationName: string; migrate?: boolean; dbMax?: number }): Promise<Services> {
  let pgHandle: EmbeddedPostgresHandle | null = null;
  let url = env.DATABASE_URL;
  let ownerUrl = env.RLQ_OWNER_DATABASE_URL ?? null;
  let readerUrl = env.RLQ_READER_DATABASE_URL ?? null;
  if (!url) {
    pgHandle = await ensureEmbeddedPostgres(env.RLQ_HOME, env.RLQ_EMBEDDED_PG_PORT);
    const superUrl = pgHandle.url;
    await migrateWith(superUrl);
    const pw = await embeddedRolePasswords(env.RLQ_HOME, superUrl);
    url = urlAs(superUrl, roles.runtime, pw.runtime);
    readerUrl = urlAs(superUrl, roles.reader, pw.reader);
    ownerUrl = superUrl;
  } else {
    const probe = createDb(url, { max: 1, applicationName: options.applicationName });
    try {
      if (options.migrate === true) {
        await migrateWith(ownerUrl ?? url);
      } else {
        const applied = await appliedMigrationCount(probe);
        const expected = expectedMigrationCount();
        if (applied === null || applied < expected) await migrateWith(ownerUrl ?? url, { applied, expected, url });
      }
      if (options.migrate !== true && env.RLQ_LOG_LEVEL !== "silent" && (await isSuperuser(probe.pool))) {
        process.stderr.write(
          `rlq: warning: ${options.applicationName} is connected to ${redactUrl(url)} as a superuser. ` +
            `On a shared server run rlq's processes as ${roles.runtime} (DATABASE_URL) and migrations as ${roles.owner} (RLQ_OWNER_DATABASE_URL); docs/security.md\n`,
        );
      }
    } finally {
      await probe.close();
    }
  }
  const db = createDb(url, { applicationName: options.applicationName, max: options.dbMax ?? 8 });
  const backend = createQueueBackend(env, url);
  await backend.check();
  const queues = createQueues(backend);
  const log = createLogger(env.RLQ_LOG_LEVEL, options.applicationName);
  return {
    env,
    db,
    backend,
    queues,
    contexts: createRunContextCache(db, { resolveRmType, tokenizerFor }),
    log,
    holder: `${hostname()}:${process.pid}`,
    checkpointRoot: resolve(env.RLQ_HOME, "checkpoints"),
    urls: { runtime: url, reader: readerUrl ?? urlAs(url, roles.reader), owner: ownerUrl },
    crashPoint: createCrashPoints(env.RLQ_CRASH_AT),
    async close() {
      await queues.close();
      await db.close();
      if (pgHandle) await pgHandle.close();
    },
  };
}

/** Apply migrations with `url`; a user that may not gets a message that says what to run. */
async function migrateWith(url: string, pending?: { applied: number | null; expected: number; url: string }): Promise<void> {
  const db = createDb(url, { max: 1, applicationName: "rlq-migrate" });
  try {
    await migrateDb(db);
  } catch (e) {
    const code = (e as { cause?: { code?: string }; code?: string }).cause?.code ?? (e as { code?: string }).code;
    if (code === "42501" || code === "42P01" || code === "3F000") {
      const state = !pending
        ? "could not be migrated"
        : pending.applied === null
          ? "has never been migrated"
          : `has ${pending.applied} of this rlq's ${pending.expected} migrations`;
      throw new RlqError(
        "db_not_migrated",
        `the database at ${redactUrl(pending?.url ?? url)} ${state}, and ${redactUrl(url)} may not migrate it (${(e as Error).message}). ` +
          "Run `rlq migrate` with RLQ_OWNER_DATABASE_URL set to the owner's (or an admin's) URL; on a managed Postgres, `rlq db admin-sql` prints the one-time setup.",
        { cause: e },
      );
    }
    throw e;
  } finally {
    await db.close();
  }
}
