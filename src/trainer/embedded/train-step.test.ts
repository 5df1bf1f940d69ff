import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { OPTIMIZER_FILE, readCheckpoint, WEIGHTS_FILE } from "../../model/checkpoint.ts";
import type { ModelConfig } from "../../model/config.ts";
import { referenceResponseLogProbs } from "../../model/reference-forward.ts";
import { scaledWeights, TINY_CONFIG, writeTestCheckpoint } from "../../model/testing.ts";
import type { TrainProgress, TrainRequest, TrainSample } from "../trainer.ts";
import { createJaxModel, type JaxModel } from "./jax-model.ts";
import { runEmbeddedTrainStep, type TrainStepDeps } from "./train-step.ts";
import { makeSyntheticBatch, makeTrainRequest } from "./testing.ts";

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
    expect(ra.metrics).toEqual(rb.metrics);
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

  it("is idempotent per attempt directory and refuses a version mismatch", async () => {
    const req = await trainRequest();
    const first = await runEmbeddedTrainStep(req, deps, () => undefined);
    expect(await runEmbeddedTrainStep(req, deps, () => undefined)).toEqual(first);
    await expect(runEmbeddedTrainStep(await trainRequest({ weightVersionIn: 3 }), deps, () => undefined)).rejects.toMatchObject({ code: "trainer_version_mismatch" });
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
      const delta = referenceResponseLogProbs(config, after, tokens, s.promptLength).reduce((a, b) => a + b, 0) - referenceResponseLogProbs(config, weights, tokens, s.promptLength).reduce((a, b) => a + b, 0);
      if (Math.sign(delta) === Math.sign(s.reward - groupMean)) up++;
      else down++;
    }
    expect(up).toBeGreaterThan(down);
  });
});
