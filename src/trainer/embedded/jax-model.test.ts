import { beforeAll, describe, expect, it } from "vitest";
import { logSoftmax, referenceForward, referenceResponseLogProbs } from "../../model/reference-forward.ts";
import { scaledWeights, TINY_CONFIG } from "../../model/testing.ts";
import type { Weights } from "../../model/weights.ts";
import { createJaxModel, type JaxModel, type PackedBatch } from "./jax-model.ts";

const config = TINY_CONFIG;
const weights = scaledWeights(config, 21, 5);
let model: JaxModel;
beforeAll(async () => {
  model = await createJaxModel(config);
});

const seqs = [
  [1, 4, 5, 13, 6, 7, 2],
  [1, 9, 9, 9, 13, 3, 18, 4, 19, 2],
  [1, 20, 21],
];

function pack(seqLen: number): PackedBatch {
  const inputIds = new Int32Array(seqs.length * seqLen);
  const targets = new Int32Array(seqs.length * seqLen);
  seqs.forEach((s, b) => {
    inputIds.set(s.slice(0, -1), b * seqLen);
    targets.set(s.slice(1), b * seqLen);
  });
  return { inputIds, targets, batch: seqs.length, seqLen };
}

/** The surrogate Σ c·logp + Σ e·H through the float64 reference. */
function referenceSurrogate(w: Weights, c: Float32Array, e: Float32Array, seqLen: number, temperature: number): number {
  let total = 0;
  seqs.forEach((s, b) => {
    const logits = referenceForward(config, w, s.slice(0, -1));
    for (let t = 0; t < s.length - 1; t++) {
      const lp = logSoftmax(logits[t]!, temperature);
      total += c[b * seqLen + t]! * lp[s[t + 1]!]!;
      let h = 0;
      for (const v of lp) h -= Math.exp(v) * v;
      total += e[b * seqLen + t]! * h;
    }
  });
  return total;
}

describe("jax-js trainer model", () => {
  it("per-token log-probs match the float64 reference forward within 1e-4", () => {
    const seqLen = 16;
    const out = model.forward(weights, pack(seqLen), 0.8);
    seqs.forEach((s, b) => {
      const ref = referenceResponseLogProbs(config, weights, s, 1, 0.8);
      expect(Math.min(...ref)).toBeLessThan(-1); // non-trivial distributions
      ref.forEach((want, j) => expect(Math.abs(out.logProbs[b * seqLen + j]! - want)).toBeLessThanOrEqual(1e-4));
    });
  });

  it("the gradient matches central finite differences through the reference forward", () => {
    const seqLen = 16;
    const c = new Float32Array(seqs.length * seqLen);
    const e = new Float32Array(seqs.length * seqLen);
    seqs.forEach((s, b) => {
      for (let t = 0; t < s.length - 1; t++) {
        c[b * seqLen + t] = Math.sin(b * 7 + t); // arbitrary signed coefficients
        e[b * seqLen + t] = 0.1 * Math.cos(t);
      }
    });
    const { grads } = model.gradient(weights, pack(seqLen), c, e, 0.9);
    const probes: [string, number][] = [
      ["tok_emb.weight", 4 * 32 + 3],
      ["pos_emb.weight", 2 * 32 + 5],
      ["blocks.0.attn.qkv.weight", 17],
      ["blocks.0.attn.qkv.weight", 32 * 96 - 1],
      ["blocks.1.mlp.fc.bias", 9],
      ["blocks.1.ln2.weight", 3],
      ["ln_f.bias", 0],
      ["head.weight", 5 * 24 + 2],
    ];
    let largest = 0;
    for (const [name, index] of probes) {
      const w = weights[name]!;
      const saved = w[index]!;
      const h = 1e-3;
      w[index] = saved + h;
      const plus = referenceSurrogate(weights, c, e, seqLen, 0.9);
      w[index] = saved - h;
      const minus = referenceSurrogate(weights, c, e, seqLen, 0.9);
      w[index] = saved;
      const fd = (plus - minus) / (2 * h);
      const got = grads[name]![index]!;
      largest = Math.max(largest, Math.abs(fd));
      expect(Math.abs(got - fd), `${name}[${index}]: jax ${got}, fd ${fd}`).toBeLessThanOrEqual(2e-3 * Math.max(1, Math.abs(fd)));
    }
    expect(largest).toBeGreaterThan(1e-2); // the probes are not all in flat directions
  });
});
