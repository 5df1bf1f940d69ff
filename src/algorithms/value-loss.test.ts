import { describe, expect, it } from "vitest";
import { computeValueLoss, computeValueLossTerms } from "./value-loss.ts";

describe("computeValueLoss", () => {
  it("hand values (value_clip 0.25, binary-exact numbers)", () => {
    // t0: V 1.5, old 1, R 2: diff 0.5 > 0.25 -> V_clip 1.25; (1.25-2)^2 = 0.5625 > (1.5-2)^2 = 0.25
    //     -> 0.5625, clamp saturated so grad 0, clipfrac 1
    // t1: V 0.75, old 1, R 0: diff -0.25 on the bound (closed) -> V_clip = 0.75 = V; tie 0.5625;
    //     grad 0.5*2*0.75 + 0.5*2*0.75 = 1.5, clipfrac 0 (|diff| > 0.25 is false)
    // t2: V 0.5, old 1, R 2: diff -0.5 -> V_clip 0.75; (0.75-2)^2 = 1.5625 < (0.5-2)^2 = 2.25
    //     -> 2.25, grad 2*(0.5-2) = -3, clipfrac 1
    const out = computeValueLoss([1.5, 0.75, 0.5], [1, 1, 1], [2, 0, 2], 0.25);
    expect(Array.from(out.loss)).toEqual([0.5625, 0.5625, 2.25]);
    expect(Array.from(out.dLoss_dValue)).toEqual([0, 1.5, -3]);
    expect(Array.from(out.clipfrac)).toEqual([1, 0, 1]);
  });

  it("matches a central finite difference away from kinks", () => {
    const cases = [
      [1.1, 1, 2],
      [1.6, 1, 2],
      [0.3, 1, 2],
      [0.9, 1, -1],
    ] as const;
    const h = 1e-6;
    for (const [v, old, r] of cases) {
      const f = (x: number): number => computeValueLoss([x], [old], [r], 0.2).loss[0] as number;
      expect(computeValueLoss([v], [old], [r], 0.2).dLoss_dValue[0]).toBeCloseTo((f(v + h) - f(v - h)) / (2 * h), 6);
    }
  });
});

describe("computeValueLossTerms", () => {
  it("aggregates like the policy loss and scales the gradient by the weights", () => {
    // sample 0: [0.5625, 0.5625] mean 0.5625; sample 1: [2.25] masked -> 0; (0.5625 + 0) / 2 = 0.28125
    const out = computeValueLossTerms({ values: [[1.5, 0.75], [0.5]], oldValues: [[1, 1], [1]], returns: [[2, 0], [2]], lossMask: [[1, 1], [0]] }, 0.25);
    expect(out.loss).toBeCloseTo(0.28125, 14);
    expect(out.metrics.value_loss).toBe(out.loss);
    // clipfrac: sample 0 [1, 0] -> 0.5, sample 1 masked -> 0; / 2 = 0.25
    expect(out.metrics.value_clipfrac).toBeCloseTo(0.25, 14);
    // weights: sample 0 1/2/2 = 0.25 each -> [0, 1.5*0.25]; sample 1 masked -> 0
    // (+ 0 turns the -3 * 0 = -0 of the masked token into 0)
    expect(out.dLoss_dValue.map((g) => Array.from(g, (v) => v + 0))).toEqual([[0, 0.375], [0]]);
  });
});
