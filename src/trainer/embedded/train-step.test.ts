import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { OPTIMIZER_FILE, readCheckpoint, WEIGHTS_FILE } from "../../model/checkpoint.ts";
import type { ModelConfig } from "../../model/config.ts";
import { referenceResponseLogProbs } from "../../model/reference-forward.ts";
import { scaledWeights, TINY_CONFIG, writeTestCheckpoint } from "../../model/testing.ts";
import type { TrainProgress, TrainRequest, TrainSample } from "../trainer.ts";
import { createJaxModel, type JaxModel } from "./jax-model.ts";
import { bucketSeqLen, microBatchRows } from "./batching.ts";
import { microBatchGradient, runEmbeddedTrainStep, type TrainStepDeps } from "./train-step.ts";
import { makeSyntheticBatch, makeTrainRequest } from "./testing.ts";
import { modelFlops, modelShape, PEAK_ENV, SPLIT_KEYS } from "./efficiency.ts";

const config = TINY_CONFIG;
const weights = scaledWeights(config, 3, 4);
let refDir: string;
let deps: TrainStepDeps;

const trainRequest = (overrides: Parameters<typeof makeTrainRequest>[2] = {}): Promise<TrainRequest> => makeTrainRequest(weights, refDir, overrides);
const syntheticBatch = (seed: number): TrainSample[] => makeSyntheticBatch(config, weights, seed);

beforeAll(async () => {
  refDir = await writeTestCheckpoint(config, weights, 0);
  const models = new Map<string, Promise<JaxModel>>();
  deps = {
    modelFor: (c: ModelConfig) => {
      const key = JSON.stringify(c);
      if (!models.has(key)) models.set(key, createJaxModel(c));
      return models.get(key)!;
    },
    initConfig: null,
    loadReference: async (uri) => (await readCheckpoint(uri)).weights,
  };
});

const TIMED = new Set<string>([...SPLIT_KEYS, "step_s", "tokens_per_s", "tflops", "mfu"]);
const withoutTiming = (m: Record<string, number>): Record<string, number> => Object.fromEntries(Object.entries(m).filter(([k]) => !TIMED.has(k)));

const bytes = async (dir: string, file: string): Promise<Buffer> => readFile(join(dir, file));

describe("embedded train step", () => {
  it("writes version v+1 with optimizer state, reports progress per optimizer step and the metrics", async () => {
    const req = await trainRequest();
    const progress: TrainProgress[] = [];
    const result = await runEmbeddedTrainStep(req, deps, (p) => progress.push(p));
    expect(result).toMatchObject({ weightVersionOut: 1, numSamples: 16 });
    expect(progress.filter((p) => p.phase === "optimizer_step").map((p) => p.done)).toEqual([1, 2]);
    const out = await readCheckpoint(result.checkpointUri);
    expect(out).toMatchObject({ version: 1, runId: "run-a", step: 0 });
    expect(out.weights["head.weight"]).not.toEqual(weights["head.weight"]);
    for (const k of ["pg_loss", "pg_clipfrac", "ppo_kl", "tis", "grad_norm", "lr", "train_rollout_logprob_abs_diff", "raw_reward"]) {
      expect(Number.isFinite(result.metrics[k]), k).toBe(true);
    }
    // Engine-side log-probs here are float64 reference values: the trainer (float32) agrees closely.
    expect(result.metrics.train_rollout_logprob_abs_diff).toBeLessThan(1e-4);
    expect(result.metrics.ppo_kl).not.toBe(0); // the second optimizer step saw moved weights
  });

  it("is deterministic: the same request twice gives bit-identical checkpoint files, and a resumed step matches", async () => {
    const a = await trainRequest();
    const b = await trainRequest();
    const ra = await runEmbeddedTrainStep(a, deps, () => undefined);
    const rb = await runEmbeddedTrainStep(b, deps, () => undefined);
    // The efficiency metrics are wall-clock measurements; every other metric is computed and must match exactly.
    expect(withoutTiming(ra.metrics)).toEqual(withoutTiming(rb.metrics));
    for (const f of [WEIGHTS_FILE, OPTIMIZER_FILE]) expect((await bytes(a.outputDir, f)).equals(await bytes(b.outputDir, f))).toBe(true);
    // Step 1 from each copy of version 1: still identical (the optimizer state round-trips exactly).
    const next = async (from: string): Promise<string> => {
      const req = await trainRequest({ step: 1, weightVersionIn: 1, checkpointUriIn: from, batch: { runId: "run-a", step: 1, samples: syntheticBatch(2) } });
      await runEmbeddedTrainStep(req, deps, () => undefined);
      return req.outputDir;
    };
    const [da, db] = [await next(ra.checkpointUri), await next(rb.checkpointUri)];
    for (const f of [WEIGHTS_FILE, OPTIMIZER_FILE]) expect((await bytes(da, f)).equals(await bytes(db, f))).toBe(true);
  });

  it("reports the step-time split summing to step_s, the model's FLOPs and TFLOP/s, and MFU under RLQ_DEVICE_PEAK_TFLOPS", async () => {
    const stepWithPeak = async (peak: string | undefined): Promise<Record<string, number>> => {
      const saved = process.env[PEAK_ENV];
      if (peak === undefined) delete process.env[PEAK_ENV];
      else process.env[PEAK_ENV] = peak;
      try {
        return (await runEmbeddedTrainStep(await trainRequest(), deps, () => undefined)).metrics;
      } finally {
        if (saved === undefined) delete process.env[PEAK_ENV];
        else process.env[PEAK_ENV] = saved;
      }
    };
    const m = await stepWithPeak("2");
    const split = SPLIT_KEYS.map((k) => m[k]);
    for (const [i, v] of split.entries()) expect(v, SPLIT_KEYS[i]).toBeGreaterThanOrEqual(0);
    expect(m.critic_s).toBe(0);
    expect(m.push_s).toBe(0);
    expect(m.fwd_bwd_s).toBeGreaterThan(0);
    const sum = split.reduce((a: number, b) => a + (b as number), 0);
    expect(Math.abs(sum - (m.step_s as number))).toBeLessThanOrEqual(0.05 * (m.step_s as number));
    // No KL term in this request: the old log-probs forward (a third) beside one forward and backward per sample.
    const samples = (await trainRequest()).batch.samples;
    const lengths = samples.map((s) => s.tokens.length - 1);
    expect(m.model_flops_per_step).toBeCloseTo(modelFlops(modelShape(config), lengths) * (4 / 3), 0);
    expect(m.tflops).toBeCloseTo((m.model_flops_per_step as number) / (m.step_s as number) / 1e12, 12);
    expect(m.tflops).toBeGreaterThan(0);
    expect(m.mfu).toBeCloseTo((m.tflops as number) / 2, 12);
    expect(m.tokens_per_s).toBeCloseTo(samples.reduce((a, s) => a + s.tokens.length, 0) / (m.step_s as number), 6);
    const without = await stepWithPeak(undefined);
    expect(without).not.toHaveProperty("mfu");
    expect(without.tflops).toBeGreaterThan(0);
  });

  it("is idempotent per attempt directory and refuses a version mismatch", async () => {
    const req = await trainRequest();
    const first = await runEmbeddedTrainStep(req, deps, () => undefined);
    expect(await runEmbeddedTrainStep(req, deps, () => undefined)).toEqual(first);
    await expect(runEmbeddedTrainStep(await trainRequest({ weightVersionIn: 3 }), deps, () => undefined)).rejects.toMatchObject({
      code: "trainer_version_mismatch",
    });
  });

  it("reads max_tokens_per_gpu: micro-batches change the float rounding, not the step", async () => {
    // lr 1e-3: Adam's 1/sqrt(v) amplifies summation-order rounding on near-zero gradients in proportion to lr.
    const whole = await trainRequest({ config: { lr: 1e-3 } });
    const split = await trainRequest({ config: { lr: 1e-3, max_tokens_per_gpu: 40 } });
    const a = await runEmbeddedTrainStep(whole, deps, () => undefined);
    const b = await runEmbeddedTrainStep(split, deps, () => undefined);
    const wa = (await readCheckpoint(a.checkpointUri)).weights;
    const wb = (await readCheckpoint(b.checkpointUri)).weights;
    let maxDiff = 0;
    let differs = false;
    for (const [name, x] of Object.entries(wa)) {
      const y = wb[name] as Float32Array;
      for (let k = 0; k < x.length; k++) {
        maxDiff = Math.max(maxDiff, Math.abs((x[k] as number) - (y[k] as number)));
        if (x[k] !== y[k]) differs = true;
      }
    }
    // Adam's 1/sqrt(v) turns rounding-level differences of near-zero gradients into a few % of lr.
    expect(maxDiff).toBeLessThan(0.05 * 1e-3);
    expect(differs).toBe(true); // the budget was honoured: the gradient was summed over several micro-batches
    for (const k of ["pg_loss", "grad_norm"]) expect(b.metrics[k]).toBeCloseTo(a.metrics[k] as number, 5);
  });

  it("sums micro-batch gradients to the whole batch's gradient", async () => {
    const samples = syntheticBatch(3);
    const model = await deps.modelFor(config);
    const seqLen = bucketSeqLen(samples, config.context_length);
    const coef = samples.map((s, i) => Float64Array.from({ length: s.responseLength }, (_, t) => Math.sin(i * 7 + t) * 0.1));
    const zero = samples.map((s) => new Float64Array(s.responseLength));
    const whole = microBatchGradient(model, weights, samples, samples.length, seqLen, coef, zero, 1);
    for (const rows of [1, 3, 5]) {
      const parts = microBatchGradient(model, weights, samples, rows, seqLen, coef, zero, 1);
      for (const [name, g] of Object.entries(whole)) {
        const h = parts[name] as Float32Array;
        let scale = 0;
        let diff = 0;
        for (let k = 0; k < g.length; k++) {
          scale = Math.max(scale, Math.abs(g[k] as number));
          diff = Math.max(diff, Math.abs((g[k] as number) - (h[k] as number)));
        }
        expect(scale, name).toBeGreaterThan(0);
        expect(diff / scale, `${name}, ${rows} rows`).toBeLessThan(1e-5);
      }
    }
    expect(microBatchRows(40, seqLen, 16)).toBe(Math.floor(40 / seqLen));
    expect(microBatchRows(1, seqLen, 16)).toBe(1);
    expect(microBatchRows(null, seqLen, 16)).toBe(16);
  });

  it("raises the log-probs of positive-advantage responses", async () => {
    const req = await trainRequest({ config: { lr: 3e-3, num_steps_per_rollout: 1, use_tis: false } });
    const result = await runEmbeddedTrainStep(req, deps, () => undefined);
    const after = (await readCheckpoint(result.checkpointUri)).weights;
    let up = 0;
    let down = 0;
    for (const s of req.batch.samples) {
      const groupMean = req.batch.samples.filter((o) => o.groupIndex === s.groupIndex).reduce((a, o) => a + o.reward, 0) / 4;
      if (s.reward === groupMean) continue;
      const tokens = Array.from(s.tokens);
      const delta =
        referenceResponseLogProbs(config, after, tokens, s.promptLength).reduce((a, b) => a + b, 0) -
        referenceResponseLogProbs(config, weights, tokens, s.promptLength).reduce((a, b) => a + b, 0);
      if (Math.sign(delta) === Math.sign(s.reward - groupMean)) up++;
      else down++;
    }
    expect(up).toBeGreaterThan(down);
  });

  it("use_opd: with zero rewards the teacher alone moves the policy toward itself (pure distillation)", async () => {
    // GRPO advantages are 0 for every sample; the OPD term gives token t the advantage log π_teacher − log π_student.
    // The teacher rates even samples 0.5 nats per token above the student and odd ones 0.5 below.
    const first = await trainRequest({ config: { lr: 3e-3, num_steps_per_rollout: 1, use_tis: false, use_opd: true, opd_kl_coef: 1 } });
    const samples = first.batch.samples.map((s, i) => {
      const student = referenceResponseLogProbs(config, weights, Array.from(s.tokens), s.promptLength);
      return { ...s, reward: 0, teacherLogProbs: Float32Array.from(student, (x) => x + (i % 2 === 0 ? 0.5 : -0.5)) };
    });
    const req = { ...first, batch: { ...first.batch, samples } };
    const after = (await readCheckpoint((await runEmbeddedTrainStep(req, deps, () => undefined)).checkpointUri)).weights;
    let toward = 0;
    samples.forEach((s, i) => {
      const tokens = Array.from(s.tokens);
      const delta =
        referenceResponseLogProbs(config, after, tokens, s.promptLength).reduce((a, b) => a + b, 0) -
        referenceResponseLogProbs(config, weights, tokens, s.promptLength).reduce((a, b) => a + b, 0);
      if (Math.sign(delta) === (i % 2 === 0 ? 1 : -1)) toward++;
    });
    expect(toward).toBeGreaterThan(samples.length * 0.75);
    // Without its teacher log-probs a use_opd batch is refused, never trained as plain GRPO.
    const bare = { ...req, outputDir: first.outputDir + "-bare", batch: { ...req.batch, samples: samples.map(({ teacherLogProbs: _, ...s }) => s) } };
    await expect(runEmbeddedTrainStep(bare, deps, () => undefined)).rejects.toThrow(/use_opd: sample 0 of group 0 has no teacher log-probs/);
  });
});
