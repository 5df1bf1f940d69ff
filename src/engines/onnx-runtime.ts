/**
 * The one module of engines/ that imports onnxruntime-node (STYLE.md boundary):
 * everything else talks to these few functions, so swapping the runtime (or its
 * version) touches one file. Note `session.run` is synchronous inside, so it
 * must only be called from a worker thread (it blocks the thread that calls it).
 */

import * as ort from "onnxruntime-node";
import { RlqError } from "../lib/errors.ts";

export type OrtTensor = ort.Tensor;
export type OrtFeeds = Record<string, ort.Tensor>;

export interface OrtSession {
  /** Run the graph; `outputNames` limits what is fetched (each output is a copy). */
  run(feeds: OrtFeeds, outputNames?: readonly string[]): Promise<Record<string, ort.Tensor>>;
  release(): Promise<void>;
}

export interface OrtSessionOptions {
  /** Threads inside one run; 1 is best for decode on 2 cores (bench/embedded-model.ts). */
  intraOpNumThreads?: number;
}

export async function createOrtSession(model: Uint8Array, options: OrtSessionOptions = {}): Promise<OrtSession> {
  const session = await ort.InferenceSession.create(model, {
    graphOptimizationLevel: "all",
    executionMode: "sequential",
    intraOpNumThreads: options.intraOpNumThreads ?? 1,
    interOpNumThreads: 1,
    // Silences ORT's coloured stderr logs and the harmless "Removing initializer" warnings.
    logSeverityLevel: 3,
  });
  return {
    run: (feeds, outputNames) => (outputNames ? session.run(feeds, outputNames as string[]) : session.run(feeds)),
    release: () => session.release(),
  };
}

/** [dims] float32 view over `data` (zero-copy: keep `data` alive and unchanged during run). */
export function floatTensor(data: Float32Array, dims: readonly number[]): OrtTensor {
  return new ort.Tensor("float32", data, dims);
}

/** [dims] int32; our graphs take ids and positions as int32 to keep BigInt out of the hot loop. */
export function int32Tensor(data: Int32Array, dims: readonly number[]): OrtTensor {
  return new ort.Tensor("int32", data, dims);
}

/** The float32 contents of an output tensor. */
export function tensorFloats(t: OrtTensor | undefined, name: string): Float32Array {
  if (!t || !(t.data instanceof Float32Array)) throw new RlqError("invariant_violated", `onnxruntime: output "${name}" missing or not float32`);
  return t.data;
}
