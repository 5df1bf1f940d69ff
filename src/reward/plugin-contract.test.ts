import { describe, expect, it } from "vitest";
import { validatePluginGroupReward, validatePluginReward } from "./plugin-contract.ts";
import { RewardError } from "./reward-result.ts";

const site = { path: "./x.js", sampleIndex: 3 };

function errorOf(fn: () => unknown): RewardError {
  try {
    fn();
  } catch (e) {
    if (e instanceof RewardError) return e;
    throw e;
  }
  throw new Error("expected a RewardError");
}

describe("validatePluginReward", () => {
  it("accepts numbers and dicts; booleans become 1/0", () => {
    expect(validatePluginReward(0.5, site)).toBe(0.5);
    expect(validatePluginReward(true, site)).toBe(1);
    expect(validatePluginReward({ score: 1, acc: false, pred: "42" }, site)).toEqual({ score: 1, acc: 0, pred: "42" });
  });
  it("names the plugin, the value and the sample", () => {
    const e = errorOf(() => validatePluginReward("abc", site));
    expect(e.code).toBe("plugin_reward_invalid");
    expect(e.message).toBe("custom_rm_path ./x.js returned 'abc' for sample 3; expected a number or an object of numbers");
  });
  it("says what is wrong inside a dict", () => {
    expect(errorOf(() => validatePluginReward({ score: null }, site)).message).toBe(
      "custom_rm_path ./x.js returned {\"score\":null} for sample 3; component 'score' is null; expected a finite number (or a string, kept as metadata)",
    );
    expect(errorOf(() => validatePluginReward({ pred: "4" }, site)).message).toMatch(/no component is numeric$/);
    expect(errorOf(() => validatePluginReward({}, site)).message).toMatch(/the object is empty$/);
  });
  it.each([
    [Number.NaN, "returned NaN for sample 3; expected a finite number"],
    [Infinity, "returned Infinity for sample 3; expected a finite number"],
    [undefined, "returned undefined for sample 3; expected a number or an object of numbers (did the function forget to return?)"],
    [null, "returned null for sample 3; expected a number or an object of numbers"],
    [[1, 2], "returned [1,2] for sample 3; expected a number or an object of numbers; an array is a group reward"],
  ] as const)("%j", (value, message) => {
    expect(errorOf(() => validatePluginReward(value, site)).message).toContain(message);
  });
  it("an HTTP plugin is named by its own option and URL", () => {
    const e = errorOf(() => validatePluginReward("x", { option: "custom_rm_path", path: "http://127.0.0.1:9000/reward" }));
    expect(e.message).toBe("custom_rm_path http://127.0.0.1:9000/reward returned 'x'; expected a number or an object of numbers");
  });
});

describe("validatePluginGroupReward", () => {
  it("accepts one reward per sample", () => {
    expect(validatePluginGroupReward([1, 0, { score: 1 }, true], 4, { path: "./g.js" })).toEqual([1, 0, { score: 1 }, 1]);
  });
  it("refuses a wrong length", () => {
    const e = errorOf(() => validatePluginGroupReward([1, 0, 1], 4, { path: "./g.js" }));
    expect(e.code).toBe("plugin_group_reward_invalid");
    expect(e.message).toBe("custom_rm_path ./g.js (group_rm) returned 3 rewards for a group of 4 samples; expected one per sample");
  });
  it("refuses a non-array", () => {
    expect(errorOf(() => validatePluginGroupReward(1, 2, { path: "./g.js" })).message).toBe(
      "custom_rm_path ./g.js (group_rm) returned 1; expected an array of 2 rewards, one per sample in order",
    );
  });
  it("names the first bad element by its index", () => {
    const e = errorOf(() => validatePluginGroupReward([1, "bad"], 2, { path: "./g.js" }));
    expect(e.code).toBe("plugin_group_reward_invalid");
    expect(e.message).toBe("custom_rm_path ./g.js returned 'bad' for sample 1; expected a number or an object of numbers (group_rm)");
  });
});
