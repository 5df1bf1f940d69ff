/**
 * On-policy distillation, learning: a student trained with use_opd and zero reward (pure
 * distillation) by the embedded trainer's own train step, on its own samples, with a teacher of
 * different weights scoring every sampled token. Reported: the student's exact reverse KL to the
 * teacher, KL(π_student ‖ π_teacher) summed over the vocabulary and averaged over the positions of
 * held-out student samples, before and after, and the factor it fell by. No services needed.
 *
 *   npx tsx bench/opd-distill.ts [--steps 40] [--lr 0.003] [--coef 1]
 */
import { parseArgs } from "node:util";
import { readCheckpoint } from "../src/model/checkpoint.ts";
import type { ModelConfig } from "../src/model/config.ts";
import type { Weights } from "../src/model/weights.ts";
import { logSoftmax, referenceForward } from "../src/model/reference-forward.ts";
import { scaledWeights, TINY_CONFIG, writeTestCheckpoint } from "../src/model/testing.ts";
import { Prng } from "../src/model/prng.ts";
import { createJaxModel, type JaxModel } from "../src/trainer/embedded/jax-model.ts";
import { runEmbeddedTrainStep, type TrainStepDeps } from "../src/trainer/embedded/train-step.ts";
import { makeTrainRequest } from "../src/trainer/embedded/testing.ts";
import type { TrainSample } from "../src/trainer/trainer.ts";
import { writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: { steps: { type: "string", default: "40" }, lr: { type: "string", default: "0.003" }, coef: { type: "string", default: "1" } },
});
const steps = Number(values.steps);
const config: ModelConfig = TINY_CONFIG;
const RESPONSE = 6;
const teacher = scaledWeights(config, 11, 4);

const prompts = (rng: Prng, n: number) => Array.from({ length: n }, () => [1, 3 + rng.nextInt(10), 13, 3 + rng.nextInt(10), 16]);

/** Sample a response from `w` at temperature 1; returns the tokens and per-position log-prob rows of both models. */
function rollout(w: Weights, prompt: number[], rng: Prng): { tokens: number[]; student: Float64Array[]; teacher: Float64Array[] } {
  const tokens = [...prompt];
  for (let t = 0; t < RESPONSE; t++) {
    const rows = referenceForward(config, w, tokens);
    const lp = logSoftmax(rows[rows.length - 1] as Float64Array);
    let u = rng.nextFloat();
    let pick = lp.length - 1;
    for (let i = 0; i < lp.length; i++) {
      u -= Math.exp(lp[i] as number);
      if (u <= 0) {
        pick = i;
        break;
      }
    }
    tokens.push(pick);
  }
  const rowsOf = (x: Weights) =>
    referenceForward(config, x, tokens)
      .slice(prompt.length - 1, tokens.length - 1)
      .map((r) => logSoftmax(r));
  return { tokens, student: rowsOf(w), teacher: rowsOf(teacher) };
}

/** Exact KL(student ‖ teacher) per position, averaged over the positions of `n` fresh student samples. */
function reverseKl(w: Weights, seed: number, n = 64): number {
  const rng = new Prng(seed);
  let sum = 0;
  let count = 0;
  for (const p of prompts(rng, n)) {
    const r = rollout(w, p, rng);
    r.student.forEach((s, t) => {
      const te = r.teacher[t] as Float64Array;
      for (let i = 0; i < s.length; i++) sum += Math.exp(s[i] as number) * ((s[i] as number) - (te[i] as number));
      count++;
    });
  }
  return sum / count;
}

const models = new Map<string, Promise<JaxModel>>();
const deps: TrainStepDeps = {
  modelFor: (c) => {
    const key = JSON.stringify(c);
    if (!models.has(key)) models.set(key, createJaxModel(c));
    return models.get(key) as Promise<JaxModel>;
  },
  initConfig: null,
  loadReference: async (uri) => (await readCheckpoint(uri)).weights,
};

let student = scaledWeights(config, 3, 4);
const refDir = await writeTestCheckpoint(config, student, 0);
const klBefore = reverseKl(student, 999);
const curve: number[] = [klBefore];
let uri: string | null = null;
const rng = new Prng(7);
for (let step = 0; step < steps; step++) {
  const samples: TrainSample[] = [];
  prompts(rng, 8).forEach((p, g) => {
    for (let i = 0; i < 4; i++) {
      const r = rollout(student, p, rng);
      const at = (rows: Float64Array[]) => Float32Array.from(rows, (row, t) => row[r.tokens[p.length + t] as number] as number);
      samples.push({
        tokens: Int32Array.from(r.tokens),
        promptLength: p.length,
        responseLength: RESPONSE,
        lossMask: new Uint8Array(RESPONSE).fill(1),
        rolloutLogProbs: at(r.student),
        teacherLogProbs: at(r.teacher),
        tokenVersions: new Int32Array(RESPONSE).fill(step),
        reward: 0,
        groupIndex: g,
        sampleIndex: i,
      });
    }
  });
  const req = await makeTrainRequest(student, refDir, {
    step,
    weightVersionIn: step,
    checkpointUriIn: uri,
    batch: { runId: "run-a", step, samples },
    config: { lr: Number(values.lr), num_steps_per_rollout: 1, use_tis: false, use_opd: true, opd_kl_coef: Number(values.coef) },
  });
  const out = await runEmbeddedTrainStep(req, deps, () => undefined);
  uri = out.checkpointUri;
  student = (await readCheckpoint(uri)).weights;
  if ((step + 1) % 10 === 0) curve.push(reverseKl(student, 999));
}
const klAfter = reverseKl(student, 999);
await writeResult("opd-distill", {
  what: "pure on-policy distillation (zero reward, use_opd, opd_kl_coef) by the embedded train step; exact reverse KL(student || teacher) per position over 64 held-out student samples",
  model: config,
  steps,
  lr: Number(values.lr),
  opd_kl_coef: Number(values.coef),
  samples_per_step: 32,
  reverse_kl_before: klBefore,
  reverse_kl_after: klAfter,
  fell_by_factor: klBefore / klAfter,
  reverse_kl_every_10_steps: curve,
});
