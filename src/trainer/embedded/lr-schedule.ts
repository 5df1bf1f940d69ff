/**
 * Megatron's learning-rate schedule (OptimizerParamScheduler.get_lr): linear
 * warmup from 0 over `warmupIters`, then constant, linear or cosine decay to
 * `minLr` at `decayIters`, and `minLr` after that. `iteration` counts optimizer
 * steps already taken and is the scheduler's `num_steps` as is: Megatron calls
 * `step(0)` when it builds the scheduler and `step()` only after each optimizer
 * step, so its first optimizer step runs at num_steps 0 (with warmup, at rate
 * 0). workers/trainer-torch/rlq_torch/train_config.py has the same function.
 */

import { RlqError } from "../../lib/errors.ts";
export interface LrSchedule {
  lr: number;
  minLr: number;
  style: "constant" | "linear" | "cosine";
  warmupIters: number;
  /** Required for linear and cosine. */
  decayIters: number | null;
}

export function learningRate(s: LrSchedule, iteration: number): number {
  const n = iteration; // Megatron's num_steps
  if (s.warmupIters > 0 && n <= s.warmupIters) return (s.lr * n) / s.warmupIters;
  if (s.style === "constant") return s.lr;
  if (s.decayIters === null) throw new RlqError("config_invalid", `lr_decay_style ${s.style} needs lr_decay_iters (or num_rollout)`);
  if (n > s.decayIters) return s.minLr;
  const span = s.decayIters - s.warmupIters;
  const ratio = span <= 0 ? 1 : (n - s.warmupIters) / span;
  const coeff = s.style === "linear" ? 1 - ratio : 0.5 * (Math.cos(Math.PI * ratio) + 1);
  return s.minLr + (s.lr - s.minLr) * coeff;
}
