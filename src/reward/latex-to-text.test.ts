import { describe, expect, it } from "vitest";
import { latexToText } from "./latex-to-text.ts";

// What pylatexenc 2.10 renders for these inputs (rules in latex-to-text.ts).
describe("latexToText (pylatexenc 2.10 rendering)", () => {
  it.each([
    ["\\frac{1}{2}", "1/2"],
    ["\\frac12", "1/2"], // arguments without braces are single characters
    ["\\frac{x+1}{2}", "x+1/2"], // no parentheses: pylatexenc's '%s/%s'
    ["\\sqrt{2}", "√(2)"],
    ["\\sqrt2", "√(2)"],
    ["\\sqrt[3]{8}", "√(8)"], // the root index is dropped
    ["\\pi r^2", "πr^2"], // the space after a control word is dropped
    ["x^{2}", "x^2"], // braces of a group vanish
    ["\\left( 1 \\right)", "( 1 )"], // \left and \right are unknown macros: nothing
    ["\\text{cm}", "cm"],
    ["\\mbox{cm}", ""], // known to take an argument, no text rule: swallowed
    ["\\unknownmacro{x}", "x"], // unknown macro: nothing, its braces are a plain group
    ["2\\cdot 3", "2·3"],
    ["2\\times 3", "2×3"],
    ["\\infty", "∞"],
    ["A \\cup B", "A ∪B"], // the space before is text, the one after the control word is dropped
    ["\\alpha+\\Omega", "α+Ω"],
    ["a~b", "a\u00a0b"], // ~ is a no-break space
    ["1\\,000", "1 000"], // \\, is a space
    ["x\\!y", "xy"],
    ["\\{1,2\\}", "{1,2}"],
    ["\\textcolor{red}{5}", "5"],
    ["\\hat{x}", "x"], // accents: base kept (pylatexenc adds a combining mark)
  ])("%j → %j", (latex, text) => {
    expect(latexToText(latex)).toBe(text);
  });
});
