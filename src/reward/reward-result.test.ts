import { describe, expect, it } from "vitest";
import { numericComponents, RewardError, rewardResultSchema, selectRewardValue } from "./reward-result.ts";

describe("reward result type", () => {
  it("accepts a finite number or a record with a numeric component", () => {
    expect(rewardResultSchema.parse(0.5)).toBe(0.5);
    expect(rewardResultSchema.parse({ score: 1, pred: "42" })).toEqual({ score: 1, pred: "42" });
  });
  it.each([Number.NaN, Infinity, "1", null, { pred: "42" }, {}, { score: true }])("rejects %j", (v) => {
    expect(rewardResultSchema.safeParse(v).success).toBe(false);
  });
  it("numericComponents keeps the numbers only", () => {
    expect(numericComponents({ score: -1, acc: 0, pred: "x" })).toEqual({ score: -1, acc: 0 });
    expect(numericComponents(1)).toEqual({});
  });
});

describe("selectRewardValue (slime Sample.get_reward_value)", () => {
  it("a scalar is returned with or without a key", () => {
    expect(selectRewardValue(0.25, null)).toBe(0.25);
    expect(selectRewardValue(0.25, "score")).toBe(0.25);
  });
  it("a dict with reward_key returns that component", () => {
    expect(selectRewardValue({ score: -1, acc: 0, pred: "[INVALID]" }, "score")).toBe(-1);
  });
  it("a dict without reward_key names the components", () => {
    expect(() => selectRewardValue({ score: 1, acc: 1 }, null)).toThrow(
      "the reward is a dict with components 'score', 'acc'; set reward_key to the one to train on",
    );
  });
  it("a missing key names the key and the components", () => {
    let error: unknown;
    try {
      selectRewardValue({ score: 1, pred: "4" }, "accuracy");
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(RewardError);
    expect((error as RewardError).code).toBe("reward_key_not_found");
    expect((error as RewardError).message).toBe("reward_key 'accuracy' is not in the reward; its components are 'score', 'pred'");
  });
  it("a key naming a string component is refused", () => {
    expect(() => selectRewardValue({ score: 1, pred: "4" }, "pred")).toThrow(expect.objectContaining({ code: "reward_key_not_numeric" }));
  });
  it("inherited names are not components", () => {
    expect(() => selectRewardValue({ score: 1 }, "toString")).toThrow(expect.objectContaining({ code: "reward_key_not_found" }));
  });
});
