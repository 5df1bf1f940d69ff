import type { Db } from "./db.ts";
import { loadDrawnPrompt, type DrawnPromptRow } from "./run-facts.ts";
import { loadGroupSegments, loadRewards, type RewardFact } from "./rollout-facts.ts";
import { assembleSample, type AssembledSample } from "../core/sample.ts";
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
export async function loadGroupView(
  db: Db,
  runId: string,
  groupId: number,
  nSamples: number,
  maskBeforeRound: number | null,
): Promise<GroupView> {
  const prompt = await loadDrawnPrompt(db, runId, groupId);
  if (!prompt) throw new RlqError("group_not_found", `run ${runId}: group ${groupId} was never drawn`);
  const segments = await loadGroupSegments(db, runId, groupId);
  const samples: AssembledSample[] = [];
  for (let i = 0; i < nSamples; i++) samples.push(assembleSample(i, segments.get(i) ?? [], maskBeforeRound));
  return { groupId, prompt, samples };
}

export async function loadGroupWithRewards(
  db: Db,
  runId: string,
  groupId: number,
  round: number,
  nSamples: number,
  maskBeforeRound: number | null,
): Promise<GroupView & { rewards: Map<number, RewardFact> }> {
  const view = await loadGroupView(db, runId, groupId, nSamples, maskBeforeRound);
  return { ...view, rewards: await loadRewards(db, runId, groupId, round) };
}
