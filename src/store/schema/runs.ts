import { bigint, integer, jsonb, pgTable, text, timestamp } from "drizzle-orm/pg-core";

/**
 * `runs`: one row per run. A projection (mutable): the immutable facts about a
 * run (its validated config, dataset and plugin fingerprints) are the
 * `run.created` decision; status, step and weight version are folded from the
 * decision log and train commits, and `rlq replay` rebuilds them.
 */
export const runs = pgTable("runs", {
  id: text("id").primaryKey(),
  name: text("name").notNull(),
  config: jsonb("config").notNull(),
  datasetFingerprint: text("dataset_fingerprint").notNull(),
  pluginFingerprints: jsonb("plugin_fingerprints").notNull(),
  /** created | running | paused | cancelled | completed */
  status: text("status").notNull(),
  /** Number of committed train steps. */
  step: integer("step").notNull().default(0),
  weightVersion: integer("weight_version").notNull().default(0),
  lastError: text("last_error"),
  lastSeq: bigint("last_seq", { mode: "number" }).notNull().default(0),
  createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  updatedAt: timestamp("updated_at", { withTimezone: true }).notNull().defaultNow(),
});

/**
 * `run_leases`: the controller fence. `epoch` grows by one each time a
 * controller takes the run; every decision carries the epoch it was made
 * under, and a trigger rejects decisions from any other epoch.
 */
export const runLeases = pgTable("run_leases", {
  runId: text("run_id").primaryKey(),
  epoch: integer("epoch").notNull(),
  holder: text("holder").notNull(),
  acquiredAt: timestamp("acquired_at", { withTimezone: true }).notNull().defaultNow(),
});
