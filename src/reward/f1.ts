/**
 * slime `f1.py`, rm_type `f1`: SQuAD-style token F1 between the response and
 * the label, in [0, 1].
 *
 * Normalisation, in SQuAD's order: lowercase, delete punctuation (deleted,
 * not replaced by a space: `quick-brown` → `quickbrown`), replace the words
 * `a`/`an`/`the` by a space, collapse whitespace. If either side normalises
 * to `yes`, `no` or `noanswer`, the two must be identical, else 0.
 * A non-string label is `str()`-ed first (slime would raise on it).
 */

import { pyStr } from "./python-compat.ts";
import type { RewardInput } from "./reward-input.ts";

const PUNCTUATION = new Set(Array.from("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")); // Python string.punctuation
// Python 3's \b is Unicode-aware; JavaScript's is ASCII-only, so spell the boundaries out.
const ARTICLES = /(?<![\p{L}\p{N}_])(?:a|an|the)(?![\p{L}\p{N}_])/gu;

/** SQuAD `normalize_answer`. */
export function normalizeAnswer(s: string): string {
  const lower = s.toLowerCase();
  const noPunct = Array.from(lower)
    .filter((ch) => !PUNCTUATION.has(ch))
    .join("");
  const noArticles = noPunct.replace(ARTICLES, " ");
  return noArticles
    .split(/\s+/u)
    .filter((t) => t !== "")
    .join(" ");
}

export interface F1Score {
  f1: number;
  precision: number;
  recall: number;
}

const ZERO: F1Score = { f1: 0, precision: 0, recall: 0 };
const SPECIAL = new Set(["yes", "no", "noanswer"]);

/** slime `f1_score(prediction, ground_truth)`; a null prediction scores 0. */
export function f1Score(prediction: string | null, groundTruth: string): F1Score {
  if (prediction === null) return ZERO;
  const pred = normalizeAnswer(prediction);
  const gt = normalizeAnswer(groundTruth);
  if ((SPECIAL.has(pred) || SPECIAL.has(gt)) && pred !== gt) return ZERO;

  const predTokens = pred.split(" ").filter((t) => t !== "");
  const gtTokens = gt.split(" ").filter((t) => t !== "");
  const gtCounts = new Map<string, number>();
  for (const t of gtTokens) gtCounts.set(t, (gtCounts.get(t) ?? 0) + 1);
  let numSame = 0;
  for (const t of predTokens) {
    const left = gtCounts.get(t) ?? 0;
    if (left > 0) {
      numSame += 1;
      gtCounts.set(t, left - 1);
    }
  }
  if (numSame === 0) return ZERO;
  const precision = numSame / predTokens.length;
  const recall = numSame / gtTokens.length;
  return { f1: (2 * precision * recall) / (precision + recall), precision, recall };
}

/** rm_type `f1`: the F1 of the response against `str(label)`. */
export function f1Reward(input: RewardInput): number {
  return f1Score(input.response, pyStr(input.label)).f1;
}
