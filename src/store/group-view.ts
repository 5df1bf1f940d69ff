import type { Db } from "./db.ts";
import type { DrawnPromptRow } from "./run-facts.ts";
import type { PromptImage } from "../data/images.ts";
import type { RewardFact } from "./rollout-facts.ts";
import {
  assembleResponse,
  assembleSample,
  type AssembledResponse,
  type AssembledSample,
  type SampleStatus,
  type SegmentFact,
  type SegmentTokens,
  type ImageRef,
} from "../core/sample.ts";
import { RlqError } from "../lib/errors.ts";
import { inKeyOrder } from "./key-order.ts";

/** A group as the workers and the controller see it: its prompt and its samples so far. */
export interface GroupView {
  groupId: number;
  prompt: DrawnPromptRow;
  samples: AssembledSample[];
}

/** A group as a reward sees it: its prompt and its samples' responses (no training columns). */
export interface GroupResponses {
  groupId: number;
  prompt: DrawnPromptRow;
  samples: AssembledResponse[];
}

/**
 * Assemble a group from its facts. `maskBeforeRound`: tokens from earlier
 * rounds get loss mask 0 (mask_offpolicy_in_partial_rollout).
 */
export async function loadGroupView(db: Db, runId: string, groupId: number, nSamples: number, maskBeforeRound: number | null): Promise<GroupView> {
  return loadGroupWithRewards(db, runId, groupId, -1, nSamples, maskBeforeRound);
}

/** One group with the rewards of `round` (the bulk loader with one key). */
export async function loadGroupWithRewards(
  db: Db,
  runId: string,
  groupId: number,
  round: number,
  nSamples: number,
  maskBeforeRound: number | null,
): Promise<GroupView & { rewards: Map<number, RewardFact> }> {
  const view = (await loadGroupsWithRewards(db, runId, [{ groupId, round, maskBeforeRound }], nSamples)).get(groupId);
  if (!view) throw new RlqError("group_not_found", `run ${runId}: group ${groupId} was never drawn`);
  return view;
}

/** Which group, which round's rewards, and how its samples are masked (see `assembleSample`). */
export interface GroupKey {
  groupId: number;
  round: number;
  maskBeforeRound: number | null;
}

/**
 * Many groups at once (the controller deciding completed groups, the train
 * step, replay): ONE statement, the same group columns the rollout and reward
 * jobs read (store/job-views.ts), so every reader sees a group the same way.
 * Segments come back as JSON: Postgres builds it and `JSON.parse` reads it.
 * For 256 groups x 8 samples x 1000 tokens the whole load takes ~540 ms,
 * against ~1130 ms for the segments alone as array rows through the driver's
 * per-element parser (how the four drizzle queries read them before;
 * bench/group-load.ts). Samples cut by the drop policy (`group.cut`) are
 * assembled from their segments after the cut.
 */
export async function loadGroupsWithRewards(
  db: Db,
  runId: string,
  keys: readonly GroupKey[],
  nSamples: number,
): Promise<Map<number, GroupView & { rewards: Map<number, RewardFact> }>> {
  const out = new Map<number, GroupView & { rewards: Map<number, RewardFact> }>();
  if (keys.length === 0) return out;
  const res = await db.pool.query<GroupRow & { i: string; rewards: Array<[number, number | string, Record<string, unknown>, number[] | null]> | null }>(
    `SELECT k.i, ${groupColumns("k.run_id", "k.group_id")},
       (SELECT json_agg(json_build_array(w.sample_index, w.reward, w.components, w.teacher_log_probs))
          FROM sample_rewards w WHERE w.run_id = k.run_id AND w.group_id = k.group_id AND w.round = k.round) AS rewards
     FROM ${groupKeysFrom(["run_id text", "group_id bigint", "round int"])}`,
    [keys.map(() => runId), keys.map((k) => k.groupId), keys.map((k) => k.round)],
  );
  const views = inKeyOrder(keys, res.rows, (k, row) => {
    const view = groupFromRow(runId, k.groupId, row, nSamples, k.maskBeforeRound);
    // JSON has no NaN/Infinity: Postgres quotes them.
    const rewards = new Map<number, RewardFact>(
      (row.rewards ?? []).map(([sampleIndex, reward, components, teacherLogProbs]) => [
        sampleIndex,
        { sampleIndex, reward: Number(reward), components, ...(teacherLogProbs != null && { teacherLogProbs }) },
      ]),
    );
    return { ...view, rewards };
  });
  keys.forEach((k, idx) => {
    const view = views[idx];
    if (view instanceof Error || view === undefined) throw view ?? new RlqError("invariant_violated", "unreachable: one result per key");
    out.set(k.groupId, view);
  });
  return out;
}

/**
 * SQL select-list: a group's drawn prompt (from `p`, see `groupKeysFrom`), its
 * segments and its cuts as JSON, for the group named by the given SQL
 * expressions. Shared by every group reader (here and store/job-views.ts).
 * `perToken` "tokens" leaves out the log-probs and loss masks (null in their
 * places): a reader of responses (the reward job, `responsesFromRow`) parses
 * about a quarter of the JSON.
 */
export function groupColumns(runId: string, groupId: string, perToken: "all" | "tokens" = "all"): string {
  return `
  p.draw_ordinal, p.epoch, p.dataset_index, p.step AS draw_step, p.prompt, p.label, p.metadata, p.prompt_tokens, p.images,
  (SELECT json_agg(json_build_array(s.sample_index, s.segment_index, s.round, s.weight_version, s.tokens,
                                    ${perToken === "all" ? "s.log_probs, s.loss_mask" : "NULL, NULL"}, s.finish_reason, s.status, s.engine, s.images))
     FROM sample_segments s WHERE s.run_id = ${runId} AND s.group_id = ${groupId}) AS segments,
  (SELECT json_agg(c.payload) FROM decisions c WHERE c.run_id = ${runId} AND c.group_id = ${groupId} AND c.kind = 'group.cut') AS cuts`;
}

/** The keys of a batch as a relation `k` with an ordinal `i` (1-based): one statement serves many jobs. */
export function groupKeysFrom(columns: string[]): string {
  const names = columns.map((c) => c.split(" ")[0]).join(", ");
  const arrays = columns.map((c, i) => `$${i + 1}::${c.split(" ")[1]}[]`).join(", ");
  return `unnest(${arrays}) WITH ORDINALITY AS k(${names}, i)
     LEFT JOIN drawn_prompts p ON p.run_id = k.run_id AND p.draw_ordinal = k.group_id`;
}

export { inKeyOrder };

export interface GroupRow {
  draw_ordinal: number | null;
  epoch: number;
  dataset_index: number;
  draw_step: number;
  prompt: string;
  label: string | null;
  metadata: unknown;
  prompt_tokens: number[];
  images: PromptImage[] | null;
  /** [sample_index, segment_index, round, weight_version, tokens, log_probs, loss_mask, finish_reason, status, engine, images]; log_probs and loss_mask null when loaded with `perToken` "tokens"; images null when the segment has none. */
  segments: Array<
    [number, number, number, number, number[], Array<number | string> | null, number[] | null, string, string, string, ImageRef[] | null | undefined]
  > | null;
  cuts: unknown[] | null;
}

/** A group with its full samples, from a row of `groupColumns(…, "all")`. */
export function groupFromRow(runId: string, groupId: number, row: GroupRow, nSamples: number, maskBeforeRound: number | null): GroupView {
  const segments = segmentsBySample(row, (tokens, logProbs, lossMask) => {
    if (logProbs === null || lossMask === null) throw new RlqError("invariant_violated", 'unreachable: groupFromRow needs a row loaded with perToken "all"');
    // JSON has no -Infinity/NaN: Postgres quotes them.
    return { logProbs: logProbs.map((v) => (typeof v === "number" ? v : Number(v))), lossMask };
  });
  return assembleGroupView(groupId, promptFromRow(runId, groupId, row), segments, cutsFromRow(row), nSamples, maskBeforeRound);
}

/** A group's responses, from a row of `groupColumns(…, "tokens")` (or "all"): what the reward job reads. */
export function responsesFromRow(runId: string, groupId: number, row: GroupRow, nSamples: number): GroupResponses {
  const prompt = promptFromRow(runId, groupId, row);
  const segments = segmentsBySample(row, () => ({}));
  const cuts = cutsFromRow(row);
  const samples: AssembledResponse[] = [];
  for (let i = 0; i < nSamples; i++) samples.push(assembleResponse(i, segments.get(i) ?? [], cuts.get(i) ?? null));
  return { groupId, prompt, samples };
}

function promptFromRow(runId: string, groupId: number, row: GroupRow): DrawnPromptRow {
  if (row.draw_ordinal === null) throw new RlqError("group_not_found", `run ${runId}: group ${groupId} was never drawn`);
  return {
    drawOrdinal: row.draw_ordinal,
    epoch: row.epoch,
    datasetIndex: row.dataset_index,
    step: row.draw_step,
    prompt: row.prompt,
    label: row.label,
    metadata: row.metadata,
    promptTokens: row.prompt_tokens,
    ...(row.images && row.images.length > 0 ? { images: row.images } : {}),
  };
}

/** The row's segments by sample index; `perToken` turns the per-token columns into what the reader keeps of them. */
function segmentsBySample<T extends object>(
  row: GroupRow,
  perToken: (tokens: number[], logProbs: Array<number | string> | null, lossMask: number[] | null) => T,
): Map<number, Array<SegmentTokens & T>> {
  const out = new Map<number, Array<SegmentTokens & T>>();
  for (const [sampleIndex, segmentIndex, round, weightVersion, tokens, logProbs, lossMask, finishReason, status, engine, images] of row.segments ?? []) {
    const list = out.get(sampleIndex) ?? [];
    out.set(sampleIndex, list);
    list.push({
      sampleIndex,
      segmentIndex,
      round,
      weightVersion,
      tokens,
      finishReason,
      status: status as SampleStatus,
      engine,
      ...(images && images.length > 0 ? { images } : {}),
      ...perToken(tokens, logProbs, lossMask),
    });
  }
  return out;
}

function cutsFromRow(row: GroupRow): Map<number, number> {
  const cuts = new Map<number, number>();
  for (const payload of row.cuts ?? []) addCut(cuts, payload);
  return cuts;
}

/** Fold one `group.cut` payload into sample index → cut round (the latest cut wins). */
function addCut(byGroup: Map<number, number>, payload: unknown): void {
  const p = payload as { round: number; samples: number[] };
  for (const i of p.samples) byGroup.set(i, Math.max(byGroup.get(i) ?? 0, p.round));
}

/**
 * A group from its loaded facts (pure): `segments` by sample index, `cuts`
 * (sample index → the round from which its segments count, see
 * `addCut`). Every loader of a group goes through here, so the
 * workers and the controller see a group the same way.
 */
export function assembleGroupView(
  groupId: number,
  prompt: DrawnPromptRow,
  segments: ReadonlyMap<number, readonly SegmentFact[]> | undefined,
  cuts: ReadonlyMap<number, number> | undefined,
  nSamples: number,
  maskBeforeRound: number | null,
): GroupView {
  const samples: AssembledSample[] = [];
  for (let i = 0; i < nSamples; i++) {
    samples.push(assembleSample(i, segments?.get(i) ?? [], { maskBeforeRound, cutBeforeRound: cuts?.get(i) ?? null }));
  }
  return { groupId, prompt, samples };
}
