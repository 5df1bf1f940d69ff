import { describe, expect, it } from "vitest";
import { gradeAnswerSympy, isFrac, normalizeSympy, splitTuple, strIsInt, stripProperlyFormattedCommas } from "./sympy-normalize.ts";

describe("_normalize (sympy side)", () => {
  it.each([
    ["\\frac{1}{2}", "1/2"], // LaTeX → text
    ["\\frac{\\sqrt{2}}{2}", "sqrt(2)/2"], // √ → sqrt
    ["7\\frac{3}{4}", "7+3/4"], // ' \\frac' insertion, then the mixed-number '+'
    ["7 3/4", "7+3/4"],
    ["1,000", "1000"], // thousands commas, via _str_is_int/_str_to_int
    ["10\\%", "10"],
    ["\\$5.00", "5"], // '$' deleted, 5.00 is an integral float → '5'
    ["5 cm", "5"], // unit word deleted
    ["2.0", "2"],
    ["\\text{(A)}", "(a)"], // unwrap \\text{}, lowercase
    ["\\left( 1, 2 \\right)", "(1,2)"],
    ["\\sqrt[3]{8}", "sqrt(8)"], // pylatexenc drops the index: slime grades ∛8 as √8
    ["1 million", "1*10^6"],
    ["\\pi r^2", "pir^2"],
    ["-\\frac{1}{2}", "-1/2"], // '- ' collapsed to '-'
    ["(-\\infty, 3) \\cup (4, \\infty)", "(-inf,3)u(4,inf)"],
    ["3 or 4", "3,4"], // ' or ' → ' , '
    ["\\text{Monday}", "mon"], // 'day' is a unit word, deleted anywhere
    ["{5}", "5"], // one outer brace pair stripped
    ["1,999.99999999", "1999"], // _str_is_int (within 1e-7) then _str_to_int TRUNCATES: slime quirk
    ["1.99999999", "2"], // but a plain float is ROUNDED by the earlier integral-float step
  ])("%j → %j", (raw, expected) => {
    expect(normalizeSympy(raw)).toBe(expected);
  });
  it("null passes through", () => expect(normalizeSympy(null)).toBeNull());
});

describe("sympy-side helpers", () => {
  it("strips only well-formed thousands commas", () => {
    expect(stripProperlyFormattedCommas("1,234,567")).toBe("1234567");
    expect(stripProperlyFormattedCommas("(1,234)")).toBe("(1234)");
    expect(stripProperlyFormattedCommas("1,23")).toBe("1,23");
    expect(stripProperlyFormattedCommas("1,2345")).toBe("1,2345"); // 4 digits after the comma
  });
  it("_is_frac: integer over positive integer, one optional char around the slash", () => {
    expect(isFrac("1/2")).toBe(true);
    expect(isFrac("-3/4")).toBe(true);
    expect(isFrac("3/0")).toBe(false); // denominator must have a non-zero digit
    expect(isFrac("0.75")).toBe(false);
    expect(isFrac("x/2")).toBe(false);
  });
  it("_str_is_int: within 1e-7 of an integer, commas allowed", () => {
    expect(strIsInt("3")).toBe(true);
    expect(strIsInt("3.00000001")).toBe(true);
    expect(strIsInt("1,000")).toBe(true);
    expect(strIsInt("3.5")).toBe(false);
    expect(strIsInt("6/2")).toBe(false); // not a float literal
  });
  it("split_tuple: outer ()[] with no inner brackets, split on commas", () => {
    expect(splitTuple("(1,2)")).toEqual(["1", "2"]);
    expect(splitTuple("[1,2)")).toEqual(["1", "2"]);
    expect(splitTuple("(1,000,2)")).toEqual(["1000", "2"]); // thousands commas first
    expect(splitTuple("((1,2))")).toEqual(["((1,2))"]); // inner brackets: one element
    expect(splitTuple("()")).toEqual(["()"]); // needs more than 2 chars
    expect(splitTuple("")).toEqual([]);
  });
});

describe("grade_answer_sympy", () => {
  it("symbolically equal expressions", () => expect(gradeAnswerSympy("x+1", "1+x")).toBe(true));
  it("reducible fractions are not equal (exact string rule)", () => {
    expect(gradeAnswerSympy("\\frac{2}{4}", "\\frac{1}{2}")).toBe(false);
  });
  it("an empty given answer is wrong", () => expect(gradeAnswerSympy("", "1")).toBe(false));
  it("a one-element truth does not constrain brackets", () => {
    // '(5)' splits to ['5'], truth '5' to ['5']: equal element-wise
    expect(gradeAnswerSympy("(5)", "5")).toBe(true);
  });
});
