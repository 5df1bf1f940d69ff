/**
 * Ragged per-sample arrays: the shape every function in algorithms/ speaks.
 *
 * A per-token quantity of a batch is one array per sample, each as long as that
 * sample's response (`[responseLength_i]`, possibly 0). A per-sample scalar is one
 * flat array `[numSamples]`. Inputs may be plain `number[]` (what a JSON harness
 * sends), `Float32Array` (what engines report) or `Float64Array`; masks may also
 * be `Uint8Array`. Outputs are always `Float64Array`: all math here is float64.
 */

import { RlqError } from "../lib/errors.ts";

export type Vec = ArrayLike<number>;
/** One `Vec` per sample, `[numSamples][responseLength_i]`. */
export type Ragged = readonly Vec[];

/** Error codes raised by algorithms/. All are user/programming errors: never retried. */
export const algorithmErrorCodes = {
  shape: "algo_shape_mismatch",
  missingInput: "algo_missing_input",
  badArgument: "algo_bad_argument",
  emptyMask: "algo_empty_mask",
} as const;

export function algorithmError(code: keyof typeof algorithmErrorCodes, message: string): RlqError {
  return new RlqError(algorithmErrorCodes[code], message, { isRetriable: false });
}

/** `x[i]` for an index the caller has already bounds-checked (noUncheckedIndexedAccess). */
export function at(x: Vec, i: number): number {
  return x[i] as number;
}

/** The sample's array; throws if the ragged input is shorter than the batch. */
export function row(x: Ragged, i: number, name: string): Vec {
  const r = x[i];
  if (r === undefined) throw algorithmError("shape", `${name}: no entry for sample ${i} (has ${x.length} samples)`);
  return r;
}

/** Throws unless `x` has `numSamples` rows with the same lengths as `like`. */
export function assertRaggedLike(x: Ragged, like: Ragged, name: string, likeName: string): void {
  if (x.length !== like.length) {
    throw algorithmError("shape", `${name} has ${x.length} samples, ${likeName} has ${like.length}`);
  }
  for (let i = 0; i < x.length; i++) {
    const a = row(x, i, name).length;
    const b = row(like, i, likeName).length;
    if (a !== b) throw algorithmError("shape", `${name}[${i}] has length ${a}, ${likeName}[${i}] has length ${b}`);
  }
}

export function assertLength(x: ArrayLike<unknown>, n: number, name: string): void {
  if (x.length !== n) throw algorithmError("shape", `${name} has length ${x.length}, expected ${n}`);
}

/** Zeros shaped like `like`. */
export function zerosLike(like: Ragged): Float64Array[] {
  return like.map((r) => new Float64Array(r.length));
}

/** `Σ_t x_t m_t`. */
export function maskedSum(x: Vec, mask: Vec): number {
  let s = 0;
  for (let t = 0; t < x.length; t++) s += at(x, t) * at(mask, t);
  return s;
}

/** `Σ_t m_t`. */
export function maskSum(mask: Vec): number {
  let s = 0;
  for (let t = 0; t < mask.length; t++) s += at(mask, t);
  return s;
}

/** `Σ_t x_t m_t / max(Σ_t m_t, 1)`: slime's `masked_mean` (a fully masked row gives 0). */
export function maskedMean(x: Vec, mask: Vec): number {
  return maskedSum(x, mask) / Math.max(maskSum(mask), 1);
}

/** Converts a ragged float64 array to plain nested arrays (for JSON). */
export function raggedToArrays(x: readonly Float64Array[]): number[][] {
  return x.map((r) => Array.from(r));
}

/** Throws unless `value` is a finite number: a positional argument from plain JS never becomes NaN. */
export function assertFiniteArgument(fn: string, name: string, value: unknown): asserts value is number {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw algorithmError(
      "badArgument",
      `${fn}: ${name} must be a finite number, got ${value === undefined ? "undefined (missing argument)" : JSON.stringify(value)}`,
    );
  }
}
