import type { RunConfig } from "../../src/config/run-config.ts";
import type { EvalSample, RolloutEvalContext, RolloutSample, RolloutTrainContext } from "../../src/rollout/rollout-function-contract.ts";

/**
 * slime's default rollout (sglang_rollout.generate_rollout_async: over-sampling
 * plus DAPO dynamic sampling) written as a `rollout_function_path` plugin
 * (docs/plugins.md), to copy and change:
 *
 * - draw `over_sampling_batch_size` groups and generate them all at once;
 * - take groups as they finish, keep those the run's dynamic filter passes
 *   (`dynamic_sampling_filter_path`, e.g. check_reward_nonzero_std);
 * - draw another batch whenever kept + in flight falls below
 *   `rollout_batch_size`;
 * - return exactly `rollout_batch_size` groups. Groups still generating are
 *   aborted by the step's seal: back to the buffer with `partial_rollout`,
 *   discarded otherwise (slime).
 *
 * It is a planner the controller replays after a restart, so it only awaits
 * ctx calls: no clock, no Math.random, no fetch. `Promise.race` is fine:
 * rlq hands results over in call order, so a replay sees the same winner.
 *
 * With `evaluation` (eval_interval + eval_prompt_data) it generates and scores
 * every eval prompt, as slime's eval_rollout does.
 */
export async function rollout(args: RunConfig, ctx: RolloutTrainContext | RolloutEvalContext) {
  if (ctx.evaluation) return evaluate(ctx);
  const target = args.rollout_batch_size;
  const overSampling = args.over_sampling_batch_size ?? target;
  const inFlight = new Map<number, Promise<readonly RolloutSample[]>>();
  const kept: Array<readonly RolloutSample[]> = [];
  const drops: Record<string, number> = {};
  let draws = 0;
  while (kept.length < target) {
    if (kept.length + inFlight.size < target) {
      for (const group of await ctx.draw(overSampling)) inFlight.set(group.groupId, ctx.generate(group));
      draws++;
      continue;
    }
    const samples = await Promise.race(inFlight.values());
    inFlight.delete((samples[0] as RolloutSample).groupId);
    const verdict = await ctx.filterDynamic(samples);
    // slime's should_drop: keep_when_insufficient keeps a rejected group rather than draw again.
    const remaining = kept.length + inFlight.size + 1;
    if (!verdict.keep && !(verdict.keep_when_insufficient && remaining <= target)) {
      const reason = verdict.reason ?? "filtered";
      drops[reason] = (drops[reason] ?? 0) + 1;
      continue;
    }
    kept.push(samples);
  }
  const metrics: Record<string, number> = { "rollout/draws": draws };
  for (const [reason, n] of Object.entries(drops)) metrics[`rollout/dynamic_filter/drop_${reason}`] = n;
  return { samples: kept, metrics };
}

async function evaluate(ctx: RolloutEvalContext) {
  const data: Record<string, { rewards: number[]; truncated: boolean[]; samples: EvalSample[] }> = {};
  for (const [name, prompts] of Object.entries(ctx.datasets)) {
    const samples = (await Promise.all(prompts.map((p) => ctx.generate(p)))).flat();
    const rewards = await ctx.score(samples);
    data[name] = { rewards: [...rewards], truncated: samples.map((s) => s.status === "truncated"), samples };
  }
  return { data };
}
