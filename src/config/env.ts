/**
 * The only reader of process.env. Everything else receives an `Env`.
 * - DATABASE_URL: a Postgres server; unset → rlq starts an embedded Postgres under RLQ_HOME.
 * - REDIS_URL: BullMQ on Redis; unset → BullMQ's Postgres backend on the same Postgres.
 * - RLQ_QUEUE_PREFIX: BullMQ prefix (Redis) / schema (Postgres); tests set one per file.
 * - RLQ_OWNER_DATABASE_URL: what `rlq migrate` connects with (rlq_owner, or an admin); default DATABASE_URL.
 * - RLQ_READER_DATABASE_URL: what `rlq sql` and the dashboard connect with; default DATABASE_URL
 *   logged in as rlq_reader (no password: trust or ~/.pgpass). docs/security.md.
 */

import { z } from "zod";
import { RlqError } from "../lib/errors.ts";

/** An exported-but-empty variable (`DATABASE_URL=`) means unset, as in a shell. */
const optionalUrl = z.preprocess((v) => (v === "" ? undefined : v), z.string().url().optional());

const envSchema = z.object({
  DATABASE_URL: optionalUrl,
  REDIS_URL: optionalUrl,
  RLQ_OWNER_DATABASE_URL: optionalUrl,
  RLQ_READER_DATABASE_URL: optionalUrl,
  RLQ_HOME: z.string().default(".rlq"),
  RLQ_QUEUE_PREFIX: z
    .string()
    .regex(/^[a-z][a-z0-9_]*$/, "lowercase letters, digits and _ (it is also a Postgres schema name)")
    .default("rlq"),
  RLQ_LOG_LEVEL: z.enum(["trace", "debug", "info", "warn", "error", "fatal", "silent"]).default("info"),
  RLQ_EMBEDDED_PG_PORT: z.coerce.number().int().positive().default(54329),
  /**
   * How long `rlq up` rides out a Postgres or Redis outage (a controller that keeps failing, the
   * run list unreadable) by retrying, before it exits with code 75 and the reason, for a
   * supervisor to restart it (docs/deploy.md, "Outages").
   */
  RLQ_OUTAGE_TIMEOUT_S: z.coerce.number().positive().default(300),
  /**
   * The dashboard's pause/resume token (docs/security.md): a POST must carry `Authorization: Bearer <it>`.
   * Unset: the dashboard is read-only.
   */
  RLQ_DASHBOARD_TOKEN: z.string().min(16, "at least 16 characters").optional(),
  /** A file that holds the dashboard token (trailing newline trimmed), instead of RLQ_DASHBOARD_TOKEN. */
  RLQ_DASHBOARD_TOKEN_FILE: z.preprocess((v) => (v === "" ? undefined : v), z.string().optional()),
  /**
   * Where the dashboard and /metrics listen (`--host` overrides it); default 127.0.0.1. Beyond
   * loopback every request needs the dashboard token, and without one they refuse to start
   * (http-access/access.ts).
   */
  RLQ_DASHBOARD_HOST: z.preprocess((v) => (v === "" ? undefined : v), z.string().default("127.0.0.1")),
  /** Serve Prometheus /metrics on this port (at RLQ_DASHBOARD_HOST) from `rlq up`, `rlq worker` and `rlq dashboard`. */
  RLQ_METRICS_PORT: z.coerce.number().int().min(0).max(65535).optional(),
  /**
   * How long a controller waits between ticks when nothing happened (ms). It is woken earlier by
   * Postgres notifications when a round, rewards, a train step, eval results or an operator
   * request of its run land (store/notify.ts); the poll only bounds a missed notification.
   */
  RLQ_CONTROLLER_POLL_MS: z.coerce.number().int().min(10).max(3_600_000).default(100),
  /** Test-only fault injection: `point[:probability]` names where a process SIGKILLs itself. */
  RLQ_CRASH_AT: z.string().optional(),
  /** The python that runs `py:` plugins (src/plugins/python.ts); default `python3` on PATH. */
  RLQ_PLUGIN_PYTHON: z.preprocess((v) => (v === "" ? undefined : v), z.string().default("python3")),
});
export type Env = z.infer<typeof envSchema>;

export function readEnv(source: NodeJS.ProcessEnv = process.env): Env {
  const parsed = envSchema.safeParse(source);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const key = issue?.path.join(".") ?? "?";
    // A URL may carry a password: name the variable, never print its value.
    const shown = /URL$/.test(key) ? "(value not shown)" : JSON.stringify(source[key]);
    throw new RlqError("config_invalid", `environment variable ${key}=${shown}: ${issue?.message ?? "invalid"}`);
  }
  return parsed.data;
}

/**
 * The process environment, for resolving secret references ({env: NAME}, config/secrets.ts)
 * where a run config names them. Handed out here so that env.ts stays the only reader.
 */
export function secretSource(): Readonly<Record<string, string | undefined>> {
  return process.env;
}

/** The python for `py:` plugins, read alone: plugin loading has no Env at hand, and must not fail on an unrelated variable. */
export function pluginPython(source: NodeJS.ProcessEnv = process.env): string {
  const v = source.RLQ_PLUGIN_PYTHON;
  return v === undefined || v === "" ? "python3" : v;
}
