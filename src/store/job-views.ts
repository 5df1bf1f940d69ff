import type { Db } from "./db.ts";
import type { DrawnPromptRow } from "./run-facts.ts";
import { addCut, roundAbortedSql } from "./rollout-facts.ts";
import { assembleGroupView, type GroupView } from "./group-view.ts";
import type { SampleStatus, SegmentFact } from "../core/sample.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * What a rollout or reward job reads when it starts, in ONE round trip: the
 * checks that refuse a job without a decision behind it, the idempotency
 * marker, and the group as the job sees it (prompt, segments, cuts).
 *
 * Why one statement: at the control-plane bench's rate (an instant engine,
 * bench/control-plane.ts) the rollout job's eight separate reads (findDecisions,
 * hasRound, the four group-view queries, isRoundAborted) and their drizzle
 * query building were the largest CPU cost per group in `rlq up`. One
 * statement also reads every check from one snapshot. The group is assembled
 * by `assembleGroupView`, as for the controller's bulk loader, so a job sees
 * exactly what the controller sees. Segments come back as JSON: float4 values
 * print the same shortest text as in the array format the driver parses
 * (non-finite ones come back as strings and are converted).
 */
const groupColumns = `
  p.draw_ordinal, p.epoch, p.dataset_index, p.step AS draw_step, p.prompt, p.label, p.metadata, p.prompt_tokens,
  (SELECT json_agg(json_build_array(s.sample_index, s.segment_index, s.round, s.weight_version, s.tokens, s.log_probs,
                                    s.loss_mask, s.finish_reason, s.status, s.engine))
     FROM sample_segments s WHERE s.run_id = $1 AND s.group_id = $2::bigint) AS segments,
  (SELECT json_agg(c.payload) FROM decisions c WHERE c.run_id = $1 AND c.group_id = $2::bigint AND c.kind = 'group.cut') AS cuts`;
const fromGroup = "FROM (SELECT 1) AS one LEFT JOIN drawn_prompts p ON p.run_id = $1 AND p.draw_ordinal = $2::bigint";

interface GroupRow {
  draw_ordinal: number | null;
  epoch: number;
  dataset_index: number;
  draw_step: number;
  prompt: string;
  label: string | null;
  metadata: unknown;
  prompt_tokens: number[];
  /** [sample_index, segment_index, round, weight_version, tokens, log_probs, loss_mask, finish_reason, status, engine] */
  segments: Array<[number, number, number, number, number[], Array<number | string>, number[], string, string, string]> | null;
  cuts: unknown[] | null;
}

function groupFromRow(runId: string, groupId: number, row: GroupRow, nSamples: number): GroupView {
  if (row.draw_ordinal === null) throw new RlqError("group_not_found", `run ${runId}: group ${groupId} was never drawn`);
  const prompt: DrawnPromptRow = {
    drawOrdinal: row.draw_ordinal,
    epoch: row.epoch,
    datasetIndex: row.dataset_index,
    step: row.draw_step,
    prompt: row.prompt,
    label: row.label,
    metadata: row.metadata,
    promptTokens: row.prompt_tokens,
  };
  const segments = new Map<number, SegmentFact[]>();
  for (const [sampleIndex, segmentIndex, round, weightVersion, tokens, logProbs, lossMask, finishReason, status, engine] of row.segments ?? []) {
    const list = segments.get(sampleIndex) ?? [];
    segments.set(sampleIndex, list);
    list.push({
      sampleIndex,
      segmentIndex,
      round,
      weightVersion,
      tokens,
      // JSON has no -Infinity/NaN: Postgres quotes them.
      logProbs: logProbs.map((v) => (typeof v === "number" ? v : Number(v))),
      lossMask,
      finishReason,
      status: status as SampleStatus,
      engine,
    });
  }
  const cuts = new Map<number, number>();
  for (const payload of row.cuts ?? []) addCut(cuts, payload);
  return assembleGroupView(groupId, prompt, segments, cuts, nSamples, null);
}

export interface RolloutJobView {
  /** A `group.dispatched` decision for this (group, round, step) exists. */
  isDispatched: boolean;
  /** The round's `group_rounds` marker is already there (a retried or duplicated job). */
  hasRound: boolean;
  /** The round is being aborted (the step's seal or a `group.aborted`; see `isRoundAborted`). */
  isAborted: boolean;
  /** Null when the job is refused or already done (the group is then not assembled). */
  view: GroupView | null;
}

export async function loadRolloutJobView(
  db: Db,
  key: { runId: string; groupId: number; round: number; step: number },
  nSamples: number,
): Promise<RolloutJobView> {
  const res = await db.pool.query<GroupRow & { is_dispatched: boolean; has_round: boolean; is_aborted: boolean }>(
    `SELECT
       EXISTS (SELECT 1 FROM decisions WHERE run_id = $1 AND group_id = $2::bigint AND kind = 'group.dispatched'
                 AND step = $4::int AND (payload->>'round')::int = $3::int) AS is_dispatched,
       EXISTS (SELECT 1 FROM group_rounds WHERE run_id = $1 AND group_id = $2::bigint AND round = $3::int) AS has_round,
       ${roundAbortedSql({ runId: "$1", groupId: "$2", round: "$3", step: "$4" })} AS is_aborted,
       ${groupColumns}
     ${fromGroup}`,
    [key.runId, key.groupId, key.round, key.step],
  );
  const row = res.rows[0];
  if (!row) throw new Error("unreachable: the statement always returns one row");
  const isUsable = row.is_dispatched && !row.has_round;
  return {
    isDispatched: row.is_dispatched,
    hasRound: row.has_round,
    isAborted: row.is_aborted,
    view: isUsable ? groupFromRow(key.runId, key.groupId, row, nSamples) : null,
  };
}

export interface RewardJobView {
  /** The round's marker (its generation facts) is there. */
  hasRound: boolean;
  /** A `group.dispatched` decision for this (group, round) exists, in any step. */
  isDispatched: boolean;
  /** Rewards already stored for this round (the first write wins). */
  rewardCount: number;
  view: GroupView | null;
}

export async function loadRewardJobView(db: Db, key: { runId: string; groupId: number; round: number }, nSamples: number): Promise<RewardJobView> {
  const res = await db.pool.query<GroupRow & { has_round: boolean; is_dispatched: boolean; reward_count: number }>(
    `SELECT
       EXISTS (SELECT 1 FROM group_rounds WHERE run_id = $1 AND group_id = $2::bigint AND round = $3::int) AS has_round,
       EXISTS (SELECT 1 FROM decisions WHERE run_id = $1 AND group_id = $2::bigint AND kind = 'group.dispatched'
                 AND (payload->>'round')::int = $3::int) AS is_dispatched,
       (SELECT count(*)::int FROM sample_rewards WHERE run_id = $1 AND group_id = $2::bigint AND round = $3::int) AS reward_count,
       ${groupColumns}
     ${fromGroup}`,
    [key.runId, key.groupId, key.round],
  );
  const row = res.rows[0];
  if (!row) throw new Error("unreachable: the statement always returns one row");
  const isUsable = row.has_round && row.is_dispatched && row.reward_count < nSamples;
  return {
    hasRound: row.has_round,
    isDispatched: row.is_dispatched,
    rewardCount: row.reward_count,
    view: isUsable ? groupFromRow(key.runId, key.groupId, row, nSamples) : null,
  };
}
