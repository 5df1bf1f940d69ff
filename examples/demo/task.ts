import { Prng } from "../../src/model/prng.ts";
import type { Tokenizer } from "../../src/model/tokenizer.ts";

/**
 * The demo task: two-number addition, asked as `47+38=` and answered as
 * `\boxed{85}` then EOS, so slime's `math` grader (rm_type: math) scores it.
 * Shared by scripts/build-demo-checkpoint.ts (supervised warm start) and the
 * RL driver; the exact-match reward here is for our own tests and scripts.
 */
export interface ArithmeticProblem {
  input: string;
  label: string;
}

/** Every a+b with 0 <= a, b < maxOperand, in a seeded random order. */
export function allProblems(seed: number, maxOperand: number): ArithmeticProblem[] {
  const out: ArithmeticProblem[] = [];
  for (let a = 0; a < maxOperand; a++) for (let b = 0; b < maxOperand; b++) out.push({ input: `${a}+${b}=`, label: String(a + b) });
  const rng = new Prng(seed);
  for (let i = out.length - 1; i > 0; i--) {
    const j = rng.nextInt(i + 1);
    [out[i], out[j]] = [out[j] as ArithmeticProblem, out[i] as ArithmeticProblem];
  }
  return out;
}

/** The response text the model is trained to produce. */
export function formatAnswer(label: string): string {
  return `\\boxed{${label}}`;
}

/** Response token ids: the boxed answer followed by EOS. */
export function answerTokens(tokenizer: Tokenizer, label: string): number[] {
  return [...tokenizer.encode(formatAnswer(label)), tokenizer.eosId];
}

/** 1 when the last \boxed{...} in `response` is exactly `label`, else 0. */
export function exactBoxedReward(response: string, label: string): number {
  const start = response.lastIndexOf("\\boxed{");
  if (start < 0) return 0;
  const end = response.indexOf("}", start);
  if (end < 0) return 0;
  return response.slice(start + "\\boxed{".length, end) === label ? 1 : 0;
}
