import { describe, expect, it } from "vitest";
import { callDynamicFilter, collectDropMetrics, shouldDropDynamicFilterOutput, toDynamicFilterOutput, type DynamicFilterOutput } from "./dynamic-filter.ts";
import { FilterError } from "./filter-error.ts";
import { builtinBufferFilter, builtinDynamicFilter, getDynamicFilter } from "./registry.ts";
import { checkRewardNonzeroStd } from "./reward-std.ts";

const group = { groupId: "g1", rewards: [1, 1] };
const site = { option: "dynamic_sampling_filter_path", path: "./f.js" };

describe("call_dynamic_filter", () => {
  it("no filter keeps everything", () => {
    expect(callDynamicFilter(undefined, group)).toEqual({ keep: true, reason: null, keep_when_insufficient: false });
  });
  it("a legacy boolean is wrapped as {keep}", () => {
    expect(callDynamicFilter(() => false, group)).toEqual({ keep: false, reason: null, keep_when_insufficient: false });
    expect(toDynamicFilterOutput(true)).toEqual({ keep: true, reason: null, keep_when_insufficient: false });
  });
  it("an output record gets its defaults", () => {
    expect(toDynamicFilterOutput({ keep: false, reason: "too_long" })).toEqual({ keep: false, reason: "too_long", keep_when_insufficient: false });
  });
  it.each([
    ["yes"],
    [null],
    [undefined],
    [{ keep: "no" }],
    [{ reason: "x" }],
    [{ keep: true, keepWhenInsufficient: true }], // camelCase typo: refused, not ignored
  ])("refuses %j from a plugin, naming it", (value) => {
    let error: unknown;
    try {
      callDynamicFilter(() => value as never, group, site);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(FilterError);
    expect((error as FilterError).code).toBe("plugin_filter_invalid");
    expect((error as FilterError).message).toMatch(/^dynamic_sampling_filter_path \.\/f\.js returned /);
  });
});

describe("should_drop", () => {
  const drop: DynamicFilterOutput = { keep: false, reason: "zero_std_1.0", keep_when_insufficient: false };
  const fallback: DynamicFilterOutput = { ...drop, keep_when_insufficient: true };
  it("a kept group is never dropped", () => {
    expect(shouldDropDynamicFilterOutput({ ...drop, keep: true }, { remainingBatchSize: 0, targetDataSize: 8 })).toBe(false);
  });
  it("a rejected group is dropped", () => {
    expect(shouldDropDynamicFilterOutput(drop, { remainingBatchSize: 8, targetDataSize: 8 })).toBe(true);
  });
  it("keep_when_insufficient keeps it while remaining <= target (dropping would force more sampling)", () => {
    expect(shouldDropDynamicFilterOutput(fallback, { remainingBatchSize: 8, targetDataSize: 8 })).toBe(false);
    expect(shouldDropDynamicFilterOutput(fallback, { remainingBatchSize: 7, targetDataSize: 8 })).toBe(false);
    expect(shouldDropDynamicFilterOutput(fallback, { remainingBatchSize: 9, targetDataSize: 8 })).toBe(true);
  });
});

describe("drop metrics (MetricGatherer)", () => {
  it("counts reasons; drops without a reason are not counted", () => {
    expect(collectDropMetrics(["zero_std_1.0", "zero_std_1.0", null, "", "zero_std_0.0"])).toEqual({
      "rollout/dynamic_filter/drop_zero_std_1.0": 2,
      "rollout/dynamic_filter/drop_zero_std_0.0": 1,
    });
  });
});

describe("built-in filters by name", () => {
  it("resolves slime's Python paths and bare names", () => {
    expect(builtinDynamicFilter("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std")).toBe(checkRewardNonzeroStd);
    expect(builtinDynamicFilter("check_reward_nonzero_std")).toBe(checkRewardNonzeroStd);
    expect(builtinDynamicFilter("./my_filter.js")).toBeNull(); // a plugin path
    expect(builtinBufferFilter(null)).not.toBeNull(); // pop_first is the default
    expect(builtinBufferFilter("slime.rollout.data_source.pop_first")).not.toBeNull();
    expect(builtinBufferFilter("./buf.js")).toBeNull();
  });
  it("getDynamicFilter lists the built-ins for an unknown name", () => {
    expect(() => getDynamicFilter("check_std")).toThrow(
      "'check_std' is not a built-in dynamic sampling filter; built-ins are 'check_reward_nonzero_std', 'check_reward_nonzero_std_with_fallback'",
    );
  });
});
