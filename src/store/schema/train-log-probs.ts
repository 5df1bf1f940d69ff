import { bigint, integer, pgTable, primaryKey, real, text } from "drizzle-orm/pg-core";

/**
 * `train_log_probs`: one row per sample a committed train step trained, insert-only, written in
 * the step's commit transaction by the attempt that won (store/train-facts.ts), so a retried step
 * never writes twice. `log_probs` is [response_length] the log-prob of each response token under
 * the step's start weights as the trainer computed it (its old log-probs, the ones its
 * train_rollout_logprob_abs_diff compares with the rollout's).
 */
export const trainLogProbs = pgTable(
  "train_log_probs",
  {
    runId: text("run_id").notNull(),
    step: integer("step").notNull(),
    groupId: bigint("group_id", { mode: "number" }).notNull(),
    sampleIndex: integer("sample_index").notNull(),
    logProbs: real("log_probs").array().notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.groupId, t.sampleIndex, t.step] })],
);
