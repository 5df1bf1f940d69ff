import { bigint, doublePrecision, integer, jsonb, pgTable, primaryKey, text } from "drizzle-orm/pg-core";

/**
 * `step_summaries`: per run and step, what the dashboard charts about the step, so that a run of a
 * million samples draws its curves from one row per step instead of aggregating its whole history.
 * A projection of `rollout_history` (store/projections.ts is its one writer; `rlq replay` rebuilds
 * it), written when step `step` trains and refreshed when its rows change afterwards:
 * - the rollout side (the `reward_*`, `groups_*` and `response_*` columns) aggregates the samples
 *   whose outcome was recorded at step `step`, exactly as the dashboard's live query does;
 * - the trained side aggregates the samples train step `step` trained.
 */
export const stepSummaries = pgTable(
  "step_summaries",
  {
    runId: text("run_id").notNull(),
    step: integer("step").notNull(),
    /** The rollout side is present when `samples` is (null: no sample's outcome was recorded at this step yet). */
    samples: integer("samples"),
    rewardTrained: doublePrecision("reward_trained"),
    rewardAll: doublePrecision("reward_all"),
    rewardFiltered: doublePrecision("reward_filtered"),
    groupsKept: integer("groups_kept"),
    groupsFiltered: integer("groups_filtered"),
    responseLengthMean: doublePrecision("response_length_mean"),
    responseLengthMax: integer("response_length_max"),
    responseTokens: bigint("response_tokens", { mode: "number" }),
    /** Σ response_length of the samples this step trained. */
    trainedResponseTokens: bigint("trained_response_tokens", { mode: "number" }),
    /** The trained samples by staleness (the `staleness` view's value): {"0": 640, "1": 128}. */
    staleness: jsonb("staleness").$type<Record<string, number>>(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.step] })],
);
