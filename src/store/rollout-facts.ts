import type { Db } from "./db.ts";
import { notifyRuns } from "./notify.ts";
import type { SegmentFact } from "../core/sample.ts";
import { inKeyOrder } from "./key-order.ts";
import { packedColumn } from "./pg-binary-array.ts";

/** What one rollout job (a group's round) produced. */
export interface RoundFacts {
  runId: string;
  groupId: number;
  round: number;
  step: number;
  jobId: string;
  expectedWeightVersion: number;
  segments: Array<SegmentFact & { tokenStart: number; error: string | null }>;
  isComplete: boolean;
  wasAborted: boolean;
}

/** Order of (run, group, round) keys: batched writes take their row locks in this order, so overlapping batches cannot deadlock. */
function compareRoundKeys(a: { runId: string; groupId: number; round: number }, b: { runId: string; groupId: number; round: number }): number {
  return a.runId < b.runId ? -1 : a.runId > b.runId ? 1 : a.groupId - b.groupId || a.round - b.round;
}

/**
 * Write a round's segments and its `group_rounds` marker atomically.
 * Idempotent per (run, group, round): if the marker is already there (a
 * retried or duplicated job), nothing is written and `false` is returned —
 * the caller reads the stored facts back and continues with them.
 */
export async function writeRound(db: Db, facts: RoundFacts): Promise<boolean> {
  const [won] = await writeRounds(db, [facts]);
  return won === true;
}

/**
 * Write several rounds (of any runs) in ONE statement: the worker coalesces
 * concurrent rollout jobs (store/job-batch.ts). Per round, exactly what
 * `writeRound` promises: its marker and its segments land together or not at
 * all, and the first writer of a marker wins. Returns, per round in order,
 * whether this call won its marker.
 *
 * How: the markers are inserted from unnested arrays with ON CONFLICT DO
 * NOTHING RETURNING the keys won; the segments are inserted joined to those
 * keys, in the same statement (data-modifying CTEs, one implicit
 * transaction). A concurrent writer of the same marker makes ON CONFLICT wait
 * for it and then skip it, so the loser writes no segment of that round.
 * Markers go in key order so two overlapping batches lock in the same order.
 * A round listed twice in one batch is written once (the later copy loses).
 * One parameter per column; the per-token arrays of all segments travel as
 * one binary array per column (store/pg-binary-array.ts), each segment's
 * slice cut out by its offset: Postgres reads them without parsing a number,
 * where an `{...}` literal per segment had it parse every token and log-prob
 * (float4in) and node-postgres escape every literal.
 */
export async function writeRounds(db: Db, rounds: readonly RoundFacts[]): Promise<boolean[]> {
  if (rounds.length === 0) return [];
  const firstIndex = new Map<string, number>();
  rounds.forEach((r, i) => {
    if (!firstIndex.has(roundKey(r))) firstIndex.set(roundKey(r), i);
  });
  const unique = [...firstIndex.values()].map((i) => rounds[i] as RoundFacts);
  unique.sort(compareRoundKeys);
  const res = await db.pool.query<{ run_id: string; group_id: string; round: number }>(WRITE_ROUNDS_SQL, [...markerColumns(unique), ...segmentColumns(unique)]);
  // A wake-up for the controllers of these runs (store/notify.ts: a hint; the round is committed).
  await notifyRuns(
    db.pool,
    "rlq_facts",
    unique.map((r) => r.runId),
  );
  const won = new Set(res.rows.map((r) => roundKey({ runId: r.run_id, groupId: Number(r.group_id), round: r.round })));
  return rounds.map((r, i) => firstIndex.get(roundKey(r)) === i && won.has(roundKey(r)));
}

function roundKey(r: { runId: string; groupId: number; round: number }): string {
  return `${r.runId}\u0000${r.groupId}\u0000${r.round}`;
}

/**
 * `writeRounds`' statement: $1..$7 the markers' columns (`markerColumns`), $8..$30 the segments'
 * columns with each per-token array's offset and length, $31..$33 the per-token arrays of all
 * segments, one binary array each, $34 each segment's observation images as JSON text or null
 * (`segmentColumns`).
 */
const WRITE_ROUNDS_SQL = `WITH marker AS (
       INSERT INTO group_rounds (run_id, group_id, round, step, job_id, is_complete, was_aborted)
       SELECT * FROM unnest($1::text[], $2::bigint[], $3::int[], $4::int[], $5::text[], $6::boolean[], $7::boolean[])
       ON CONFLICT DO NOTHING RETURNING run_id, group_id, round),
     segments AS (
       INSERT INTO sample_segments (run_id, group_id, sample_index, segment_index, round, step, job_id,
         weight_version, expected_weight_version, is_version_mismatch, token_start, token_end, tokens, log_probs, loss_mask,
         engine, finish_reason, status, error, images)
       SELECT v.run_id, v.group_id, v.sample_index, v.segment_index, v.seg_round, v.step, v.job_id, v.weight_version, v.expected,
              v.is_mismatch, v.token_start, v.token_end,
              a.tokens[v.tokens_at : v.tokens_at + v.tokens_len - 1],
              a.log_probs[v.log_probs_at : v.log_probs_at + v.log_probs_len - 1],
              a.loss_mask[v.loss_mask_at : v.loss_mask_at + v.loss_mask_len - 1],
              v.engine, v.finish_reason, v.status, v.error, v.images::jsonb
         FROM unnest($8::text[], $9::bigint[], $10::int[], $11::int[], $12::text[], $13::int[], $14::int[], $15::int[], $16::int[], $17::int[],
                     $18::boolean[], $19::int[], $20::int[], $21::int[], $22::int[], $23::int[], $24::int[], $25::int[], $26::int[],
                     $27::text[], $28::text[], $29::text[], $30::text[], $34::text[])
           AS v(run_id, group_id, round, step, job_id, expected, sample_index, segment_index, seg_round, weight_version,
                is_mismatch, token_start, token_end, tokens_at, tokens_len, log_probs_at, log_probs_len, loss_mask_at, loss_mask_len,
                engine, finish_reason, status, error, images)
         JOIN marker w ON w.run_id = v.run_id AND w.group_id = v.group_id AND w.round = v.round
         CROSS JOIN (SELECT $31::int4[] AS tokens, $32::float4[] AS log_probs, $33::int2[] AS loss_mask) a
       RETURNING 1)
     SELECT run_id, group_id, round FROM marker`;

/** The `group_rounds` markers, one array per column ($1..$7 of WRITE_ROUNDS_SQL). */
function markerColumns(unique: readonly RoundFacts[]): unknown[] {
  return [
    unique.map((r) => r.runId),
    unique.map((r) => r.groupId),
    unique.map((r) => r.round),
    unique.map((r) => r.step),
    unique.map((r) => r.jobId),
    unique.map((r) => r.isComplete),
    unique.map((r) => r.wasAborted),
  ];
}

/** The segments of every round, one array per column ($8..$34 of WRITE_ROUNDS_SQL). */
function segmentColumns(unique: readonly RoundFacts[]): unknown[] {
  const g = {
    runId: [] as string[],
    groupId: [] as number[],
    round: [] as number[],
    step: [] as number[],
    jobId: [] as string[],
    expected: [] as number[],
    sampleIndex: [] as number[],
    segmentIndex: [] as number[],
    segRound: [] as number[],
    weightVersion: [] as number[],
    isMismatch: [] as boolean[],
    tokenStart: [] as number[],
    tokenEnd: [] as number[],
    tokens: packedColumn("int4", "a segment's tokens"),
    logProbs: packedColumn("float4", "a segment's log-probs"),
    lossMask: packedColumn("int2", "a segment's loss mask"),
    engine: [] as string[],
    finishReason: [] as string[],
    status: [] as string[],
    error: [] as Array<string | null>,
    images: [] as Array<string | null>,
  };
  for (const r of unique) {
    for (const seg of r.segments) {
      g.runId.push(r.runId);
      g.groupId.push(r.groupId);
      g.round.push(r.round);
      g.step.push(r.step);
      g.jobId.push(r.jobId);
      g.expected.push(r.expectedWeightVersion);
      g.sampleIndex.push(seg.sampleIndex);
      g.segmentIndex.push(seg.segmentIndex);
      g.segRound.push(seg.round);
      g.weightVersion.push(seg.weightVersion);
      g.isMismatch.push(seg.weightVersion !== r.expectedWeightVersion);
      g.tokenStart.push(seg.tokenStart);
      g.tokenEnd.push(seg.tokenStart + seg.tokens.length);
      g.tokens.push(seg.tokens);
      g.logProbs.push(seg.logProbs);
      g.lossMask.push(seg.lossMask);
      g.engine.push(seg.engine);
      g.finishReason.push(seg.finishReason);
      g.status.push(seg.status);
      g.error.push(seg.error);
      g.images.push(seg.images && seg.images.length > 0 ? JSON.stringify(seg.images) : null);
    }
  }
  return [
    g.runId,
    g.groupId,
    g.round,
    g.step,
    g.jobId,
    g.expected,
    g.sampleIndex,
    g.segmentIndex,
    g.segRound,
    g.weightVersion,
    g.isMismatch,
    g.tokenStart,
    g.tokenEnd,
    g.tokens.at,
    g.tokens.len,
    g.logProbs.at,
    g.logProbs.len,
    g.lossMask.at,
    g.lossMask.len,
    g.engine,
    g.finishReason,
    g.status,
    g.error,
    g.tokens.binary(),
    g.logProbs.binary(),
    g.lossMask.binary(),
    g.images,
  ];
}

export interface RoundStatus {
  groupId: number;
  round: number;
  isComplete: boolean;
  wasAborted: boolean;
  rewardCount: number;
}

/**
 * The round markers (and how many rewards landed) for the given (group, round)
 * pairs. The controller polls this for every live group each tick: one plain
 * statement, no query building per id.
 */
export async function loadRoundStatuses(db: Db, runId: string, keys: ReadonlyArray<{ groupId: number; round: number }>): Promise<Map<number, RoundStatus>> {
  const out = new Map<number, RoundStatus>();
  if (keys.length === 0) return out;
  const wanted = new Map(keys.map((k) => [k.groupId, k.round]));
  const res = await db.pool.query<{ group_id: number; round: number; is_complete: boolean; was_aborted: boolean; reward_count: number }>(
    `SELECT r.group_id, r.round, r.is_complete, r.was_aborted,
            (SELECT count(*)::int FROM sample_rewards w WHERE w.run_id = r.run_id AND w.group_id = r.group_id AND w.round = r.round) AS reward_count
       FROM unnest($2::bigint[], $3::int[]) AS k(group_id, round)
       JOIN group_rounds r ON r.run_id = $1 AND r.group_id = k.group_id AND r.round = k.round`,
    [runId, [...wanted.keys()], [...wanted.values()]],
  );
  for (const r of res.rows) {
    if (wanted.get(r.group_id) !== r.round) continue;
    out.set(r.group_id, { groupId: r.group_id, round: r.round, isComplete: r.is_complete, wasAborted: r.was_aborted, rewardCount: r.reward_count });
  }
  return out;
}

export interface RewardFact {
  sampleIndex: number;
  reward: number;
  components: Record<string, unknown>;
  /** use_opd: `[response_length]` the teacher's log-probs of the response tokens; absent without OPD. */
  teacherLogProbs?: readonly number[] | null;
}

export interface RewardWrite {
  key: { runId: string; groupId: number; round: number; step: number; jobId: string };
  rewards: readonly RewardFact[];
}

/** Write a round's rewards (idempotent per sample and round; the first write wins). */
export async function writeRewards(db: Db, key: RewardWrite["key"], rewards: readonly RewardFact[]): Promise<void> {
  await writeRewardsOfRounds(db, [{ key, rewards }]);
}

/** The rewards of several rounds (of any runs) in one statement, one parameter per column; the first write of each wins. */
export async function writeRewardsOfRounds(db: Db, writes: readonly RewardWrite[]): Promise<void> {
  const rows = writes.flatMap((w) => w.rewards.map((r) => ({ ...w.key, ...r })));
  if (rows.length === 0) return;
  // Key order: two overlapping statements take their row locks in the same order.
  rows.sort((a, b) => compareRoundKeys(a, b) || a.sampleIndex - b.sampleIndex);
  await db.pool.query(
    `INSERT INTO sample_rewards (run_id, group_id, sample_index, round, step, job_id, reward, components, teacher_log_probs)
     SELECT r, g, s, o, st, j, w, c, t::float4[]
       FROM unnest($1::text[], $2::bigint[], $3::int[], $4::int[], $5::int[], $6::text[], $7::float8[], $8::jsonb[], $9::text[]) AS u(r, g, s, o, st, j, w, c, t)
     ON CONFLICT DO NOTHING`,
    [
      rows.map((r) => r.runId),
      rows.map((r) => r.groupId),
      rows.map((r) => r.sampleIndex),
      rows.map((r) => r.round),
      rows.map((r) => r.step),
      rows.map((r) => r.jobId),
      rows.map((r) => r.reward),
      rows.map((r) => JSON.stringify(r.components)),
      // Per-token arrays travel as array literals (Postgres arrays cannot be ragged); Float32 values print exactly.
      rows.map((r) => (r.teacherLogProbs == null ? null : `{${r.teacherLogProbs.join(",")}}`)),
    ],
  );
  await notifyRuns(
    db.pool,
    "rlq_facts",
    writes.map((w) => w.key.runId),
  );
}

/**
 * SQL: "this round is being aborted": listed in its step's seal (sync mode)
 * or by a `group.aborted` decision (a weight sync in async mode), written with
 * the caller's placeholders. Indexed on (run_id, kind, step) and (run_id, group_id).
 */
export function roundAbortedSql(p: { runId: string; groupId: string; round: string; step: string }): string {
  return `EXISTS (SELECT 1 FROM decisions WHERE run_id = ${p.runId} AND (
    (kind = 'step.sealed' AND step = ${p.step}::int
      AND payload->'aborted' @> jsonb_build_array(jsonb_build_object('groupId', ${p.groupId}::bigint, 'round', ${p.round}::int)))
    OR (kind = 'group.aborted' AND group_id = ${p.groupId}::bigint AND (payload->>'round')::int = ${p.round}::int)))`;
}

/** Whether each round (of any runs) is being aborted (`roundAbortedSql`), in one statement, in key order: the rollout jobs' abort watchers poll it. */
export async function areRoundsAborted(db: Db, keys: ReadonlyArray<{ runId: string; groupId: number; round: number; step: number }>): Promise<boolean[]> {
  if (keys.length === 0) return [];
  const res = await db.pool.query<{ i: string; is_aborted: boolean }>(
    `SELECT k.i, ${roundAbortedSql({ runId: "k.run_id", groupId: "k.group_id", round: "k.round", step: "k.step" })} AS is_aborted
       FROM unnest($1::text[], $2::bigint[], $3::int[], $4::int[]) WITH ORDINALITY AS k(run_id, group_id, round, step, i)`,
    [keys.map((k) => k.runId), keys.map((k) => k.groupId), keys.map((k) => k.round), keys.map((k) => k.step)],
  );
  return inKeyOrder(keys, res.rows, (_, r) => r.is_aborted).map((r) => r === true);
}
