import { describe, expect, it } from "vitest";
import { icepop, resolveOldLogProbs, tisTrainLogProbs, vanillaTis } from "./off-policy.ts";

const close = (actual: ArrayLike<number> | undefined, expected: number[], digits = 12): void => {
  expect(actual?.length).toBe(expected.length);
  expected.forEach((v, i) => expect(actual?.[i]).toBeCloseTo(v, digits));
};

// old - rollout = [ln 3, ln 0.5, 0, ln 0.01] -> rho = [3, 0.5, 1, 0.01]
const ROLLOUT = [[-2, -2, -2, -2]];
const OLD = [[-2 + Math.log(3), -2 + Math.log(0.5), -2, -2 + Math.log(0.01)]];

describe("vanillaTis", () => {
  it("w = clamp(rho, tis_clip_low, tis_clip), with metrics", () => {
    // clamp to [0.1, 2]: [2, 0.5, 1, 0.1]; clipped where w != rho: [1, 0, 0, 1]; |rho - 1| = [2, 0.5, 0, 0.99]
    const out = vanillaTis(OLD, ROLLOUT, 2, 0.1);
    close(out.weights[0], [2, 0.5, 1, 0.1]);
    close(out.ratio[0], [3, 0.5, 1, 0.01]);
    expect(Array.from(out.clipfrac[0] ?? [])).toEqual([1, 0, 0, 1]);
    close(out.abs[0], [2, 0.5, 0, 0.99]);
  });
  it("defaults (0, 2) leave small ratios alone", () => {
    close(vanillaTis(OLD, ROLLOUT, { tis_clip: 2 }).weights[0], [2, 0.5, 1, 0.01]);
  });
});

describe("icepop", () => {
  it("keeps rho inside [tis_clip_low, tis_clip] and zeroes the rest", () => {
    // [3 -> 0, 0.5, 1, 0.01 -> 0]
    const out = icepop(OLD, ROLLOUT, { tis_clip: 2, tis_clip_low: 0.1 });
    close(out.weights[0], [0, 0.5, 1, 0]);
    expect(Array.from(out.clipfrac[0] ?? [])).toEqual([1, 0, 0, 1]);
  });
});

describe("resolveOldLogProbs (bypass mode)", () => {
  const logProbs = [[-1, -2]];
  const oldLogProbs = [[-1.5, -2.5]];
  const rolloutLogProbs = [[-1.1, -2.1]];
  it("use_rollout_logprobs uses the rollout log-probs as old", () => {
    expect(resolveOldLogProbs({ logProbs, oldLogProbs, rolloutLogProbs }, true)).toBe(rolloutLogProbs);
    expect(() => resolveOldLogProbs({ logProbs }, true)).toThrow(/rolloutLogProbs/);
  });
  it("otherwise the recomputed old, else the current log-probs", () => {
    expect(resolveOldLogProbs({ logProbs, oldLogProbs, rolloutLogProbs }, false)).toBe(oldLogProbs);
    expect(resolveOldLogProbs({ logProbs, rolloutLogProbs }, false)).toBe(logProbs);
  });
  it("TIS's pi_old is never the rollout log-probs", () => {
    expect(tisTrainLogProbs({ logProbs, oldLogProbs, rolloutLogProbs })).toBe(oldLogProbs);
    expect(tisTrainLogProbs({ logProbs, rolloutLogProbs })).toBe(logProbs);
  });
  it("rejects a mis-shaped old", () => {
    expect(() => resolveOldLogProbs({ logProbs, oldLogProbs: [[-1]] }, false)).toThrow(/oldLogProbs\[0\]/);
  });
});
