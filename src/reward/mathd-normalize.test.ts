import { describe, expect, it } from "vitest";
import { gradeAnswerMathd, mathdNormalizeAnswer, stripString } from "./mathd-normalize.ts";

// Ported from slime tests/test_rm_math.py (_strip_string and grade_answer_mathd), plus the error paths.
describe("_strip_string (Hendrycks)", () => {
  it.each([
    ["\\frac12", "\\frac{1}{2}"], // shorthand fraction gets braces
    ["\\tfrac{1}{2}", "\\frac{1}{2}"], // tfrac → frac
    ["\\left(1\\right)", "(1)"], // \left/\right removed
    ["45^{\\circ}", "45"],
    ["45^\\circ", "45"],
    [".7", "0.7"], // leading 0 added
    ["0.5", "\\frac{1}{2}"], // the one hard-coded decimal
    [".5", "\\frac{1}{2}"], // leading zero first, then the 0.5 rule
    ["3/4", "\\frac{3}{4}"], // canonical a/b
    ["03/4", "03/4"], // int('03') prints as '3': not canonical, left alone
    ["1 + 1", "1+1"], // spaces removed
    ["k = 7", "7"], // left of '=' has ≤ 2 chars ('k ')
    ["abc = 7", "abc=7"], // left has 4 chars: kept
    ["\\frac1{72}", "\\frac{1}{72}"],
    ["\\sqrt3", "\\sqrt{3}"],
    ["5\\text{ apples}", "5"], // unit removal at '\\text{ '
    ["\\$10\\%", "10"],
    ["x^2 \\!", "x^2"],
  ])("%j → %j", (raw, expected) => {
    expect(stripString(raw)).toBe(expected);
  });

  it("\\frac followed by a single character gives up and returns its input", () => {
    expect(stripString("\\frac1")).toBe("\\frac1");
  });
});

describe("mathd_normalize_answer", () => {
  it("unwraps a whole-string \\text{...}", () => {
    expect(mathdNormalizeAnswer("\\text{42}")).toBe("42");
  });
  it("null passes through", () => {
    expect(mathdNormalizeAnswer(null)).toBeNull();
  });
  it("where Python raises inside _strip_string, the stripped input is returned unnormalised", () => {
    // two '\\text{ ' → assert len(splits) == 2 fails; spaces and '\\$' are therefore kept
    expect(mathdNormalizeAnswer(" \\$5\\text{ a}\\text{ b} ")).toBe("\\$5\\text{ a}\\text{ b}");
    // '\\sqrt' at the very end → split[0] IndexError
    expect(mathdNormalizeAnswer("2\\sqrt")).toBe("2\\sqrt");
  });
});

describe("grade_answer_mathd", () => {
  it.each([
    ["\\frac{1}{2}", "0.5"],
    ["\\frac12", "\\frac{1}{2}"],
    ["45^\\circ", "45"],
    ["3/4", "\\frac{3}{4}"],
  ])("%j ≡ %j", (given, gt) => {
    expect(gradeAnswerMathd(given, gt)).toBe(true);
  });
  it("rejects different answers", () => {
    expect(gradeAnswerMathd("42", "43")).toBe(false);
    // mathd knows only the exact string 0.5: 0.75 is not turned into 3/4
    expect(gradeAnswerMathd("\\frac{3}{4}", "0.75")).toBe(false);
  });
});
