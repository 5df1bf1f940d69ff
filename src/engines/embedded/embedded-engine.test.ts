import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { writeCheckpoint } from "../../model/checkpoint.ts";
import { scaledWeights, TINY_CONFIG, writeTestCheckpoint } from "../../model/testing.ts";
import { join } from "node:path";
import type { GenerateRequest } from "../engine.ts";
import { createEmbeddedEngine, type EmbeddedEngine } from "./embedded-engine.ts";

const config = TINY_CONFIG;
let engine: EmbeddedEngine;
let checkpointDir: string;

beforeAll(async () => {
  checkpointDir = await writeTestCheckpoint(config, scaledWeights(config, 5, 6), 0);
  engine = await createEmbeddedEngine({ checkpointUri: checkpointDir, id: "emb-test", maxBatchSize: 16 });
});
afterAll(async () => {
  await engine.close();
});

function request(id: string, seed: number, maxNewTokens: number, inputIds = [1, 4, 5]): GenerateRequest {
  return { requestId: id, inputIds, sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens, stopTokenIds: [], seed } };
}

describe("embedded engine (worker thread)", () => {
  it("serves its checkpoint's version and generates deterministically under concurrency", async () => {
    expect(await engine.weightVersion()).toBe(0);
    expect(await engine.health()).toBe(true);
    const alone = await engine.generate(request("solo", 7, 12));
    const many = await Promise.all(Array.from({ length: 12 }, (_, i) => engine.generate(request(`g-${i}`, i === 5 ? 7 : 100 + i, 12))));
    expect(alone).toMatchObject({ engineId: "emb-test", weightVersion: 0, finishReason: "length" });
    expect(many[5]!.tokenIds).toEqual(alone.tokenIds);
    expect(many[5]!.logProbs).toEqual(alone.logProbs);
  });

  it("abort resolves the pending generate with its tokens so far and finishReason abort", async () => {
    const full = await engine.generate(request("full", 3, 28, [1, 2]));
    const pending = engine.generate(request("cut", 3, 28, [1, 2]));
    await engine.abort(["cut", "never-seen"]);
    const cut = await pending;
    expect(cut.finishReason).toBe("abort");
    expect(cut.tokenIds.length).toBeLessThan(28);
    expect(cut.tokenIds).toEqual(full.tokenIds.slice(0, cut.tokenIds.length));
  });

  it("rejects invalid and duplicate requests without harming others", async () => {
    await expect(engine.generate({ ...request("neg", 1, 3), inputIds: [] })).rejects.toMatchObject({ code: "embedded_invalid_request" });
    await expect(engine.generate(request("oov", 1, 3, [1, 500]))).rejects.toMatchObject({ code: "embedded_invalid_request" });
    const first = engine.generate(request("dup", 1, 20));
    await expect(engine.generate(request("dup", 1, 20))).rejects.toMatchObject({ code: "embedded_duplicate_request" });
    expect((await first).tokenIds).toHaveLength(20);
  });

  it("loads a new weight version from a safetensors file and reports it", async () => {
    const before = await engine.generate(request("v0", 11, 10));
    const { uri } = await writeCheckpoint(join(checkpointDir, "v1"), { config, weights: scaledWeights(config, 99, 6), version: 1, runId: "test", step: 0 });
    await engine.loadWeights(1, uri);
    expect(await engine.weightVersion()).toBe(1);
    const after = await engine.generate(request("v1", 11, 10));
    expect(after.weightVersion).toBe(1);
    expect(after.tokenIds).not.toEqual(before.tokenIds);
    await expect(engine.loadWeights(2, uri)).rejects.toMatchObject({ code: "embedded_load_failed" });
    expect(await engine.weightVersion()).toBe(1);
  });
});
