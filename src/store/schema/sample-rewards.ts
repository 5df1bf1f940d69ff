import { bigint, doublePrecision, index, integer, jsonb, pgTable, primaryKey, real, text, timestamp } from "drizzle-orm/pg-core";

/**
 * `sample_rewards`: one row per (sample, round) scored, insert-only, written by
 * the reward worker keyed by its job. `reward` is the value trained on (after
 * `reward_key`); `components` keeps every named component the reward returned.
 */
export const sampleRewards = pgTable(
  "sample_rewards",
  {
    runId: text("run_id").notNull(),
    groupId: bigint("group_id", { mode: "number" }).notNull(),
    sampleIndex: integer("sample_index").notNull(),
    round: integer("round").notNull(),
    step: integer("step").notNull(),
    jobId: text("job_id").notNull(),
    reward: doublePrecision("reward").notNull(),
    components: jsonb("components").notNull(),
    /** use_opd: [response_length] the teacher's log-prob of each response token (engines/teacher.ts); null without OPD. */
    teacherLogProbs: real("teacher_log_probs").array(),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.groupId, t.sampleIndex, t.round] }), index("sample_rewards_run_step_idx").on(t.runId, t.step)],
);
