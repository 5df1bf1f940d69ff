import { describe, expect, it } from "vitest";
import { computeSftLossTerms } from "./sft-loss.ts";

const f = (xs: number[]) => Float64Array.from(xs);

describe("computeSftLossTerms: slime's -sum_of_sample_mean(log_probs)", () => {
  // Two samples: 3 tokens (the middle one masked) and 1 token.
  const logp = [f([-1, -5, -3]), f([-0.5])];
  const mask = [f([1, 0, 1]), f([1])];

  it("default: each sample's token mean, averaged over the samples (derived by hand)", () => {
    const t = computeSftLossTerms(logp, mask, { calculate_per_token_loss: false });
    // sample 0: (1 + 3) / 2 = 2; sample 1: 0.5; mean over 2 samples = 1.25
    expect(t.loss).toBeCloseTo(1.25, 12);
    expect(t.metrics.loss).toBe(t.loss);
    expect(t.dLoss_dLogp.map((r) => [...r])).toEqual([[-0.25, -0, -0.25], [-0.5]]);
    expect(t.dLoss_dEntropy.map((r) => [...r])).toEqual([[0, 0, 0], [0]]);
  });

  it("calculate_per_token_loss: the token sum over the token count (derived by hand)", () => {
    const t = computeSftLossTerms(logp, mask, { calculate_per_token_loss: true });
    // (1 + 3 + 0.5) / 3 tokens = 1.5
    expect(t.loss).toBeCloseTo(1.5, 12);
    expect(t.dLoss_dLogp.map((r) => [...r].map((x) => Number(x.toFixed(12))))).toEqual([[-0.333333333333, 0, -0.333333333333], [-0.333333333333]]);
  });
});
