/**
 * Where an embedded train step's time goes, and how much of the device it used: the same keys with the
 * same meaning as the torch trainer's (workers/trainer-torch/rlq_torch/efficiency.py, docs/trainer-torch.md
 * "Where a step's time goes"). jax-js computes synchronously on the worker thread, so a phase's wall time
 * is the time between two marks; the phases are contiguous and sum to `step_s`.
 */

import type { ModelConfig } from "../../model/config.ts";
import { parameterSpecs } from "../../model/weights.ts";
import { RlqError } from "../../lib/errors.ts";

/** The split's keys (seconds); a phase the embedded trainer lacks (critic_s, push_s) reports 0. */
export const SPLIT_KEYS = [
  "load_s",
  "old_logprobs_s",
  "ref_logprobs_s",
  "prepare_s",
  "critic_s",
  "fwd_bwd_s",
  "optimizer_s",
  "save_s",
  "push_s",
  "other_s",
] as const;
export type SplitKey = (typeof SPLIT_KEYS)[number];

export const PEAK_ENV = "RLQ_DEVICE_PEAK_TFLOPS";

/** The step's wall time as contiguous phases: `mark(phase)` closes the time since the previous mark into `phase`. */
export class StepClock {
  private readonly t0: number;
  private last: number;
  readonly split = new Map<SplitKey, number>();

  constructor(private readonly now: () => number = () => performance.now() / 1000) {
    this.t0 = this.last = now();
  }

  mark(phase: SplitKey): void {
    const t = this.now();
    this.split.set(phase, (this.split.get(phase) ?? 0) + t - this.last);
    this.last = t;
  }

  elapsed(): number {
    return this.last - this.t0;
  }
}

export interface ModelShape {
  params: number;
  layers: number;
  dAttn: number;
}

/** {params, layers, d_attn} of the embedded GPT: every parameter (embeddings and the untied head included), d_attn = d_model. */
export function modelShape(config: ModelConfig): ModelShape {
  const params = parameterSpecs(config).reduce((a, s) => a + s.shape.reduce((x, y) => x * y, 1), 0);
  return { params, layers: config.n_layers, dAttn: config.d_model };
}

/** FLOPs of a forward and backward (or a forward alone, a third) over sequences of these lengths: Σ 6·N·T + 6·L·d_attn·T². */
export function modelFlops(shape: ModelShape, lengths: readonly number[], forwardOnly = false): number {
  let total = 0;
  for (const t of lengths) total += 6 * shape.params * t + 6 * shape.layers * shape.dAttn * t * t;
  return forwardOnly ? total / 3 : total;
}

/** The device's peak in FLOP/s from RLQ_DEVICE_PEAK_TFLOPS, else null (the embedded trainer runs on a CPU, which has no table entry). */
export function devicePeakFlops(env: Readonly<Record<string, string | undefined>> = process.env): number | null {
  const raw = env[PEAK_ENV];
  if (raw === undefined || raw === "") return null;
  const v = Number(raw);
  if (!Number.isFinite(v) || !(v > 0)) {
    throw new RlqError("trainer_config", `${PEAK_ENV}=${JSON.stringify(raw)}: expected the device's peak in TFLOP/s, a number > 0, e.g. 989.4`);
  }
  return v * 1e12;
}

/** The split (SPLIT_KEYS), step_s, tokens_per_s, tflops, model_flops_per_step, and mfu only with a known peak. */
export function efficiencyMetrics(clock: StepClock, tokens: number, flops: number, peak: number | null): Record<string, number> {
  const stepS = clock.elapsed();
  const out: Record<string, number> = {};
  for (const k of SPLIT_KEYS) out[k] = clock.split.get(k) ?? 0;
  const perS = 1 / Math.max(stepS, 1e-9);
  Object.assign(out, { step_s: stepS, tokens_per_s: tokens * perS, tflops: (flops * perS) / 1e12, model_flops_per_step: flops });
  if (peak !== null) out.mfu = (flops * perS) / peak;
  return out;
}
