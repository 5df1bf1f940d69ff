import type { Db } from "../store/db.ts";
import { findDecisions } from "../store/run-facts.ts";
import { loadGroupsWithRewards, type GroupView } from "../store/group-view.ts";
import type { RewardFact } from "../store/rollout-facts.ts";
import type { RunContext } from "../runtime/run-context.ts";
import type { TrainBatch, TrainSample } from "../trainer/trainer.ts";
import { maskStale } from "../core/sample.ts";
import { stepLoads, type GroupLoad } from "../core/group-load.ts";
import { RlqError } from "../lib/errors.ts";

/** A kept group's samples as the trainer takes them (the batch sets `groupIndex`), and its loss tokens. */
export interface GroupSamples {
  samples: Array<Omit<TrainSample, "groupIndex">>;
  numTokens: number;
}

/** A kept group built ahead of its train job (jobs/batch-stager.ts), with the load it was read with. */
export interface StagedGroup extends GroupSamples {
  load: GroupLoad;
}

export function isSameLoad(a: GroupLoad | undefined, b: GroupLoad): boolean {
  return a !== undefined && a.groupId === b.groupId && a.round === b.round && a.maskBeforeRound === b.maskBeforeRound && a.minVersion === b.minVersion;
}

/**
 * One kept group as training data: each sample with the rewards of the load's round; staleness_policy
 * mask gives tokens older than the bound loss mask 0 (core/group-load.ts: the rule the history rows use).
 */
export function groupSamples(g: GroupView & { rewards: Map<number, RewardFact> }, load: GroupLoad, step: number): GroupSamples {
  const samples: GroupSamples["samples"] = [];
  let numTokens = 0;
  const prompt = g.prompt.promptTokens;
  for (const assembled of g.samples) {
    const s = maskStale(assembled, load.minVersion);
    const r = g.rewards.get(s.sampleIndex);
    if (!r) throw new RlqError("batch_inconsistent", `train step ${step}: group ${load.groupId} sample ${s.sampleIndex} has no reward for round ${load.round}`);
    const tokens = new Int32Array(prompt.length + s.responseTokens.length);
    tokens.set(prompt);
    tokens.set(s.responseTokens, prompt.length);
    samples.push({
      tokens,
      promptLength: prompt.length,
      responseLength: s.responseTokens.length,
      lossMask: new Uint8Array(s.lossMask),
      denomMask: new Uint8Array(s.denomMask),
      rolloutLogProbs: new Float32Array(s.logProbs),
      ...(r.teacherLogProbs != null && { teacherLogProbs: teacherRow(r.teacherLogProbs, s.responseTokens.length, step, load.groupId, s.sampleIndex) }),
      tokenVersions: new Int32Array(s.tokenVersions),
      reward: r.reward,
      sampleIndex: s.sampleIndex,
      // By reference: the batch encoder reads the bytes the rollout sent (checked against the recorded sha256).
      // Observation images (custom generate tool turns) follow the prompt's, as the engine was sent them.
      ...(((g.prompt.images?.length ?? 0) > 0 || (s.images?.length ?? 0) > 0) && { images: [...(g.prompt.images ?? []), ...(s.images ?? [])] }),
    });
    for (const m of s.lossMask) numTokens += m;
  }
  return { samples, numTokens };
}

/**
 * The sealed step's batch, in the seal's order: each kept group trains on the round of its last keep
 * verdict of the step (`stepLoads`). `staged`: groups built while the step collected
 * (jobs/batch-stager.ts); one is used only if it was read with exactly the load derived here, and
 * every other group is read now, 256 per statement.
 */
export async function loadTrainBatch(
  db: Db,
  ctx: RunContext,
  step: number,
  staged: ReadonlyMap<number, StagedGroup> = new Map(),
): Promise<{ batch: TrainBatch; groupIds: number[]; numTokens: number; stagedGroups: number }> {
  const { runId, config } = ctx;
  const [seal] = await findDecisions(db, runId, "step.sealed", { step });
  if (!seal) throw new RlqError("no_decision_behind_job", `train step ${step}: the step was never sealed`);
  const verdicts = await findDecisions(db, runId, "group.filtered", { step });
  const { loads, missing } = stepLoads(config, step, seal.kept, verdicts);
  if (missing !== null) throw new RlqError("batch_inconsistent", `train step ${step}: kept group ${missing} has no keep verdict`);
  const built = new Map<number, GroupSamples>();
  for (const k of loads) {
    const s = staged.get(k.groupId);
    if (s && isSameLoad(s.load, k)) built.set(k.groupId, s);
  }
  const stagedGroups = built.size;
  const unstaged = loads.filter((k) => !built.has(k.groupId));
  for (let i = 0; i < unstaged.length; i += 256) {
    const chunk = unstaged.slice(i, i + 256);
    const views = await loadGroupsWithRewards(db, runId, chunk, config.n_samples_per_prompt);
    for (const k of chunk) {
      const view = views.get(k.groupId);
      if (!view) throw new RlqError("invariant_violated", `unreachable: group ${k.groupId} was loaded with its chunk`);
      built.set(k.groupId, groupSamples(view, k, step));
    }
  }
  const samples: TrainSample[] = [];
  let numTokens = 0;
  for (const [groupIndex, { groupId }] of loads.entries()) {
    const g = built.get(groupId) as GroupSamples;
    for (const s of g.samples) samples.push({ ...s, groupIndex });
    numTokens += g.numTokens;
  }
  return { batch: { runId, step, samples }, groupIds: seal.kept, numTokens, stagedGroups };
}

/** A stored teacher row as the trainer takes it; its length must be the response's (the teacher scored these tokens). */
function teacherRow(row: readonly number[], responseLength: number, step: number, groupId: number, sampleIndex: number): Float32Array {
  if (row.length !== responseLength) {
    throw new RlqError(
      "batch_inconsistent",
      `train step ${step}: group ${groupId} sample ${sampleIndex} has ${row.length} teacher log-probs for ${responseLength} response tokens`,
    );
  }
  return Float32Array.from(row);
}
