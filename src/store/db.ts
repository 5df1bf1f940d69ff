import pg from "pg";
import { drizzle } from "drizzle-orm/node-postgres";
import * as schema from "./schema/index.ts";
import { createNotifications, type Notifications } from "./notify.ts";
import type { Database } from "./database.ts";

export type { Database };

export interface Db {
  pool: pg.Pool;
  db: Database;
  url: string;
  /** LISTEN/NOTIFY wake-ups (store/notify.ts): one connection, opened on the first subscription. */
  notifications: Notifications;
  close(): Promise<void>;
}

// int8 → number: our bigints are ordinals and sequence numbers, far below 2^53.
pg.types.setTypeParser(20, (v) => Number(v));

/** Open a pool. Nothing connects until the first query. */
export function createDb(url: string, options: { max?: number; applicationName?: string; options?: string } = {}): Db {
  const pool = new pg.Pool({
    connectionString: url,
    max: options.max ?? 8,
    application_name: options.applicationName ?? "rlq",
    ...(options.options === undefined ? {} : { options: options.options }),
  });
  // An idle client losing its server (restart, 57P01) must not crash the process: it holds no
  // work, pg-pool drops it, and the next checkout connects anew.
  pool.on("error", () => undefined);
  // Nor may a checked-out client between two queries (a transaction awaiting its caller): pg
  // emits that as an "error" event with no listener, which kills the process. The next query on
  // it fails instead, and the caller retries (docs/deploy.md, "Outages").
  pool.on("connect", (client) => {
    // As above: the next query on this client fails and says why.
    client.on("error", () => undefined);
  });
  const db = drizzle(pool, { schema });
  const notifications = createNotifications(url, { applicationName: `${options.applicationName ?? "rlq"}-listen` });
  let closed = false;
  return {
    pool,
    db,
    url,
    notifications,
    async close() {
      if (closed) return;
      closed = true;
      await notifications.close();
      await pool.end();
    },
  };
}
