import { sql } from "drizzle-orm";
import { bigint, index, integer, jsonb, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";

/**
 * `decisions`: the run's decision log (insert-only). Only the controller that
 * holds the run's lease writes here. `seq` is gapless per run and
 * `lease_epoch` must equal the run's current lease epoch: both are enforced by
 * a trigger (migrations/0001), so a controller that lost its lease cannot
 * keep deciding.
 */
export const decisions = pgTable(
  "decisions",
  {
    runId: text("run_id").notNull(),
    seq: bigint("seq", { mode: "number" }).notNull(),
    leaseEpoch: integer("lease_epoch").notNull(),
    kind: text("kind").notNull(),
    step: integer("step"),
    groupId: bigint("group_id", { mode: "number" }),
    payload: jsonb("payload").notNull(),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.runId, t.seq] }),
    index("decisions_run_group_idx").on(t.runId, t.groupId),
    index("decisions_run_kind_step_idx").on(t.runId, t.kind, t.step),
    // A rollout job's abort check (store/rollout-facts.ts roundAbortedSql), polled by every round in
    // flight: without it the planner walked every group.aborted of the run through the kind index,
    // a cost that grew with the run's history (docs/performance.md, "Cluster scale"). Partial, so it
    // stays small and wins even on a table whose statistics are stale.
    index("decisions_group_aborted_idx")
      .on(t.runId, t.groupId)
      .where(sql`${t.kind} = 'group.aborted'`),
    // A job's start view (store/job-views.ts) looks up its round's group.dispatched and its group's
    // group.cut decisions. Through the (run_id, kind, step) index, the reward view's dispatch
    // lookup (no step) read every dispatch of the run per key: 0.75 ms a key at step 24 of a
    // 64-engine bench run, growing with the run (docs/performance.md, "Cluster scale"). The planner
    // did not choose a plain (run_id, group_id, kind) index over it on a table never analyzed; it
    // chooses this partial one.
    index("decisions_group_lookup_idx")
      .on(t.runId, t.groupId, t.kind)
      .where(sql`${t.kind} IN ('group.dispatched', 'group.cut')`),
  ],
);
