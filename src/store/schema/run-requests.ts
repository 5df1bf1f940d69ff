import { bigint, bigserial, jsonb, pgTable, text, timestamp, index } from "drizzle-orm/pg-core";

/**
 * `run_requests`: operator requests (pause, resume, cancel, amend) waiting for
 * the run's controller, which alone writes the decision log. A control table,
 * not a fact: `handled_seq` points at the decision that answered it.
 */
export const runRequests = pgTable(
  "run_requests",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    runId: text("run_id").notNull(),
    kind: text("kind").notNull(),
    payload: jsonb("payload").notNull(),
    handledSeq: bigint("handled_seq", { mode: "number" }),
    error: text("error"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [index("run_requests_run_idx").on(t.runId, t.handledSeq)],
);
