import { z } from "zod";

/**
 * The only reader of process.env. Everything else receives an `Env`.
 * - DATABASE_URL: a Postgres server; unset → rlq starts an embedded Postgres under RLQ_HOME.
 * - REDIS_URL: BullMQ on Redis; unset → BullMQ's Postgres backend on the same Postgres.
 * - RLQ_QUEUE_PREFIX: BullMQ prefix (Redis) / schema (Postgres); tests set one per file.
 */
const envSchema = z.object({
  DATABASE_URL: z.string().url().optional(),
  REDIS_URL: z.string().url().optional(),
  RLQ_HOME: z.string().default(".rlq"),
  RLQ_QUEUE_PREFIX: z
    .string()
    .regex(/^[a-z][a-z0-9_]*$/, "lowercase letters, digits and _ (it is also a Postgres schema name)")
    .default("rlq"),
  RLQ_LOG_LEVEL: z.enum(["trace", "debug", "info", "warn", "error", "fatal", "silent"]).default("info"),
  RLQ_EMBEDDED_PG_PORT: z.coerce.number().int().positive().default(54329),
  /** Test-only fault injection: `point[:probability]` names where a process SIGKILLs itself. */
  RLQ_CRASH_AT: z.string().optional(),
});
export type Env = z.infer<typeof envSchema>;

export function readEnv(source: NodeJS.ProcessEnv = process.env): Env {
  const parsed = envSchema.safeParse(source);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const key = issue?.path.join(".") ?? "?";
    throw new Error(`environment variable ${key}=${JSON.stringify(source[key])}: ${issue?.message ?? "invalid"}`);
  }
  return parsed.data;
}
