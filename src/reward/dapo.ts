/**
 * slime `math_dapo_utils.compute_score`, rm_type `dapo` (DAPO's Minerva-style
 * checker). Returns `{score: 1 | -1, acc: 1 | 0, pred}`: train on it with
 * `reward_key: score`. slime returns `acc` as a Python bool; rlq stores it as
 * 1/0 so that it is a numeric component like the others.
 *
 * - only the last 300 characters of the response are read;
 * - the prediction is the LAST `Answer: ...` (case-insensitive, up to the end
 *   of the line), normalised by `normalizeFinalAnswer`; no match → `[INVALID]`;
 * - the label is normalised the same way and then must be a number:
 *   `str(int(float(label)))` (DAPO's answers are integers). A label that is
 *   not a number raises, as in slime.
 */

import { pyFloat, pyIntStr, pyIsDigitString, pyStr, pyTailCodePoints } from "./python-compat.ts";
import type { RewardInput } from "./reward-input.ts";
import { RewardError, type RewardComponents } from "./reward-result.ts";

const SUBSTITUTIONS: ReadonlyArray<readonly [string, string]> = [
  ["an ", ""],
  ["a ", ""],
  [".$", "$"],
  ["\\$", ""],
  ["\\ ", ""],
  [" ", ""],
  ["mbox", "text"],
  [",\\text{and}", ","],
  ["\\text{and}", ","],
  ["\\text{m}", "\\text{}"],
];

const REMOVED_EXPRESSIONS = [
  "square",
  "ways",
  "integers",
  "dollars",
  "mph",
  "inches",
  "hours",
  "km",
  "units",
  "\\ldots",
  "sue",
  "points",
  "feet",
  "minutes",
  "digits",
  "cents",
  "degrees",
  "cm",
  "gm",
  "pounds",
  "meters",
  "meals",
  "edges",
  "students",
  "childrentickets",
  "multiples",
  "\\text{s}",
  "\\text{.}",
  "\\text{\ns}",
  "\\text{}^2",
  "\\text{}^3",
  "\\text{\n}",
  "\\text{}",
  "\\mathrm{th}",
  "^\\circ",
  "^{\\circ}",
  "\\;",
  ",\\!",
  "{,}",
  '"',
  "\\dots",
  "<|im_end|>",
  "<|endoftext|>",
];

/** slime `normalize_final_answer` (DAPO), step for step. */
export function normalizeFinalAnswer(finalAnswer: string): string {
  let s = finalAnswer.split("=").at(-1) ?? "";
  for (const [before, after] of SUBSTITUTIONS) s = s.replaceAll(before, after);
  for (const expr of REMOVED_EXPRESSIONS) s = s.replaceAll(expr, "");
  s = s.replace(/(.*?)(\$)(.*?)(\$)(.*)/g, (_m, _a, _b, inner: string) => `$${inner}$`);
  s = s.replace(/(\\text\{)(.*?)(\})/g, "$2");
  s = s.replace(/(\\textbf\{)(.*?)(\})/g, "$2");
  s = s.replace(/(\\overline\{)(.*?)(\})/g, "$2");
  s = s.replace(/(\\boxed\{)(.*)(\})/g, "$2");
  s = s.replace(/(frac)([^{])(.)/g, "frac{$2}{$3}");
  s = s.replace(/(sqrt)([^{])/g, "sqrt{$2}");
  s = s.replaceAll("$", "");
  if (pyIsDigitString(s.replaceAll(",", ""))) s = s.replaceAll(",", "");
  return s.trim();
}

/** slime dapo `last_boxed_only_string`: needs the literal `\boxed{` (no `\fbox`). */
function lastBoxedOnlyString(text: string): string | null {
  const idx = text.lastIndexOf("\\boxed{");
  if (idx < 0) return null;
  let open = 0;
  for (let i = idx; i < text.length; i++) {
    if (text[i] === "{") open += 1;
    if (text[i] === "}") {
      open -= 1;
      if (open === 0) return text.slice(idx, i + 1);
    }
  }
  return null;
}

/** `str(int(float(normalize_final_answer(gt))))`, or a RewardError where Python raises. */
function integerGroundTruth(label: unknown): string {
  const normalized = normalizeFinalAnswer(pyStr(label));
  const f = pyFloat(normalized);
  if (f === null || !Number.isFinite(f)) {
    throw new RewardError("invalid_label", `dapo needs a numeric label (it compares str(int(float(label)))); got ${JSON.stringify(pyStr(label))}`);
  }
  return pyIntStr(f);
}

/** slime `is_correct_minerva`: [isCorrect, normalizedPrediction]. */
export function isCorrectMinerva(solution: string, label: unknown): [boolean, string] {
  const matches = [...solution.matchAll(/Answer\s*:\s*([^\n]+)/gi)];
  const extracted = matches.at(-1)?.[1] ?? "[INVALID]";
  const pred = normalizeFinalAnswer(extracted);
  return [pred === integerGroundTruth(label), pred];
}

/** slime `is_correct_strict_box`: the last `\boxed{}` of the last 100 characters must equal the label exactly. */
export function isCorrectStrictBox(pred: string, gt: string): [1 | -1, string | null] {
  const boxed = lastBoxedOnlyString(pyTailCodePoints(pred, 100));
  const extracted = boxed === null ? null : boxed.slice("\\boxed{".length, -1);
  return [extracted === gt ? 1 : -1, extracted];
}

export interface DapoOptions {
  /** slime's `strict_box_verify` (off for rm_type `dapo`). */
  strictBoxVerify?: boolean;
}

/** slime `compute_score` (DAPO). */
export function dapoComputeScore(solution: string, label: unknown, options: DapoOptions = {}): RewardComponents {
  const tail = pyTailCodePoints(solution, 300); // "The longest answer in MATH-500 has 159 characters"
  let correct: boolean;
  let pred: string | null;
  if (options.strictBoxVerify === true) {
    const [score, extracted] = isCorrectStrictBox(tail, pyStr(label));
    correct = score === 1;
    pred = extracted;
  } else {
    [correct, pred] = isCorrectMinerva(tail, label);
  }
  const out: RewardComponents = { score: correct ? 1.0 : -1.0, acc: correct ? 1 : 0 };
  if (pred !== null) out.pred = pred;
  return out;
}

/** rm_type `dapo`. */
export function dapoReward(input: RewardInput): RewardComponents {
  return dapoComputeScore(input.response, input.label);
}
