/**
 * Checkpoints: one directory per weight version holding one safetensors file of
 * weights (`weights.safetensors`) and, for trainer outputs, the AdamW state
 * beside it (`optimizer.safetensors`). The weights file's metadata carries
 * format, version, run, step and the model config (JSON), so the file is
 * self-describing: the engine builds its graph from it. A checkpoint URI is the
 * directory's file:// URI (what train steps commit); the weights file's own path
 * or URI is accepted wherever a checkpoint is read.
 */

import { mkdir, readFile, rename, stat, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseModelConfig, type ModelConfig } from "./config.ts";
import { decodeSafetensors, encodeSafetensors, type NamedTensor } from "./safetensors.ts";
import { assertWeightsMatch, parameterSpecs, type Weights } from "./weights.ts";
import { RlqError } from "../lib/errors.ts";

export const MODEL_FORMAT = "rlq-gpt-v1";
export const OPTIMIZER_FORMAT = "rlq-adamw-v1";

export interface Checkpoint {
  config: ModelConfig;
  weights: Weights;
  version: number;
  runId: string;
  /** The rollout step that produced this version (-1 for an initial or warm-start checkpoint). */
  step: number;
}

/** AdamW moments, float32 like the weights, so the in-memory state equals the file bit for bit. */
export interface OptimizerState {
  /** Optimizer steps taken so far (drives bias correction and the LR schedule). */
  iteration: number;
  expAvg: Weights;
  expAvgSq: Weights;
}

export const WEIGHTS_FILE = "weights.safetensors";
export const OPTIMIZER_FILE = "optimizer.safetensors";

/** `file:///x/model-v3.safetensors` or a plain path → a filesystem path. */
export function pathFromUri(uri: string): string {
  return uri.startsWith("file:") ? fileURLToPath(uri) : uri;
}

export function uriFromPath(path: string): string {
  return pathToFileURL(path).href;
}

export function encodeCheckpoint(ckpt: Checkpoint): Uint8Array {
  assertWeightsMatch(ckpt.config, ckpt.weights);
  const tensors: NamedTensor[] = parameterSpecs(ckpt.config).map((s) => ({
    name: s.name,
    shape: s.shape,
    data: ckpt.weights[s.name] as Float32Array,
  }));
  return encodeSafetensors(tensors, {
    format: MODEL_FORMAT,
    version: String(ckpt.version),
    run: ckpt.runId,
    step: String(ckpt.step),
    config: JSON.stringify(ckpt.config),
  });
}

export function decodeCheckpoint(bytes: Uint8Array, source = "checkpoint"): Checkpoint {
  const file = decodeSafetensors(bytes);
  const meta = file.metadata;
  if (meta.format !== MODEL_FORMAT) throw new RlqError("model_invalid", `${source}: metadata.format is ${String(meta.format)}, expected ${MODEL_FORMAT}`);
  if (meta.config === undefined) throw new RlqError("model_invalid", `${source}: metadata.config is missing`);
  const config = parseModelConfig(JSON.parse(meta.config));
  const weights: Weights = {};
  for (const spec of parameterSpecs(config)) {
    const t = file.tensors.get(spec.name);
    if (!t || !(t.data instanceof Float32Array) || t.shape.join(",") !== spec.shape.join(",")) {
      throw new RlqError("model_invalid", `${source}: tensor "${spec.name}" missing or not F32 [${spec.shape.join(", ")}]`);
    }
    weights[spec.name] = t.data;
  }
  return { config, weights, version: Number(meta.version ?? 0), runId: meta.run ?? "", step: Number(meta.step ?? -1) };
}

export function encodeOptimizerState(config: ModelConfig, state: OptimizerState, ckpt: Omit<Checkpoint, "weights" | "config">): Uint8Array {
  const tensors: NamedTensor[] = [];
  for (const s of parameterSpecs(config)) {
    tensors.push({ name: `exp_avg.${s.name}`, shape: s.shape, data: state.expAvg[s.name] as Float32Array });
    tensors.push({ name: `exp_avg_sq.${s.name}`, shape: s.shape, data: state.expAvgSq[s.name] as Float32Array });
  }
  return encodeSafetensors(tensors, {
    format: OPTIMIZER_FORMAT,
    iteration: String(state.iteration),
    version: String(ckpt.version),
    run: ckpt.runId,
    step: String(ckpt.step),
  });
}

export function decodeOptimizerState(config: ModelConfig, bytes: Uint8Array, source = "optimizer state"): OptimizerState {
  const file = decodeSafetensors(bytes);
  if (file.metadata.format !== OPTIMIZER_FORMAT) throw new RlqError("model_invalid", `${source}: metadata.format is not ${OPTIMIZER_FORMAT}`);
  const expAvg: Weights = {};
  const expAvgSq: Weights = {};
  for (const s of parameterSpecs(config)) {
    const m = file.tensors.get(`exp_avg.${s.name}`)?.data;
    const v = file.tensors.get(`exp_avg_sq.${s.name}`)?.data;
    if (!(m instanceof Float32Array) || !(v instanceof Float32Array)) throw new RlqError("model_invalid", `${source}: moments for "${s.name}" missing`);
    expAvg[s.name] = m;
    expAvgSq[s.name] = v;
  }
  return { iteration: Number(file.metadata.iteration ?? 0), expAvg, expAvgSq };
}

/** Write bytes through a temporary name and rename, so a reader never sees a half file. */
export async function writeFileAtomic(path: string, bytes: Uint8Array | string): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const tmp = `${path}.tmp-${process.pid}`;
  await writeFile(tmp, bytes);
  await rename(tmp, path);
}

/** Write `weights.safetensors` (and `optimizer.safetensors` when given) into `dir`; returns their paths and the directory's URI. */
export async function writeCheckpoint(
  dir: string,
  ckpt: Checkpoint,
  optimizer?: OptimizerState,
): Promise<{ weightsPath: string; optimizerPath: string | null; uri: string }> {
  const weightsPath = join(dir, WEIGHTS_FILE);
  let optimizerPath: string | null = null;
  if (optimizer) {
    // Optimizer first: a weights file present means its state is present too.
    optimizerPath = join(dir, OPTIMIZER_FILE);
    await writeFileAtomic(optimizerPath, encodeOptimizerState(ckpt.config, optimizer, ckpt));
  }
  await writeFileAtomic(weightsPath, encodeCheckpoint(ckpt));
  return { weightsPath, optimizerPath, uri: uriFromPath(dir) };
}

/** Resolve a checkpoint URI or path (a directory or its weights file) to the weights file. */
export async function resolveModelPath(uriOrPath: string): Promise<string> {
  const path = pathFromUri(uriOrPath);
  const st = await stat(path);
  return st.isDirectory() ? join(path, WEIGHTS_FILE) : path;
}

export async function readCheckpoint(uriOrPath: string): Promise<Checkpoint & { path: string }> {
  const path = await resolveModelPath(uriOrPath);
  return { ...decodeCheckpoint(await readFile(path), path), path };
}

/** The optimizer state beside a weights file, or null if there is none (a warm start). */
export async function readOptimizerState(weightsPath: string, config: ModelConfig): Promise<OptimizerState | null> {
  const path = join(dirname(weightsPath), OPTIMIZER_FILE);
  let bytes: Uint8Array;
  try {
    bytes = await readFile(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw err;
  }
  return decodeOptimizerState(config, bytes, path);
}
