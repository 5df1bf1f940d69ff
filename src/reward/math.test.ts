import { describe, expect, it } from "vitest";
import { gradeAnswerVerl, mathReward } from "./math.ts";

/**
 * rm_type `math` (slime `grade_answer_verl`) on a broad table. Each row says
 * which rule decides it; "mathd" means the Hendrycks `_strip_string`
 * normalisation makes both sides the same string, "sympy" means the second
 * normalisation (`_normalize`) and its element rules decide, "symbolic" means
 * the final guarded simplification of `gt - given` decides.
 */
const B = (s: string): string => `So the final answer is \\boxed{${s}}.`;

type Row = readonly [name: string, response: string, label: unknown, expected: 0 | 1];

const rows: readonly Row[] = [
  // --- extraction: only the LAST \boxed{...} counts, braces must balance
  ["no box at all → 0 (no 'Answer:' handling)", "Answer: 5", "5", 0],
  ["GSM8K '####' is not read → 0", "#### 5", "5", 0],
  ["plain text answer without a box → 0", "The answer is 5", 5, 0],
  ["\\boxed without braces → 0 (remove_boxed needs the exact prefix '\\boxed{')", "\\boxed 5", "5", 0],
  ["unterminated box → braces never balance → 0", "\\boxed{3", "3", 0],
  ["two boxes: the last one (5) is graded → 1", "\\boxed{4} then \\boxed{5}", "5", 1],
  ["two boxes: the first one (4) is ignored → 0", "\\boxed{4} then \\boxed{5}", "4", 0],
  ["nested box: rfind finds the inner \\boxed{3} → 1", "\\boxed{\\boxed{3}}", "3", 1],
  ["empty box: given '' never matches → 0", B(""), "5", 0],
  ["label itself boxed: replaced by its content '5' → 1", B("5"), "\\boxed{5}", 1],

  // --- falsy labels: `if not label: return False`
  ["label 0 (a number) is falsy → 0 even for \\boxed{0}", B("0"), 0, 0],
  ["label '0' (a string) is truthy → graded → 1", B("0"), "0", 1],
  ["label null → 0", B("5"), null, 0],
  ["label '' → 0", B(""), "", 0],

  // --- fractions and decimals
  ["\\frac{1}{2} vs 0.5: mathd turns the exact string '0.5' into \\frac{1}{2} → 1", B("\\frac{1}{2}"), "0.5", 1],
  ["label as a number 0.5: str(0.5) = '0.5', same as above → 1", B("\\frac{1}{2}"), 0.5, 1],
  [".5 vs \\frac12: mathd adds the leading 0, then 0.5 → \\frac{1}{2}; \\frac12 → \\frac{1}{2} → 1", B(".5"), "\\frac12", 1],
  ["\\dfrac{3}{4} vs 3/4: mathd dfrac→frac, and 3/4 → \\frac{3}{4} → 1", B("\\dfrac{3}{4}"), "3/4", 1],
  ["\\frac{3}{4} vs 0.75: sympy '3/4' vs '0.75' (0.75 is no a/b fraction), symbolic 0.75-3/4 = 0 → 1", B("\\frac{3}{4}"), "0.75", 1],
  ["unreduced \\frac{2}{4} vs \\frac{1}{2}: both a/b fractions → exact string compare '2/4' ≠ '1/2' → 0", B("\\frac{2}{4}"), "\\frac{1}{2}", 0],
  ["6/2 vs 3: integer ground truth needs an integer answer ('6/2' is not an int) → 0", B("6/2"), "3", 0],
  ["\\frac{6}{2} vs 3: the same rule in LaTeX form → 0", B("\\frac{6}{2}"), "3", 0],
  ["3 vs \\frac{6}{2}: only the given side is an int → 0", B("3"), "\\frac{6}{2}", 0],
  ["0.50 vs 0.5: sympy, neither an int, symbolic 0.5-0.50 = 0 → 1", B("0.50"), "0.5", 1],
  ["2.0 vs 2: sympy turns the integral float '2.0' into '2' → 1", B("2.0"), "2", 1],
  ["3.14 vs \\pi: symbolic pi-3.14 ≠ 0 → 0", B("3.14"), "\\pi", 0],

  // --- mixed numbers
  ["7 3/4 vs 7\\frac{3}{4}: sympy injects '+' between '7' and '3' on both sides: '7+3/4' → 1", B("7 3/4"), "7\\frac{3}{4}", 1],
  ["7\\frac{3}{4} vs 31/4: sympy '7+3/4' vs '31/4', symbolic 31/4-(7+3/4) = 0 → 1", B("7\\frac{3}{4}"), "31/4", 1],

  // --- negative numbers
  ["-5 vs -5 → 1", B("-5"), "-5", 1],
  ["'- 5' vs -5: mathd removes spaces → 1", B("- 5"), "-5", 1],
  ["-\\frac{1}{2} vs -0.5: sympy '-1/2' vs '-0.5', symbolic → 1", B("-\\frac{1}{2}"), "-0.5", 1],

  // --- thousands separators
  ["1,000 vs 1000: sympy strips well-formed thousands commas → 1", B("1,000"), "1000", 1],
  ["1,000 vs label number 1000 → 1", B("1,000"), 1000, 1],
  ["1,234,567 vs 1234567 → 1", B("1,234,567"), "1234567", 1],
  ["1,23 (not a thousands group) stays '1,23', not an int, while 123 is → 0", B("1,23"), "123", 0],

  // --- units, dollars, percent, degrees
  ["5\\text{ cm} vs 5: mathd keeps what precedes '\\text{ ' → 1", B("5\\text{ cm}"), "5", 1],
  ["5 meters vs 5: sympy deletes the unit word 'meter(s)' → 1", B("5 meters"), "5", 1],
  ["\\$5 vs 5: mathd removes '\\$' → 1", B("\\$5"), "5", 1],
  ["\\$1,000 vs 1000: mathd leaves '1,000'; sympy drops '$' and the comma → 1", B("\\$1,000"), "1000", 1],
  ["10\\% vs 10: mathd removes '\\%' → 1", B("10\\%"), "10", 1],
  ["50\\% vs 50 → 1", B("50\\%"), "50", 1],
  ["90^\\circ vs 90: mathd removes '^\\circ' → 1", B("90^\\circ"), "90", 1],
  ["30^{\\circ} vs 30: mathd removes '^{\\circ}' → 1", B("30^{\\circ}"), "30", 1],
  ["2 million vs 2000000: sympy makes '2*10^6', not an int, vs an int → 0", B("2 million"), "2000000", 0],

  // --- LaTeX forms
  ["x=5 vs 5: mathd keeps the right of '=' when the left has ≤ 2 chars → 1", B("x=5"), "5", 1],
  ["\\sqrt3 vs \\sqrt{3}: mathd adds the braces → 1", B("\\sqrt3"), "\\sqrt{3}", 1],
  ["\\sqrt{2}/2 vs \\frac{\\sqrt{2}}{2}: both render as 'sqrt(2)/2' in sympy → 1", B("\\sqrt{2}/2"), "\\frac{\\sqrt{2}}{2}", 1],
  ["\\frac{1}{\\sqrt{2}} vs \\frac{\\sqrt{2}}{2}: symbolic 1/sqrt(2) = sqrt(2)/2 → 1", B("\\frac{1}{\\sqrt{2}}"), "\\frac{\\sqrt{2}}{2}", 1],
  ["2\\sqrt{2} vs \\sqrt{8}: symbolic → 1", B("2\\sqrt{2}"), "\\sqrt{8}", 1],
  ["\\left(1, 2\\right) vs (1,2): mathd removes \\left/\\right and spaces → 1", B("\\left(1, 2\\right)"), "(1,2)", 1],
  ["\\infty vs \\infty → 1", B("\\infty"), "\\infty", 1],
  ["\\text{Monday} vs Monday: the whole-string \\text{} is unwrapped → 1", B("\\text{Monday}"), "Monday", 1],
  ["monday vs Monday: sympy lowercases (and deletes the unit 'day' on both sides) → 1", B("monday"), "Monday", 1],
  ["\\text{(B)} vs B: sympy '(b)' is a one-element tuple 'b', symbolic b-b = 0 → 1", B("\\text{(B)}"), "B", 1],
  ["\\frac{x+1}{2} vs \\frac{1+x}{2}: pylatexenc renders 'x+1/2' and '1+x/2' (no parentheses), which differ → 0", B("\\frac{x+1}{2}"), "\\frac{1+x}{2}", 0],

  // --- tuples and intervals
  ["(1,2) vs (1,2) → 1", B("(1,2)"), "(1,2)", 1],
  ["(1, 2) vs (1,2): mathd removes spaces → 1", B("(1, 2)"), "(1,2)", 1],
  ["(2,1) vs (1,2): element-wise, 1-2 ≠ 0 → 0", B("(2,1)"), "(1,2)", 0],
  ["[1,2) vs (1,2): bracket types must match when the truth has > 1 element → 0", B("[1,2)"), "(1,2)", 0],
  ["[\\frac{1}{2}, 3) vs [0.5,3): same brackets, 1/2 = 0.5 and 3 = 3 element-wise → 1", B("[\\frac{1}{2}, 3)"), "[0.5,3)", 1],
  ["(1,2,3) vs (1,2): element counts differ → 0", B("(1,2,3)"), "(1,2)", 0],
  ["x \\in [1,2] vs [1,2]: '∈' survives, so the strings and element counts differ → 0", B("x \\in [1,2]"), "[1,2]", 0],

  // --- variables and the symbolic guards
  ["x+1 vs 1+x: symbolic → 1", B("x+1"), "1+x", 1],
  ["2x vs x+x: implicit multiplication, symbolic → 1", B("2x"), "x+x", 1],
  ["x^2+2x+1 vs (x+1)^2: symbolic expansion → 1", B("x^2+2x+1"), "(x+1)^2", 1],
  ["a+b+c vs c+b+a: 3 distinct letters → symbolic step skipped → 0", B("a+b+c"), "c+b+a", 0],
  ["\\sqrt{2} vs 2^(1/2): '^(' guard skips the symbolic step → 0", B("\\sqrt{2}"), "2^(1/2)", 0],
  ["x^5 vs x^10/x^5: '^' followed by 2+ digits guard → 0", B("x^5"), "x^10/x^5", 0],
];

describe("math reward (slime grade_answer_verl)", () => {
  it.each(rows)("%s", (_name, response, label, expected) => {
    expect(mathReward({ response, label })).toBe(expected);
  });

  it("gradeAnswerVerl answers the same as the reward, as a boolean", () => {
    expect(gradeAnswerVerl(B("42"), "42")).toBe(true);
    expect(gradeAnswerVerl("just 42", "42")).toBe(false);
    expect(gradeAnswerVerl(B("42"), "")).toBe(false);
  });

  it("a ground truth whose \\boxed cannot be extracted matches nothing", () => {
    // '\\boxed 5' in the label: extract_answer gives None, and mathd/sympy of None never equal a string.
    expect(mathReward({ response: B("5"), label: "\\boxed 5" })).toBe(0);
  });
});
