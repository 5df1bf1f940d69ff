import { bigint, integer, jsonb, pgTable, primaryKey, text, index } from "drizzle-orm/pg-core";

/**
 * `drawn_prompts`: one row per prompt draw (insert-only), written by the
 * controller in the same transaction as its `prompts.drawn` decision.
 * `draw_ordinal` is gapless from 0 within a run and is also the group id: one
 * drawn prompt is one group of `n_samples_per_prompt` samples.
 * The `prompt_draws` view adds each draw's outcome.
 */
export const drawnPrompts = pgTable(
  "drawn_prompts",
  {
    runId: text("run_id").notNull(),
    drawOrdinal: bigint("draw_ordinal", { mode: "number" }).notNull(),
    epoch: integer("epoch").notNull(),
    datasetIndex: integer("dataset_index").notNull(),
    /** The rollout step the prompt was drawn for. */
    step: integer("step").notNull(),
    prompt: text("prompt").notNull(),
    label: text("label"),
    metadata: jsonb("metadata").notNull(),
    promptTokens: integer("prompt_tokens").array().notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.drawOrdinal] }), index("drawn_prompts_run_step_idx").on(t.runId, t.step)],
);
