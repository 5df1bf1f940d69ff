import { teacherLogProbsOfRound } from "./teacher-logprobs.ts";
import type { RewardFact } from "../store/rollout-facts.ts";
import type { JobStore } from "../store/job-batch.ts";
import type { RewardJob } from "../queue/payloads.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * The reward job: score every sample of a completed group round and write
 * the rewards keyed by (group, sample, round). Idempotent: rewards already
 * there are kept (the first write wins) and not recomputed.
 */
export async function scoreGroupRound(
  store: JobStore,
  ctx: RunContext,
  job: RewardJob,
  jobId: string,
  log: { warn(obj: object, msg: string): void } | null = null,
): Promise<void> {
  const { runId, groupId, round, step } = job;
  const n = ctx.config.n_samples_per_prompt;
  // One round trip: the round's facts, the decision behind them, rewards already stored, the group.
  const start = await store.loadRewardView(job, n);
  if (!start.hasRound) {
    throw new RlqError("no_fact_behind_job", `reward job ${jobId}: round ${round} of group ${groupId} has no generation facts`);
  }
  if (!start.isDispatched) {
    throw new RlqError("no_decision_behind_job", `reward job ${jobId}: no dispatch decision for group ${groupId} round ${round}`);
  }
  const view = start.view;
  if (start.rewardCount >= n || view === null) return;
  const inputs = view.samples.map((s) => ({
    sampleIndex: s.sampleIndex,
    prompt: view.prompt.prompt,
    response: ctx.tokenizer.decode(s.responseTokens),
    label: view.prompt.label,
    metadata: view.prompt.metadata as Record<string, unknown>,
    status: s.status,
  }));
  const scored = await ctx.reward.score(inputs);
  // use_opd: the teacher's per-token log-probs travel in the same rows as the rewards (jobs/teacher-logprobs.ts).
  const teacher = ctx.config.use_opd ? await teacherLogProbsOfRound(ctx.config, view.prompt.promptTokens, view.samples, log, jobId) : null;
  const facts: RewardFact[] = scored.map((r, i) => ({
    sampleIndex: i,
    reward: r.value,
    components: r.components,
    ...(teacher && { teacherLogProbs: teacher.get(view.samples[i]?.sampleIndex ?? i) ?? null }),
  }));
  await store.writeRewards({ key: { runId, groupId, round, step, jobId }, rewards: facts });
}
