/**
 * @file The rollout viewer's SQL: one builder per page, each returning the
 * statement and its parameters (run through `readSelect` as rlq_reader) and the
 * same statement with the values written in (`inlined`), which the page shows
 * for copying into `rlq sql`.
 *
 * Every list is keyset-paged over an index of rollout_history, so a page costs
 * the same at step 5 as at step 5000 of a run with a million samples:
 * - steps: (run_id, step), newest first, `before` = the last step shown;
 * - a step's groups and samples: (run_id, step), then the rows of that one step;
 * - a search over the whole run: the primary key (run_id, group_id, sample_index).
 * bench/viewer.ts measures each page on a million-sample history.
 */

/** A statement with positional parameters ($1...). */
export interface Statement {
  text: string;
  params: unknown[];
}

/** Collects predicates and their parameters, numbering them in order. */
class Where {
  readonly parts: string[] = [];
  readonly params: unknown[] = [];
  add(value: unknown, make: (p: string) => string): void {
    this.params.push(value);
    this.parts.push(make(`$${this.params.length}`));
  }
  /** A parameter without a predicate (a LIMIT, a keyset bound used in two places). */
  param(value: unknown): string {
    this.params.push(value);
    return `$${this.params.length}`;
  }
  get sql(): string {
    return this.parts.join("\n     AND ");
  }
}

/** The oldest weight version a sample's tokens came from (segments' versions; -1 marks tokens not generated). */
const oldestVersion = "(SELECT min(v) FROM unnest(h.weight_versions) v WHERE v >= 0)";
/**
 * Staleness as the `staleness` view counts it: the input version of the step that trained the
 * sample (or, for a sample not trained, of its own step) minus the oldest version among its
 * segments. NULL while that step has not committed.
 */
const stalenessExpr = `(ts.weight_version_in - ${oldestVersion})`;

export const stepsPageSize = 25;
export const groupsPageSize = 50;
export const samplesPageSize = 50;

/** Steps of a run, newest first: per step the groups kept, filtered, discarded and aborted, mean reward and length. */
export function stepsPage(runId: string, before: number | null, limit = stepsPageSize): Statement {
  const w = new Where();
  w.add(runId, (p) => `h.run_id = ${p}`);
  if (before !== null) w.add(before, (p) => `h.step < ${p}`);
  const lim = w.param(limit);
  return {
    text: `WITH s AS (
  SELECT h.step, count(*)::int AS samples,
         count(DISTINCT h.group_id)::int AS groups,
         count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'kept')::int AS kept,
         count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'filtered')::int AS filtered,
         count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'discarded')::int AS discarded,
         avg(h.reward)::float8 AS mean_reward,
         avg(h.reward) FILTER (WHERE h.trained_step IS NOT NULL)::float8 AS trained_reward,
         avg(h.response_length)::float8 AS mean_length
    FROM rollout_history h
   WHERE ${w.sql}
   GROUP BY h.step ORDER BY h.step DESC LIMIT ${lim})
SELECT s.*,
       (SELECT count(DISTINCT d.group_id)::int FROM decisions d
         WHERE d.run_id = $1 AND d.kind = 'group.aborted' AND d.step = s.step) AS aborted,
       ts.weight_version_in, ts.weight_version_out, ts.committed_at
  FROM s LEFT JOIN train_steps ts ON ts.run_id = $1 AND ts.step = s.step
 ORDER BY s.step DESC`,
    params: w.params,
  };
}

/** One step's summary (the same columns as a row of `stepsPage`) for the side-by-side comparison. */
export function stepSummary(runId: string, step: number): Statement {
  return {
    text: `SELECT $2::int AS step, count(*)::int AS samples,
       count(DISTINCT h.group_id)::int AS groups,
       count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'kept')::int AS kept,
       count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'filtered')::int AS filtered,
       count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'discarded')::int AS discarded,
       (SELECT count(DISTINCT d.group_id)::int FROM decisions d
         WHERE d.run_id = $1 AND d.kind = 'group.aborted' AND d.step = $2) AS aborted,
       avg(h.reward)::float8 AS mean_reward,
       avg(h.reward) FILTER (WHERE h.trained_step IS NOT NULL)::float8 AS trained_reward,
       stddev_pop(h.reward)::float8 AS reward_std,
       avg(h.response_length)::float8 AS mean_length,
       max(h.response_length) AS max_length,
       count(*) FILTER (WHERE h.status = 'truncated')::int AS truncated,
       (SELECT json_object_agg(m.key, m.value) FROM train_metrics m WHERE m.run_id = $1 AND m.step = $2) AS train_metrics
  FROM rollout_history h
 WHERE h.run_id = $1 AND h.step = $2`,
    params: [runId, step],
  };
}

/**
 * A step's groups by id, after `after`: what the filter decided for each (kept, filtered with its
 * reason, discarded as surplus) and the groups aborted in the step (a round cut by a weight sync;
 * such a group may still finish in a later round and then shows its outcome here too).
 */
export function groupsPage(runId: string, step: number, options: { after: number | null; outcome: string | null; limit?: number }): Statement {
  const after = options.after ?? -1;
  const params: unknown[] = [runId, step, after, options.limit ?? groupsPageSize];
  const outcome = options.outcome === null ? "" : `\n WHERE coalesce(h.outcome, 'aborted') = $5`;
  if (options.outcome !== null) params.push(options.outcome);
  return {
    text: `WITH h AS (
  SELECT group_id, count(*)::int AS samples, min(outcome) AS outcome, min(outcome_reason) AS reason,
         avg(reward)::float8 AS mean_reward, stddev_pop(reward)::float8 AS reward_std,
         min(reward) AS min_reward, max(reward) AS max_reward, avg(response_length)::float8 AS mean_length,
         left(min(prompt), 160) AS prompt
    FROM rollout_history
   WHERE run_id = $1 AND step = $2 AND group_id > $3
   GROUP BY group_id),
a AS (
  SELECT group_id, count(*)::int AS aborted_rounds, min(payload->>'reason') AS abort_reason
    FROM decisions
   WHERE run_id = $1 AND kind = 'group.aborted' AND step = $2 AND group_id > $3
   GROUP BY group_id)
SELECT coalesce(h.group_id, a.group_id) AS group_id, coalesce(h.outcome, 'aborted') AS outcome,
       coalesce(h.reason, a.abort_reason) AS reason, h.samples, h.mean_reward, h.reward_std,
       h.min_reward, h.max_reward, h.mean_length, h.prompt, coalesce(a.aborted_rounds, 0) AS aborted_rounds
  FROM h FULL JOIN a ON a.group_id = h.group_id${outcome}
 ORDER BY 1 LIMIT $4`,
    params,
  };
}

/** What the samples list can be narrowed to; every field optional. */
export interface SampleFilter {
  step?: number | undefined;
  group?: number | undefined;
  rewardMin?: number | undefined;
  rewardMax?: number | undefined;
  lengthMin?: number | undefined;
  lengthMax?: number | undefined;
  /** rollout_history.status: completed | truncated | aborted | failed */
  status?: string | undefined;
  /** kept | filtered | discarded */
  outcome?: string | undefined;
  /** A weight version among the sample's segments. */
  version?: number | undefined;
  stalenessMin?: number | undefined;
  stalenessMax?: number | undefined;
  /** Case-insensitive substring of the prompt or the response. */
  text?: string | undefined;
  /** Keyset: the last (group_id, sample_index) shown. */
  after?: [number, number] | undefined;
  limit?: number | undefined;
}

/** Samples matching `f`, by (group_id, sample_index), one page. */
export function samplesPage(runId: string, f: SampleFilter): Statement {
  const w = new Where();
  w.add(runId, (p) => `h.run_id = ${p}`);
  if (f.step !== undefined) w.add(f.step, (p) => `h.step = ${p}`);
  if (f.group !== undefined) w.add(f.group, (p) => `h.group_id = ${p}`);
  if (f.rewardMin !== undefined) w.add(f.rewardMin, (p) => `h.reward >= ${p}`);
  if (f.rewardMax !== undefined) w.add(f.rewardMax, (p) => `h.reward <= ${p}`);
  if (f.lengthMin !== undefined) w.add(f.lengthMin, (p) => `h.response_length >= ${p}`);
  if (f.lengthMax !== undefined) w.add(f.lengthMax, (p) => `h.response_length <= ${p}`);
  if (f.status !== undefined) w.add(f.status, (p) => `h.status = ${p}`);
  if (f.outcome !== undefined) w.add(f.outcome, (p) => `h.outcome = ${p}`);
  if (f.version !== undefined) w.add(f.version, (p) => `${p} = ANY(h.weight_versions)`);
  if (f.stalenessMin !== undefined) w.add(f.stalenessMin, (p) => `${stalenessExpr} >= ${p}`);
  if (f.stalenessMax !== undefined) w.add(f.stalenessMax, (p) => `${stalenessExpr} <= ${p}`);
  if (f.text !== undefined) w.add(f.text.toLowerCase(), (p) => `(strpos(lower(h.response), ${p}) > 0 OR strpos(lower(h.prompt), ${p}) > 0)`);
  if (f.after !== undefined) {
    const [g, i] = f.after;
    w.add(g, (p) => `(h.group_id, h.sample_index) > (${p}, ${w.param(i)})`);
  }
  const lim = w.param(f.limit ?? samplesPageSize);
  return {
    text: `SELECT h.step, h.group_id, h.sample_index, h.reward, h.response_length, h.status, h.outcome, h.outcome_reason,
       h.trained_step, h.weight_versions, ${stalenessExpr} AS staleness, left(h.response, 120) AS response
  FROM rollout_history h
  LEFT JOIN train_steps ts ON ts.run_id = h.run_id AND ts.step = coalesce(h.trained_step, h.step)
 WHERE ${w.sql}
 ORDER BY h.group_id, h.sample_index LIMIT ${lim}`,
    params: w.params,
  };
}

/**
 * One sample, whole: text, tokens and their per-token arrays (teacher_log_probs when the run
 * distils, train_log_probs once a step trained it, else null), reward and its components, staleness.
 */
export function sampleRow(runId: string, groupId: number, sampleIndex: number): Statement {
  return {
    text: `SELECT h.step, h.group_id, h.sample_index, h.draw_ordinal, h.prompt, h.response, h.tokens, h.prompt_length,
       h.response_length, h.loss_mask, h.rollout_log_probs, h.teacher_log_probs, h.token_versions, h.weight_versions,
       h.num_segments, h.status, h.finish_reason, h.reward, h.reward_components, h.outcome, h.outcome_reason, h.trained_step,
       ts.weight_version_in, ${stalenessExpr} AS staleness, tl.log_probs AS train_log_probs
  FROM rollout_history h
  LEFT JOIN train_steps ts ON ts.run_id = h.run_id AND ts.step = coalesce(h.trained_step, h.step)
  LEFT JOIN train_log_probs tl
    ON tl.run_id = h.run_id AND tl.group_id = h.group_id AND tl.sample_index = h.sample_index AND tl.step = h.trained_step
 WHERE h.run_id = $1 AND h.group_id = $2 AND h.sample_index = $3`,
    params: [runId, groupId, sampleIndex],
  };
}

/** A sample's segments: which weight version generated which tokens, on which engine, in which round. */
export function sampleSegmentsOf(runId: string, groupId: number, sampleIndex: number): Statement {
  return {
    text: `SELECT segment_index, round, step, weight_version, expected_weight_version, is_version_mismatch,
       token_start, token_end, engine, finish_reason, status, error, created_at
  FROM sample_segments
 WHERE run_id = $1 AND group_id = $2 AND sample_index = $3
 ORDER BY segment_index`,
    params: [runId, groupId, sampleIndex],
  };
}

/** Every reward a sample was given (one per round scored), with the components the reward function returned. */
export function sampleRewardsOf(runId: string, groupId: number, sampleIndex: number): Statement {
  return {
    text: `SELECT round, step, reward, components, created_at
  FROM sample_rewards
 WHERE run_id = $1 AND group_id = $2 AND sample_index = $3
 ORDER BY round`,
    params: [runId, groupId, sampleIndex],
  };
}

/** The group's decisions (dispatched, filtered, aborted, cut, outcome): why the sample ended as it did. */
export function groupDecisions(runId: string, groupId: number): Statement {
  return {
    text: `SELECT seq, lease_epoch, kind, step, group_id, payload, created_at
  FROM decisions
 WHERE run_id = $1 AND group_id = $2
 ORDER BY seq`,
    params: [runId, groupId],
  };
}

/** A value as an SQL literal: numbers as they are, text quoted ('' for '), arrays as ARRAY[...]. */
export function literal(v: unknown): string {
  if (v === null || v === undefined) return "NULL";
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new RangeError(`literal: ${v} has no SQL literal; pass a finite number`);
    return String(v);
  }
  if (typeof v === "boolean") return v ? "true" : "false";
  if (Array.isArray(v)) return `ARRAY[${v.map(literal).join(", ")}]`;
  if (typeof v === "string") return `'${v.replace(/'/g, "''")}'`;
  throw new TypeError(`literal: a ${typeof v} has no SQL literal here; pass a number, boolean, string or array of them`);
}

/** `s` with each $n replaced by its parameter's literal: the statement as `rlq sql` runs it. */
export function inlined(s: Statement): string {
  return s.text.replace(/\$(\d+)/g, (m, n: string) => {
    const i = Number(n) - 1;
    if (i < 0 || i >= s.params.length) throw new RangeError(`inlined: ${m} has no parameter (${s.params.length} given)`);
    return literal(s.params[i]);
  });
}

/** The shell command that runs `s` (double quotes; \, ", $ and ` escaped). */
export function rlqSqlCommand(s: Statement): string {
  return `rlq sql "${inlined(s).replace(/[\\"$`]/g, (c) => `\\${c}`)}"`;
}
