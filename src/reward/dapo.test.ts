import { describe, expect, it } from "vitest";
import { dapoComputeScore, dapoReward, isCorrectMinerva, isCorrectStrictBox, normalizeFinalAnswer } from "./dapo.ts";
import { RewardError } from "./reward-result.ts";

// Ported from slime tests/test_rm_math_dapo.py, plus the label and 300-char rules.
describe("normalize_final_answer (DAPO)", () => {
  it.each([
    ["x = 42", "42"], // last segment after '='
    ["an answer", "answer"], // 'an ' deleted
    ["42 square", "42"], // spaces deleted, then the word 'square'
    ["100 dollars", "100"],
    ["\\text{hello}", "hello"],
    ["\\boxed{42}", "42"],
    ["1,234,567", "1234567"], // all digits once commas go → commas dropped
    ["a b c", "bc"], // 'a ' is an article, then spaces deleted
    ["42<|endoftext|>", "42"],
    ["42<|im_end|>", "42"],
    ["$42$", "42"],
    ["\\frac12", "\\frac{1}{2}"], // shorthand expanded; the backslash in front is kept
  ])("%j → %j", (raw, expected) => {
    expect(normalizeFinalAnswer(raw)).toBe(expected);
  });
});

describe("is_correct_minerva / is_correct_strict_box", () => {
  it("reads the last 'Answer:' line", () => {
    expect(isCorrectMinerva("Long solution. Answer: 42", "42")).toEqual([true, "42"]);
    // two candidates on separate lines: the last one (42) is graded
    expect(isCorrectMinerva("Answer: 41 was a wrong guess.\nAnswer: 42", "42")[0]).toBe(true);
  });
  it("no 'Answer:' → [INVALID]", () => {
    expect(isCorrectMinerva("just a number 42", "42")).toEqual([false, "[INVALID]"]);
  });
  it("the label goes through str(int(float(label))): 42.0 and '42.9' both become '42'", () => {
    expect(isCorrectMinerva("Answer: 42", "42.0")[0]).toBe(true);
    expect(isCorrectMinerva("Answer: 42", "42.9")[0]).toBe(true); // int() truncates
  });
  it("strict box: exact match of the last box in the last 100 chars, 1 or -1", () => {
    expect(isCorrectStrictBox("long preamble … \\boxed{42}", "42")).toEqual([1, "42"]);
    expect(isCorrectStrictBox("\\boxed{43}", "42")).toEqual([-1, "43"]);
    expect(isCorrectStrictBox("plain 42", "42")).toEqual([-1, null]);
  });
});

describe("dapo reward {score, acc, pred}", () => {
  it("correct → score 1, acc 1", () => {
    expect(dapoReward({ response: "So... Answer: 42", label: "42" })).toEqual({ score: 1, acc: 1, pred: "42" });
  });
  it("thousands separators in the prediction: '1,000' → '1000' vs str(int(float(1000))) → correct", () => {
    expect(dapoReward({ response: "Answer: 1,000", label: 1000 })).toEqual({ score: 1, acc: 1, pred: "1000" });
  });
  it("wrong → score -1 (not 0), acc 0", () => {
    expect(dapoReward({ response: "Answer: 43", label: "42" })).toEqual({ score: -1, acc: 0, pred: "43" });
  });
  it("no 'Answer:' → -1 with pred '[INVALID]'", () => {
    expect(dapoReward({ response: "the answer is 42", label: "42" })).toEqual({ score: -1, acc: 0, pred: "[INVALID]" });
  });
  it("only the last 300 characters are read", () => {
    const response = `Answer: 42\n${"x".repeat(300)}`; // the answer line falls outside the tail
    expect(dapoReward({ response, label: "42" }).score).toBe(-1);
  });
  it("strict box mode compares the raw box content", () => {
    expect(dapoComputeScore("\\boxed{42}", "42", { strictBoxVerify: true })).toEqual({ score: 1, acc: 1, pred: "42" });
    // a box pushed out of the 300-char tail is not seen; pred is absent (None in slime)
    expect(dapoComputeScore(`\\boxed{42}${" filler".repeat(60)}`, "42", { strictBoxVerify: true })).toEqual({ score: -1, acc: 0 });
  });
  it("a label that is not a number raises, as slime's float(label) does", () => {
    expect(() => dapoReward({ response: "Answer: x", label: "abc" })).toThrow(RewardError);
    expect(() => dapoReward({ response: "Answer: x", label: null })).toThrow(/dapo needs a numeric label/);
  });
});
