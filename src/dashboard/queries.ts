/**
 * Everything the dashboard shows, as single parameterised SELECTs over the
 * documented tables and views (docs/sql.md), each run through `readSelect`
 * (store/dashboard-read.ts) so that one function decides which role reads.
 * Numbers come back as JS numbers: the page charts them as they are.
 */

import type { Db } from "../store/db.ts";
import { readSelect } from "../store/dashboard-read.ts";
import { STEP_AGGREGATE_COLUMNS, STEP_AGGREGATES } from "../store/step-aggregates.ts";

const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

export const sql = {
  runs: `SELECT id, name, status, step, weight_version, last_error, created_at, updated_at,
           (config->>'num_rollout')::int AS num_rollout
         FROM runs ORDER BY created_at DESC LIMIT 200`,
  run: `SELECT id, name, status, step, weight_version, last_error, created_at, updated_at,
          (config->>'num_rollout')::int AS num_rollout, (config->>'rollout_batch_size')::int AS rollout_batch_size,
          (config->>'n_samples_per_prompt')::int AS n_samples_per_prompt
        FROM runs WHERE id = $1`,
  /** Long format (step, key, value): the page pivots; keys are whatever the trainer reported. */
  trainMetrics: `SELECT step, key, value FROM train_metrics WHERE run_id = $1 ORDER BY step, key`,
  /**
   * Reward and length per step (store/step-aggregates.ts): the summarised steps from `step_summaries`
   * (one row per step, written as each step trains), the rest (the steps in flight, and any a summary
   * does not cover) aggregated live from the history over the (run_id, step) index.
   */
  rewardPerStep: `WITH done AS (SELECT step, ${STEP_AGGREGATE_COLUMNS.join(", ")} FROM step_summaries WHERE run_id = $1 AND samples IS NOT NULL),
         top AS (SELECT coalesce(max(step), -1) AS step FROM done),
         gaps AS (SELECT g AS step FROM top, generate_series(0, top.step) AS g EXCEPT SELECT step FROM done)
         SELECT * FROM done
         UNION ALL
         SELECT h.step, ${STEP_AGGREGATES} FROM rollout_history h
         WHERE h.run_id = $1 AND (h.step > (SELECT step FROM top) OR h.step IN (SELECT step FROM gaps)) GROUP BY h.step
         ORDER BY step`,
  /** Throughput between consecutive commits; the first step's interval starts at the run's creation. */
  trainSteps: `SELECT t.step, t.num_samples, t.num_tokens, t.attempt, t.weight_version_in, t.weight_version_out, t.committed_at,
           extract(epoch FROM t.committed_at - coalesce(lag(t.committed_at) OVER (ORDER BY t.step), r.created_at)) AS seconds,
           ss.trained_response_tokens AS response_tokens,
           extract(epoch FROM t.committed_at - d.created_at) AS train_seconds
         FROM train_steps t JOIN runs r ON r.id = t.run_id
         LEFT JOIN step_summaries ss ON ss.run_id = t.run_id AND ss.step = t.step
         LEFT JOIN decisions d ON d.run_id = t.run_id AND d.kind = 'train.dispatched' AND d.step = t.step
         WHERE t.run_id = $1 ORDER BY t.step`,
  /** Trained samples by staleness, from each step's summary (trained marks are set only by a step's commit). */
  staleness: `SELECT e.key::int AS staleness, sum(e.value::bigint) AS samples
         FROM step_summaries s, jsonb_each_text(s.staleness) e WHERE s.run_id = $1 GROUP BY 1 ORDER BY 1`,
  /** Rounds dispatched whose marker has not landed, by the weight version they were dispatched at. */
  inFlight: `SELECT (d.payload->>'weightVersion')::int AS weight_version, count(*) AS groups
         FROM decisions d
         WHERE d.run_id = $1 AND d.kind = 'group.dispatched'
           AND NOT EXISTS (SELECT 1 FROM group_rounds g WHERE g.run_id = d.run_id AND g.group_id = d.group_id AND g.round = (d.payload->>'round')::int)
         GROUP BY 1 ORDER BY 1`,
  busyFraction: `SELECT sum(extract(epoch FROM t.committed_at - d.created_at)) / nullif(extract(epoch FROM max(t.committed_at) - min(d.created_at)), 0) AS busy
         FROM train_steps t JOIN decisions d ON d.run_id = t.run_id AND d.kind = 'train.dispatched' AND d.step = t.step
         WHERE t.run_id = $1`,
  engines: `SELECT worker, snapshot, at FROM engine_metrics WHERE run_id = $1 ORDER BY worker`,
  evals: `SELECT step, dataset, weight_version, mean_reward, pass_at_k, truncated_fraction FROM eval_results WHERE run_id = $1 ORDER BY step, dataset`,
  decisionTail: `SELECT seq, kind, step, group_id, lease_epoch, payload, created_at FROM decisions WHERE run_id = $1 ORDER BY seq DESC LIMIT $2`,
  samples: `SELECT group_id, sample_index, step, reward, response_length, outcome, outcome_reason, trained_step, weight_versions
         FROM rollout_history WHERE run_id = $1 AND ($2::int IS NULL OR step = $2::int)
         ORDER BY step DESC, group_id, sample_index LIMIT 200`,
  sample: `SELECT group_id, sample_index, step, draw_ordinal, prompt, response, tokens, prompt_length, response_length,
           loss_mask, token_versions, weight_versions, reward, reward_components, outcome, outcome_reason, trained_step, finish_reason
         FROM rollout_history WHERE run_id = $1 AND group_id = $2 AND sample_index = $3`,
} as const;

export interface RunOverview {
  run: Record<string, unknown> | null;
  trainMetrics: Array<{ step: number; key: string; value: number }>;
  rewardPerStep: Array<Record<string, number | null>>;
  trainSteps: Array<Record<string, unknown>>;
  staleness: Array<{ staleness: number; samples: number }>;
  inFlight: Array<{ weight_version: number | null; groups: number }>;
  busyFraction: number | null;
  engines: Array<{ worker: string; snapshot: unknown; at: string }>;
  evals: Array<Record<string, unknown>>;
  decisions: Array<Record<string, unknown>>;
}

const numbers = (row: Record<string, unknown>, keep: readonly string[] = []): Record<string, number | null> =>
  Object.fromEntries(
    Object.entries(row)
      .filter(([k]) => !keep.includes(k))
      .map(([k, v]) => [k, num(v)]),
  );

/** One run's page: ten reads, each a single SELECT. */
export async function loadRunOverview(db: Db, runId: string, decisionTail = 40): Promise<RunOverview> {
  const [run, tm, rw, ts, st, fl, busy, eng, ev, dec] = await Promise.all([
    readSelect(db, sql.run, [runId]),
    readSelect<{ step: number; key: string; value: unknown }>(db, sql.trainMetrics, [runId]),
    readSelect(db, sql.rewardPerStep, [runId]),
    readSelect(db, sql.trainSteps, [runId]),
    readSelect(db, sql.staleness, [runId]),
    readSelect(db, sql.inFlight, [runId]),
    readSelect<{ busy: unknown }>(db, sql.busyFraction, [runId]),
    readSelect<{ worker: string; snapshot: unknown; at: Date }>(db, sql.engines, [runId]),
    readSelect(db, sql.evals, [runId]),
    readSelect(db, sql.decisionTail, [runId, decisionTail]),
  ]);
  return {
    run: run[0] ?? null,
    trainMetrics: tm.map((r) => ({ step: Number(r.step), key: r.key, value: Number(r.value) })),
    rewardPerStep: rw.map((r) => numbers(r)),
    trainSteps: ts.map((r) => ({ ...numbers(r, ["committed_at"]), committed_at: r.committed_at })),
    staleness: st.map((r) => ({ staleness: Number(r.staleness), samples: Number(r.samples) })),
    inFlight: fl.map((r) => ({ weight_version: num(r.weight_version), groups: Number(r.groups) })),
    busyFraction: num(busy[0]?.busy),
    engines: eng.map((r) => ({ worker: r.worker, snapshot: r.snapshot, at: new Date(r.at).toISOString() })),
    evals: ev,
    decisions: dec,
  };
}

export async function listRunsForDashboard(db: Db): Promise<Array<Record<string, unknown>>> {
  return readSelect(db, sql.runs);
}

export async function listSamples(db: Db, runId: string, step: number | null): Promise<Array<Record<string, unknown>>> {
  return readSelect(db, sql.samples, [runId, step]);
}

export async function loadSample(db: Db, runId: string, groupId: number, sampleIndex: number): Promise<Record<string, unknown> | null> {
  const rows = await readSelect(db, sql.sample, [runId, groupId, sampleIndex]);
  return rows[0] ?? null;
}
