import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { referenceForward } from "../../model/reference-forward.ts";
import { scaledWeights, TINY_CONFIG } from "../../model/testing.ts";
import { SlotKvCache } from "./kv-cache.ts";
import { ModelRunner } from "./model-runner.ts";

const config = TINY_CONFIG;
const weights = scaledWeights(config, 11, 8);
const V = config.vocab_size;
let runner: ModelRunner;

beforeAll(async () => {
  runner = await ModelRunner.create(config, weights);
});
afterAll(async () => {
  await runner.release();
});

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs((a[i] as number) - (b[i] as number)));
  return m;
}

describe("ONNX model runner", () => {
  it("prefill logits match the float64 reference forward within 1e-4", async () => {
    const tokens = [1, 5, 9, 13, 4, 7, 18, 3, 3, 20, 11];
    const out = await runner.prefill(Int32Array.from(tokens), 1, tokens.length);
    const ref = referenceForward(config, weights, tokens);
    // Guard against a vacuous test: the logits must be spread out.
    expect(Math.max(...ref[5]!) - Math.min(...ref[5]!)).toBeGreaterThan(1);
    for (let t = 0; t < tokens.length; t++) {
      expect(maxAbsDiff(out.logits.subarray(t * V, (t + 1) * V), ref[t]!)).toBeLessThanOrEqual(1e-4);
    }
  });

  it("KV-cache decode equals full recomputation, batched with different lengths", async () => {
    const seqs = [
      [1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
      [1, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9],
      [1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3],
    ];
    const prompts = [3, 6, 1];
    const cache = new SlotKvCache(config, 4);
    for (const [slot, seq] of seqs.entries()) {
      const n = prompts[slot]!;
      const pre = await runner.prefill(Int32Array.from(seq.slice(0, n)), 1, n);
      cache.writePrefill(slot, pre.present, n);
    }
    const full = await Promise.all(seqs.map((s) => runner.prefill(Int32Array.from(s), 1, s.length)));
    let worst = 0;
    for (let step = 0; step < 9; step++) {
      const positions = Int32Array.from(prompts.map((p) => p + step));
      const ids = Int32Array.from(seqs.map((s, i) => s[positions[i]!]!));
      const out = await runner.decode(ids, positions, cache.views(seqs.length), cache.length);
      cache.writeDecode(out.fresh, positions);
      seqs.forEach((_, i) => {
        const pos = positions[i]!;
        const want = full[i]!.logits.subarray(pos * V, (pos + 1) * V);
        worst = Math.max(worst, maxAbsDiff(out.logits.subarray(i * V, (i + 1) * V), want));
      });
    }
    expect(worst).toBeLessThanOrEqual(1e-5);
  });

  it("a row's decode logits do not depend on the other rows (bit-identical for B >= 2)", async () => {
    const seq = [1, 5, 9, 13, 4, 7];
    const other = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
    // Two rows, the second a dummy: a single row takes ORT's GEMV path and rounds differently.
    const alone = new SlotKvCache(config, 2);
    alone.writePrefill(0, (await runner.prefill(Int32Array.from(seq.slice(0, 5)), 1, 5)).present, 5);
    const pair = await runner.decode(Int32Array.of(seq[5]!, 0), Int32Array.of(5, 0), alone.views(2), alone.length);
    const a = { logits: pair.logits.subarray(0, V) };
    const batched = new SlotKvCache(config, 3);
    batched.writePrefill(0, (await runner.prefill(Int32Array.from(other), 1, other.length)).present, other.length);
    batched.writePrefill(1, (await runner.prefill(Int32Array.from(seq.slice(0, 5)), 1, 5)).present, 5);
    batched.writePrefill(2, (await runner.prefill(Int32Array.from(other.slice(0, 9)), 1, 9)).present, 9);
    const b = await runner.decode(Int32Array.of(4, seq[5]!, 8), Int32Array.of(16, 5, 9), batched.views(3), batched.length);
    expect(Array.from(b.logits.subarray(V, 2 * V))).toEqual(Array.from(a.logits));
  });
});
