/**
 * Weight names, shapes and deterministic initialisation.
 *
 * Matrices are stored [in, out] so every implementation computes `x @ W + b`
 * without a transpose. The names are the checkpoint's tensor names and the ONNX
 * graph's input names; renaming one breaks every existing checkpoint.
 */

import type { ModelConfig } from "./config.ts";
import { deriveSeed, Prng } from "./prng.ts";
import { RlqError } from "../lib/errors.ts";

export type Weights = Record<string, Float32Array>;

export interface ParameterSpec {
  name: string;
  shape: number[];
  /** How initWeights fills it. */
  init: "normal" | "residual" | "zeros" | "ones";
}

/** Canonical order of every parameter: checkpoints, graphs and optimizers iterate in this order. */
export function parameterSpecs(config: ModelConfig): ParameterSpec[] {
  const { vocab_size: v, context_length: c, d_model: d, d_mlp: m } = config;
  const specs: ParameterSpec[] = [
    { name: "tok_emb.weight", shape: [v, d], init: "normal" },
    { name: "pos_emb.weight", shape: [c, d], init: "normal" },
  ];
  for (let l = 0; l < config.n_layers; l++) {
    const p = `blocks.${l}.`;
    specs.push(
      { name: `${p}ln1.weight`, shape: [d], init: "ones" },
      { name: `${p}ln1.bias`, shape: [d], init: "zeros" },
      // Columns are [q | k | v], each d_model wide with heads contiguous (head h = cols h*hd..).
      { name: `${p}attn.qkv.weight`, shape: [d, 3 * d], init: "normal" },
      { name: `${p}attn.qkv.bias`, shape: [3 * d], init: "zeros" },
      { name: `${p}attn.proj.weight`, shape: [d, d], init: "residual" },
      { name: `${p}attn.proj.bias`, shape: [d], init: "zeros" },
      { name: `${p}ln2.weight`, shape: [d], init: "ones" },
      { name: `${p}ln2.bias`, shape: [d], init: "zeros" },
      { name: `${p}mlp.fc.weight`, shape: [d, m], init: "normal" },
      { name: `${p}mlp.fc.bias`, shape: [m], init: "zeros" },
      { name: `${p}mlp.proj.weight`, shape: [m, d], init: "residual" },
      { name: `${p}mlp.proj.bias`, shape: [d], init: "zeros" },
    );
  }
  specs.push(
    { name: "ln_f.weight", shape: [d], init: "ones" },
    { name: "ln_f.bias", shape: [d], init: "zeros" },
    { name: "head.weight", shape: [d, v], init: "normal" },
  );
  return specs;
}

export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Total parameter count. */
export function parameterCount(config: ModelConfig): number {
  return parameterSpecs(config).reduce((n, s) => n + numel(s.shape), 0);
}

/**
 * GPT-2 initialisation: N(0, 0.02) for embeddings and matrices, residual
 * projections scaled by 1/sqrt(2 * n_layers), LayerNorm gain 1, biases 0.
 * Each tensor draws from its own stream derived from (seed, name), so the same
 * seed gives bit-identical weights whatever the order of construction.
 */
export function initWeights(config: ModelConfig, seed: number): Weights {
  const weights: Weights = {};
  const residualStd = 0.02 / Math.sqrt(2 * config.n_layers);
  for (const spec of parameterSpecs(config)) {
    const data = new Float32Array(numel(spec.shape));
    if (spec.init === "ones") data.fill(1);
    if (spec.init === "normal" || spec.init === "residual") {
      const std = spec.init === "normal" ? 0.02 : residualStd;
      const rng = new Prng(deriveSeed(seed, `init:${spec.name}`));
      for (let i = 0; i < data.length; i++) data[i] = rng.nextNormal() * std;
    }
    weights[spec.name] = data;
  }
  return weights;
}

/** Throws unless `weights` holds exactly the config's tensors with the right sizes. */
export function assertWeightsMatch(config: ModelConfig, weights: Weights): void {
  const specs = parameterSpecs(config);
  for (const spec of specs) {
    const w = weights[spec.name];
    if (!w) throw new RlqError("model_invalid", `weights: missing tensor "${spec.name}"`);
    if (w.length !== numel(spec.shape)) {
      throw new RlqError("model_invalid", `weights: "${spec.name}" has ${w.length} values, expected shape [${spec.shape.join(", ")}]`);
    }
  }
  const extra = Object.keys(weights).filter((k) => !specs.some((s) => s.name === k));
  if (extra.length > 0) throw new RlqError("model_invalid", `weights: unexpected tensors ${extra.join(", ")}`);
}

/** Get a tensor or throw (noUncheckedIndexedAccess-friendly). */
export function tensor(weights: Weights, name: string): Float32Array {
  const w = weights[name];
  if (!w) throw new RlqError("model_invalid", `weights: missing tensor "${name}"`);
  return w;
}
