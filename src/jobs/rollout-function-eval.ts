/**
 * rollout_function_path, eval branch (slime's `generate_rollout(...,
 * evaluation=True)`): the user's function runs inside the eval job. An eval
 * is idempotent as a whole (its results land in one transaction; a retried
 * job starts over), so there is nothing to replay: `ctx.generate` calls the
 * engine at the pinned version with the eval_* sampling settings and
 * `ctx.score` the run's reward. The function returns per dataset
 * `{rewards, truncated, samples}` (index-aligned), stored like the built-in
 * eval: eval_samples, and eval_results with the mean reward, the truncated
 * fraction and unbiased pass@k over each prompt's samples (correct: reward >= 1).
 */

import type { Db } from "../store/db.ts";
import { writeEval, type EvalResultRow, type EvalSampleRow } from "../store/eval-facts.ts";
import type { Engine } from "../engines/engine.ts";
import type { EvalJob } from "../queue/payloads.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { loadEvalDataset } from "../runtime/plugins-registry.ts";
import { evalSampleMetadata, resolveEvalDatasets, type EvalDataset } from "../config/eval-datasets.ts";
import { passAtK } from "../algorithms/index.ts";
import { seedFrom } from "../lib/hash.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import {
  badReturn,
  deepFreeze,
  evalOutputSchema,
  loadRolloutFunction,
  zodDetail,
  type EvalPrompt,
  type EvalSample,
  type RolloutEvalContext,
} from "../rollout/rollout-function-contract.ts";
import { evalSampling } from "../rollout/sampling-params.ts";

export interface RolloutEvalDeps {
  db: Db;
  engine: Engine;
  weightVersion: number;
  maxInFlight?: number;
}

interface Produced {
  sample: EvalSample;
  tokens: number[];
  components: Record<string, unknown> | null;
}

/** A counting semaphore: at most `limit` engine requests at once, whatever the function fans out. */
function limiter(limit: number) {
  let active = 0;
  const waiting: Array<() => void> = [];
  return async <T>(fn: () => Promise<T>): Promise<T> => {
    if (active >= limit) await new Promise<void>((r) => waiting.push(r));
    active++;
    try {
      return await fn();
    } finally {
      active--;
      waiting.shift()?.();
    }
  };
}

export async function runRolloutFunctionEval(deps: RolloutEvalDeps, ctx: RunContext, job: EvalJob): Promise<void> {
  const { runId, step } = job;
  const c = ctx.config;
  const path = c.rollout_function_path as string;
  const fn = await loadRolloutFunction(path, process.cwd());
  const datasets: Record<string, readonly EvalPrompt[]> = {};
  const settings = new Map<string, EvalDataset>();
  for (const d of resolveEvalDatasets(c)) {
    const { dataset: data } = await loadEvalDataset(c, d, ctx.tokenizer);
    settings.set(d.name, d);
    datasets[d.name] = deepFreeze(
      data.rows.map((r) => ({ dataset: d.name, index: r.index, prompt: r.prompt, label: r.label, metadata: evalSampleMetadata(d, r.metadata) })),
    );
  }
  // Keyed by (dataset, prompt, sample): what the function hands back may be a copy (it is checked, then the recorded sample is stored).
  const produced = new Map<string, Produced>();
  const nextSample = new Map<string, number>();
  const limit = limiter(Math.max(1, deps.maxInFlight ?? 256));
  const where = `rollout_function_path ${path} (eval ${step})`;

  const evalCtx: RolloutEvalContext = Object.freeze({
    evaluation: true,
    rolloutId: step,
    datasets: deepFreeze(datasets),
    async generate(prompt: EvalPrompt, options: { n?: number } = {}): Promise<readonly EvalSample[]> {
      const rows = datasets[prompt?.dataset];
      const row = rows?.[prompt.index];
      if (!row || row.prompt !== prompt.prompt) throw new RlqError("plugin_bad_call", `${where}: ctx.generate expects a prompt from ctx.datasets`);
      const d = settings.get(prompt.dataset) as EvalDataset;
      const n = options.n ?? d.n;
      if (!Number.isInteger(n) || n < 1) throw new RlqError("plugin_bad_call", `${where}: ctx.generate: n = ${String(n)}; expected a positive integer`);
      // Sample indices continue across calls for one prompt, so the first call's samples use the
      // built-in eval's request ids and seeds, and no two samples share a key.
      const key = `${row.dataset}\u0000${row.index}`;
      const first = nextSample.get(key) ?? 0;
      nextSample.set(key, first + n);
      const inputIds = ctx.tokenizer.encode(row.prompt);
      const gens = await Promise.all(
        Array.from({ length: n }, (_, i) =>
          limit(() =>
            deps.engine.generate({
              requestId: `${runId}-eval${step}-${row.dataset}-${row.index}-${first + i}`,
              inputIds,
              sampling: { ...evalSampling(d, c, ctx.tokenizer.eosId), seed: seedFrom(c.rollout_seed, "eval", row.dataset, row.index, first + i) },
            }),
          ),
        ),
      );
      return deepFreeze(
        gens.map((g, i) => {
          const sample: EvalSample = {
            dataset: row.dataset,
            promptIndex: row.index,
            sampleIndex: first + i,
            prompt: row.prompt,
            label: row.label,
            metadata: row.metadata,
            response: ctx.tokenizer.decode(g.tokenIds),
            responseTokens: g.tokenIds,
            finishReason: g.finishReason,
            status: g.finishReason === "stop" ? "completed" : "truncated",
            weightVersion: g.weightVersion,
          };
          produced.set(sampleKey(sample), { sample, tokens: [...inputIds, ...g.tokenIds], components: null });
          return sample;
        }),
      );
    },
    async score(samples: readonly EvalSample[]): Promise<readonly number[]> {
      const known = Array.isArray(samples) ? samples.map((s) => produced.get(sampleKey(s))) : [undefined];
      if (known.some((k) => k === undefined)) throw new RlqError("plugin_bad_call", `${where}: ctx.score expects samples from ctx.generate`);
      const scored = await ctx.reward.score(
        known.map((k, i) => {
          const s = (k as Produced).sample;
          return { sampleIndex: i, prompt: s.prompt, response: s.response, label: s.label, metadata: s.metadata, status: s.status };
        }),
      );
      scored.forEach((r, i) => {
        const k = known[i];
        if (k) k.components = r.components;
      });
      return deepFreeze(scored.map((r) => r.value));
    },
  });

  let value: unknown;
  try {
    value = await fn(deepFreeze(structuredClone(c)), evalCtx);
  } catch (e) {
    if (e instanceof RlqError) throw e;
    throw new RlqError("plugin_threw", `${where}: the function threw: ${errorMessage(e)}`, { cause: e });
  }
  const { results, samples } = toRows(value, { path, step, runId, weightVersion: deps.weightVersion, passK: c.eval_pass_k, datasets, produced });
  await writeEval(deps.db, results, samples);
}

function sampleKey(s: { dataset?: unknown; promptIndex?: unknown; sampleIndex?: unknown } | null | undefined): string {
  return `${String(s?.dataset)}\u0000${String(s?.promptIndex)}\u0000${String(s?.sampleIndex)}`;
}

function toRows(
  value: unknown,
  o: {
    path: string;
    step: number;
    runId: string;
    weightVersion: number;
    passK: readonly number[];
    datasets: Record<string, readonly EvalPrompt[]>;
    produced: Map<string, Produced>;
  },
): { results: EvalResultRow[]; samples: EvalSampleRow[] } {
  const bad = (detail: string) => badReturn(o.path, o.step, true, detail);
  const parsed = evalOutputSchema.safeParse(value);
  if (!parsed.success)
    throw bad(
      `a value of the wrong shape; expected {data: {dataset: {rewards: number[], truncated: boolean[], samples: EvalSample[]}}, metrics?} (${zodDetail(parsed.error)})`,
    );
  const entries = Object.entries(parsed.data.data);
  if (entries.length === 0) throw bad("no dataset; expected at least one of eval_prompt_data's datasets");
  const results: EvalResultRow[] = [];
  const samples: EvalSampleRow[] = [];
  for (const [name, d] of entries) {
    if (!(name in o.datasets)) throw bad(`dataset '${name}', which is not in eval_prompt_data (${Object.keys(o.datasets).join(", ")})`);
    if (d.rewards.length !== d.samples.length || d.truncated.length !== d.samples.length) {
      throw bad(
        `dataset '${name}' with ${d.samples.length} samples, ${d.rewards.length} rewards and ${d.truncated.length} truncated flags; they must be index-aligned`,
      );
    }
    if (d.samples.length === 0) throw bad(`dataset '${name}' with no samples`);
    const byPrompt = new Map<number, number[]>();
    const keys = new Set<string>();
    d.samples.forEach((ref, i) => {
      const p = o.produced.get(sampleKey(ref));
      if (!p || p.sample.dataset !== name) throw bad(`dataset '${name}' sample #${i}, which is not a sample ctx.generate produced for that dataset`);
      const key = `${p.sample.promptIndex}/${p.sample.sampleIndex}`;
      if (keys.has(key)) throw bad(`dataset '${name}' sample ${key} twice`);
      keys.add(key);
      const reward = d.rewards[i] as number;
      byPrompt.set(p.sample.promptIndex, [...(byPrompt.get(p.sample.promptIndex) ?? []), reward]);
      samples.push({
        runId: o.runId,
        step: o.step,
        dataset: name,
        promptIndex: p.sample.promptIndex,
        sampleIndex: p.sample.sampleIndex,
        weightVersion: p.sample.weightVersion,
        prompt: p.sample.prompt,
        label: p.sample.label,
        response: p.sample.response,
        tokens: p.tokens,
        finishReason: p.sample.finishReason,
        reward,
        rewardComponents: p.components ?? {},
      });
    });
    // pass@k per prompt over its own samples; prompts with fewer than k samples do not count for that k.
    const passAt: Record<string, number> = {};
    for (const k of o.passK) {
      const eligible = [...byPrompt.values()].filter((rs) => rs.length >= k);
      if (eligible.length === 0) continue;
      passAt[String(k)] = eligible.reduce((a, rs) => a + passAtK(rs.length, rs.filter((r) => r >= 1).length, k), 0) / eligible.length;
    }
    results.push({
      runId: o.runId,
      step: o.step,
      dataset: name,
      weightVersion: o.weightVersion,
      numPrompts: byPrompt.size,
      numSamples: d.samples.length,
      meanReward: d.rewards.reduce((a, b) => a + b, 0) / d.samples.length,
      passAtK: passAt,
      truncatedFraction: d.truncated.filter(Boolean).length / d.samples.length,
    });
  }
  return { results, samples };
}
