import { Queue, Worker, withBackend, createPostgresBackend, type ConnectionOptions } from "bullmq";
import { isIP } from "node:net";
import { Redis } from "ioredis";
import type { Env } from "../config/env.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * The queue backend: BullMQ on Redis when REDIS_URL is set (production), else
 * BullMQ's Postgres backend in its own schema of rlq's Postgres (zero-setup).
 * Everything BullMQ-specific stays in queue/.
 */
export interface QueueBackend {
  readonly kind: "redis" | "postgres";
  readonly prefix: string;
  // The two backends' classes differ only in their connection type parameter.
  readonly Queue: typeof Queue;
  readonly Worker: typeof Worker;
  readonly connection: ConnectionOptions;
  /** Extra per-object options (prefix on Redis). */
  readonly baseOptions: Record<string, unknown>;
  /** Make sure the store can hold queue state safely; throws with a clear message if not. */
  check(): Promise<void>;
  /** Drop every queue's state (tests: simulates losing Redis / the queue schema). */
  wipe(): Promise<void>;
}

/**
 * ioredis options from a URL: `redis://` or `rediss://` (TLS; the server's certificate is checked
 * against Node's CAs plus NODE_EXTRA_CA_CERTS), `user:password@` for an ACL user or requirepass.
 */
export function redisOptionsFromUrl(url: string): Record<string, unknown> {
  const u = new URL(url);
  if (u.protocol !== "redis:" && u.protocol !== "rediss:") {
    throw new RlqError("config_invalid", `REDIS_URL: expected redis://[user:password@]host:port[/db] or rediss:// for TLS, got the scheme ${u.protocol}`);
  }
  return {
    // SNI carries host names only (Node refuses an IP address there); the certificate check uses the host either way.
    ...(u.protocol === "rediss:" ? { tls: isIP(u.hostname) === 0 ? { servername: u.hostname } : {} } : {}),
    host: u.hostname,
    port: Number(u.port || 6379),
    ...(u.password ? { password: decodeURIComponent(u.password) } : {}),
    ...(u.username ? { username: decodeURIComponent(u.username) } : {}),
    db: u.pathname.length > 1 ? Number(u.pathname.slice(1)) : 0,
    maxRetriesPerRequest: null,
  };
}

export function createQueueBackend(env: Env, databaseUrl: string): QueueBackend {
  const prefix = env.RLQ_QUEUE_PREFIX;
  if (env.REDIS_URL) {
    const redisUrl = env.REDIS_URL;
    const connection = redisOptionsFromUrl(redisUrl) as ConnectionOptions;
    return {
      kind: "redis",
      prefix,
      Queue,
      Worker,
      connection,
      baseOptions: { prefix },
      async check() {
        const r = new Redis({ ...(connection as Record<string, unknown>), maxRetriesPerRequest: 1, lazyConnect: true });
        try {
          await r.connect();
          // A managed Redis or an ACL user may not run CONFIG: then the operator vouches for the policy.
          const res = await r.config("GET", "maxmemory-policy").catch((e: Error) => {
            if (/NOPERM|unknown command|no permissions/i.test(e.message)) return [] as string[];
            throw e;
          });
          const policy = res[1];
          if (policy !== undefined && policy !== "noeviction") {
            throw new RlqError(
              "config_invalid",
              `Redis at ${new URL(redisUrl).host} has maxmemory-policy=${policy}; rlq needs noeviction ` +
                "(an evicted job key loses work silently). Run: redis-cli CONFIG SET maxmemory-policy noeviction",
            );
          }
        } finally {
          r.disconnect();
        }
      },
      async wipe() {
        const r = new Redis({ ...(connection as Record<string, unknown>), maxRetriesPerRequest: 1 });
        try {
          let cursor = "0";
          do {
            const [next, keys] = await r.scan(cursor, "MATCH", `${prefix}:*`, "COUNT", 1000);
            cursor = next;
            if (keys.length > 0) await r.del(...keys);
          } while (cursor !== "0");
        } finally {
          r.disconnect();
        }
      },
    };
  }
  const pg = withBackend(createPostgresBackend);
  const connection = { connectionString: databaseUrl, schema: `${prefix}_queue`, migrate: true, max: 6 };
  return {
    kind: "postgres",
    prefix,
    Queue: pg.Queue as unknown as typeof Queue,
    Worker: pg.Worker as unknown as typeof Worker,
    connection: connection,
    baseOptions: {},
    async check() {
      // Postgres does not evict; its own migrations run on first use.
    },
    async wipe() {
      const { default: pgLib } = await import("pg");
      const client = new pgLib.Client({ connectionString: databaseUrl });
      await client.connect();
      try {
        // Empty every table of the queue schema (keeps BullMQ's own migration state).
        const res = await client.query<{ t: string }>(
          "SELECT format('%I.%I', schemaname, tablename) AS t FROM pg_tables WHERE schemaname = $1 AND tablename NOT ILIKE '%migration%'",
          [`${prefix}_queue`],
        );
        if (res.rows.length === 0) return;
        // TRUNCATE takes every table's lock at once while the queue's workers hold row locks on them:
        // Postgres may pick the TRUNCATE as a deadlock's victim (40P01), which rolls it back whole.
        // Try again: the workers' transactions are short.
        for (let attempt = 1; ; attempt++) {
          try {
            await client.query(`TRUNCATE ${res.rows.map((r) => r.t).join(", ")} CASCADE`);
            return;
          } catch (e) {
            if ((e as { code?: string }).code !== "40P01" || attempt >= 5) throw e;
          }
        }
      } finally {
        await client.end();
      }
    },
  };
}
