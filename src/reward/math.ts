/**
 * slime `grade_answer_verl(solution, label)`, the `math` rm_type:
 *
 * 1. a falsy label (`""`, `null`, `0`, `false`) is never matched;
 *    otherwise `str(label)`; a label containing `\boxed` is replaced by its
 *    last boxed content;
 * 2. the answer is the content of the LAST `\boxed{}` of the response; no
 *    box (or `\boxed 5`, or unbalanced braces) → wrong. There is no `####`
 *    and no `Answer:` handling;
 * 3. correct iff `grade_answer_mathd` or `grade_answer_sympy`.
 */

import { extractAnswer } from "./boxed.ts";
import { gradeAnswerMathd } from "./mathd-normalize.ts";
import { pyIsFalsy, pyStr } from "./python-compat.ts";
import type { RewardInput } from "./reward-input.ts";
import type { SymbolicOptions } from "./symbolic-equal.ts";
import { gradeAnswerSympy } from "./sympy-normalize.ts";

export function gradeAnswerVerl(solution: string, label: unknown, options: SymbolicOptions = {}): boolean {
  if (pyIsFalsy(label)) return false;
  let groundTruth: string | null = pyStr(label);
  if (groundTruth.includes("\\boxed")) groundTruth = extractAnswer(groundTruth);
  const given = extractAnswer(solution);
  if (given === null) return false;
  return gradeAnswerMathd(given, groundTruth) || gradeAnswerSympy(given, groundTruth, options);
}

/** rm_type `math`: 1 or 0. */
export function mathReward(input: RewardInput, options: SymbolicOptions = {}): number {
  return gradeAnswerVerl(input.response, input.label, options) ? 1 : 0;
}
