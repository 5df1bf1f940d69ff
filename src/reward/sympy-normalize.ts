/**
 * The "sympy" half of slime's math grader (`grade_answer_sympy` in
 * math_utils.py): a second, more lenient string normalisation, then
 * tuple/interval splitting, the fraction and integer rules, and only as the
 * very last step a symbolic check (done here with Compute Engine instead of
 * sympy; see symbolic-equal.ts).
 */

import { latexToText } from "./latex-to-text.ts";
import { pyFloat, pyIntStr, pyRoundToInt } from "./python-compat.ts";
import { areEqualUnderSymbolic, type SymbolicOptions } from "./symbolic-equal.ts";
import { RlqError } from "../lib/errors.ts";

const UNITS = ["degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year", "foot", "feet", "inch", "yard"];
// Python: re.sub(f"{unit}(es)?(s)? *(\^[0-9]+)?", "", expr); `unit` is matched anywhere, even inside words.
const UNIT_PATTERNS = UNITS.map((u) => new RegExp(`${u}(es)?(s)? *(\\^[0-9]+)?`, "g"));
const TEXT_WRAPPED = /^\\text\{(.+?)\}(?=\n?$)/;
const TUPLE_CHARS = "()[]";

/** slime `_parse_latex`: pylatexenc's text rendering plus its symbol substitutions. */
function parseLatex(expr: string): string {
  let e = expr.replaceAll("\\tfrac", "\\frac").replaceAll("\\dfrac", "\\frac");
  e = e.replaceAll("\\frac", " \\frac"); // play nice with mixed numbers: 7\frac{3}{4} → "7 3/4"
  e = latexToText(e);
  e = e.replaceAll("√", "sqrt").replaceAll("π", "pi").replaceAll("∞", "inf").replaceAll("∪", "U");
  e = e.replaceAll("·", "*").replaceAll("×", "*");
  return e.trim();
}

/** slime `_is_int` on a float: within 1e-7 of round(x); false where Python's round raises. */
function isIntFloat(x: number): boolean {
  const r = pyRoundToInt(x);
  return r !== null && Math.abs(x - r) <= 1e-7;
}

/** slime `_is_frac`: `-?digits` + any char? + `/` + `0*[1-9]digits` + any char?. */
export function isFrac(expr: string): boolean {
  return /^-?[0-9]+.?\/0*[1-9][0-9]*.?(?=\n?$)/.test(expr);
}

/** slime `_strip_properly_formatted_commas`: `1,000,000` → `1000000`, tuple commas kept. */
export function stripProperlyFormattedCommas(expr: string): string {
  const p = /(\d)(,)(\d\d\d)($|\D)/g;
  let current = expr;
  for (;;) {
    const next = current.replace(p, "$1$3$4");
    if (next === current) return next;
    current = next;
  }
}

/** slime `_str_is_int`. */
export function strIsInt(x: string): boolean {
  const f = pyFloat(stripProperlyFormattedCommas(x));
  return f !== null && isIntFloat(f);
}

/** slime `_str_to_int`: int(float(x without commas)), i.e. TRUNCATION (`1.99999999` → 1). */
function strToInt(x: string): string {
  const f = pyFloat(x.replaceAll(",", ""));
  if (f === null || !Number.isFinite(f)) throw new RlqError("invariant_violated", `not an int: ${x}`); // unreachable after strIsInt
  return pyIntStr(f);
}

/** slime `_normalize` (sympy side), step for step. null in, null out. */
export function normalizeSympy(input: string | null): string | null {
  if (input === null) return null;
  let e = input;
  const m = TEXT_WRAPPED.exec(e);
  if (m !== null) e = m[1] ?? "";
  e = e.replaceAll("\\%", "%").replaceAll("\\$", "$").replaceAll("$", "").replaceAll("%", "");
  e = e.replaceAll(" or ", " , ").replaceAll(" and ", " , ");
  e = e.replaceAll("million", "*10^6").replaceAll("billion", "*10^9").replaceAll("trillion", "*10^12");
  for (const p of UNIT_PATTERNS) e = e.replace(p, "");
  e = e.replace(/\^ *\\circ/g, "");
  if (e.length > 0 && e[0] === "{" && e[e.length - 1] === "}") e = e.slice(1, -1);
  e = e.replace(/,\\! */g, "");
  const f = pyFloat(e);
  if (f !== null && isIntFloat(f)) e = BigInt(pyRoundToInt(f) ?? 0).toString();
  if (e.includes("\\")) e = parseLatex(e);
  e = e.replace(/- */g, "-");
  e = e.replace(/([0-9]) +([0-9])/g, "$1+$2"); // mixed numbers: "7 3/4" → "7+3/4"
  e = e.replaceAll(" ", "");
  e = e.replaceAll("{", "").replaceAll("}", "");
  e = e.toLowerCase();
  if (strIsInt(e)) e = strToInt(e);
  return e;
}

/** slime `split_tuple`: `(a,b)` / `[a,b)` → elements; anything else is one element. */
export function splitTuple(input: string): string[] {
  const expr = stripProperlyFormattedCommas(input);
  if (expr.length === 0) return [];
  const inner = expr.slice(1, -1);
  if (
    expr.length > 2 &&
    TUPLE_CHARS.includes(expr[0] as string) &&
    TUPLE_CHARS.includes(expr[expr.length - 1] as string) &&
    [...TUPLE_CHARS].every((ch) => !inner.includes(ch))
  ) {
    return inner.split(",").map((x) => x.trim());
  }
  return [expr];
}

/**
 * slime `grade_answer_sympy`. Per element: both fractions → exact string
 * equality (an unreduced fraction is wrong); exactly one side an integer →
 * wrong (an integer ground truth needs an integer answer); otherwise the
 * guarded symbolic check.
 */
export function gradeAnswerSympy(givenAnswer: string | null, groundTruth: string | null, options: SymbolicOptions = {}): boolean {
  const gt = normalizeSympy(groundTruth);
  const given = normalizeSympy(givenAnswer);
  if (gt === null || given === null) return false;
  if (gt === given) return true;
  if (given.length === 0) return false;

  const gtElems = splitTuple(gt);
  const givenElems = splitTuple(given);
  // With more than one element the bracket types must match: (1,2) is not [1,2].
  if (gtElems.length > 1 && (gt[0] !== given[0] || gt[gt.length - 1] !== given[given.length - 1])) return false;
  if (gtElems.length !== givenElems.length) return false;

  let isCorrect = false;
  for (let i = 0; i < gtElems.length; i++) {
    const g = gtElems[i] as string;
    const a = givenElems[i] as string;
    if (isFrac(g) && isFrac(a)) isCorrect = g === a;
    else if (strIsInt(g) !== strIsInt(a)) isCorrect = false;
    else isCorrect = areEqualUnderSymbolic(g, a, options);
    if (!isCorrect) break;
  }
  return isCorrect;
}
