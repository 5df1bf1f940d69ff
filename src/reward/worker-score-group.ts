import type { Db } from "../store/db.ts";
import { findDecisions } from "../store/run-facts.ts";
import { hasRound, loadRewards, writeRewards, type RewardFact } from "../store/rollout-facts.ts";
import { loadGroupView } from "../store/group-view.ts";
import type { RewardJob } from "../queue/payloads.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * The reward job: score every sample of a completed group round and write
 * the rewards keyed by (group, sample, round). Idempotent: rewards already
 * there are kept (the first write wins) and not recomputed.
 */
export async function scoreGroupRound(db: Db, ctx: RunContext, job: RewardJob, jobId: string): Promise<void> {
  const { runId, groupId, round, step } = job;
  if (!(await hasRound(db, runId, groupId, round))) {
    throw new RlqError("no_fact_behind_job", `reward job ${jobId}: round ${round} of group ${groupId} has no generation facts`);
  }
  const dispatched = await findDecisions(db, runId, "group.dispatched", { groupId });
  if (!dispatched.some((d) => d.round === round)) {
    throw new RlqError("no_decision_behind_job", `reward job ${jobId}: no dispatch decision for group ${groupId} round ${round}`);
  }
  const n = ctx.config.n_samples_per_prompt;
  const existing = await loadRewards(db, runId, groupId, round);
  if (existing.size >= n) return;
  const view = await loadGroupView(db, runId, groupId, n, null);
  const inputs = view.samples.map((s) => ({
    sampleIndex: s.sampleIndex,
    prompt: view.prompt.prompt,
    response: ctx.tokenizer.decode(s.responseTokens),
    label: view.prompt.label,
    metadata: view.prompt.metadata as Record<string, unknown>,
    status: s.status,
  }));
  const scored = await ctx.reward.score(inputs);
  const facts: RewardFact[] = scored.map((r, i) => ({ sampleIndex: i, reward: r.value, components: r.components }));
  await writeRewards(db, { runId, groupId, round, step, jobId }, facts);
}
