import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import * as reward from "./index.ts";

describe("the package's public entry points", () => {
  it("rlq/reward exports the reward hub: getRewardFunction and the graders", () => {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as {
      exports: Record<string, { import: string; types: string }>;
    };
    expect(pkg.exports["./reward"]).toEqual({ types: "./dist/reward/index.d.ts", import: "./dist/reward/index.js" });
    expect(pkg.exports["./algorithms"]).toEqual({ types: "./dist/algorithms/index.d.ts", import: "./dist/algorithms/index.js" });
    for (const name of ["getRewardFunction", "mathReward", "deepscalerReward", "dapoReward", "f1Reward", "gpqaReward", "exactMatchReward", "gradeAnswerVerl"]) {
      expect(typeof (reward as Record<string, unknown>)[name], name).toBe("function");
    }
    const math = reward.getRewardFunction("math");
    expect(math({ response: "The answer is \\boxed{2}", label: "2" })).toBe(1);
  });
});
