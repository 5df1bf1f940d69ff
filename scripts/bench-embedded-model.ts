/**
 * Measures the embedded model's engine and trainer speed on this machine and
 * prints one JSON object (numbers quoted in docs/embedded-model.md).
 *
 * Model: vocab 32, context 64, d_model 64, 4 heads, 2 layers, MLP 256 (the
 * shapes of the ONNX feasibility study, onnx-kv.md), random weights.
 * - engine: the decode scheduler in-process (the same code the worker runs),
 *   B concurrent requests with 16-token prompts, 48 new tokens each, no stop
 *   tokens; generated tokens / wall time, including prefill and sampling. Also
 *   the plain ONNX decode-call ceiling at the same B (P=40, no sampling).
 * - trainer: one jit-compiled fwd+bwd at B=256, T=24, then AdamW on the result,
 *   median of 5 after one warm-up (the warm-up includes jit compilation).
 * Usage: npx tsx scripts/bench-embedded-model.ts
 */
import { cpus } from "node:os";
import { DecodeScheduler } from "../src/engines/embedded/scheduler.ts";
import { ModelRunner } from "../src/engines/embedded/model-runner.ts";
import { SlotKvCache } from "../src/engines/embedded/kv-cache.ts";
import { parseModelConfig } from "../src/model/config.ts";
import { initWeights, parameterSpecs } from "../src/model/weights.ts";
import { adamwStep, zeroOptimizerState } from "../src/trainer/embedded/adamw.ts";
import { createJaxModel } from "../src/trainer/embedded/jax-model.ts";

const config = parseModelConfig({ vocab_size: 32, context_length: 64, d_model: 64, n_heads: 4, n_layers: 2, d_mlp: 256 });
const weights = initWeights(config, 1);
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

async function engineTokensPerSecond(runner: ModelRunner, batch: number): Promise<number> {
  const rates: number[] = [];
  for (let rep = 0; rep < 4; rep++) {
    let produced = 0;
    const scheduler = new DecodeScheduler(runner, 0, { done: () => undefined, failed: () => undefined }, { maxBatchSize: batch, logitNoiseStd: 0 });
    for (let i = 0; i < batch; i++) {
      const prompt = Array.from({ length: 16 }, (_, t) => (i * 7 + t * 3) % 32);
      scheduler.submit({ requestId: `b${i}`, inputIds: prompt, sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: 48, stopTokenIds: [], seed: i } });
    }
    const t0 = performance.now();
    while (!scheduler.isIdle) produced += await scheduler.step();
    if (rep > 0) rates.push(produced / ((performance.now() - t0) / 1000));
  }
  return Math.round(median(rates));
}

async function decodeCeiling(runner: ModelRunner, batch: number): Promise<number> {
  const rows = Math.max(batch, 2);
  const cache = new SlotKvCache(config, rows);
  const ids = new Int32Array(rows).fill(3);
  const positions = new Int32Array(rows).fill(40);
  for (let i = 0; i < 20; i++) await runner.decode(ids, positions, cache.views(rows), cache.length);
  const n = 200;
  const t0 = performance.now();
  for (let i = 0; i < n; i++) await runner.decode(ids, positions, cache.views(rows), cache.length);
  return Math.round((n * batch) / ((performance.now() - t0) / 1000));
}

async function trainerStepMs(): Promise<{ fwdBwdMs: number; adamMs: number; fwdMs: number }> {
  const model = await createJaxModel(config);
  const B = 256;
  const T = 24;
  const batch = { inputIds: Int32Array.from({ length: B * T }, (_, i) => (i * 7) % 32), targets: Int32Array.from({ length: B * T }, (_, i) => (i * 5 + 3) % 32), batch: B, seqLen: T };
  const coef = new Float32Array(B * T).fill(-1 / (B * T));
  const zero = new Float32Array(B * T);
  const specs = parameterSpecs(config);
  const state = zeroOptimizerState(specs, weights);
  const fb: number[] = [];
  const ad: number[] = [];
  const fw: number[] = [];
  for (let i = 0; i < 6; i++) {
    const t0 = performance.now();
    const { grads } = model.gradient(weights, batch, coef, zero, 1);
    const t1 = performance.now();
    adamwStep(specs, weights, grads, state, { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0, clipGrad: 1 });
    const t2 = performance.now();
    model.forward(weights, batch, 1);
    const t3 = performance.now();
    if (i > 0) {
      fb.push(t1 - t0);
      ad.push(t2 - t1);
      fw.push(t3 - t2);
    }
  }
  return { fwdBwdMs: Math.round(median(fb)), adamMs: Math.round(median(ad) * 10) / 10, fwdMs: Math.round(median(fw)) };
}

const runner = await ModelRunner.create(config, weights);
const engine: Record<string, unknown> = {};
for (const b of [1, 16, 64]) engine[`batch${b}`] = { generatedTokensPerS: await engineTokensPerSecond(runner, b), decodeCallCeilingTokensPerS: await decodeCeiling(runner, b) };
await runner.release();
const trainer = await trainerStepMs();
console.log(JSON.stringify({ date: new Date().toISOString(), cpu: cpus()[0]?.model, cores: cpus().length, node: process.version, config, engine, trainer: { batch: 256, seqLen: 24, ...trainer } }, null, 1));
