import { jsonb, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";

/**
 * `engine_metrics`: the latest engine-pool snapshot of each rollout worker
 * process, per run (requests, tokens/s, errors, latency percentiles per
 * engine). Operational telemetry, overwritten every few seconds: not a fact,
 * not replayed.
 */
export const engineMetrics = pgTable(
  "engine_metrics",
  {
    runId: text("run_id").notNull(),
    worker: text("worker").notNull(),
    snapshot: jsonb("snapshot").notNull(),
    at: timestamp("at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.worker] })],
);
