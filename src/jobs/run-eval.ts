/**
 * The eval job: every prompt of every eval dataset (loaded as the run's prompts are, with the
 * dataset's own settings: config/eval-datasets.ts), its n_samples_per_eval_prompt samples each,
 * at the one weight version the decision pinned; rewards from the run's reward (the dataset's
 * rm_type, when it names one, through the sample's metadata as slime does); mean reward and
 * unbiased pass@k per dataset. A sample
 * counts as correct for pass@k when its reward is >= 1 (the rule-based rewards
 * give 1 for a correct answer).
 */

import type { Db } from "../store/db.ts";
import { findDecisions } from "../store/run-facts.ts";
import { loadEvalResults, writeEval, type EvalResultRow, type EvalSampleRow } from "../store/eval-facts.ts";
import type { Engine } from "../engines/engine.ts";
import type { EvalJob } from "../queue/payloads.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { loadEvalDataset } from "../runtime/plugins-registry.ts";
import { evalSampleMetadata, resolveEvalDatasets } from "../config/eval-datasets.ts";
import { passAtK } from "../algorithms/index.ts";
import { seedFrom } from "../lib/hash.ts";
import { RlqError } from "../lib/errors.ts";
import { runRolloutFunctionEval } from "./rollout-function-eval.ts";
import { evalSampling } from "../rollout/sampling-params.ts";

export interface EvalDeps {
  db: Db;
  engineFor(ctx: RunContext, weightVersion: number): Promise<Engine>;
  maxInFlight?: number;
}

async function mapLimited<T, R>(items: readonly T[], limit: number, fn: (x: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i] as T);
      }
    }),
  );
  return out;
}

export async function runEval(deps: EvalDeps, ctx: RunContext, job: EvalJob, jobId: string): Promise<void> {
  const { runId, step } = job;
  const dispatched = (await findDecisions(deps.db, runId, "eval.dispatched", { step }))[0];
  if (!dispatched) throw new RlqError("no_decision_behind_job", `eval job ${jobId}: no eval.dispatched decision for step ${step}`);
  if ((await loadEvalResults(deps.db, runId, step)).length > 0) return;
  const c = ctx.config;
  const engine = await deps.engineFor(ctx, dispatched.weightVersion);
  // slime's generate_rollout(..., evaluation=True): the user's rollout function plans the eval.
  if (c.rollout_function_path !== null) {
    await runRolloutFunctionEval({ db: deps.db, engine, weightVersion: dispatched.weightVersion, maxInFlight: deps.maxInFlight }, ctx, job);
    return;
  }
  const results: EvalResultRow[] = [];
  const samples: EvalSampleRow[] = [];
  for (const d of resolveEvalDatasets(c)) {
    const name = d.name;
    const n = d.n;
    const { dataset: data } = await loadEvalDataset(c, d, ctx.tokenizer);
    const sampling = evalSampling(d, ctx.config, ctx.tokenizer.eosId);
    const perPrompt = await mapLimited(data.rows, Math.max(1, Math.floor((deps.maxInFlight ?? 256) / n)), async (row) => {
      const inputIds = ctx.tokenizer.encode(row.prompt);
      const gens = await Promise.all(
        Array.from({ length: n }, (_, j) =>
          engine.generate({
            requestId: `${runId}-eval${step}-${name}-${row.index}-${j}`,
            inputIds,
            sampling: { ...sampling, seed: seedFrom(c.rollout_seed, "eval", name, row.index, j) },
          }),
        ),
      );
      const inputs = gens.map((g, j) => ({
        sampleIndex: j,
        prompt: row.prompt,
        response: ctx.tokenizer.decode(g.tokenIds),
        label: row.label,
        metadata: evalSampleMetadata(d, row.metadata),
        status: g.finishReason === "stop" ? "completed" : "truncated",
      }));
      const rewards = await ctx.reward.score(inputs);
      return { row, gens, inputs, rewards, inputIds };
    });
    let rewardSum = 0;
    let truncated = 0;
    const passSums = new Map<number, number>(c.eval_pass_k.map((k) => [k, 0]));
    for (const p of perPrompt) {
      let correct = 0;
      p.gens.forEach((g, j) => {
        const r = p.rewards[j];
        if (!r) return;
        rewardSum += r.value;
        if (r.value >= 1) correct++;
        if (g.finishReason === "length") truncated++;
        samples.push({
          runId,
          step,
          dataset: name,
          promptIndex: p.row.index,
          sampleIndex: j,
          weightVersion: g.weightVersion,
          prompt: p.row.prompt,
          label: p.row.label,
          response: p.inputs[j]?.response ?? "",
          tokens: [...p.inputIds, ...g.tokenIds],
          finishReason: g.finishReason,
          reward: r.value,
          rewardComponents: r.components,
        });
      });
      for (const k of c.eval_pass_k) passSums.set(k, (passSums.get(k) ?? 0) + passAtK(n, correct, k));
    }
    const prompts = perPrompt.length;
    results.push({
      runId,
      step,
      dataset: name,
      weightVersion: dispatched.weightVersion,
      numPrompts: prompts,
      numSamples: prompts * n,
      meanReward: rewardSum / Math.max(1, prompts * n),
      passAtK: Object.fromEntries([...passSums].map(([k, v]) => [String(k), v / Math.max(1, prompts)])),
      truncatedFraction: truncated / Math.max(1, prompts * n),
    });
  }
  await writeEval(deps.db, results, samples);
}
