/**
 * `\boxed{}` extraction exactly as slime's `math_utils.py` does it (the math,
 * deepscaler and `boxed_` paths all go through here).
 *
 * Rules kept on purpose, each pinned by a test:
 * - only the LAST `\boxed` counts (`rfind`);
 * - braces are counted from that `\boxed`; if they never balance, nothing is
 *   extracted (an unterminated box scores 0, it does not throw);
 * - the extracted span must start with exactly `\boxed{` and end with `}`:
 *   `\boxed 5` has no braces and yields nothing;
 * - `extract_answer` requires the substring `\boxed`, so the `\fbox` fallback
 *   inside `last_boxed_only_string` is unreachable from the graders.
 */

/** slime `last_boxed_only_string`: the last `\boxed{...}` (or `\fbox`) span, or null. */
export function lastBoxedOnlyString(text: string): string | null {
  let idx = text.lastIndexOf("\\boxed");
  if (idx < 0) {
    idx = text.lastIndexOf("\\fbox");
    if (idx < 0) return null;
  }
  let open = 0;
  for (let i = idx; i < text.length; i++) {
    const ch = text[i];
    if (ch === "{") open += 1;
    if (ch === "}") {
      open -= 1;
      if (open === 0) return text.slice(idx, i + 1);
    }
  }
  return null;
}

/** slime `math_utils.remove_boxed`: the content of `\boxed{...}`, or null if the prefix/suffix is not exact. */
export function removeBoxed(s: string | null): string | null {
  const left = "\\boxed{";
  if (s === null || !s.startsWith(left) || !s.endsWith("}")) return null;
  return s.slice(left.length, -1);
}

/** slime `extract_boxed_answer`. */
export function extractBoxedAnswer(solution: string): string | null {
  return removeBoxed(lastBoxedOnlyString(solution));
}

/** slime `math_utils.extract_answer`: null unless the text contains `\boxed`. */
export function extractAnswer(passage: string): string | null {
  if (passage.includes("\\boxed")) return extractBoxedAnswer(passage);
  return null;
}
