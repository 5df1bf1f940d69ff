/**
 * @file GRPO on the demo task rewarded by a learned reward model alone: the embedded engine and trainer (the loop of
 * scripts/demo-rl-loop.ts), each sample's reward the ONNX reward model's score of `prompt + response`
 * (src/reward/onnx-rm.ts, in-process, one batched call per step). The true task reward (examples/demo/task.ts
 * exactBoxedReward: the boxed answer equals the label) is measured on the same samples and never trained on.
 *
 * Usage:
 *   .venv/bin/python scripts/build-preferences.py --out /tmp/prefs
 *   .venv/bin/python scripts/train-reward-model.py --pairs /tmp/prefs --out /tmp/rm
 *   npx tsx scripts/grpo-with-reward-model.ts --rm /tmp/rm/onnx [--steps 30] [--prompts 32] [--samples 8]
 *        [--lr 1e-3] [--out bench/results/grpo-with-reward-model.json]
 * Prints one JSON line per step and a summary (also written to --out).
 */
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { exactBoxedReward, type ArithmeticProblem } from "../examples/demo/task.ts";
import { createEmbeddedEngine } from "../src/engines/embedded/embedded-engine.ts";
import { mixSeed } from "../src/model/prng.ts";
import { createDemoTokenizer } from "../src/model/tokenizer.ts";
import { loadOnnxRewardModel } from "../src/reward/index.ts";
import { createEmbeddedTrainer } from "../src/trainer/embedded/embedded-trainer.ts";
import type { TrainSample } from "../src/trainer/trainer.ts";

const { values: args } = parseArgs({
  options: {
    rm: { type: "string" },
    fixtures: { type: "string", default: "examples/demo" },
    steps: { type: "string", default: "30" },
    prompts: { type: "string", default: "32" },
    samples: { type: "string", default: "8" },
    lr: { type: "string", default: "1e-3" },
    warmup: { type: "string", default: "5" },
    out: { type: "string" },
    "rm-format": { type: "string", default: "raw" },
  },
});

/**
 * What the reward model reads: the demo's bare prompt and response (`raw`), or both rendered in the fixture model's
 * ChatML template (`chat`), the format scripts/build-preferences.py writes with --format chat.
 */
function rmInput(prompt: string, response: string): { prompt: string; response: string } {
  if (args["rm-format"] === "raw") return { prompt, response };
  if (args["rm-format"] === "chat") return { prompt: `<|im_start|>user\n${prompt}<|im_end|>\n<|im_start|>assistant\n`, response: `${response}<|im_end|>` };
  throw new Error(`--rm-format ${args["rm-format"]}: expected raw or chat`);
}

const mean = (x: readonly number[]): number => x.reduce((a, b) => a + b, 0) / x.length;

async function main(): Promise<void> {
  if (!args.rm) throw new Error("--rm DIR is required: the reward model directory scripts/train-reward-model.py writes (OUT/onnx)");
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
  const rewardModel = await loadOnnxRewardModel(resolve(args.rm), { batchSize: 64 });
  const engine = await createEmbeddedEngine({ checkpointUri: warmStart, maxBatchSize: 64 });
  const trainer = await createEmbeddedTrainer();
  const workDir = await mkdtemp(join(tmpdir(), "rlq-grpo-rm-"));
  const config = {
    lr: Number(args.lr),
    lr_warmup_iters: Number(args.warmup),
    ref_load: warmStart,
    rollout_temperature: 1,
    num_steps_per_rollout: 1,
    clip_grad: 1,
  };
  const started = Date.now();
  let version = 0;
  let checkpointUri: string | null = null;
  const history: Array<{ step: number; trueReward: number; rmReward: number; examples: string[] }> = [];
  try {
    for (let step = 0; step < numSteps; step++) {
      const batch = Array.from({ length: numPrompts }, (_, g) => problems[(step * numPrompts + g) % problems.length] as ArithmeticProblem);
      const results = await Promise.all(
        batch.flatMap((p, g) =>
          Array.from({ length: groupSize }, (_, i) => {
            const inputIds = tokenizer.formatPrompt(p.input);
            return engine
              .generate({
                requestId: `grpo-rm-${step}-${g}-${i}`,
                inputIds,
                sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: 8, stopTokenIds: [tokenizer.eosId], seed: mixSeed(11, step, g, i) },
              })
              .then((r) => ({ r, g, i, inputIds, prompt: p.input, response: tokenizer.decode(r.tokenIds), label: p.label }));
          }),
        ),
      );
      // The reward trained on: the learned model's score, one batched onnxruntime call for the step's samples.
      const rmScores = await rewardModel.score(results.map((x) => rmInput(x.prompt, x.response)));
      const trueRewards = results.map((x) => exactBoxedReward(x.response, x.label));
      const samples: TrainSample[] = results.map(({ r, g, i, inputIds }, k) => ({
        tokens: Int32Array.from([...inputIds, ...r.tokenIds]),
        promptLength: inputIds.length,
        responseLength: r.tokenIds.length,
        lossMask: new Uint8Array(r.tokenIds.length).fill(1),
        rolloutLogProbs: Float32Array.from(r.logProbs),
        tokenVersions: new Int32Array(r.tokenIds.length).fill(r.weightVersion),
        reward: rmScores[k] as number,
        groupIndex: g,
        sampleIndex: i,
      }));
      const result = await trainer.trainStep(
        {
          runId: "grpo-rm",
          step,
          attempt: 1,
          weightVersionIn: version,
          checkpointUriIn: checkpointUri,
          outputDir: join(workDir, `step-${step}`),
          config,
          batch: { runId: "grpo-rm", step, samples },
        },
        () => undefined,
        new AbortController().signal,
      );
      await engine.loadWeights(result.weightVersionOut, result.checkpointUri);
      version = result.weightVersionOut;
      checkpointUri = result.checkpointUri;
      // A few responses per step, so a reward the policy games (a high score for a wrong answer) shows in the results.
      const examples = results.slice(0, 4).map((x, k) => `${x.prompt}${x.response} -> rm ${(rmScores[k] as number).toFixed(2)}, true ${trueRewards[k]}`);
      history.push({ step, trueReward: Number(mean(trueRewards).toFixed(4)), rmReward: Number(mean(rmScores).toFixed(4)), examples });
      console.log(JSON.stringify({ ...history[history.length - 1], elapsedS: (Date.now() - started) / 1000 }));
    }
  } finally {
    await engine.close();
    await trainer.close();
    await rewardModel.close();
    await rm(workDir, { recursive: true, force: true });
  }
  const window = Math.min(5, Math.floor(history.length / 2));
  const first = history.slice(0, window);
  const last = history.slice(-window);
  const summary = {
    what: "GRPO on the demo task (embedded engine and trainer) rewarded only by the ONNX reward model; trueReward = exact boxed answer, not trained on",
    command: `npx tsx scripts/grpo-with-reward-model.ts ${process.argv.slice(2).join(" ")}`,
    steps: numSteps,
    samplesPerStep: numPrompts * groupSize,
    seconds: (Date.now() - started) / 1000,
    window,
    trueRewardFirst: Number(mean(first.map((h) => h.trueReward)).toFixed(4)),
    trueRewardLast: Number(mean(last.map((h) => h.trueReward)).toFixed(4)),
    rmRewardFirst: Number(mean(first.map((h) => h.rmReward)).toFixed(4)),
    rmRewardLast: Number(mean(last.map((h) => h.rmReward)).toFixed(4)),
    history,
  };
  console.log(JSON.stringify(summary));
  if (args.out) await writeFile(args.out, JSON.stringify(summary, null, 2) + "\n");
}

await main();
