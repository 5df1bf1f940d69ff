/**
 * slime `get_deepscaler_rule_based_reward(response, label)`, rm_type
 * `deepscaler`: 1 or 0.
 *
 * - The graded part is the text after the LAST `</think>`; failing that, the
 *   text between the first and second `###Response` (Python's
 *   `split("###Response")[1]`); with neither marker the reward is 0.
 * - Then the last `\boxed{}` of that part, graded as `math` does (mathd or
 *   sympy). Unlike `math`, a label of `0` is graded (only `""` scores 0), and
 *   a label with `\boxed`/`\fbox` is unwrapped (an `\fbox`-only label yields
 *   nothing, so 0).
 * - A label that is not a string, number or boolean raises (slime asserts).
 */

import { extractAnswer } from "./boxed.ts";
import { gradeAnswerMathd } from "./mathd-normalize.ts";
import { pyStr } from "./python-compat.ts";
import type { RewardInput } from "./reward-input.ts";
import { RewardError } from "./reward-result.ts";
import type { SymbolicOptions } from "./symbolic-equal.ts";
import { gradeAnswerSympy } from "./sympy-normalize.ts";

export function deepscalerReward(input: RewardInput, options: SymbolicOptions = {}): number {
  const { response, label } = input;
  let solution: string;
  if (response.includes("</think>")) solution = response.split("</think>").at(-1) ?? "";
  else if (response.includes("###Response")) solution = response.split("###Response")[1] ?? "";
  else return 0;

  const modelAnswer = extractAnswer(solution);
  if (modelAnswer === null) return 0;
  if (label === "") return 0;
  // Python's isinstance(label, (str, float, int)) also admits bool.
  if (typeof label !== "string" && typeof label !== "number" && typeof label !== "boolean") {
    throw new RewardError("invalid_label", `deepscaler needs a string or number label, got ${pyStr(label)}`);
  }
  let truth: string | null = pyStr(label);
  if (truth.includes("\\boxed") || truth.includes("\\fbox")) truth = extractAnswer(truth);
  if (truth === null) return 0;
  return gradeAnswerMathd(modelAnswer, truth) || gradeAnswerSympy(modelAnswer, truth, options) ? 1 : 0;
}
