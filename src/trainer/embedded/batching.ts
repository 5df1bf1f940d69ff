/**
 * Packs variable-length samples into the fixed [B, T] blocks the jit-compiled
 * model runs on, and maps per-token results back to per-sample response arrays.
 *
 * Row b holds tokens[0..n-2] as inputs and tokens[1..n-1] as targets, right-padded
 * (causal attention means padding never affects real positions). Response token j
 * of a sample is predicted at row position promptLength + j - 1. T is rounded up
 * to a multiple of 8 so that a few distinct shapes (= jit compilations) cover a run.
 */

import type { TrainSample } from "../trainer.ts";
import type { PackedBatch } from "./jax-model.ts";
import { RlqError } from "../../lib/errors.ts";

export const SEQ_BUCKET = 8;

export function bucketSeqLen(samples: readonly TrainSample[], contextLength: number): number {
  let longest = 1;
  for (const s of samples) longest = Math.max(longest, s.tokens.length - 1);
  return Math.min(Math.ceil(longest / SEQ_BUCKET) * SEQ_BUCKET, contextLength);
}

/** Pack `samples` (in order) into [samples.length, seqLen]. */
export function packBatch(samples: readonly TrainSample[], seqLen: number): PackedBatch {
  const b = samples.length;
  const inputIds = new Int32Array(b * seqLen);
  const targets = new Int32Array(b * seqLen);
  samples.forEach((s, row) => {
    const n = s.tokens.length;
    if (n - 1 > seqLen) throw new RlqError("trainer_bad_batch", `sample ${s.groupIndex}/${s.sampleIndex}: ${n} tokens exceed the packed length ${seqLen + 1}`);
    if (s.promptLength < 1)
      throw new RlqError("trainer_bad_batch", `sample ${s.groupIndex}/${s.sampleIndex}: promptLength must be >= 1 (the first token has no prediction)`);
    inputIds.set(s.tokens.subarray(0, n - 1), row * seqLen);
    targets.set(s.tokens.subarray(1, n), row * seqLen);
  });
  return { inputIds, targets, batch: b, seqLen };
}

/** [B, T] packed values → one array per sample over its response tokens. */
export function unpackResponses(values: Float32Array, samples: readonly TrainSample[], seqLen: number): Float64Array[] {
  return samples.map((s, row) => {
    const out = new Float64Array(s.responseLength);
    const base = row * seqLen + s.promptLength - 1;
    for (let j = 0; j < s.responseLength; j++) out[j] = values[base + j] as number;
    return out;
  });
}

/** Per-sample response arrays → [B, T] packed float32 (zeros at prompt and padding positions). */
export function packResponses(values: readonly ArrayLike<number>[], samples: readonly TrainSample[], seqLen: number): Float32Array {
  const out = new Float32Array(samples.length * seqLen);
  samples.forEach((s, row) => {
    const v = values[row] as ArrayLike<number>;
    const base = row * seqLen + s.promptLength - 1;
    for (let j = 0; j < s.responseLength; j++) out[base + j] = v[j] as number;
  });
  return out;
}

/**
 * Rows per micro-batch for a token budget (max_tokens_per_gpu, in padded tokens: rows × seqLen),
 * at least 1 (a sample longer than the budget runs alone) and at most `cap` (the global batch).
 */
export function microBatchRows(maxTokensPerGpu: number | null, seqLen: number, cap: number): number {
  if (maxTokensPerGpu === null) return cap;
  return Math.max(1, Math.min(cap, Math.floor(maxTokensPerGpu / seqLen)));
}
