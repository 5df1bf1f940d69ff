/**
 * slime `gpqa.py`, rm_type `gpqa`: multiple choice, 1.0 or 0.0.
 *
 * Which letter the model chose (`extractLetterFromResponse`), looking only
 * after the last `</think>`:
 * 1. the FIRST match (case-insensitive) of each pattern in turn, kept only if
 *    it is a valid letter: `(answer|option|choice) (is|:)? X`, then
 *    `X is (the)? correct`, then `final (answer|option) (is|:)? X`;
 *    a first match on an invalid letter does not look further for that pattern
 *    (`The answer is probably B` reads `P` and moves on to the next pattern);
 * 2. else the LAST standalone capital letter that is valid (case-sensitive).
 *
 * Which letter is correct: `metadata.correct_letter`; a one-letter label;
 * a numeric label as an index into the valid letters (this one overrides
 * `correct_letter`); a text label matched against `metadata.choices`.
 * Valid letters: `metadata.valid_letters`, else one per choice, else A–J.
 * Without a letter on both sides, a response that contains the correct
 * choice's text (or `metadata.correct_answer` / `answer_text`, or a text
 * label) as whole words scores 1.
 */

import { pyIsFalsy, pyStr } from "./python-compat.ts";
import type { RewardInput } from "./reward-input.ts";

const DEFAULT_VALID_LETTERS = Array.from("ABCDEFGHIJ");
const LETTER_PATTERNS = [
  /(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])/i,
  /([A-Z])\s*(?:is\s*(?:the)?\s*correct)/i,
  /final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])/i,
];

function stripChainOfThought(text: string): string {
  if (!text) return "";
  const idx = text.lastIndexOf("</think>");
  return idx < 0 ? text : text.slice(idx + "</think>".length);
}

function normalizeText(text: string): string {
  return text
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, " ")
    .trim();
}

/** Python `list(x)` for what metadata may hold: arrays as is, dicts by value, strings by character. */
function pyList(value: unknown): unknown[] | null {
  if (value === null || value === undefined) return null;
  if (Array.isArray(value)) return value;
  if (typeof value === "string") return Array.from(value);
  if (typeof value === "object") return Object.values(value);
  return null;
}

/** slime `_extract_letter_from_response`. */
export function extractLetterFromResponse(response: string | null, validLetters: readonly string[]): string | null {
  if (!response) return null;
  const text = stripChainOfThought(response);
  const valid = new Set(validLetters.map((l) => l.toUpperCase()));
  for (const pattern of LETTER_PATTERNS) {
    const letter = pattern.exec(text)?.[1]?.toUpperCase();
    if (letter !== undefined && valid.has(letter)) return letter;
  }
  // Python 3's \b is Unicode-aware: `éA` has no boundary before `A`.
  const candidates = [...text.matchAll(/(?<![\p{L}\p{N}_])([A-Z])(?![\p{L}\p{N}_])/gu)].map((m) => m[1] as string);
  for (const letter of candidates.reverse()) if (valid.has(letter)) return letter;
  return null;
}

/** slime `compute_gpqa_reward(response, label, metadata)`. */
export function computeGpqaReward(response: string | null, label: unknown, metadata: Record<string, unknown> = {}): number {
  if (response === null) return 0.0;
  const choices = pyList(metadata.choices);
  const validRaw = pyList(metadata.valid_letters);
  const validLetters =
    validRaw !== null && validRaw.length > 0
      ? validRaw.map((l) => pyStr(l).toUpperCase())
      : choices !== null && choices.length > 0
        ? DEFAULT_VALID_LETTERS.concat(Array.from("KLMNOPQRSTUVWXYZ")).slice(0, choices.length)
        : DEFAULT_VALID_LETTERS;

  let correctLetter: string | null = typeof metadata.correct_letter === "string" ? metadata.correct_letter.trim().toUpperCase() : null;
  let correctAnswer: unknown = metadata.correct_answer;
  let labelText: string | null = null;
  if (typeof label === "string") {
    labelText = label.trim();
    if (Array.from(labelText).length === 1 && validLetters.includes(labelText.toUpperCase()) && !correctLetter) {
      correctLetter = labelText.toUpperCase();
    }
  } else if (typeof label === "number" || typeof label === "boolean") {
    const idx = Math.trunc(Number(label)); // Python int(label); bool is an int there
    if (Number.isFinite(idx) && idx >= 0 && idx < validLetters.length) correctLetter = validLetters[idx] ?? null;
  }

  if (!correctLetter && choices !== null && choices.length > 0 && labelText) {
    const normalizedLabel = normalizeText(labelText);
    const idx = choices.findIndex((c) => normalizeText(pyStr(c)) === normalizedLabel);
    if (idx >= 0 && idx < validLetters.length) {
      correctLetter = validLetters[idx] ?? null;
      // slime: metadata.setdefault("correct_answer", choice); we do not mutate the caller's metadata.
      if (correctAnswer === undefined) correctAnswer = choices[idx];
    }
  }

  const extracted = extractLetterFromResponse(response, validLetters);
  if (extracted && correctLetter) return extracted === correctLetter ? 1.0 : 0.0;

  const candidates: string[] = [];
  if (correctLetter && choices !== null && choices.length > 0) {
    const idx = validLetters.indexOf(correctLetter);
    if (idx >= 0 && idx < choices.length) candidates.push(pyStr(choices[idx]));
  }
  for (const value of [correctAnswer, metadata.answer_text]) {
    if (!pyIsFalsy(value)) candidates.push(pyStr(value));
  }
  if (labelText && !(Array.from(labelText).length === 1 && validLetters.includes(labelText.toUpperCase()))) {
    candidates.push(labelText);
  }
  const targets = new Set(candidates.filter((t) => t !== "").map(normalizeText));
  const normalizedResponse = ` ${normalizeText(stripChainOfThought(response))} `;
  for (const target of targets) if (target && normalizedResponse.includes(` ${target} `)) return 1.0;

  if (extracted && !correctLetter && labelText) return extracted === labelText.trim().toUpperCase() ? 1.0 : 0.0;
  return 0.0;
}

/** rm_type `gpqa`. */
export function gpqaReward(input: RewardInput): number {
  return computeGpqaReward(input.response, input.label, input.metadata ?? {});
}
