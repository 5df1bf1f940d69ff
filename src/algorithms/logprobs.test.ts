import { describe, expect, it } from "vitest";
import { logitsGradient, logProbsAndEntropyFromLogits } from "./logprobs.ts";

// Logits [0, ln 2, ln 3] -> softmax [1, 2, 3] / 6.
const ROW = [0, Math.log(2), Math.log(3)];

describe("logProbsAndEntropyFromLogits", () => {
  it("log softmax over the full vocabulary and the entropy", () => {
    // token 2: ln(3/6) = -0.6931471805599453; token 0: ln(1/6) = -1.791759469228055
    // H = -(1/6 ln 1/6 + 1/3 ln 1/3 + 1/2 ln 1/2) = 0.2986265782 + 0.3662040962 + 0.3465735903 = 1.0114042647073518
    const { logProbs, entropy } = logProbsAndEntropyFromLogits(Float64Array.from([...ROW, ...ROW]), [2, 0], 3);
    expect(logProbs[0]).toBeCloseTo(-0.6931471805599453, 14);
    expect(logProbs[1]).toBeCloseTo(-1.791759469228055, 14);
    expect(entropy[0]).toBeCloseTo(1.0114042647073518, 14);
    expect(entropy[1]).toBeCloseTo(1.0114042647073518, 14);
  });

  it("divides by the temperature first", () => {
    // [0, 2 ln 2, 2 ln 3] / 2 = ROW, so the same distribution; at temperature 1 it is [1, 4, 9] / 14.
    const doubled = Float64Array.from(ROW.map((z) => 2 * z));
    expect(logProbsAndEntropyFromLogits(doubled, [2], 3, 2).logProbs[0]).toBeCloseTo(Math.log(0.5), 14);
    expect(logProbsAndEntropyFromLogits(doubled, [2], 3, 1).logProbs[0]).toBeCloseTo(Math.log(9 / 14), 14);
  });

  it("is stable for large logits and accepts Float32Array", () => {
    // [1000, 1000]: ln(1/2), H = ln 2
    const out = logProbsAndEntropyFromLogits(Float32Array.from([1000, 1000]), [1], 2);
    expect(out.logProbs[0]).toBeCloseTo(-Math.LN2, 12);
    expect(out.entropy[0]).toBeCloseTo(Math.LN2, 12);
  });

  it("a -Infinity logit has probability 0 and no NaN", () => {
    const out = logProbsAndEntropyFromLogits(Float64Array.from([0, -Infinity]), [0], 2);
    expect(out.logProbs[0]).toBe(0);
    expect(out.entropy[0]).toBe(0);
  });

  it("an empty response gives empty arrays", () => {
    expect(logProbsAndEntropyFromLogits(new Float64Array(0), [], 5).logProbs.length).toBe(0);
  });

  it("validates shapes, token ids and temperature", () => {
    expect(() => logProbsAndEntropyFromLogits(new Float64Array(5), [0, 1], 3)).toThrow(/logits/);
    expect(() => logProbsAndEntropyFromLogits(new Float64Array(3), [3], 3)).toThrow(/outside/);
    expect(() => logProbsAndEntropyFromLogits(new Float64Array(3), [0], 3, 0)).toThrow(/temperature/);
  });
});

describe("logitsGradient", () => {
  it("hand value: d logp_y / d z = (onehot - p) / T", () => {
    // p = [1/6, 1/3, 1/2], y = 2, T = 1: [-1/6, -1/3, 1/2]
    const g = logitsGradient(Float64Array.from(ROW), [2], 3, 1, [1]);
    [-1 / 6, -1 / 3, 1 / 2].forEach((v, i) => expect(g[i]).toBeCloseTo(v, 14));
  });

  it("matches a central finite difference of a*logp + b*H, with temperature", () => {
    const V = 5;
    const logits = Float64Array.from([0.3, -1.2, 2.0, 0.7, -0.4, 1.1, 0.0, -2.5, 0.9, 0.2]);
    const tokens = [2, 4];
    const a = [0.7, -1.3];
    const b = [-0.25, 0.6];
    const T = 0.8;
    const f = (z: Float64Array): number => {
      const { logProbs, entropy } = logProbsAndEntropyFromLogits(z, tokens, V, T);
      return a.reduce((s, ai, t) => s + ai * (logProbs[t] as number) + (b[t] as number) * (entropy[t] as number), 0);
    };
    const g = logitsGradient(logits, tokens, V, T, a, b);
    const h = 1e-6;
    for (let k = 0; k < logits.length; k++) {
      const up = Float64Array.from(logits);
      const dn = Float64Array.from(logits);
      up[k] = (up[k] as number) + h;
      dn[k] = (dn[k] as number) - h;
      expect(g[k]).toBeCloseTo((f(up) - f(dn)) / (2 * h), 7);
    }
  });
});
