/**
 * @file GRPO on the demo task rewarded by a learned reward model alone: the embedded engine and trainer (the loop of
 * scripts/demo-rl-loop.ts), each sample's reward the ONNX reward model's score of `prompt + response`
 * (src/reward/onnx-rm.ts, in-process, one batched call per step). The true task reward (examples/demo/task.ts
 * exactBoxedReward: the boxed answer equals the label) is measured on the same samples and never trained on.
 *
 * Guards against a policy that games the model (its score rises while the true reward falls):
 * - `--kl-coef C`: slime's KL loss to the reference (the warm start), use_kl_loss with kl_loss_type low_var_kl;
 * - `--rm-threshold auto|none|T`: the reward is 1 where the model's score is above T, else 0, rather than the raw score.
 *   `auto` takes the T that best separates chosen from rejected responses of the held-out preference pairs
 *   (`--rm-pairs FILE`, scripts/build-preferences.py's eval.jsonl: the reward model's own held-out data, never the
 *   policy's true reward). Within a group, answers the model cannot tell apart (a near miss beside the right sum, both
 *   above T) then get the same reward, so the policy is pushed only where the model is sure, rather than toward the
 *   fine score differences it can be gamed by;
 * - `--eval-every N`: every N steps the policy answers the held-out prompts (examples/demo/eval.jsonl, seeded draws)
 *   and the reward model alone scores them; the run keeps the version with the best held-out score and stops after
 *   `--patience` evaluations without a better one. The true reward of those held-out answers is recorded beside it,
 *   never read by the choice.
 *
 * Usage:
 *   npx tsx scripts/sample-demo-policy.ts --out /tmp/policy
 *   .venv/bin/python scripts/build-preferences.py --out /tmp/prefs --format chat --policy-samples /tmp/policy
 *   .venv/bin/python scripts/train-reward-model.py --pairs /tmp/prefs --out /tmp/rm
 *   npx tsx scripts/grpo-with-reward-model.ts --rm /tmp/rm/onnx --rm-format chat [--steps 30] [--prompts 32]
 *        [--samples 8] [--lr 1e-3] [--kl-coef 0] [--eval-every 0] [--patience 3] [--eval-samples 4]
 *        [--out bench/results/grpo-with-reward-model.json]
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
    "kl-coef": { type: "string", default: "0" },
    "eval-every": { type: "string", default: "0" },
    patience: { type: "string", default: "3" },
    "eval-samples": { type: "string", default: "4" },
    "rm-threshold": { type: "string", default: "none" },
    "rm-pairs": { type: "string" },
    seed: { type: "string", default: "11" },
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

/**
 * The threshold that best separates the chosen (above) from the rejected (below) responses' scores: the midpoint
 * between two neighbouring sorted scores with the most right on both sides. Returns it with its accuracy.
 */
function separatingThreshold(chosen: readonly number[], rejected: readonly number[]): { threshold: number; accuracy: number } {
  const all = [...chosen.map((s) => ({ s, isChosen: true })), ...rejected.map((s) => ({ s, isChosen: false }))].sort((a, b) => a.s - b.s);
  // Everything above a threshold below all scores: every chosen right, every rejected wrong.
  let right = chosen.length;
  let best = { threshold: (all[0]?.s ?? 0) - 1, accuracy: right / all.length };
  for (let i = 0; i < all.length; i++) {
    right += (all[i] as { isChosen: boolean }).isChosen ? -1 : 1;
    const next = all[i + 1];
    if (next !== undefined && next.s === (all[i] as { s: number }).s) continue;
    const threshold = next === undefined ? (all[i] as { s: number }).s + 1 : ((all[i] as { s: number }).s + next.s) / 2;
    if (right / all.length > best.accuracy) best = { threshold, accuracy: right / all.length };
  }
  return best;
}

async function main(): Promise<void> {
  if (!args.rm) throw new Error("--rm DIR is required: the reward model directory scripts/train-reward-model.py writes (OUT/onnx)");
  const fixtures = resolve(args.fixtures);
  const warmStart = join(fixtures, "warm-start");
  const problems = (await readFile(join(fixtures, "train.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as ArithmeticProblem);
  const heldOut = (await readFile(join(fixtures, "eval.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as ArithmeticProblem);
  const tokenizer = createDemoTokenizer();
  const klCoef = Number(args["kl-coef"]);
  const evalEvery = Number(args["eval-every"]);
  const patience = Number(args.patience);
  const evalSamples = Number(args["eval-samples"]);
  const numSteps = Number(args.steps);
  const numPrompts = Number(args.prompts);
  const groupSize = Number(args.samples);
  const rewardModel = await loadOnnxRewardModel(resolve(args.rm), { batchSize: 64 });
  let threshold: { threshold: number; accuracy: number } | null = null;
  if (args["rm-threshold"] === "auto") {
    if (!args["rm-pairs"]) throw new Error("--rm-threshold auto needs --rm-pairs FILE: held-out preference pairs (scripts/build-preferences.py's eval.jsonl)");
    const pairs = (await readFile(resolve(args["rm-pairs"]), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { prompt: string; chosen: string; rejected: string });
    const chosen = await rewardModel.score(pairs.map((p) => ({ prompt: p.prompt, response: p.chosen })));
    const rejected = await rewardModel.score(pairs.map((p) => ({ prompt: p.prompt, response: p.rejected })));
    threshold = separatingThreshold(chosen, rejected);
    console.log(JSON.stringify({ rmThreshold: threshold, pairs: pairs.length }));
  } else if (args["rm-threshold"] !== "none") {
    const t = Number(args["rm-threshold"]);
    if (!Number.isFinite(t)) throw new Error(`--rm-threshold ${args["rm-threshold"]}: expected auto, none or a number`);
    threshold = { threshold: t, accuracy: NaN };
  }
  /** What the policy is rewarded with: the raw scores, or 1/0 above/below the threshold. */
  const shape = (scores: number[]): number[] => (threshold === null ? scores : scores.map((x) => (x > (threshold as { threshold: number }).threshold ? 1 : 0)));
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
    ...(klCoef > 0 ? { use_kl_loss: true, kl_loss_coef: klCoef, kl_loss_type: "low_var_kl" } : {}),
  };
  // The same seeds at every evaluation, so two versions are compared on the same draws.
  async function evaluateHeldOut(v: number): Promise<{ version: number; rmScore: number; trueReward: number }> {
    const answers = await Promise.all(
      heldOut.flatMap((p, g) =>
        Array.from({ length: evalSamples }, (_, i) =>
          engine
            .generate({
              requestId: `grpo-rm-eval-${v}-${g}-${i}`,
              inputIds: tokenizer.formatPrompt(p.input),
              sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: 8, stopTokenIds: [tokenizer.eosId], seed: mixSeed(23, g, i) },
            })
            .then((r) => ({ prompt: p.input, response: tokenizer.decode(r.tokenIds), label: p.label })),
        ),
      ),
    );
    const scores = shape(await rewardModel.score(answers.map((x) => rmInput(x.prompt, x.response))));
    return {
      version: v,
      rmScore: Number(mean(scores).toFixed(4)),
      trueReward: Number(mean(answers.map((x) => exactBoxedReward(x.response, x.label))).toFixed(4)),
    };
  }
  const evals: Array<{ step: number; version: number; rmScore: number; trueReward: number }> = [];
  let best: { step: number; version: number; rmScore: number; trueReward: number } | null = null;
  let evalsSinceBest = 0;
  let stoppedEarlyAt: number | null = null;
  if (evalEvery > 0) {
    best = { step: 0, ...(await evaluateHeldOut(0)) };
    evals.push(best);
    console.log(JSON.stringify({ heldOut: best }));
  }
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
                sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: 8, stopTokenIds: [tokenizer.eosId], seed: mixSeed(Number(args.seed), step, g, i) },
              })
              .then((r) => ({ r, g, i, inputIds, prompt: p.input, response: tokenizer.decode(r.tokenIds), label: p.label }));
          }),
        ),
      );
      // The reward trained on: the learned model's score, one batched onnxruntime call for the step's samples.
      const rmScores = shape(await rewardModel.score(results.map((x) => rmInput(x.prompt, x.response))));
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
      if (evalEvery > 0 && (step + 1) % evalEvery === 0 && best) {
        const e = { step: step + 1, ...(await evaluateHeldOut(version)) };
        evals.push(e);
        console.log(JSON.stringify({ heldOut: e }));
        if (e.rmScore > best.rmScore) {
          best = e;
          evalsSinceBest = 0;
        } else if (++evalsSinceBest >= patience) {
          stoppedEarlyAt = step + 1;
          break;
        }
      }
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
    steps: history.length,
    stepsPlanned: numSteps,
    samplesPerStep: numPrompts * groupSize,
    seconds: (Date.now() - started) / 1000,
    window,
    trueRewardFirst: Number(mean(first.map((h) => h.trueReward)).toFixed(4)),
    trueRewardLast: Number(mean(last.map((h) => h.trueReward)).toFixed(4)),
    rmRewardFirst: Number(mean(first.map((h) => h.rmReward)).toFixed(4)),
    rmRewardLast: Number(mean(last.map((h) => h.rmReward)).toFixed(4)),
    klCoef,
    lr: config.lr,
    rmThreshold: threshold,
    ...(evalEvery > 0
      ? {
          heldOut: {
            what: `examples/demo/eval.jsonl, ${evalSamples} draws a prompt at temperature 1; the version kept is the best by the reward model's mean score alone`,
            start: evals[0],
            chosen: best,
            last: evals[evals.length - 1],
            trueRewardGainChosen: best && evals[0] ? Number((best.trueReward - evals[0].trueReward).toFixed(4)) : null,
            stoppedEarlyAt,
            evals,
          },
        }
      : {}),
    history,
  };
  console.log(JSON.stringify(summary));
  if (args.out) await writeFile(args.out, JSON.stringify(summary, null, 2) + "\n");
}

await main();
