import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { logSoftmax, referenceForward } from "../../model/reference-forward.ts";
import { scaledWeights, TINY_CONFIG } from "../../model/testing.ts";
import type { GenerateRequest } from "../engine.ts";
import { ModelRunner } from "./model-runner.ts";
import { DecodeScheduler, type SchedulerResult } from "./scheduler.ts";

const config = TINY_CONFIG;
const weights = scaledWeights(config, 5, 6);
let runner: ModelRunner;
beforeAll(async () => {
  runner = await ModelRunner.create(config, weights);
});
afterAll(async () => {
  await runner.release();
});

function request(id: string, inputIds: number[], seed: number, maxNewTokens: number, extra: Partial<GenerateRequest["sampling"]> = {}): GenerateRequest {
  return { requestId: id, inputIds, sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens, stopTokenIds: [], seed, ...extra } };
}

function newScheduler(version = 0): { scheduler: DecodeScheduler; results: Map<string, SchedulerResult> } {
  const results = new Map<string, SchedulerResult>();
  const scheduler = new DecodeScheduler(
    runner,
    version,
    {
      done: (id, r) => results.set(id, r),
      failed: (id, m) => results.set(id, { tokenIds: [], logProbs: [], finishReason: "abort", weightVersion: -1, error: m } as SchedulerResult),
    },
    { maxBatchSize: 8, logitNoiseStd: 0 },
  );
  return { scheduler, results };
}

async function runAlone(req: GenerateRequest): Promise<SchedulerResult> {
  const { scheduler, results } = newScheduler();
  scheduler.submit(req);
  while (!scheduler.isIdle) await scheduler.step();
  return results.get(req.requestId)!;
}

describe("decode scheduler", () => {
  it("same seed, input and weights give the same tokens; another seed gives others", async () => {
    const a = await runAlone(request("a", [1, 4, 5], 42, 20));
    const b = await runAlone(request("b", [1, 4, 5], 42, 20));
    const c = await runAlone(request("c", [1, 4, 5], 43, 20));
    expect(a.tokenIds).toHaveLength(20);
    expect(b.tokenIds).toEqual(a.tokenIds);
    expect(b.logProbs).toEqual(a.logProbs);
    expect(c.tokenIds).not.toEqual(a.tokenIds);
  });

  it("batched decode with requests joining and leaving equals decoding each alone", async () => {
    const reqs = [
      request("r0", [1, 4, 5], 1, 25),
      request("r1", [1, 9, 9, 9, 9, 9, 9], 2, 6),
      request("r2", [1], 3, 18, { stopTokenIds: [2, 7], temperature: 0.8 }),
      request("r3", [1, 13, 14], 4, 12, { topK: 5, topP: 0.9 }),
      request("r4", [1, 20, 21, 22, 23], 5, 9),
    ];
    const { scheduler, results } = newScheduler();
    scheduler.submit(reqs[0]!);
    scheduler.submit(reqs[1]!);
    await scheduler.step();
    await scheduler.step();
    scheduler.submit(reqs[2]!); // joins mid-flight
    await scheduler.step();
    scheduler.submit(reqs[3]!);
    for (let i = 0; i < 5; i++) await scheduler.step(); // r1 leaves in here
    scheduler.submit(reqs[4]!);
    while (!scheduler.isIdle) await scheduler.step();
    for (const req of reqs) {
      const alone = await runAlone(req);
      expect(results.get(req.requestId)).toEqual(alone);
    }
  });

  it("identical prompts admitted together share one prefill row and still decode as each alone", async () => {
    const group = [7, 8, 9, 10].map((seed, i) => request(`g${i}`, [1, 6, 2, 6], seed, 15));
    const other = request("o", [1, 5, 2, 6], 11, 15); // same length, another prompt: its own row
    const ones = [12, 13].map((seed, i) => request(`one${i}`, [3], seed, 10)); // one-token prompts: one row, alone
    const rowsPerPrefill: number[] = [];
    const prefill = runner.prefill.bind(runner);
    const spy = (ids: Int32Array, batch: number, seqLen: number) => {
      rowsPerPrefill.push(batch);
      return prefill(ids, batch, seqLen);
    };
    runner.prefill = spy;
    const { scheduler, results } = newScheduler();
    try {
      for (const r of [...group, other, ...ones]) scheduler.submit(r);
      await scheduler.step();
    } finally {
      runner.prefill = prefill;
    }
    expect(rowsPerPrefill.sort()).toEqual([1, 2]); // [g0..g3, o] as 2 rows; one0 and one1 as 1 row
    while (!scheduler.isIdle) await scheduler.step();
    for (const req of [...group, other, ...ones]) expect(results.get(req.requestId)).toEqual(await runAlone(req));
    expect(results.get("g0")!.tokenIds).not.toEqual(results.get("g1")!.tokenIds); // each its own seed
  });

  it("reports log softmax(logits / T) over the full vocabulary before top-k/top-p, matching the float64 reference", async () => {
    const input = [1, 6, 7];
    const res = await runAlone(request("lp", input, 9, 12, { temperature: 0.7, topK: 4, topP: 0.8 }));
    const all = [...input, ...res.tokenIds];
    const logits = referenceForward(config, weights, all);
    res.tokenIds.forEach((tok, i) => {
      const want = logSoftmax(logits[input.length - 1 + i]!, 0.7)[tok]!;
      expect(Math.abs(res.logProbs[i]! - want)).toBeLessThanOrEqual(1e-4);
    });
  });

  it("abort returns the tokens so far, a prefix of the uninterrupted run", async () => {
    const req = request("ab", [1, 3, 5], 77, 20);
    const full = await runAlone(req);
    const { scheduler, results } = newScheduler();
    scheduler.submit(req);
    await scheduler.step(); // prefill samples 1 token, then one decode step samples another
    await scheduler.step();
    scheduler.abort(["ab", "unknown-id"]);
    const partial = results.get("ab")!;
    expect(partial.finishReason).toBe("abort");
    expect(partial.tokenIds).toEqual(full.tokenIds.slice(0, 3));
    expect(partial.logProbs).toEqual(full.logProbs.slice(0, 3));
    expect(scheduler.isIdle).toBe(true);
  });

  it("continuing from partial tokens with the same seed continues the same stream", async () => {
    const full = await runAlone(request("f", [1, 8], 5, 14));
    const head = full.tokenIds.slice(0, 6);
    const rest = await runAlone(request("g", [1, 8, ...head], 5, 8));
    expect(rest.tokenIds).toEqual(full.tokenIds.slice(6));
  });

  it("a weight swap ends in-flight requests with abort at the old version; new requests use the new one", async () => {
    const { scheduler, results } = newScheduler(3);
    scheduler.submit(request("old", [1, 2], 1, 20));
    await scheduler.step();
    const swapped = scheduler.swapWeights(4, scaledWeights(config, 6, 6));
    scheduler.submit(request("new", [1, 2], 1, 3));
    await scheduler.step();
    await swapped;
    while (!scheduler.isIdle) await scheduler.step();
    expect(results.get("old")).toMatchObject({ finishReason: "abort", weightVersion: 3 });
    expect(results.get("old")!.tokenIds).toHaveLength(2);
    expect(results.get("new")).toMatchObject({ finishReason: "length", weightVersion: 4 });
    runner.setWeights(weights); // the runner is shared by the other tests
  });

  it("maxNewTokens 0 and a full context finish with length and no tokens; a token outside the vocabulary fails", async () => {
    expect(await runAlone(request("z", [1, 2], 1, 0))).toMatchObject({ tokenIds: [], finishReason: "length" });
    expect(await runAlone(request("ctx", new Array<number>(config.context_length).fill(3), 1, 5))).toMatchObject({ tokenIds: [], finishReason: "length" });
    const near = await runAlone(request("near", new Array<number>(config.context_length - 2).fill(3), 1, 5));
    expect(near).toMatchObject({ finishReason: "length" });
    expect(near.tokenIds).toHaveLength(2);
    expect(await runAlone(request("bad", [1, 99], 1, 5))).toMatchObject({ error: expect.stringContaining("99") });
    expect(await runAlone(request("neg", [1, -2], 1, 5))).toMatchObject({ error: expect.stringContaining("-2") });
  });
});
