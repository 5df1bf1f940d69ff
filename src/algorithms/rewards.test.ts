import { describe, expect, it } from "vitest";
import { getRewardValue, groupNormalizeRewards, postProcessRewards } from "./rewards.ts";

const close = (actual: ArrayLike<number>, expected: number[], digits = 12): void => {
  expect(actual.length).toBe(expected.length);
  expected.forEach((v, i) => expect(actual[i]).toBeCloseTo(v, digits));
};

// Interleaved groups: group 0 at positions 0, 2, 4; group 1 at 1, 3, 5, 6.
const REWARDS = [1, 0.2, 0, 0.9, 1, 0.4, 0.5];
const GROUPS = [0, 1, 0, 1, 0, 1, 1];

describe("groupNormalizeRewards", () => {
  it("groups by group index, not by position, and divides by unbiased std + 1e-6", () => {
    // group 0: [1, 0, 1], mean 2/3, centred [1/3, -2/3, 1/3]
    //   var = (1/9 + 4/9 + 1/9) / (3 - 1) = 1/3, std = 0.5773502691896258
    //   -> 1/3 / 0.5773512691896258 = 0.5773492691913578, -2/3 / ... = -1.1546985383827153
    // group 1: [0.2, 0.9, 0.4, 0.5], mean 0.5, centred [-0.3, 0.4, -0.1, 0]
    //   var = (0.09 + 0.16 + 0.01 + 0) / 3 = 0.08666..., std = 0.2943920288775949
    //   -> -0.3 / 0.2943930288775949 = -1.0190458692034328, 0.4 / ... = 1.3587278256045772, -0.1 / ... = -0.3396819564011442
    const out = groupNormalizeRewards(REWARDS, GROUPS, { useStd: true });
    close(out, [0.5773492691913578, -1.0190458692034328, -1.1546985383827153, 1.3587278256045772, 0.5773492691913578, -0.3396819564011442, 0]);
  });

  it("without std only centres", () => {
    const out = groupNormalizeRewards(REWARDS, GROUPS, { useStd: false });
    close(out, [1 / 3, -0.3, -2 / 3, 0.4, 1 / 3, -0.1, 0]);
  });

  it("an all-equal group gives exact zeros (a naive mean would not)", () => {
    // (0.1 + 0.1 + 0.1) / 3 = 0.10000000000000002 ≠ 0.1, so a plain mean leaves -1.4e-17 residues
    // that std normalisation then blows up; the shifted mean is exactly 0.1.
    expect((0.1 + 0.1 + 0.1) / 3).not.toBe(0.1);
    for (const useStd of [true, false]) {
      const out = groupNormalizeRewards([0.1, 0.1, 0.1, 1, 0], ["a", "a", "a", "b", "b"], { useStd });
      expect(Array.from(out.subarray(0, 3))).toEqual([0, 0, 0]);
      expect(Object.is(out[0], 0) || Object.is(out[0], -0)).toBe(true);
    }
  });

  it("a single-sample group gives 0, with or without std", () => {
    // centred: 5 - 5 = 0; the unbiased std of one element is undefined, so no division.
    expect(Array.from(groupNormalizeRewards([5], [7], { useStd: true }))).toEqual([0]);
    expect(Array.from(groupNormalizeRewards([5, 1, 3], [0, 1, 1], { useStd: true }))).toEqual([0, -1 / (Math.SQRT2 + 1e-6), 1 / (Math.SQRT2 + 1e-6)]);
  });

  it("uses the eps passed in", () => {
    // [0, 2]: centred [-1, 1], std = sqrt(2 / 1) = 1.4142135623730951; eps 0.5858.. makes std+eps = 2.
    const out = groupNormalizeRewards([0, 2], [0, 0], { useStd: true, eps: 2 - Math.SQRT2 });
    close(out, [-0.5, 0.5], 14);
  });

  it("rejects a group index array of the wrong length", () => {
    expect(() => groupNormalizeRewards([1, 2], [0], { useStd: false })).toThrow(/groupIndices/);
  });
});

describe("postProcessRewards", () => {
  const base = { rewards_normalization: true, grpo_std_normalization: true };
  it("grpo, gspo, cispo: centre and divide by std", () => {
    for (const est of ["grpo", "gspo", "cispo"] as const) {
      const { raw, normalized } = postProcessRewards([1, 0], [0, 0], { ...base, advantage_estimator: est });
      // [1, 0]: centred [0.5, -0.5], std = sqrt(0.5 / 1) = 0.7071067811865476
      close(normalized, [0.5 / (Math.SQRT1_2 + 1e-6), -0.5 / (Math.SQRT1_2 + 1e-6)]);
      expect(Array.from(raw)).toEqual([1, 0]);
    }
  });
  it("grpo_std_normalization false (Dr.GRPO) only centres", () => {
    const { normalized } = postProcessRewards([1, 0], [0, 0], { ...base, grpo_std_normalization: false, advantage_estimator: "grpo" });
    expect(Array.from(normalized)).toEqual([0.5, -0.5]);
  });
  it("reinforce_plus_plus_baseline centres without std even when std normalisation is on", () => {
    const { normalized } = postProcessRewards([1, 0, 3], [0, 0, 1], { ...base, advantage_estimator: "reinforce_plus_plus_baseline" });
    expect(Array.from(normalized)).toEqual([0.5, -0.5, 0]);
  });
  it("reinforce_plus_plus and ppo keep raw rewards", () => {
    for (const est of ["reinforce_plus_plus", "ppo"] as const) {
      expect(Array.from(postProcessRewards([1, 0], [0, 0], { ...base, advantage_estimator: est }).normalized)).toEqual([1, 0]);
    }
  });
  it("rewards_normalization false keeps raw rewards", () => {
    const { normalized } = postProcessRewards([1, 0], [0, 0], { ...base, rewards_normalization: false, advantage_estimator: "grpo" });
    expect(Array.from(normalized)).toEqual([1, 0]);
  });
});

describe("getRewardValue", () => {
  it("returns a scalar reward as is, and a dict reward's reward_key entry", () => {
    expect(getRewardValue(0.5)).toBe(0.5);
    expect(getRewardValue({ acc: 1, format: 0.2 }, "format")).toBe(0.2);
  });
  it("names the problem when key and reward disagree", () => {
    expect(() => getRewardValue({ acc: 1 })).toThrow(/reward_key is not set/);
    expect(() => getRewardValue(1, "acc")).toThrow(/scalar/);
    expect(() => getRewardValue({ acc: 1 }, "format")).toThrow(/no numeric key "format"/);
  });
});
