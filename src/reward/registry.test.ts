import { describe, expect, it } from "vitest";
import { getRewardFunction, IN_PROCESS_RM_TYPES, resolveRmType } from "./registry.ts";
import { RewardError } from "./reward-result.ts";

describe("getRewardFunction", () => {
  it("serves every in-process rm_type", () => {
    for (const t of IN_PROCESS_RM_TYPES) expect(typeof getRewardFunction(t)).toBe("function");
  });
  it("ignores surrounding whitespace, as slime's .strip()", () => {
    expect(getRewardFunction(" math ")({ response: "\\boxed{2}", label: "2" })).toBe(1);
  });
  it("boxed_ first replaces the response by its last box content", () => {
    const f1 = getRewardFunction("boxed_f1");
    expect(f1({ response: "I think London. Final: \\boxed{Paris}", label: "Paris" })).toBe(1);
    // no box → the response becomes "" → F1 0
    expect(f1({ response: "Paris", label: "Paris" })).toBe(0);
  });
  it("boxed_math always scores 0: the content of the LAST box never contains a \\boxed for math to grade", () => {
    const boxedMath = getRewardFunction("boxed_math");
    expect(boxedMath({ response: "\\boxed{5}", label: "5" })).toBe(0);
    expect(boxedMath({ response: "\\boxed{\\boxed{5}}", label: "5" })).toBe(0); // rfind finds the inner box: content '5'
  });
  it("exact_match: trimmed string equality, case-sensitive", () => {
    const em = getRewardFunction("exact_match");
    expect(em({ response: "  Paris\n", label: "Paris" })).toBe(1);
    expect(em({ response: "paris", label: "Paris" })).toBe(0);
    expect(em({ response: "0", label: 0 })).toBe(1); // str(0) = '0'
    expect(em({ response: "", label: null })).toBe(0); // a missing label never matches
    expect(getRewardFunction("boxed_exact_match")({ response: "so \\boxed{ 42 }", label: "42" })).toBe(1);
  });
  it("dapo returns its components", () => {
    expect(getRewardFunction("dapo")({ response: "Answer: 7", label: 7 })).toEqual({ score: 1, acc: 1, pred: "7" });
  });
  it("remote_rm is named but not served in process", () => {
    expect(() => getRewardFunction("remote_rm")).toThrow(expect.objectContaining({ code: "rm_type_not_in_process" }));
  });
  it("an unknown rm_type lists the known ones", () => {
    let error: unknown;
    try {
      getRewardFunction("maths");
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(RewardError);
    expect((error as RewardError).code).toBe("unknown_rm_type");
    expect((error as RewardError).message).toMatch(/unknown rm_type 'maths'; expected one of 'math', 'deepscaler'/);
    expect((error as RewardError).isRetriable).toBe(false);
  });
  it("an empty rm_type says to set one", () => {
    expect(() => getRewardFunction("")).toThrow(/no rm_type given/);
  });
});

describe("resolveRmType", () => {
  it("a non-empty metadata.rm_type wins over the run's rm_type", () => {
    expect(resolveRmType({ rm_type: "f1" }, "math")).toBe("f1");
    expect(resolveRmType({ rm_type: "" }, "math")).toBe("math");
    expect(resolveRmType({}, " dapo ")).toBe("dapo");
    expect(resolveRmType(null, null)).toBe("");
  });
});
