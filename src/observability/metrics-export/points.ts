/**
 * The points the metric sinks export, read from committed facts only.
 * A train step's points exist once its `train_steps` row does: the row, its
 * `train_metrics` and the `trained_step` marks of its samples commit in one
 * transaction (docs/architecture.md, "Train steps commit once"), so a step is
 * read whole or not at all. An eval's points exist once its `eval_results`
 * row does. Tag names follow slime (slime/observability/*.py):
 * `train/<key>` (train_metric_utils / megatron model.py), `rollout/raw_reward`,
 * `rollout/response_len/mean|max` (rollout_metrics.py), `perf/*`, and
 * `eval/<dataset>`, `eval/<dataset>/pass@k`, `eval/<dataset>-truncated_ratio`.
 */

import type { Db } from "../../store/db.ts";
import { readSelect } from "../../store/dashboard-read.ts";

export interface MetricPoint {
  /** What the point belongs to: `train` (one per step) or `eval/<dataset>`. */
  stream: string;
  step: number;
  /** Seconds since the epoch: when the fact was committed. */
  wallTime: number;
  scalars: Array<{ tag: string; value: number }>;
}

export const pointKey = (p: { stream: string; step: number }): string => `${p.stream}@${p.step}`;

const trainPointsSql = `WITH s AS (
    SELECT step, committed_at, num_samples, num_tokens FROM train_steps WHERE run_id = $1 AND step > $2 ORDER BY step LIMIT $3
  )
  SELECT s.step, extract(epoch FROM s.committed_at)::float8 AS wall_time, 'train/' || m.key AS tag, m.value::float8 AS value
    FROM s JOIN train_metrics m ON m.run_id = $1 AND m.step = s.step
  UNION ALL
  SELECT s.step, extract(epoch FROM s.committed_at)::float8, x.tag, x.value
    FROM s JOIN LATERAL (
      SELECT avg(h.reward)::float8 AS reward, avg(h.response_length)::float8 AS len_mean, max(h.response_length)::float8 AS len_max
      FROM rollout_history h WHERE h.run_id = $1 AND h.trained_step = s.step
    ) a ON true
    CROSS JOIN LATERAL (VALUES ('rollout/raw_reward', a.reward), ('rollout/response_len/mean', a.len_mean), ('rollout/response_len/max', a.len_max),
                               ('perf/num_samples', s.num_samples::float8), ('perf/num_tokens', s.num_tokens::float8)) AS x(tag, value)
    WHERE x.value IS NOT NULL
  ORDER BY 1, 3`;

const evalPointsSql = `SELECT step, dataset, extract(epoch FROM created_at)::float8 AS wall_time, mean_reward::float8 AS mean_reward,
    pass_at_k, truncated_fraction::float8 AS truncated_fraction
  FROM eval_results WHERE run_id = $1 ORDER BY step, dataset`;

/** Train points of the steps after `afterStep`, at most `limit` steps, in step order. */
export async function readTrainPoints(db: Db, runId: string, afterStep: number, limit = 200): Promise<MetricPoint[]> {
  const rows = await readSelect<{ step: number; wall_time: number; tag: string; value: number }>(db, trainPointsSql, [runId, afterStep, limit]);
  const out = new Map<number, MetricPoint>();
  for (const r of rows) {
    const step = Number(r.step);
    let p = out.get(step);
    if (!p) out.set(step, (p = { stream: "train", step, wallTime: Number(r.wall_time), scalars: [] }));
    if (Number.isFinite(Number(r.value))) p.scalars.push({ tag: r.tag, value: Number(r.value) });
  }
  return [...out.values()];
}

/** Every eval point of the run (a few per run), in (step, dataset) order. */
export async function readEvalPoints(db: Db, runId: string): Promise<MetricPoint[]> {
  const rows = await readSelect<{
    step: number;
    dataset: string;
    wall_time: number;
    mean_reward: number | null;
    pass_at_k: Record<string, number> | null;
    truncated_fraction: number | null;
  }>(db, evalPointsSql, [runId]);
  return rows.map((r) => {
    const scalars: MetricPoint["scalars"] = [];
    if (r.mean_reward !== null) scalars.push({ tag: `eval/${r.dataset}`, value: Number(r.mean_reward) });
    for (const [k, v] of Object.entries(r.pass_at_k ?? {})) scalars.push({ tag: `eval/${r.dataset}/pass@${k}`, value: Number(v) });
    if (r.truncated_fraction !== null) scalars.push({ tag: `eval/${r.dataset}-truncated_ratio`, value: Number(r.truncated_fraction) });
    return { stream: `eval/${r.dataset}`, step: Number(r.step), wallTime: Number(r.wall_time), scalars };
  });
}
