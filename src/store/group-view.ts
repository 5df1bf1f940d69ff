import type { Db } from "./db.ts";
import { loadDrawnPrompts, type DrawnPromptRow } from "./run-facts.ts";
import { loadCutsOfGroups, loadRewardsOfGroups, loadSegmentsOfGroups, type RewardFact } from "./rollout-facts.ts";
import { assembleSample, type AssembledSample, type SegmentFact } from "../core/sample.ts";
import { RlqError } from "../lib/errors.ts";

/** A group as the workers and the controller see it: its prompt and its samples so far. */
export interface GroupView {
  groupId: number;
  prompt: DrawnPromptRow;
  samples: AssembledSample[];
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
 * Many groups at once (the controller deciding a batch of completed groups):
 * four queries in all instead of four per group. Samples cut by the drop
 * policy (`group.cut`) are assembled from their segments after the cut.
 */
export async function loadGroupsWithRewards(
  db: Db,
  runId: string,
  keys: readonly GroupKey[],
  nSamples: number,
): Promise<Map<number, GroupView & { rewards: Map<number, RewardFact> }>> {
  const out = new Map<number, GroupView & { rewards: Map<number, RewardFact> }>();
  if (keys.length === 0) return out;
  const ids = keys.map((k) => k.groupId);
  const [prompts, segments, rewards, cuts] = await Promise.all([
    loadDrawnPrompts(db, runId, ids),
    loadSegmentsOfGroups(db, runId, ids),
    loadRewardsOfGroups(db, runId, ids),
    loadCutsOfGroups(db, runId, ids),
  ]);
  for (const k of keys) {
    const prompt = prompts.get(k.groupId);
    if (!prompt) throw new RlqError("group_not_found", `run ${runId}: group ${k.groupId} was never drawn`);
    const view = assembleGroupView(k.groupId, prompt, segments.get(k.groupId), cuts.get(k.groupId), nSamples, k.maskBeforeRound);
    const r = new Map<number, RewardFact>();
    for (const f of rewards.get(k.groupId) ?? []) if (f.round === k.round) r.set(f.sampleIndex, f);
    out.set(k.groupId, { ...view, rewards: r });
  }
  return out;
}

/**
 * A group from its loaded facts (pure): `segments` by sample index, `cuts`
 * (sample index → the round from which its segments count, see
 * `loadCutsOfGroups`). Every loader of a group goes through here, so the
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
