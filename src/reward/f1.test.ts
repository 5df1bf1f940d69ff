import { describe, expect, it } from "vitest";
import { f1Reward, f1Score, normalizeAnswer } from "./f1.ts";

// Ported from slime tests/test_rm_f1.py, plus repeated tokens and non-string labels.
describe("SQuAD normalize_answer", () => {
  it.each([
    ["The Quick Brown Fox.", "quick brown fox"], // article, punctuation, case
    ["An apple, a day", "apple day"],
    ["HELLO   WORLD", "hello world"],
    ["a.b,c!", "abc"], // punctuation is deleted, not replaced by a space: one word 'abc'
    ["", ""],
    ["the", ""],
    ["éthe the", "éthe"], // 'é' is a word character in Python 3, so 'éthe' holds no article 'the'
  ])("%j → %j", (raw, expected) => expect(normalizeAnswer(raw)).toBe(expected));
});

describe("f1_score", () => {
  it("exact match: p = r = f1 = 1", () => {
    expect(f1Score("Paris is the capital", "Paris is the capital")).toEqual({ f1: 1, precision: 1, recall: 1 });
  });
  it("partial overlap: ['brown','fox'] vs ['quick','brown','fox'] → p 1, r 2/3, f1 0.8", () => {
    const s = f1Score("the brown fox", "a quick brown fox");
    expect(s.precision).toBeCloseTo(1, 12);
    expect(s.recall).toBeCloseTo(2 / 3, 12);
    expect(s.f1).toBeCloseTo(0.8, 12); // 2·1·(2/3) / (1 + 2/3)
  });
  it("repeated tokens count with multiplicity: {x:2,y:1} ∩ {x:1,y:2} = 2 → p = r = f1 = 2/3", () => {
    expect(f1Score("x x y", "x y y").f1).toBeCloseTo(2 / 3, 12);
  });
  it("no overlap → 0", () => expect(f1Score("apple banana", "carrot date")).toEqual({ f1: 0, precision: 0, recall: 0 }));
  it("null prediction → 0", () => expect(f1Score(null, "anything").f1).toBe(0));
  it.each(["yes", "no", "noanswer"])("special %s must match exactly, on either side", (special) => {
    expect(f1Score(special, "some other phrase").f1).toBe(0);
    expect(f1Score(`some ${special} phrase`, special).f1).toBe(0); // token F1 would be 0.5
    expect(f1Score(special, special).f1).toBe(1);
  });
  it("the rm_type reads response and str(label)", () => {
    expect(f1Reward({ response: "The Cat sat", label: "cat sat on the mat" })).toBeCloseTo(2 / 3, 12); // p 1, r 1/2
    expect(f1Reward({ response: "42", label: 42 })).toBe(1);
  });
});
