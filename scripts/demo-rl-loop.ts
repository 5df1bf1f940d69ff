/**
 * A small synchronous GRPO loop over the embedded engine and trainer, outside
 * the queue system: generate -> reward -> train -> load new weights. It measures
 * how fast the demo's reward rises from the warm start (docs/embedded-model.md)
 * and is the reference the full `npm run demo` path can be compared against.
 *
 * Usage: npx tsx scripts/demo-rl-loop.ts [--fixtures examples/demo] [--steps 30]
 *        [--prompts 32] [--samples 8] [--lr 1e-3] [--warmup 5] [--noise 0] [--tis]
 * Prints one JSON line per step and a summary line.
 */
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { exactBoxedReward, type ArithmeticProblem } from "../examples/demo/task.ts";
import { createEmbeddedEngine } from "../src/engines/embedded/embedded-engine.ts";
import { mixSeed } from "../src/model/prng.ts";
import { createDemoTokenizer } from "../src/model/tokenizer.ts";
import { createEmbeddedTrainer } from "../src/trainer/embedded/embedded-trainer.ts";
import type { TrainSample } from "../src/trainer/trainer.ts";

const { values: args } = parseArgs({
  options: {
    fixtures: { type: "string", default: "examples/demo" },
    steps: { type: "string", default: "30" },
    prompts: { type: "string", default: "32" },
    samples: { type: "string", default: "8" },
    lr: { type: "string", default: "1e-3" },
    warmup: { type: "string", default: "5" },
    noise: { type: "string", default: "0" },
    tis: { type: "boolean", default: false },
  },
});

async function main(): Promise<void> {
  const fixtures = resolve(args.fixtures);
  const warmStart = join(fixtures, "warm-start");
  const problems = (await readFile(join(fixtures, "train.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as ArithmeticProblem);
  const tokenizer = createDemoTokenizer();
  const numSteps = Number(args.steps);
  const numPrompts = Number(args.prompts);
  const groupSize = Number(args.samples);
  const engine = await createEmbeddedEngine({ checkpointUri: warmStart, maxBatchSize: 64, logitNoiseStd: Number(args.noise) });
  const trainer = await createEmbeddedTrainer();
  const workDir = await mkdtemp(join(tmpdir(), "rlq-demo-loop-"));
  const config = {
    lr: Number(args.lr),
    lr_warmup_iters: Number(args.warmup),
    ref_load: warmStart,
    rollout_temperature: 1,
    num_steps_per_rollout: 1,
    clip_grad: 1,
    use_tis: args.tis,
  };
  const started = Date.now();
  let version = 0;
  let checkpointUri: string | null = null;
  const rewards: number[] = [];
  try {
    for (let step = 0; step < numSteps; step++) {
      const t0 = Date.now();
      const batch = Array.from({ length: numPrompts }, (_, g) => problems[(step * numPrompts + g) % problems.length] as ArithmeticProblem);
      const results = await Promise.all(
        batch.flatMap((p, g) =>
          Array.from({ length: groupSize }, (_, i) => {
            const inputIds = tokenizer.formatPrompt(p.input);
            return engine
              .generate({
                requestId: `demo-${step}-${g}-${i}`,
                inputIds,
                sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: 8, stopTokenIds: [tokenizer.eosId], seed: mixSeed(7, step, g, i) },
              })
              .then((r) => ({ r, g, i, inputIds, reward: exactBoxedReward(tokenizer.decode(r.tokenIds), p.label) }));
          }),
        ),
      );
      const t1 = Date.now();
      const samples: TrainSample[] = results.map(({ r, g, i, inputIds, reward }) => ({
        tokens: Int32Array.from([...inputIds, ...r.tokenIds]),
        promptLength: inputIds.length,
        responseLength: r.tokenIds.length,
        lossMask: new Uint8Array(r.tokenIds.length).fill(1),
        rolloutLogProbs: Float32Array.from(r.logProbs),
        tokenVersions: new Int32Array(r.tokenIds.length).fill(r.weightVersion),
        reward,
        groupIndex: g,
        sampleIndex: i,
      }));
      const meanReward = samples.reduce((a, s) => a + s.reward, 0) / samples.length;
      rewards.push(meanReward);
      const result = await trainer.trainStep(
        {
          runId: "demo-loop",
          step,
          attempt: 1,
          weightVersionIn: version,
          checkpointUriIn: checkpointUri,
          outputDir: join(workDir, `step-${step}`),
          config,
          batch: { runId: "demo-loop", step, samples },
        },
        () => undefined,
        new AbortController().signal,
      );
      const t2 = Date.now();
      await engine.loadWeights(result.weightVersionOut, result.checkpointUri);
      version = result.weightVersionOut;
      checkpointUri = result.checkpointUri;
      const t3 = Date.now();
      const generated = samples.reduce((a, s) => a + s.responseLength, 0);
      console.log(
        JSON.stringify({
          step,
          meanReward: Number(meanReward.toFixed(4)),
          generateMs: t1 - t0,
          engineTokensPerS: Math.round((generated / (t1 - t0)) * 1000),
          trainMs: t2 - t1,
          loadMs: t3 - t2,
          logprobAbsDiff: Number(result.metrics.train_rollout_logprob_abs_diff?.toExponential(2)),
          elapsedS: (Date.now() - started) / 1000,
        }),
      );
    }
  } finally {
    await engine.close();
    await trainer.close();
    await rm(workDir, { recursive: true, force: true });
  }
  const first = rewards.slice(0, 3);
  const last = rewards.slice(-3);
  const mean = (x: number[]): number => x.reduce((a, b) => a + b, 0) / x.length;
  console.log(
    JSON.stringify({
      summary: true,
      steps: numSteps,
      seconds: (Date.now() - started) / 1000,
      rewardFirst3: mean(first),
      rewardLast3: mean(last),
      samplesPerStep: numPrompts * groupSize,
    }),
  );
}

await main();
