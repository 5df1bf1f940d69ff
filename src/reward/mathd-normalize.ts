/**
 * The "mathd" half of slime's math grader: Hendrycks' `_strip_string`
 * normalisation followed by exact string equality (`grade_answer_mathd`).
 * Every step below is in slime's order; reordering changes results (the
 * leading-zero fix must run before the `0.5` special case, for example).
 */

import { pyInt } from "./python-compat.ts";

/** Thrown by a step where Python would raise; `mathdNormalizeAnswer` then keeps the input as is. */
class StripError extends Error {}

const TEXT_WRAPPED = /^\\text\{(.+?)\}(?=\n?$)/;

/** slime `mathd_normalize_answer`: strip, unwrap a whole-string `\text{...}`, `_strip_string`. */
export function mathdNormalizeAnswer(answer: string | null): string | null {
  if (answer === null) return null;
  let a = answer.trim();
  try {
    const m = TEXT_WRAPPED.exec(a);
    if (m !== null) a = (m[1] ?? "").trim();
    return stripString(a);
  } catch (e) {
    // Python: `except Exception: return answer` (the stripped, unwrapped text).
    if (e instanceof StripError) return a;
    throw e;
  }
}

/** `\frac12` → `\frac{1}{2}`, `\frac1{72}` → `\frac{1}{72}`; gives up (returns its input) on `\frac1`. */
function fixFracs(string: string): string {
  const substrs = string.split("\\frac");
  let newStr = substrs[0] ?? "";
  for (const substr of substrs.slice(1)) {
    newStr += "\\frac";
    if (substr.length === 0) throw new StripError("\\frac at end of string"); // Python: substr[0] IndexError
    if (substr[0] === "{") {
      newStr += substr;
      continue;
    }
    if (substr.length < 2) return string;
    const a = substr[0];
    const b = substr[1];
    const post = substr.slice(2);
    newStr += b !== "{" ? `{${a}}{${b}}${post}` : `{${a}}${b}${post}`;
  }
  return newStr;
}

/** `3/4` → `\frac{3}{4}` only for canonical integers (`03/4` and `+3/4` stay). */
function fixASlashB(string: string): string {
  const parts = string.split("/");
  if (parts.length !== 2) return string;
  const a = pyInt(parts[0] ?? "");
  const b = pyInt(parts[1] ?? "");
  if (a === null || b === null || string !== `${a}/${b}`) return string;
  return `\\frac{${a}}{${b}}`;
}

/** `\text{ ` (with the space) only ever introduces units: keep what precedes it. */
function removeRightUnits(string: string): string {
  if (!string.includes("\\text{ ")) return string;
  const splits = string.split("\\text{ ");
  if (splits.length !== 2) throw new StripError("more than one '\\text{ '"); // Python: assert len(splits) == 2
  return splits[0] ?? "";
}

/** `\sqrt3` → `\sqrt{3}`. */
function fixSqrt(string: string): string {
  if (!string.includes("\\sqrt")) return string;
  const splits = string.split("\\sqrt");
  let out = splits[0] ?? "";
  for (const split of splits.slice(1)) {
    if (split.length === 0) throw new StripError("\\sqrt at end of string"); // Python: split[0] IndexError
    out += split[0] !== "{" ? `\\sqrt{${split[0]}}${split.slice(1)}` : `\\sqrt${split}`;
  }
  return out;
}

/** slime/Hendrycks `_strip_string`, step for step. */
export function stripString(input: string): string {
  let s = input.replaceAll("\n", "");
  s = s.replaceAll("\\!", "");
  s = s.replaceAll("\\\\", "\\");
  s = s.replaceAll("tfrac", "frac").replaceAll("dfrac", "frac");
  s = s.replaceAll("\\left", "").replaceAll("\\right", "");
  s = s.replaceAll("^{\\circ}", "").replaceAll("^\\circ", "");
  s = s.replaceAll("\\$", "");
  s = removeRightUnits(s);
  s = s.replaceAll("\\%", "");
  s = s.replaceAll(" .", " 0.").replaceAll("{.", "{0.");
  if (s.length === 0) return s;
  if (s[0] === ".") s = "0" + s;
  const eq = s.split("=");
  if (eq.length === 2 && (eq[0] ?? "").length <= 2) s = eq[1] ?? "";
  s = fixSqrt(s);
  s = s.replaceAll(" ", "");
  s = fixFracs(s);
  if (s === "0.5") s = "\\frac{1}{2}";
  s = fixASlashB(s);
  return s;
}

/** slime `grade_answer_mathd`: equal after `mathd_normalize_answer` on both sides. */
export function gradeAnswerMathd(givenAnswer: string | null, groundTruth: string | null): boolean {
  return mathdNormalizeAnswer(groundTruth) === mathdNormalizeAnswer(givenAnswer);
}
