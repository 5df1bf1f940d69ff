import { hostname } from "node:os";
import { resolve } from "node:path";
import type { Env } from "../config/env.ts";
import { createDb, type Db } from "../store/db.ts";
import { migrateDb } from "../store/migrate.ts";
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
  crashPoint(name: string): void;
  close(): Promise<void>;
}

export async function createServices(env: Env, options: { applicationName: string; migrate?: boolean; dbMax?: number }): Promise<Services> {
  let pgHandle: EmbeddedPostgresHandle | null = null;
  let url = env.DATABASE_URL;
  if (!url) {
    pgHandle = await ensureEmbeddedPostgres(env.RLQ_HOME, env.RLQ_EMBEDDED_PG_PORT);
    url = pgHandle.url;
  }
  const db = createDb(url, { applicationName: options.applicationName, max: options.dbMax ?? 8 });
  if (options.migrate !== false) await migrateDb(db);
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
    crashPoint: createCrashPoints(env.RLQ_CRASH_AT),
    async close() {
      await queues.close();
      await db.close();
      if (pgHandle) await pgHandle.close();
    },
  };
}
