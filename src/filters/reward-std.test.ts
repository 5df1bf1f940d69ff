import { describe, expect, it } from "vitest";
import { checkRewardNonzeroStd, checkRewardNonzeroStdWithFallback, unbiasedStd, zeroStdReason } from "./reward-std.ts";
import { FilterError } from "./filter-error.ts";

const g = (rewards: number[]) => ({ groupId: "g1", rewards });

describe("unbiasedStd (torch.std, float64)", () => {
  it("divides by n-1: [1,0,1,0] → mean 0.5, Σ(x-m)² = 1, /3 → sqrt(1/3)", () => {
    expect(unbiasedStd([1, 0, 1, 0])).toBeCloseTo(Math.sqrt(1 / 3), 15);
  });
  it("one value → NaN, as torch", () => expect(unbiasedStd([0.5])).toBeNaN());
});

describe("check_reward_nonzero_std", () => {
  it("keeps a group with differing rewards", () => {
    expect(checkRewardNonzeroStd(g([1, 0, 1, 0]))).toEqual({ keep: true, reason: null, keep_when_insufficient: false });
  });
  it.each([
    [[1, 1, 1, 1], "zero_std_1.0"], // Python: str(round(1.0, 1)) = '1.0'
    [[0, 0, 0, 0], "zero_std_0.0"],
    [[-1, -1], "zero_std_-1.0"], // dapo's wrong-answer score
    [[0.25, 0.25], "zero_std_0.2"], // 0.25 is an exact tie: half to even
    [[0.15, 0.15], "zero_std_0.1"], // 0.15 is stored as 0.1499…: down (Math.round would go up)
    [[0.35, 0.35], "zero_std_0.3"], // stored as 0.3499…
    [[12345.678, 12345.678], "zero_std_12345.7"],
    [[1e16, 1e16], "zero_std_1e+16"], // Python's repr switches to exponent form at 1e16
  ] as const)("all equal %j → drop, reason %s", (rewards, reason) => {
    expect(checkRewardNonzeroStd(g([...rewards]))).toEqual({ keep: false, reason, keep_when_insufficient: false });
  });
  it("the threshold is std > 1e-6, on the unbiased std", () => {
    // [0, 1e-6]: mean 5e-7, Σ(x-m)² = 2·(5e-7)² = 5e-13, /1 → std ≈ 7.07e-7 ≤ 1e-6 → drop
    expect(checkRewardNonzeroStd(g([0, 1e-6]))).toMatchObject({ keep: false, reason: "zero_std_0.0" });
    // [0, 2e-6]: std ≈ 1.414e-6 > 1e-6 → keep
    expect(checkRewardNonzeroStd(g([0, 2e-6])).keep).toBe(true);
  });
  it("the reason rounds the FIRST reward of the group", () => {
    // [0.04, 0.04 + 1e-9]: near-equal → dropped, r0 = 0.04 → round 0.0
    expect(checkRewardNonzeroStd(g([0.04, 0.04 + 1e-9])).reason).toBe("zero_std_0.0");
  });
  it("a one-sample group has NaN std and is always dropped", () => {
    expect(checkRewardNonzeroStd(g([0.5]))).toEqual({ keep: false, reason: "zero_std_0.5", keep_when_insufficient: false });
  });
  it("a NaN reward makes the std NaN → drop", () => {
    expect(checkRewardNonzeroStd(g([Number.NaN, 1]))).toMatchObject({ keep: false, reason: "zero_std_nan" });
  });
  it("an empty group is a caller bug", () => {
    expect(() => checkRewardNonzeroStd(g([]))).toThrow(FilterError);
  });
});

describe("check_reward_nonzero_std_with_fallback", () => {
  it("same verdict, with keep_when_insufficient", () => {
    expect(checkRewardNonzeroStdWithFallback(g([1, 1]))).toEqual({ keep: false, reason: "zero_std_1.0", keep_when_insufficient: true });
    expect(checkRewardNonzeroStdWithFallback(g([1, 0]))).toEqual({ keep: true, reason: null, keep_when_insufficient: true });
  });
});

describe("zeroStdReason", () => {
  it("formats like Python's str(round(r, 1))", () => {
    expect(zeroStdReason(1)).toBe("zero_std_1.0");
    expect(zeroStdReason(0.0001)).toBe("zero_std_0.0");
    expect(zeroStdReason(-0.04)).toBe("zero_std_-0.0"); // Python keeps the sign of a rounded-away negative
  });
});
