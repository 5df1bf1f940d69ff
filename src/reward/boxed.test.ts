import { describe, expect, it } from "vitest";
import { extractAnswer, extractBoxedAnswer, lastBoxedOnlyString, removeBoxed } from "./boxed.ts";

// Ported from slime tests/test_rm_math.py (extraction part).
describe("boxed extraction (slime math_utils)", () => {
  it("rfind picks the last box", () => {
    expect(lastBoxedOnlyString("first attempt \\boxed{wrong}, final \\boxed{42}")).toBe("\\boxed{42}");
  });
  it("balances nested braces", () => {
    expect(lastBoxedOnlyString("answer: \\boxed{\\frac{1}{2}}")).toBe("\\boxed{\\frac{1}{2}}");
  });
  it("falls back to \\fbox only when there is no \\boxed", () => {
    expect(lastBoxedOnlyString("answer: \\fbox{7}")).toBe("\\fbox{7}");
  });
  it("returns null when missing or unterminated", () => {
    expect(lastBoxedOnlyString("plain text, no box")).toBeNull();
    expect(lastBoxedOnlyString("start \\boxed{never closes")).toBeNull();
  });
  it("remove_boxed needs the exact '\\boxed{' prefix and a final '}'", () => {
    expect(removeBoxed("\\boxed{x+1}")).toBe("x+1");
    expect(removeBoxed("\\boxed{\\frac{1}{2}}")).toBe("\\frac{1}{2}");
    expect(removeBoxed("not boxed at all")).toBeNull();
    expect(removeBoxed("\\fbox{7}")).toBeNull(); // so an \fbox never yields an answer
    expect(removeBoxed(null)).toBeNull();
  });
  it("\\boxed 5 (no braces): the brace scan runs off the end → null", () => {
    expect(extractBoxedAnswer("\\boxed 5")).toBeNull();
  });
  it("\\boxed 5 followed by a later group: the span exists but has no '\\boxed{' prefix → null", () => {
    // scan from '\\boxed' balances on '{x}', giving '\\boxed 5 {x}', which remove_boxed rejects
    expect(lastBoxedOnlyString("\\boxed 5 {x}")).toBe("\\boxed 5 {x}");
    expect(extractBoxedAnswer("\\boxed 5 {x}")).toBeNull();
  });
  it("extract_answer requires the substring \\boxed (the \\fbox fallback is unreachable)", () => {
    expect(extractAnswer("Solution: \\boxed{42}")).toBe("42");
    expect(extractAnswer("just 42")).toBeNull();
    expect(extractAnswer("answer: \\fbox{7}")).toBeNull();
  });
});
