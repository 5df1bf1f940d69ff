/**
 * The collect phase of a train-only run (`debug_rollouts_from`, config/debug-keys.ts): slime's
 * --debug-train-only with --load-debug-rollout-data (slime/ray/rollout.py loads the saved
 * rollout of each rollout id instead of generating it). rlq's saved rollouts are the source
 * run's rows: each draw ordinal this run dispatches gets, as its round, the source run's
 * recorded samples for the same ordinal (tokens, loss masks, rollout log-probs, token versions)
 * and their rewards, written by the controller as an SFT run writes its rounds (sft-collect.ts).
 * The decisions are the RL run's, so the filters, the seal, the train job and replay are
 * unchanged, and a run with the source's seed and config draws the same ordinals and keeps the
 * same groups, so its trainer sees the source's batches.
 */

import type { Db } from "../store/db.ts";
import { RlqError } from "../lib/errors.ts";
import { insertDrawnPrompts, loadRunRow } from "../store/run-facts.ts";
import { loadRoundStatuses, writeRewardsOfRounds, writeRounds, type RoundFacts, type RewardFact } from "../store/rollout-facts.ts";
import type { ImageRef, SampleStatus } from "../core/sample.ts";
import type { ControllerHost } from "./host.ts";
import type { RoundKey } from "./groups.ts";
import { collectWritten } from "./sft-collect.ts";
import { planDraw } from "./draw.ts";
import { overSamplingBatchSize } from "../config/run-config.ts";
import { dispatchDecision } from "../core/decide-groups.ts";
import type { Decision } from "../core/decisions.ts";

export async function collectRecorded(h: ControllerHost): Promise<boolean> {
  return collectWritten(h, writeRecordedRounds, drawRecorded);
}

/**
 * The RL run's draw (groups.ts drawAndDispatch: over_sampling_batch_size prompts, buffered groups
 * first), committed without enqueueing rollout jobs: the next tick writes the rounds.
 */
async function drawRecorded(h: ControllerHost): Promise<void> {
  const s = h.state;
  const { fromBuffer, draws, cursor, rows } = await planDraw(
    { dataset: h.dataset, tokenizer: h.ctx.tokenizer, bufferFilter: h.bufferFilter },
    s,
    overSamplingBatchSize(s.config),
    s.step,
  );
  const list: Decision[] = [
    { kind: "prompts.drawn", payload: { step: s.step, fromBuffer, fresh: draws, cursor } },
    ...fromBuffer.map((groupId) => dispatchDecision(s, groupId, (s.groups.get(groupId)?.round ?? -1) + 1)),
    ...draws.map((d) => dispatchDecision(s, d.groupId, 0)),
  ];
  await h.commit(list, (tx) => insertDrawnPrompts(tx, rows));
  h.deps.crashPoint("controller.after_draw");
}

async function writeRecordedRounds(h: ControllerHost, keys: readonly RoundKey[]): Promise<number | null> {
  const s = h.state;
  const source = s.config.debug_rollouts_from as string;
  if (keys.length === 0) return 0;
  const statuses = await loadRoundStatuses(h.deps.db, s.runId, keys);
  const n = s.config.n_samples_per_prompt;
  const missing = keys.filter((k) => (statuses.get(k.groupId)?.rewardCount ?? 0) < n);
  if (missing.length === 0) return 0;
  const recorded = await loadRecordedGroups(
    h.deps.db,
    source,
    missing.map((k) => k.groupId),
  );
  const rounds: RoundFacts[] = [];
  const rewards: Array<{ key: RoundFacts; rewards: RewardFact[] }> = [];
  for (const k of missing) {
    const g = recorded.get(k.groupId);
    if (!g || g.rewards.length < n) {
      await h.pause(
        `debug_rollouts_from: run ${source} has no complete scored sample group for draw ${k.groupId}${g ? ` (its last round ${g.round} has ${g.rewards.length} of ${n} rewards)` : ""}: record the source run until it has drawn this far (num_rollout), or use a source run with deterministic: true, whose every dispatched group completes`,
      );
      return null;
    }
    const step = s.groups.get(k.groupId)?.step ?? s.step;
    const round: RoundFacts = {
      runId: s.runId,
      groupId: k.groupId,
      round: k.round,
      step,
      jobId: `replay-${s.runId}-${k.groupId}-${k.round}`,
      expectedWeightVersion: s.weightVersion,
      isComplete: true,
      wasAborted: false,
      segments: g.segments.map((seg) => ({ ...seg, round: k.round })),
    };
    rounds.push(round);
    rewards.push({ key: round, rewards: g.rewards });
  }
  await writeRounds(h.deps.db, rounds);
  await writeRewardsOfRounds(
    h.deps.db,
    rewards.map(({ key: r, rewards }) => ({ key: { runId: r.runId, groupId: r.groupId, round: r.round, step: r.step, jobId: r.jobId }, rewards })),
  );
  return rounds.length;
}

interface RecordedGroup {
  round: number;
  segments: RoundFacts["segments"];
  rewards: RewardFact[];
}

/**
 * A recorded run's groups, by draw ordinal: every segment of the group (all rounds: a sample
 * continued after an abort is its segments in order) and the rewards of its last round, which
 * scored the finished samples (each sample's latest reward up to it). A group whose last round is unfinished or aborted is left out.
 */
async function loadRecordedGroups(db: Db, runId: string, groupIds: readonly number[]): Promise<Map<number, RecordedGroup>> {
  const out = new Map<number, RecordedGroup>();
  const last = await db.pool.query<{ group_id: string; round: number }>(
    `SELECT DISTINCT ON (group_id) group_id, round FROM group_rounds
      WHERE run_id = $1 AND group_id = ANY($2::bigint[]) AND is_complete AND NOT was_aborted ORDER BY group_id, round DESC`,
    [runId, groupIds],
  );
  const lastRound = new Map(last.rows.map((r) => [Number(r.group_id), r.round]));
  if (lastRound.size === 0) return out;
  const segs = await db.pool.query<{
    group_id: string;
    round: number;
    sample_index: number;
    segment_index: number;
    weight_version: number;
    token_start: number;
    tokens: number[];
    log_probs: number[];
    loss_mask: number[];
    engine: string;
    finish_reason: string;
    status: string;
    error: string | null;
    images: ImageRef[] | null;
  }>(
    `SELECT group_id, round, sample_index, segment_index, weight_version, token_start, tokens, log_probs, loss_mask, engine, finish_reason, status, error, images
       FROM sample_segments WHERE run_id = $1 AND group_id = ANY($2::bigint[]) ORDER BY group_id, sample_index, segment_index`,
    [runId, [...lastRound.keys()]],
  );
  // Each sample's latest reward up to the group's last finished round.
  const rw = await db.pool.query<{
    group_id: string;
    round: number;
    sample_index: number;
    reward: number;
    components: Record<string, unknown>;
    teacher_log_probs: number[] | null;
  }>(
    `SELECT DISTINCT ON (w.group_id, w.sample_index) w.group_id, w.round, w.sample_index, w.reward, w.components, w.teacher_log_probs
       FROM sample_rewards w WHERE w.run_id = $1 AND w.group_id = ANY($2::bigint[]) ORDER BY w.group_id, w.sample_index, w.round DESC`,
    [runId, [...lastRound.keys()]],
  );
  for (const [groupId, round] of lastRound) out.set(groupId, { round, segments: [], rewards: [] });
  for (const r of segs.rows) {
    const g = out.get(Number(r.group_id));
    if (!g || r.round > g.round) continue;
    g.segments.push({
      sampleIndex: r.sample_index,
      segmentIndex: r.segment_index,
      round: r.round,
      weightVersion: r.weight_version,
      tokens: r.tokens,
      logProbs: r.log_probs,
      lossMask: r.loss_mask,
      finishReason: r.finish_reason,
      status: r.status as SampleStatus,
      engine: r.engine,
      tokenStart: r.token_start,
      error: r.error,
      // Observation images go with their segment: the replayed batch carries them as the recorded one did.
      ...(r.images && r.images.length > 0 ? { images: r.images } : {}),
    });
  }
  for (const r of rw.rows) {
    const g = out.get(Number(r.group_id));
    if (g && r.round <= g.round)
      g.rewards.push({ sampleIndex: r.sample_index, reward: r.reward, components: r.components, teacherLogProbs: r.teacher_log_probs });
  }
  return out;
}

/**
 * At start: a train-only run's source must exist and draw what this run draws (the same dataset
 * file, seed, shuffle, batch and group size), so each draw ordinal names the same prompt in both.
 */
export async function refuseIncompatibleSource(
  db: Db,
  config: { debug_rollouts_from: string | null } & Record<string, unknown>,
  datasetFingerprint: string,
): Promise<void> {
  const source = config.debug_rollouts_from;
  if (source === null) return;
  const row = await loadRunRow(db, source);
  if (!row) throw new RlqError("config_invalid", `debug_rollouts_from: run ${source} does not exist: name a recorded run (rlq run list shows their ids)`);
  if (row.datasetFingerprint !== datasetFingerprint)
    throw new RlqError(
      "config_invalid",
      `debug_rollouts_from: run ${source} drew from another dataset (fingerprint ${row.datasetFingerprint.slice(0, 12)}, this run's ${datasetFingerprint.slice(0, 12)}): set prompt_data to the source run's file`,
    );
  const src = row.config as Record<string, unknown>;
  for (const key of DRAW_KEYS) {
    if (JSON.stringify(src[key]) !== JSON.stringify(config[key]))
      throw new RlqError(
        "config_invalid",
        `debug_rollouts_from: run ${source} has ${key} ${JSON.stringify(src[key])}, this run ${JSON.stringify(config[key])}: set ${key}: ${JSON.stringify(src[key])} so both runs draw the same prompts`,
      );
  }
}

/** The keys that decide which prompt each draw ordinal is and how many samples its group has. */
const DRAW_KEYS = ["n_samples_per_prompt", "rollout_batch_size", "over_sampling_batch_size", "seed", "rollout_shuffle"] as const;
