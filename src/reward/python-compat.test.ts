import { describe, expect, it } from "vitest";
import { pyFloat, pyFloatRepr, pyInt, pyIsFalsy, pyRound, pyRoundToInt, pyStr, pyTailCodePoints } from "./python-compat.ts";

describe("pyFloat (Python float(str))", () => {
  it.each([
    ["1_000", 1000], // underscores between digits are allowed
    [" 12 ", 12], // surrounding whitespace is allowed
    [".5", 0.5],
    ["5.", 5],
    ["1e5", 100000],
    ["-2.5E-1", -0.25],
    ["inf", Infinity],
    ["-Infinity", -Infinity],
  ] as const)("float(%j) = %d", (s, v) => {
    expect(pyFloat(s)).toBe(v);
  });
  it("nan parses to NaN", () => expect(pyFloat("NaN")).toBeNaN());
  it.each(["1,000", "", "_1", "1__0", "1_", "0x10", "1/2", "five"])("float(%j) raises → null", (s) => {
    expect(pyFloat(s)).toBeNull();
  });
});

describe("pyRoundToInt (Python round(x)), ties to even", () => {
  it.each([
    [2.5, 2],
    [3.5, 4],
    [-2.5, -2],
    [0.5, 0],
    [1.5, 2],
    [2.4999, 2],
  ] as const)("round(%d) = %d", (x, r) => expect(pyRoundToInt(x)).toBe(r));
  it("inf and nan raise in Python → null", () => {
    expect(pyRoundToInt(Infinity)).toBeNull();
    expect(pyRoundToInt(Number.NaN)).toBeNull();
  });
});

describe("pyRound (Python round(x, n)) on the exact binary value", () => {
  it.each([
    [0.25, 1, 0.2], // 0.25 is exact: a true tie, to even → 0.2 (toFixed would say 0.3)
    [0.75, 1, 0.8], // exact tie, to even → 0.8
    [0.35, 1, 0.3], // 0.35 is stored as 0.34999… → 0.3 (Math.round(3.5)/10 would say 0.4)
    [0.15, 1, 0.1], // 0.15 is stored as 0.14999… → 0.1
    [2.675, 2, 2.67], // the classic: stored as 2.67499…
    [-0.25, 1, -0.2],
    [12345.678, 1, 12345.7],
    [1e16, 1, 1e16],
  ] as const)("round(%d, %d) = %d", (x, n, r) => expect(pyRound(x, n)).toBe(r));
  it("keeps a negative zero, as Python does for round(-0.04, 1)", () => {
    expect(Object.is(pyRound(-0.04, 1), -0)).toBe(true);
  });
});

describe("pyFloatRepr (Python str(float))", () => {
  it.each([
    [1, "1.0"],
    [0, "0.0"],
    [-0, "-0.0"],
    [0.1, "0.1"],
    [-1, "-1.0"],
    [123.456, "123.456"],
    [1e15, "1000000000000000.0"], // exponent 15: still fixed
    [1e16, "1e+16"], // exponent 16: scientific, sign and 2-digit exponent
    [1.5e16, "1.5e+16"],
    [0.0001, "0.0001"], // exponent -4: fixed
    [0.00001, "1e-05"], // exponent -5: scientific
    [1.2345e-7, "1.2345e-07"],
    [1e100, "1e+100"],
    [Number.NaN, "nan"],
    [Infinity, "inf"],
    [-Infinity, "-inf"],
  ] as const)("str(%d) = %s", (x, s) => expect(pyFloatRepr(x)).toBe(s));
});

describe("pyStr / pyIsFalsy / pyInt / pyTailCodePoints", () => {
  it("prints JSON scalars as Python's str would (integral numbers as ints)", () => {
    expect(pyStr("a")).toBe("a");
    expect(pyStr(42)).toBe("42");
    expect(pyStr(42.5)).toBe("42.5");
    expect(pyStr(1e21)).toBe("1000000000000000000000"); // a Python int prints every digit
    expect(pyStr(true)).toBe("True");
    expect(pyStr(null)).toBe("None");
  });
  it("Python truthiness: 0, '', None, False, [] and {} are falsy; NaN is truthy", () => {
    for (const v of [0, "", null, undefined, false, [], {}]) expect(pyIsFalsy(v)).toBe(true);
    for (const v of ["0", 1, -1, Number.NaN, [0], { a: 1 }, true]) expect(pyIsFalsy(v)).toBe(false);
  });
  it("int(str) accepts a sign and underscores, rejects the rest", () => {
    expect(pyInt("-3")).toBe(-3n);
    expect(pyInt("+3")).toBe(3n);
    expect(pyInt("1_0")).toBe(10n);
    expect(pyInt("3.0")).toBeNull();
    expect(pyInt("")).toBeNull();
  });
  it("slices by code points, as Python does", () => {
    expect(pyTailCodePoints("ab😀", 1)).toBe("😀"); // one code point, two UTF-16 units
    expect(pyTailCodePoints("abc", 5)).toBe("abc");
  });
});
