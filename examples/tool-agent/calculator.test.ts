import { describe, expect, it } from "vitest";
import { calculate, trailingToolCall } from "./calculator.ts";

describe("calculator tool", () => {
  it("evaluates integer arithmetic with precedence and parentheses", () => {
    expect(calculate("3*4")).toBe(12);
    expect(calculate("2+3*4")).toBe(14);
    expect(calculate("(2+3)*4")).toBe(20);
    expect(calculate("7-10")).toBe(-3);
    expect(calculate("-2*-3")).toBe(6);
    expect(calculate(" 1 + 1 ")).toBe(2);
  });
  it("refuses anything that is not arithmetic", () => {
    for (const bad of ["", "3*", "()", "1.5+1", "\\boxed{3}", "3?4", "2)(3"]) expect(calculate(bad)).toBeNull();
  });
  it("finds the tool call the text ends with", () => {
    expect(trailingToolCall("12+(3*4)")).toBe("3*4");
    expect(trailingToolCall("((1+2)*3)")).toBe("(1+2)*3");
    expect(trailingToolCall("12+3")).toBeNull();
    expect(trailingToolCall("3)")).toBeNull();
  });
});
