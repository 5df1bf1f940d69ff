import { bigint, integer, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";

/**
 * `run_snapshots`: the controller's folded run state at a decision seq
 * (core/run-state-snapshot.ts), so a restart folds only the decisions after
 * it. A projection, not a fact: derived from `decisions` alone, deletable, and
 * only the latest few are kept. `state` is JSON as text (a 1M-sample run's is a
 * few MB; text skips jsonb's parse on write and print on read).
 */
export const runSnapshots = pgTable(
  "run_snapshots",
  {
    runId: text("run_id").notNull(),
    /** The seq of the last decision folded into `state`. */
    seq: bigint("seq", { mode: "number" }).notNull(),
    format: integer("format").notNull(),
    state: text("state").notNull(),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.seq] })],
);
