/**
 * The last step of slime's math grader, `are_equal_under_sympy(gt, given)`:
 * `sympy.simplify(gt - given) == 0`, behind slime's guards. Here the
 * difference is simplified by Compute Engine (@cortex-js/compute-engine)
 * instead of sympy.
 *
 * Guards, as in slime (checked on the string `(gt)-(given)`):
 * - more than 2 distinct letters (after deleting `sqrt` and `frac`) → skip;
 * - the substrings `^{` or `^(` → skip;
 * - `^` followed by 2+ digits, or `^digits^` → skip.
 * Plus a wall-clock limit (`timeLimitMs`) that sympy does not have: a
 * simplification that runs past it counts as "not equal". That is the one
 * place where a reward can depend on machine load; the default is generous.
 *
 * Equal means: the simplified difference is structurally 0, or its
 * `Together` form is 0 or a fraction with numerator 0. No numeric sampling
 * (CE's `isIdenticallyEqual` samples random points), so a verdict replays.
 * Arithmetic is at machine precision, like sympy's 15-digit Floats:
 * `0.1+0.2` vs `0.3` is not equal in either.
 */

import { createRequire } from "node:module";
import type { ComputeEngine, MathJsonExpression } from "@cortex-js/compute-engine";
import { pyIsAlphaChar } from "./python-compat.ts";
import { parseSympyText, type MathJson } from "./sympy-expr.ts";

export interface SymbolicOptions {
  /** Wall-clock limit for one simplification, in ms. Default 2000. */
  timeLimitMs?: number;
}

export const DEFAULT_SYMBOLIC_TIME_LIMIT_MS = 2000;

export type SymbolicOutcome = "equal" | "not_equal" | "guarded" | "unparseable" | "timeout" | "error";

const BAD_SUBSTRINGS = ["^{", "^("];
const BAD_REGEXES = [/\^[0-9]+\^/, /\^[0-9][0-9]+/];

/** slime `count_unknown_letters_in_expr`: distinct letters once `sqrt` and `frac` are deleted. */
export function countUnknownLettersInExpr(expr: string): number {
  const rest = expr.replaceAll("sqrt", "").replaceAll("frac", "");
  return new Set(Array.from(rest).filter(pyIsAlphaChar)).size;
}

/** slime `should_allow_eval`. */
export function shouldAllowEval(expr: string): boolean {
  if (countUnknownLettersInExpr(expr) > 2) return false;
  if (BAD_SUBSTRINGS.some((b) => expr.includes(b))) return false;
  return !BAD_REGEXES.some((r) => r.test(expr));
}

type ComputeEngineModule = typeof import("@cortex-js/compute-engine");

let lib: ComputeEngineModule | undefined;
let engine: ComputeEngine | undefined;

/**
 * Compute Engine is loaded on the first symbolic comparison, not with rlq: its 4.5 MB cost every
 * `rlq up` and `rlq worker` start ~0.25 s (bench/recovery.ts measures restart from spawn), and
 * only a math reward that reaches the last step of slime's grader needs it. `require` keeps the
 * grader synchronous; the package ships a CommonJS build of the same release for it. The bundle
 * leaves the package out (scripts/bundle.mjs), so this loads it from node_modules.
 */
function computeEngine(): ComputeEngineModule {
  lib ??= createRequire(import.meta.url)("@cortex-js/compute-engine") as ComputeEngineModule;
  return lib;
}

/** One engine per process, created on first use (creating one costs ~60 ms). */
function getEngine(): ComputeEngine {
  if (engine === undefined) {
    engine = new (computeEngine().ComputeEngine)();
    // Machine floats, as sympy's default 15-digit Float arithmetic.
    engine.precision = "machine";
  }
  return engine;
}

function isZero(ce: ComputeEngine, json: MathJson): boolean {
  const diff = ce.box(json);
  if (diff.simplify().isSame(0)) return true;
  const together = ce
    .box(["Together", json] as MathJsonExpression)
    .evaluate()
    .simplify();
  if (together.isSame(0)) return true;
  return computeEngine().isFunction(together, "Divide") && together.op1.isSame(0);
}

/** `are_equal_under_sympy` with the reason for the verdict (for tests and debugging). */
export function compareSymbolically(groundTruth: string, given: string, options: SymbolicOptions = {}): SymbolicOutcome {
  if (!shouldAllowEval(`(${groundTruth})-(${given})`)) return "guarded";
  const a = parseSympyText(groundTruth);
  const b = parseSympyText(given);
  if (a === null || b === null) return "unparseable";
  const ce = getEngine();
  const timeLimitMs = options.timeLimitMs ?? DEFAULT_SYMBOLIC_TIME_LIMIT_MS;
  // A scope per comparison: symbols declared while boxing (and any type
  // inferred for them) must not leak into the next sample's comparison.
  ce.pushScope();
  try {
    return ce.withTimeLimit(timeLimitMs, () => isZero(ce, ["Subtract", a, b])) ? "equal" : "not_equal";
  } catch (e) {
    return e instanceof computeEngine().CancellationError ? "timeout" : "error";
  } finally {
    ce.popScope();
  }
}

/** slime `are_equal_under_sympy`: true only when the guarded symbolic check proves equality. */
export function areEqualUnderSymbolic(groundTruth: string, given: string, options: SymbolicOptions = {}): boolean {
  return compareSymbolically(groundTruth, given, options) === "equal";
}
