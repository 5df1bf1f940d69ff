/**
 * A step's charted aggregates over its `rollout_history` rows (alias `h`), written once for the two
 * places that compute them: the `step_summaries` writer (store/projections.ts) and the dashboard's
 * live query for the steps not summarised yet (dashboard/queries.ts). Reward and length per step:
 * the trained samples' mean (what the step trained on) and the filter's view (every sample that
 * reached an outcome in the step, kept or not).
 */
export const STEP_AGGREGATES = `count(*) AS samples,
  avg(h.reward) FILTER (WHERE h.trained_step IS NOT NULL) AS reward_trained,
  avg(h.reward) AS reward_all,
  avg(h.reward) FILTER (WHERE h.outcome = 'filtered') AS reward_filtered,
  count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'kept') AS groups_kept,
  count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'filtered') AS groups_filtered,
  avg(h.response_length) FILTER (WHERE h.trained_step IS NOT NULL) AS response_length_mean,
  max(h.response_length) AS response_length_max,
  sum(h.response_length) AS response_tokens`;

/** The columns STEP_AGGREGATES yields, in its order. */
export const STEP_AGGREGATE_COLUMNS = [
  "samples",
  "reward_trained",
  "reward_all",
  "reward_filtered",
  "groups_kept",
  "groups_filtered",
  "response_length_mean",
  "response_length_max",
  "response_tokens",
] as const;
