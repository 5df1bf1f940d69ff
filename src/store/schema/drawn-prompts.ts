import { sql } from "drizzle-orm";
import { bigint, integer, jsonb, pgTable, primaryKey, text, index } from "drizzle-orm/pg-core";
import type { PromptImage } from "../../data/images.ts";

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
    /**
     * With multimodal_keys: the prompt's images in placeholder order, each by sha256 with where its
     * bytes are (`path`: the dataset's file, or RLQ_HOME/images/<sha256> for inline ones) and where
     * it came from (`origin`, `source`, `key`). Never the bytes. Query:
     * `SELECT p.draw_ordinal, i->>'sha256' FROM drawn_prompts p, jsonb_array_elements(p.images) i`.
     */
    images: jsonb("images")
      .$type<PromptImage[]>()
      .notNull()
      .default(sql`'[]'::jsonb`),
  },
  (t) => [primaryKey({ columns: [t.runId, t.drawOrdinal] }), index("drawn_prompts_run_step_idx").on(t.runId, t.step)],
);
