import { describe, expect, it } from "vitest";
import { makeAggregator } from "./aggregation.ts";
import { absDiff, reduceTokenMetrics } from "./metrics.ts";
import { maskedMean, maskedSum, maskSum, raggedToArrays } from "./ragged.ts";

describe("absDiff", () => {
  it("is |a - b| per token", () => {
    // |-1 - -1.5| = 0.5, |-2 - -1| = 1, |0 - 0| = 0
    expect(raggedToArrays(absDiff([[-1, -2], [0]], [[-1.5, -1], [0]]))).toEqual([[0.5, 1], [0]]);
  });
  it("rejects ragged mismatches", () => {
    expect(() => absDiff([[1]], [[1, 2]])).toThrow(/length/);
  });
});

describe("reduceTokenMetrics", () => {
  it("reduces every token metric with the aggregator and prefixes the names", () => {
    // masks [[1, 1], [1, 0]]: weights [[1/4, 1/4], [1/2, 0]]
    // a: (1 + 3)/2 = 2 and 5 -> (2 + 5)/2 = 3.5;  b: (0 + 1)/2 = 0.5 and 1 -> 0.75
    const agg = makeAggregator([
      [1, 1],
      [1, 0],
    ]);
    const out = reduceTokenMetrics(
      {
        a: [
          [1, 3],
          [5, 100],
        ],
        b: [
          [0, 1],
          [1, 1],
        ],
      },
      agg,
      "mis_",
    );
    expect(out).toEqual({ mis_a: 3.5, mis_b: 0.75 });
  });
});

describe("masked reductions (slime's masked_sum / masked_mean)", () => {
  it("hand values and the fully masked guard", () => {
    // [2, 4, 6] x [1, 0, 1]: sum 8, count 2, mean 4; all masked: 0 / max(0, 1) = 0
    expect(maskedSum([2, 4, 6], [1, 0, 1])).toBe(8);
    expect(maskSum([1, 0, 1])).toBe(2);
    expect(maskedMean([2, 4, 6], [1, 0, 1])).toBe(4);
    expect(maskedMean([2, 4], [0, 0])).toBe(0);
    expect(maskedMean([], [])).toBe(0);
  });
});
