import { describe, expect, it } from "vitest";
import { deepscalerReward } from "./deepscaler.ts";

// Ported from slime tests/test_rm_deepscaler.py, plus the marker and label corners.
const r = (response: string, label: unknown): number => deepscalerReward({ response, label });

describe("deepscaler reward", () => {
  it("grades only after the last </think> (the 99 inside the thinking is ignored)", () => {
    expect(r("Let me reconsider. \\boxed{99}</think>Final: \\boxed{42}", "42")).toBe(1);
  });
  it("'###Response' format: the part after the marker", () => {
    expect(r("Scratch work \\boxed{wrong}###Response\\boxed{42}", "42")).toBe(1);
  });
  it("with two '###Response' markers only the segment between them counts (split()[1])", () => {
    expect(r("a###Response\\boxed{1}###Response\\boxed{2}", "1")).toBe(1);
    expect(r("a###Response\\boxed{1}###Response\\boxed{2}", "2")).toBe(0);
  });
  it("no marker at all → 0, even with a correct box", () => expect(r("\\boxed{42}", "42")).toBe(0));
  it("marker but no box → 0", () => expect(r("plain</think>no box here", "42")).toBe(0));
  it("empty label → 0", () => expect(r("</think>\\boxed{42}", "")).toBe(0));
  it("numeric label is str()-ed", () => expect(r("</think>\\boxed{42}", 42)).toBe(1));
  it("label 0 is graded (unlike math, where a falsy label scores 0)", () => expect(r("</think>\\boxed{0}", 0)).toBe(1));
  it("a boxed label is unwrapped", () => expect(r("</think>\\boxed{42}", "\\boxed{42}")).toBe(1));
  it("an \\fbox-only label yields no ground truth → 0", () => expect(r("</think>\\boxed{7}", "\\fbox{7}")).toBe(0));
  it("wrong answer → 0", () => expect(r("</think>\\boxed{43}", "42")).toBe(0));
  it("mathd OR sympy: \\frac{1}{2} vs 0.5 → 1", () => expect(r("</think>\\boxed{\\frac{1}{2}}", "0.5")).toBe(1));
  it("a null label raises (slime asserts the label type)", () => {
    expect(() => r("</think>\\boxed{1}", null)).toThrow(/deepscaler needs a string or number label/);
  });
});
