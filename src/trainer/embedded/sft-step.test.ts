import { beforeAll, describe, expect, it } from "vitest";
import { readCheckpoint } from "../../model/checkpoint.ts";
import type { ModelConfig } from "../../model/config.ts";
import type { Weights } from "../../model/weights.ts";
import { referenceResponseLogProbs } from "../../model/reference-forward.ts";
import { scaledWeights, TINY_CONFIG, writeTestCheckpoint } from "../../model/testing.ts";
import type { TrainSample } from "../trainer.ts";
import { createJaxModel, type JaxModel } from "./jax-model.ts";
import { runEmbeddedTrainStep, type TrainStepDeps } from "./train-step.ts";
import { makeTrainRequest } from "./testing.ts";

/**
 * loss_type sft_loss in the embedded trainer: the step's `loss` is the NLL of the responses computed
 * by hand here from the float64 reference forward (src/model/reference-forward.ts), averaged as
 * slime's sft_loss_function averages it (docs/sft.md), and one step lowers it on its batch.
 */
const config = TINY_CONFIG;
const weights = scaledWeights(config, 3, 4);
let refDir: string;
let deps: TrainStepDeps;

beforeAll(async () => {
  refDir = await writeTestCheckpoint(config, weights, 0);
  let model: Promise<JaxModel> | null = null;
  deps = {
    modelFor: (c: ModelConfig) => (model ??= createJaxModel(c)),
    initConfig: null,
    loadReference: async (uri) => (await readCheckpoint(uri)).weights,
  };
});

function handLoss(w: Weights, samples: readonly TrainSample[], perToken: boolean): number {
  const parts = samples.map((s) => {
    const logp = referenceResponseLogProbs(config, w, Array.from(s.tokens), s.promptLength);
    const sum = logp.reduce((a, x, t) => a + x * (s.lossMask[t] ?? 0), 0);
    const n = s.lossMask.reduce((a, m) => a + m, 0);
    return { sum, n };
  });
  if (perToken) return -parts.reduce((a, p) => a + p.sum, 0) / parts.reduce((a, p) => a + Math.max(p.n, 1), 0);
  return -parts.reduce((a, p) => a + p.sum / Math.max(p.n, 1), 0) / parts.length;
}

describe("embedded trainer, loss_type sft_loss", () => {
  it.each([false, true])("reports the responses' NLL (calculate_per_token_loss %s) and one step lowers it", async (perToken) => {
    const req = await makeTrainRequest(weights, refDir, {
      config: { loss_type: "sft_loss", calculate_per_token_loss: perToken, num_steps_per_rollout: 1, lr: 3e-3, use_tis: false },
    });
    const samples = req.batch.samples;
    expect(samples.some((s) => s.lossMask.includes(0))).toBe(true);
    const result = await runEmbeddedTrainStep(req, deps, () => undefined);
    const before = handLoss(weights, samples, perToken);
    // The trainer computes in float32, the reference forward in float64.
    expect(Math.abs((result.metrics.loss as number) - before)).toBeLessThan(1e-5);
    expect(result.metrics).not.toHaveProperty("pg_loss");
    const after = handLoss((await readCheckpoint(result.checkpointUri)).weights, samples, perToken);
    expect(after).toBeLessThan(before);
  });
});
