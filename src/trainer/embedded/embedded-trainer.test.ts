import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPTIMIZER_FILE, readCheckpoint, WEIGHTS_FILE } from "../../model/checkpoint.ts";
import { scaledWeights, TINY_CONFIG, writeTestCheckpoint } from "../../model/testing.ts";
import { createJaxModel } from "./jax-model.ts";
import { createEmbeddedTrainer, type EmbeddedTrainer } from "./embedded-trainer.ts";
import { makeTrainRequest } from "./testing.ts";
import { runEmbeddedTrainStep } from "./train-step.ts";
import type { TrainProgress } from "../trainer.ts";

const weights = scaledWeights(TINY_CONFIG, 3, 4);
let refDir: string;
let trainer: EmbeddedTrainer;
beforeAll(async () => {
  refDir = await writeTestCheckpoint(TINY_CONFIG, weights, 0);
  trainer = await createEmbeddedTrainer();
});
afterAll(async () => {
  await trainer.close();
});

describe("embedded trainer (worker thread)", () => {
  it("trains in its worker, reports progress, and writes the same bytes as an in-process step", async () => {
    const req = await makeTrainRequest(weights, refDir);
    const progress: TrainProgress[] = [];
    const result = await trainer.trainStep(req, (p) => progress.push(p), new AbortController().signal);
    expect(result.weightVersionOut).toBe(1);
    expect(progress.at(-1)).toEqual({ done: 2, total: 2, phase: "optimizer_step" });

    const local = await makeTrainRequest(weights, refDir);
    await runEmbeddedTrainStep(
      local,
      { modelFor: createJaxModel, initConfig: null, loadReference: async (u) => (await readCheckpoint(u)).weights },
      () => undefined,
    );
    for (const f of [WEIGHTS_FILE, OPTIMIZER_FILE]) {
      expect((await readFile(join(req.outputDir, f))).equals(await readFile(join(local.outputDir, f)))).toBe(true);
    }
  });

  it("an abort rejects with a retriable train_aborted, and the next step still runs", async () => {
    const controller = new AbortController();
    const req = await makeTrainRequest(weights, refDir);
    const pending = trainer.trainStep(req, () => controller.abort("test"), controller.signal);
    await expect(pending).rejects.toMatchObject({ code: "train_aborted", isRetriable: true });
    const again = await trainer.trainStep(await makeTrainRequest(weights, refDir), () => undefined, new AbortController().signal);
    expect(again.weightVersionOut).toBe(1);
  });

  it("reports a bad config as a non-retriable error", async () => {
    const req = await makeTrainRequest(weights, refDir, { config: { lr: -1 } });
    await expect(trainer.trainStep(req, () => undefined, new AbortController().signal)).rejects.toMatchObject({ code: "trainer_config", isRetriable: false });
  });
});
