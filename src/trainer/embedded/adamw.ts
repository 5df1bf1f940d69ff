/**
 * AdamW (decoupled weight decay, torch.optim.AdamW semantics) with Megatron's
 * global-norm gradient clipping. Math in float64, state and weights stored as
 * float32: the in-memory state after a step is exactly what the checkpoint
 * holds, so resuming from files reproduces an uninterrupted run bit for bit.
 * Iteration order is the canonical parameter order, so sums are deterministic.
 */

import type { OptimizerState } from "../../model/checkpoint.ts";
import type { ParameterSpec, Weights } from "../../model/weights.ts";
import { RlqError } from "../../lib/errors.ts";

export interface AdamWConfig {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
  /** Max global L2 norm of the gradient (Megatron clip_grad). */
  clipGrad: number;
}

export function zeroOptimizerState(specs: readonly ParameterSpec[], weights: Weights): OptimizerState {
  const expAvg: Weights = {};
  const expAvgSq: Weights = {};
  for (const s of specs) {
    const n = (weights[s.name] as Float32Array).length;
    expAvg[s.name] = new Float32Array(n);
    expAvgSq[s.name] = new Float32Array(n);
  }
  return { iteration: 0, expAvg, expAvgSq };
}

export function globalGradNorm(specs: readonly ParameterSpec[], grads: Weights): number {
  let sq = 0;
  for (const s of specs) for (const g of grads[s.name] as Float32Array) sq += g * g;
  return Math.sqrt(sq);
}

/**
 * One optimizer step, in place on `weights` and `state`. Weight decay skips
 * 1-D tensors (biases, LayerNorm), as Megatron's default no_weight_decay_cond.
 * @returns the pre-clip gradient norm
 */
export function adamwStep(specs: readonly ParameterSpec[], weights: Weights, grads: Weights, state: OptimizerState, c: AdamWConfig): number {
  const norm = globalGradNorm(specs, grads);
  if (!Number.isFinite(norm)) throw new RlqError("train_nonfinite", `gradient norm is ${norm}: refusing to update the weights`);
  // Megatron: clip_coeff = clip_grad / (norm + 1e-6), applied only when < 1.
  const clipCoeff = c.clipGrad / (norm + 1e-6);
  const scale = clipCoeff < 1 ? clipCoeff : 1;
  const t = state.iteration + 1;
  const bias1 = 1 - c.beta1 ** t;
  const bias2 = 1 - c.beta2 ** t;
  for (const s of specs) {
    const p = weights[s.name] as Float32Array;
    const g = grads[s.name] as Float32Array;
    const m = state.expAvg[s.name] as Float32Array;
    const v = state.expAvgSq[s.name] as Float32Array;
    const decay = s.shape.length > 1 ? 1 - c.lr * c.weightDecay : 1;
    for (let i = 0; i < p.length; i++) {
      const gi = (g[i] as number) * scale;
      const mi = c.beta1 * (m[i] as number) + (1 - c.beta1) * gi;
      const vi = c.beta2 * (v[i] as number) + (1 - c.beta2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      // Use the stored (float32-rounded) moments so the file state alone determines the next step.
      const mHat = (m[i] as number) / bias1;
      const vHat = (v[i] as number) / bias2;
      p[i] = (p[i] as number) * decay - (c.lr * mHat) / (Math.sqrt(vHat) + c.eps);
    }
  }
  state.iteration = t;
  return norm;
}
