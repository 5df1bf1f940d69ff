import { doublePrecision, integer, jsonb, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";

/**
 * `eval_results`: one row per (run, step, dataset), insert-only: an eval of
 * the eval datasets at one pinned weight version. `pass_at_k` maps k to the
 * unbiased pass@k estimate (a sample is correct when its reward >= 1).
 */
export const evalResults = pgTable(
  "eval_results",
  {
    runId: text("run_id").notNull(),
    step: integer("step").notNull(),
    dataset: text("dataset").notNull(),
    weightVersion: integer("weight_version").notNull(),
    numPrompts: integer("num_prompts").notNull(),
    numSamples: integer("num_samples").notNull(),
    meanReward: doublePrecision("mean_reward").notNull(),
    passAtK: jsonb("pass_at_k").notNull(),
    truncatedFraction: doublePrecision("truncated_fraction").notNull(),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.step, t.dataset] })],
);

/** `eval_samples`: every eval sample (insert-only), written with its dataset's result. */
export const evalSamples = pgTable(
  "eval_samples",
  {
    runId: text("run_id").notNull(),
    step: integer("step").notNull(),
    dataset: text("dataset").notNull(),
    promptIndex: integer("prompt_index").notNull(),
    sampleIndex: integer("sample_index").notNull(),
    weightVersion: integer("weight_version").notNull(),
    prompt: text("prompt").notNull(),
    label: text("label"),
    response: text("response").notNull(),
    tokens: integer("tokens").array().notNull(),
    finishReason: text("finish_reason").notNull(),
    reward: doublePrecision("reward").notNull(),
    rewardComponents: jsonb("reward_components").notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.step, t.dataset, t.promptIndex, t.sampleIndex] })],
);
