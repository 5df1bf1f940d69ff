import { describe, expect, it } from "vitest";
import { aggregate, makeAggregator } from "./aggregation.ts";

// slime tests/test_metric_report.py: rollout R0 owns samples 0, 1, 2 (mask sums 3+3+3 = 9), R1 owns 3.
const X = [
  [1, 2, 3],
  [4, 5, 6],
  [7, 8, 9],
  [10, 11, 12],
];
const ONES = X.map((r) => r.map(() => 1));

describe("aggregate (default: per-rollout mean of token means)", () => {
  it("reproduces slime's pinned per-rollout and per-token values", () => {
    // default: R0 = (6 + 15 + 24) / 9 = 5, R1 = 33 / 3 = 11; (5 + 11) / 2 rollouts = 8
    expect(aggregate(X, ONES, { rolloutIds: [0, 0, 0, 1] })).toBeCloseTo(8, 14);
    // per-token: 78 / 12 = 6.5 (rollout ids do not matter)
    expect(aggregate(X, ONES, { rolloutIds: [0, 0, 0, 1], calculate_per_token_loss: true })).toBeCloseTo(6.5, 14);
    expect(aggregate(X, ONES, { calculate_per_token_loss: true })).toBeCloseTo(6.5, 14);
  });

  it("without rollout ids every sample is its own rollout", () => {
    // sample means 2, 5, 8, 11 -> 26 / 4 = 6.5; masks [[1,1],[1,1,0]]: (1.5 + 4) / 2 = 2.75
    expect(aggregate(X, ONES)).toBeCloseTo(6.5, 14);
    expect(
      aggregate(
        [
          [1, 2],
          [3, 5, 7],
        ],
        [
          [1, 1],
          [1, 1, 0],
        ],
      ),
    ).toBeCloseTo(2.75, 14);
  });

  it("a fully masked sample counts as a zero mean, and as 1 token in per-token mode", () => {
    // default: (1.5 + 0/max(0,1)) / 2 = 0.75;  per-token: (1 + 2) / (2 + max(0, 1)) = 1
    expect(aggregate([[1, 2], [9]], [[1, 1], [0]])).toBeCloseTo(0.75, 14);
    expect(aggregate([[1, 2], [9]], [[1, 1], [0]], { calculate_per_token_loss: true })).toBeCloseTo(1, 14);
  });

  it("an empty response behaves like a fully masked sample", () => {
    expect(aggregate([[1, 2], []], [[1, 1], []])).toBeCloseTo(0.75, 14);
    expect(aggregate([[1, 2], []], [[1, 1], []], { calculate_per_token_loss: true })).toBeCloseTo(1, 14);
  });

  it("an empty batch reduces to 0, not NaN", () => {
    expect(aggregate([], [])).toBe(0);
    expect(aggregate([], [], { calculate_per_token_loss: true })).toBe(0);
  });

  it("denomMask keeps the original denominators when tokens are zeroed afterwards", () => {
    // loss mask [1, 0] (token 1 rejected), denom mask [1, 1]: 2 / 2 = 1 (not 2 / 1 = 2)
    expect(aggregate([[2, 4]], [[1, 0]], { denomMask: [[1, 1]] })).toBeCloseTo(1, 14);
    expect(aggregate([[2, 4]], [[1, 0]])).toBeCloseTo(2, 14);
    // per-token: 2 / max(2, 1) = 1
    expect(aggregate([[2, 4]], [[1, 0]], { denomMask: [[1, 1]], calculate_per_token_loss: true })).toBeCloseTo(1, 14);
  });

  it("shared rollout ids share the summed denominator (string ids too)", () => {
    // "a": samples 0 and 1, masks 2 + 1 = 3 -> (1 + 2 + 3) / 3 = 2; "b": 10 -> mean over 2 rollouts = 6
    expect(aggregate([[1, 2], [3], [10]], [[1, 1], [1], [1]], { rolloutIds: ["a", "a", "b"] })).toBeCloseTo(6, 14);
  });

  it("micro-batch overrides: sampleDenominators and normalizer", () => {
    // one micro-batch holding sample 0 of R0 from the pinned case: 6 / 9 / 2 = 1/3
    expect(aggregate([[1, 2, 3]], [[1, 1, 1]], { sampleDenominators: [9], normalizer: 2 })).toBeCloseTo(1 / 3, 14);
    // per-token, whole step has 12 tokens: 6 / 12 = 0.5
    expect(aggregate([[1, 2, 3]], [[1, 1, 1]], { normalizer: 12, calculate_per_token_loss: true })).toBeCloseTo(0.5, 14);
    // summing the micro-batches reproduces the whole-batch value 8
    const parts = [0, 1, 2, 3].map((i) => aggregate([X[i] as number[]], [ONES[i] as number[]], { sampleDenominators: [i < 3 ? 9 : 3], normalizer: 2 }));
    expect(parts.reduce((a, b) => a + b, 0)).toBeCloseTo(8, 14);
  });

  it("weights are d agg / d x, zero on masked tokens", () => {
    // masks [[1, 0], [1]]: weights [[1/1/2, 0], [1/1/2]]
    const agg = makeAggregator([[1, 0], [1]]);
    expect(agg.weights.map((w) => Array.from(w))).toEqual([[0.5, 0], [0.5]]);
    expect(agg.normalizer).toBe(2);
  });

  it("rejects shape mismatches", () => {
    expect(() => aggregate([[1, 2]], [[1]])).toThrow(/length/);
    expect(() => aggregate([[1]], [[1]], { rolloutIds: [1, 2] })).toThrow(/rolloutIds/);
  });
});
