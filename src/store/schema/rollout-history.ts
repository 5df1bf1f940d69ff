import { bigint, boolean, doublePrecision, index, integer, jsonb, pgTable, primaryKey, real, smallint, text } from "drizzle-orm/pg-core";

/**
 * `rollout_history`: one row per sample that reached a final outcome in a step
 * (kept, filtered or discarded). A projection: assembled from the sample's
 * segments and rewards when the controller records the outcome, with
 * `trained_step` set by the train commit. `rlq replay` rebuilds it.
 * In-flight samples are visible in `sample_segments`.
 */
export const rolloutHistory = pgTable(
  "rollout_history",
  {
    runId: text("run_id").notNull(),
    step: integer("step").notNull(),
    groupId: bigint("group_id", { mode: "number" }).notNull(),
    sampleIndex: integer("sample_index").notNull(),
    drawOrdinal: bigint("draw_ordinal", { mode: "number" }).notNull(),
    prompt: text("prompt").notNull(),
    response: text("response").notNull(),
    /** Prompt tokens followed by response tokens. */
    tokens: integer("tokens").array().notNull(),
    promptLength: integer("prompt_length").notNull(),
    responseLength: integer("response_length").notNull(),
    lossMask: smallint("loss_mask").array().notNull(),
    rolloutLogProbs: real("rollout_log_probs").array().notNull(),
    /** use_opd: [response_length] the teacher's log-probs of the response tokens (sample_rewards); null without OPD. */
    teacherLogProbs: real("teacher_log_probs").array(),
    /** [response_length] the weight version that sampled each token (-1: not generated). */
    tokenVersions: integer("token_versions").array().notNull(),
    /** Distinct versions of the segments, in order. */
    weightVersions: integer("weight_versions").array().notNull(),
    numSegments: integer("num_segments").notNull(),
    /** pending | completed | truncated | aborted | failed */
    status: text("status").notNull(),
    finishReason: text("finish_reason").notNull(),
    reward: doublePrecision("reward"),
    rewardComponents: jsonb("reward_components"),
    isKept: boolean("kept").notNull(),
    /** kept | filtered | discarded */
    outcome: text("outcome").notNull(),
    outcomeReason: text("outcome_reason"),
    trainedStep: integer("trained_step"),
  },
  (t) => [primaryKey({ columns: [t.runId, t.groupId, t.sampleIndex] }), index("rollout_history_run_step_idx").on(t.runId, t.step)],
);
