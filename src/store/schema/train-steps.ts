import { doublePrecision, integer, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";

/**
 * `train_steps`: at most one row per (run_id, step), ever (insert-only; the
 * primary key is what makes a step commit once). Written in one transaction
 * with the step's `train_metrics` and the `trained_step` marks.
 */
export const trainSteps = pgTable(
  "train_steps",
  {
    runId: text("run_id").notNull(),
    step: integer("step").notNull(),
    attempt: text("attempt").notNull(),
    weightVersionIn: integer("weight_version_in").notNull(),
    weightVersionOut: integer("weight_version_out").notNull(),
    numSamples: integer("num_samples").notNull(),
    numTokens: integer("num_tokens").notNull(),
    checkpointUri: text("checkpoint_uri").notNull(),
    /** sha256 of the committed weights file: equal for a retried and an uninterrupted step. */
    checkpointSha256: text("checkpoint_sha256").notNull(),
    committedAt: timestamp("committed_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.step] })],
);

export const trainMetrics = pgTable(
  "train_metrics",
  {
    runId: text("run_id").notNull(),
    step: integer("step").notNull(),
    key: text("key").notNull(),
    value: doublePrecision("value").notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.step, t.key] })],
);
