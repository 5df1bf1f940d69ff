import { describe, expect, it } from "vitest";
import { computeGpqaReward, extractLetterFromResponse, gpqaReward } from "./gpqa.ts";

// Ported from slime tests/test_rm_gpqa.py, plus the first-match quirk.
const AJ = Array.from("ABCDEFGHIJ");

describe("extract_letter_from_response", () => {
  it.each([
    ["The answer is B.", "B"],
    ["Answer: C", "C"],
    ["My choice is D", "D"],
    ["A is correct here", "A"],
    ["E is the correct option", "E"],
    ["Final answer: B", "B"],
    ["the final option is C", "C"],
    ["we ruled out A, then B, settled on C", "C"], // fallback: last standalone valid capital
    ["The answer is probably B", "B"], // pattern 1 reads 'p' → P invalid → fallback finds B
    ["The answer is definitely A", "D"], // pattern 1 reads 'd' → D IS valid: slime returns D
  ])("%j → %s", (response, letter) => expect(extractLetterFromResponse(response, AJ)).toBe(letter));
  it("strips the chain of thought before matching", () => {
    expect(extractLetterFromResponse("Let me think… Answer: A is wrong.</think>The answer is B.", AJ)).toBe("B");
  });
  it("none when nothing matches or the response is empty", () => {
    expect(extractLetterFromResponse("no idea, sorry", AJ)).toBeNull();
    expect(extractLetterFromResponse("", AJ)).toBeNull();
    expect(extractLetterFromResponse(null, AJ)).toBeNull();
  });
  it("respects a restricted set of valid letters", () => {
    // 'Answer: C' matches but C is invalid; the fallback walks standalone letters backwards: B
    expect(extractLetterFromResponse("Answer: C, but actually A was right, no wait B.", ["A", "B"])).toBe("B");
  });
});

describe("compute_gpqa_reward", () => {
  it("letter label", () => {
    expect(computeGpqaReward("The answer is C.", "C")).toBe(1);
    expect(computeGpqaReward("The answer is C.", "D")).toBe(0);
  });
  it("integer label indexes the valid letters (2 → C with 4 choices)", () => {
    expect(computeGpqaReward("Answer: C", 2, { choices: ["alpha", "beta", "gamma", "delta"] })).toBe(1);
  });
  it("choices as a dict are read by value", () => {
    expect(computeGpqaReward("Answer: B", 1, { choices: { a: "first", b: "second", c: "third" } })).toBe(1);
  });
  it("a text label is matched against the choices (normalised) to find its letter", () => {
    expect(computeGpqaReward("I think the answer is B.", "capital of france", { choices: ["London", "Capital of France", "Berlin"] })).toBe(1);
  });
  it("no letter in the response: the correct choice's text, as whole words, scores 1", () => {
    expect(computeGpqaReward("Definitely paris.", "Paris", { choices: ["London", "Paris", "Berlin"] })).toBe(1);
  });
  it("metadata.correct_letter (any case) takes precedence over a text label", () => {
    expect(computeGpqaReward("Answer: A", "anything", { correct_letter: "a" })).toBe(1);
  });
  it("a numeric label overrides metadata.correct_letter", () => {
    expect(computeGpqaReward("Answer: A", 1, { correct_letter: "A" })).toBe(0); // index 1 → B
  });
  it("falls through to 0", () => {
    expect(computeGpqaReward("random text", "some answer")).toBe(0);
    expect(computeGpqaReward(null, "A")).toBe(0);
  });
  it("the rm_type reads metadata from the input", () => {
    expect(gpqaReward({ response: "Answer: B", label: 1, metadata: { choices: ["x", "y"] } })).toBe(1);
  });
});
