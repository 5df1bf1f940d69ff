/**
 * Embedded model speed (issue 4): engine decode tokens/s at batch 1, 16 and 64
 * against the plain ONNX decode forward at the same shapes (the ceiling,
 * measured in the same run), and trainer tokens/s per fwd+bwd step. Two model
 * shapes: the demo's warm start (examples/demo/warm-start: vocab 24, ctx 32,
 * d 64, 4 heads, 2 layers, MLP 256, its real weights) and the shape of the engine's feasibility study
 * model (vocab 32, ctx 64, same widths, random weights). One ORT thread, as
 * the engine runs by default. Each sample runs for ~0.4 s (rounds of B
 * requests); medians of several samples after a warm-up. Every measure's sample sits
 * between two decode-ceiling samples and is read against their mean (`_median_of_pairs`: the
 * median of those per-sample ratios): on a shared box the ceiling moves by up to 2x within
 * seconds, so only a ceiling sampled next to a measure shares its noise.
 *
 * Per shape and batch B (B requests, P-token prompts, G new tokens each, no
 * stop tokens, temperature 1, so every request runs to its budget):
 * - ceiling: `session.run` of the decode graph alone with feeds built once,
 *   rows = B (B = 1 also padded to 2 rows, which is what the engine runs),
 *   cache length = context; tokens/s = B * calls / wall.
 * - scheduler: the engine's DecodeScheduler in this thread (the code the
 *   engine worker runs): `generated` = all tokens / wall, including the B
 *   prefills; `decode` = tokens of the ticks after the first (pure
 *   batched decode: tensor wrapping, ORT, KV-cache writes, sampling) / their
 *   wall time. `decode_vs_ceiling` = decode / ceiling (ratio of medians).
 * - generation ceiling: the same rounds as plain ORT, one [B, P] prefill then G - 1 decode runs,
 *   nothing between the runs: what an end-to-end engine could reach at most. The decode ceiling
 *   leaves the prefill out (at the demo shape, B = 64, a prefill costs ~3 decode runs).
 * - worker engine: createEmbeddedEngine (worker thread, message passing,
 *   schema checks), rounds of B concurrent generate() calls, each round sent when the last one
 *   has come back (lock-step: the engine idles while the client turns round); tokens / wall
 *   (prefills included).
 * - sustained: the worker engine as a rollout worker drives it, maxBatchSize B and 2B requests
 *   in flight, so its queue never runs dry (sustainedEngine); distinct prompts, and GRPO groups of
 *   8 samples sharing a prompt (the demo's n_samples_per_prompt), whose prefill the engine does
 *   once per group. Their generation ceiling prefills one row per group.
 * Trainer (jax-js, wasm, this thread): B=256, T=24; fwd+bwd tokens/s =
 * B*T / fwd+bwd time; also forward only and AdamW.
 *
 *   npx tsx bench/embedded-model.ts [--reps 5] [--batches 1,16,64]
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createEmbeddedEngine, type EmbeddedEngine } from "../src/engines/embedded/embedded-engine.ts";
import { buildDecodeModel, buildPrefillModel } from "../src/engines/embedded/graph-builder.ts";
import { ModelRunner } from "../src/engines/embedded/model-runner.ts";
import { DecodeScheduler } from "../src/engines/embedded/scheduler.ts";
import { createOrtSession, floatTensor, int32Tensor, type OrtFeeds } from "../src/engines/onnx-runtime.ts";
import { readCheckpoint, writeCheckpoint } from "../src/model/checkpoint.ts";
import { headDim, parseModelConfig, type ModelConfig } from "../src/model/config.ts";
import { initWeights, parameterSpecs, type Weights } from "../src/model/weights.ts";
import { adamwStep, zeroOptimizerState } from "../src/trainer/embedded/adamw.ts";
import { createJaxModel } from "../src/trainer/embedded/jax-model.ts";
import { repoRoot } from "../test/helpers/processes.ts";
import { median, writeResult } from "./lib.ts";

const { values } = parseArgs({ options: { reps: { type: "string", default: "5" }, batches: { type: "string", default: "1,16,64" } }, strict: false });
const reps = Number(values.reps);
const BATCHES = String(values.batches).split(",").map(Number);
const TRAIN_B = 256;
const TRAIN_T = 24;
/** Seconds per sample of each engine measure (several rounds of B requests). */
const SAMPLE_S = 0.4;

interface Shape {
  name: string;
  config: ModelConfig;
  weights: Weights;
  /** A checkpoint directory the worker engine can load. */
  checkpointDir: string;
  promptLen: number;
  newTokens: number;
}

const round = (x: number, digits = 0): number => Math.round(x * 10 ** digits) / 10 ** digits;
/**
 * Request i's prompt. Distinct for i < vocab² (its first two tokens spell i in base vocab): the engine
 * shares a prefill row between identical prompts admitted together, so "distinct prompts" must be.
 */
const prompt = (vocab: number, len: number, i: number): number[] =>
  Array.from({ length: len }, (_, t) => (t === 0 ? i % vocab : t === 1 ? Math.floor(i / vocab) % vocab : (i * 7 + t * 3 + 1) % vocab));
/** GRPO groups: the demo's n_samples_per_prompt (examples/demo.yaml); a group's samples share one prompt. */
const GROUP = 8;

function weightFeeds(config: ModelConfig, weights: Weights): OrtFeeds {
  const feeds: OrtFeeds = {};
  for (const spec of parameterSpecs(config)) feeds[spec.name] = floatTensor(weights[spec.name] as Float32Array, spec.shape);
  return feeds;
}

/** A decode run's feeds at `rows` rows: token 3 at mid-context over a full cache of 0.01s (the ceilings' fixed input). */
function decodeFeeds(config: ModelConfig, weights: OrtFeeds, rows: number): OrtFeeds {
  const feeds: OrtFeeds = { ...weights };
  feeds.input_ids = int32Tensor(new Int32Array(rows).fill(3), [rows]);
  feeds.positions = int32Tensor(new Int32Array(rows).fill(Math.floor(config.context_length / 2)), [rows]);
  const dims = [rows, config.n_heads, config.context_length, headDim(config)];
  for (let l = 0; l < config.n_layers; l++) {
    for (const kind of ["key", "value"]) feeds[`past.${l}.${kind}`] = floatTensor(new Float32Array(dims.reduce((a, b) => a * b, 1)).fill(0.01), dims);
  }
  return feeds;
}

/** Plain ONNX decode: one session, feeds built once, `calls` runs. Returns tokens/s for `batch` real rows. */
async function ceiling(config: ModelConfig, weights: Weights, batch: number, rows: number, seconds: number): Promise<number> {
  const session = await createOrtSession(buildDecodeModel(config), { intraOpNumThreads: 1 });
  try {
    const feeds = decodeFeeds(config, weightFeeds(config, weights), rows);
    for (let i = 0; i < 20; i++) await session.run(feeds);
    let calls = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      for (let i = 0; i < 20; i++) await session.run(feeds);
      calls += 20;
    }
    return (batch * calls) / ((performance.now() - t0) / 1000);
  } finally {
    await session.release();
  }
}

/**
 * Plain ONNX generation: the same work as one round of the engine's requests with no host code
 * between the runs: one [B, P] prefill, then G - 1 decode runs (rows = B, padded to 2 at B = 1
 * as the engine pads), feeds built once. Returns tokens/s (B * G per round). The decode-only
 * ceiling leaves the prefill's own ORT work out; an end-to-end engine cannot.
 */
async function generationCeiling(shape: Shape, batch: number, seconds: number, group = 1): Promise<number> {
  const { config, weights } = shape;
  const prefillRows = Math.ceil(batch / group); // a group's samples share one prompt: one prefill row each
  const prefill = await createOrtSession(buildPrefillModel(config), { intraOpNumThreads: 1 });
  const decode = await createOrtSession(buildDecodeModel(config), { intraOpNumThreads: 1 });
  try {
    const w = weightFeeds(config, weights);
    const ids = new Int32Array(prefillRows * shape.promptLen); // the scheduler's prompts, one [B / group, P] prefill
    for (let i = 0; i < prefillRows; i++) ids.set(prompt(config.vocab_size, shape.promptLen, i), i * shape.promptLen);
    const prefillFeeds: OrtFeeds = { ...w, input_ids: int32Tensor(ids, [prefillRows, shape.promptLen]) };
    const rows = Math.max(2, batch);
    const decodeRun = decodeFeeds(config, w, rows);
    const oneRound = async () => {
      await prefill.run(prefillFeeds);
      for (let i = 1; i < shape.newTokens; i++) await decode.run(decodeRun);
    };
    for (let i = 0; i < 3; i++) await oneRound();
    let rounds = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      await oneRound();
      rounds++;
    }
    return (batch * shape.newTokens * rounds) / ((performance.now() - t0) / 1000);
  } finally {
    await prefill.release();
    await decode.release();
  }
}

/**
 * The engine's scheduler in this thread, rounds of B requests until `seconds`
 * have passed: all tokens / wall, and the pure-decode ticks (after each round's first) / their wall.
 */
async function scheduler(shape: Shape, runner: ModelRunner, batch: number, seconds: number): Promise<{ generated: number; decode: number }> {
  let tokens = 0;
  let decodeTokens = 0;
  let wallMs = 0;
  let decodeMs = 0;
  for (let r = 0; wallMs < seconds * 1000; r++) {
    const s = new DecodeScheduler(runner, 0, { done: () => undefined, failed: () => undefined }, { maxBatchSize: batch, logitNoiseStd: 0 });
    for (let i = 0; i < batch; i++) {
      s.submit({
        requestId: `b${i}`,
        inputIds: prompt(shape.config.vocab_size, shape.promptLen, i),
        sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: shape.newTokens, stopTokenIds: [], seed: r * batch + i },
      });
    }
    const t0 = performance.now();
    tokens += await s.step(); // admits (prefills) every request, then one decode tick
    const t1 = performance.now();
    let d = 0;
    while (!s.isIdle) d += await s.step();
    const t2 = performance.now();
    tokens += d;
    decodeTokens += d;
    wallMs += t2 - t0;
    decodeMs += t2 - t1;
  }
  return { generated: tokens / (wallMs / 1000), decode: decodeTokens / (decodeMs / 1000) };
}

/** One warm-up sample, then the sampler and the engine's close (closed at once if the warm-up fails). */
async function warmedUp(engine: EmbeddedEngine, sample: () => Promise<number>): Promise<{ sample(): Promise<number>; close(): Promise<void> }> {
  try {
    await sample();
  } catch (e) {
    await engine.close();
    throw e;
  }
  return { sample, close: () => engine.close() };
}

/**
 * The worker-thread engine: `sample()` runs rounds of B concurrent generate() calls until
 * `seconds` have passed and returns tokens / wall. One engine per batch size, warmed up by one
 * sample; its samples are interleaved with the ceiling's (engineBench).
 */
async function workerEngine(shape: Shape, batch: number, seconds: number): Promise<{ sample(): Promise<number>; close(): Promise<void> }> {
  const engine = await createEmbeddedEngine({ checkpointUri: shape.checkpointDir, maxBatchSize: 64 });
  let id = 0;
  const sample = async (): Promise<number> => {
    let tokens = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      const results = await Promise.all(
        Array.from({ length: batch }, (_, i) =>
          engine.generate({
            requestId: `w${id++}`,
            inputIds: prompt(shape.config.vocab_size, shape.promptLen, i),
            sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: shape.newTokens, stopTokenIds: [], seed: id },
          }),
        ),
      );
      tokens += results.reduce((n, r) => n + r.tokenIds.length, 0);
    }
    return tokens / ((performance.now() - t0) / 1000);
  };
  return warmedUp(engine, sample);
}

/**
 * The worker-thread engine under sustained load, as a rollout worker drives it: maxBatchSize B,
 * and the client keeps 2B requests in flight, sending a group's `group` samples (one prompt,
 * their own seeds) together and the next group as soon as room frees, so the engine's queue
 * never runs dry. Returns the steady rate: tokens of the requests that finished after the first
 * tick's finishes, over the time from those to the last finish before `seconds` ended.
 */
async function sustainedEngine(shape: Shape, batch: number, group: number, seconds: number): Promise<{ sample(): Promise<number>; close(): Promise<void> }> {
  const engine = await createEmbeddedEngine({ checkpointUri: shape.checkpointDir, maxBatchSize: batch });
  let id = 0;
  let groups = 0;
  const sample = (): Promise<number> =>
    new Promise<number>((resolve, reject) => {
      const t0 = performance.now();
      let inFlight = 0;
      let first = -1;
      let firstBurst = false;
      let last = -1;
      let tokens = 0;
      const send = (): void => {
        const g = groups++;
        for (let k = 0; k < group; k++) {
          inFlight++;
          engine
            .generate({
              requestId: `s${id++}`,
              inputIds: prompt(shape.config.vocab_size, shape.promptLen, g % 500),
              sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: shape.newTokens, stopTokenIds: [], seed: id },
            })
            .then((r) => {
              inFlight--;
              const now = performance.now();
              if (now - t0 < seconds * 1000) {
                if (first < 0) {
                  // The first tick's finishes (one message from the worker) start the clock.
                  first = now;
                  firstBurst = true;
                  setImmediate(() => (firstBurst = false));
                } else if (!firstBurst) {
                  tokens += r.tokenIds.length;
                  last = now;
                }
                while (inFlight + group <= 2 * batch) send();
              } else if (inFlight === 0) {
                resolve(last > first ? tokens / ((last - first) / 1000) : Number.NaN);
              }
            }, reject);
        }
      };
      while (inFlight + group <= 2 * batch) send();
    });
  return warmedUp(engine, sample);
}

const MEASURED = ["ceilingGeneration", "ceilingGenerationGrouped", "generated", "decode", "worker", "workerSustained", "workerGrouped"] as const;
type Measured = (typeof MEASURED)[number];
const RATES = ["ceiling", "ceilingPadded", ...MEASURED] as const;
type Rate = (typeof RATES)[number];
/** One sample of every measure (tokens/s), with the decode ceiling sampled on each side of it. */
type Run = Record<Rate, number> & { near: Record<Measured, number>; ceilings: number[] };

async function engineBench(shape: Shape): Promise<Record<string, unknown>> {
  const runner = await ModelRunner.create(shape.config, shape.weights, { intraOpNumThreads: 1 });
  const out: Record<string, unknown> = {};
  try {
    for (const batch of BATCHES) {
      await scheduler(shape, runner, batch, 0.1); // warm-up
      const group = Math.min(GROUP, batch);
      const runs: Run[] = [];
      const engine = await workerEngine(shape, batch, SAMPLE_S);
      const steady = await sustainedEngine(shape, batch, 1, SAMPLE_S);
      const grouped = group > 1 ? await sustainedEngine(shape, batch, group, SAMPLE_S) : steady;
      try {
        for (let rep = 0; rep < reps; rep++) {
          // Each measure sits between two decode-ceiling samples and is read against their mean: on
          // this shared box the ceiling moves by up to 2x within seconds, so a ceiling sampled a few
          // seconds away shares little of a measure's noise.
          const c = (): Promise<number> => ceiling(shape.config, shape.weights, batch, batch, SAMPLE_S);
          const c0 = await c();
          const cp = batch === 1 ? await ceiling(shape.config, shape.weights, 1, 2, SAMPLE_S) : c0;
          const cg = await generationCeiling(shape, batch, SAMPLE_S);
          const c1 = await c();
          const cgg = group > 1 ? await generationCeiling(shape, batch, SAMPLE_S, group) : cg;
          const c2 = group > 1 ? await c() : c1;
          const s = await scheduler(shape, runner, batch, SAMPLE_S);
          const c3 = await c();
          const w = await engine.sample();
          const c4 = await c();
          const ws = await steady.sample();
          const c5 = await c();
          const wg = group > 1 ? await grouped.sample() : ws;
          const c6 = group > 1 ? await c() : c5;
          if (!Number.isFinite(ws) || !Number.isFinite(wg))
            throw new Error(`${shape.name} B=${batch}: a sustained sample saw fewer than two ticks' finishes; raise SAMPLE_S`);
          const ceilings = [c0, c1, c2, c3, c4, c5, c6];
          const near = (x: number, y: number): number => round((x + y) / 2);
          runs.push({
            ceiling: round(ceilings.reduce((t, x) => t + x, 0) / ceilings.length),
            ceilingPadded: round(cp),
            ceilingGeneration: round(cg),
            ceilingGenerationGrouped: round(cgg),
            generated: round(s.generated),
            decode: round(s.decode),
            worker: round(w),
            workerSustained: round(ws),
            workerGrouped: round(wg),
            near: {
              ceilingGeneration: near(c0, c1),
              ceilingGenerationGrouped: near(c1, c2),
              generated: near(c2, c3),
              decode: near(c2, c3),
              worker: near(c3, c4),
              workerSustained: near(c4, c5),
              workerGrouped: near(c5, c6),
            },
            ceilings: ceilings.map((x) => round(x)),
          });
        }
      } finally {
        await engine.close();
        await steady.close();
        if (grouped !== steady) await grouped.close();
      }
      const worker = runs.map((r) => r.worker);
      const med = Object.fromEntries(RATES.map((k) => [k, median(runs.map((r) => r[k]))])) as Record<Rate, number>;
      /**
       * Median over the samples of a measure's ratio to the decode ceiling sampled around it, or
       * to a generation ceiling (both read against their own neighbouring decode ceilings).
       */
      const pairs = (num: Measured, den: "ceiling" | "ceilingGeneration" | "ceilingGenerationGrouped"): number =>
        round(median(runs.map((r) => r[num] / r.near[num] / (den === "ceiling" ? 1 : r[den] / r.near[den]))), 3);
      const allCeilings = runs.flatMap((r) => r.ceilings);
      out[`batch${batch}`] = {
        ceiling_tokens_per_s: round(med.ceiling),
        ...(batch === 1 ? { ceiling_padded_to_2_rows_tokens_per_s: round(med.ceilingPadded) } : {}),
        generation_ceiling_tokens_per_s: round(med.ceilingGeneration),
        generation_ceiling_vs_ceiling: round(med.ceilingGeneration / med.ceiling, 3),
        generation_ceiling_vs_ceiling_median_of_pairs: pairs("ceilingGeneration", "ceiling"),
        ceiling_min_max_tokens_per_s: [Math.min(...allCeilings), Math.max(...allCeilings)],
        scheduler_decode_tokens_per_s: round(med.decode),
        scheduler_generated_tokens_per_s: round(med.generated),
        worker_engine_tokens_per_s: round(med.worker),
        decode_vs_ceiling: round(med.decode / med.ceiling, 3),
        decode_vs_ceiling_median_of_pairs: pairs("decode", "ceiling"),
        generated_vs_ceiling: round(med.generated / med.ceiling, 3),
        worker_vs_ceiling: round(med.worker / med.ceiling, 3),
        worker_vs_ceiling_median_of_pairs: pairs("worker", "ceiling"),
        generated_vs_generation_ceiling: round(med.generated / med.ceilingGeneration, 3),
        worker_vs_generation_ceiling: round(med.worker / med.ceilingGeneration, 3),
        worker_vs_generation_ceiling_median_of_pairs: pairs("worker", "ceilingGeneration"),
        // Sustained load (2B in flight, maxBatchSize B), distinct prompts, then GRPO groups of `group`.
        sustained: {
          worker_engine_tokens_per_s: round(med.workerSustained),
          worker_vs_ceiling: round(med.workerSustained / med.ceiling, 3),
          worker_vs_ceiling_median_of_pairs: pairs("workerSustained", "ceiling"),
          worker_vs_generation_ceiling_median_of_pairs: pairs("workerSustained", "ceilingGeneration"),
        },
        sustained_grouped: {
          group,
          generation_ceiling_tokens_per_s: round(med.ceilingGenerationGrouped),
          generation_ceiling_vs_ceiling: round(med.ceilingGenerationGrouped / med.ceiling, 3),
          generation_ceiling_vs_ceiling_median_of_pairs: pairs("ceilingGenerationGrouped", "ceiling"),
          worker_engine_tokens_per_s: round(med.workerGrouped),
          worker_vs_ceiling: round(med.workerGrouped / med.ceiling, 3),
          worker_vs_ceiling_median_of_pairs: pairs("workerGrouped", "ceiling"),
          worker_vs_generation_ceiling_median_of_pairs: pairs("workerGrouped", "ceilingGenerationGrouped"),
        },
        runs,
        worker_runs: worker.map((w) => round(w)),
      };
      const x = (v: number): string => `x${v.toFixed(2)}`;
      process.stderr.write(
        `${shape.name} B=${batch}: ceiling ${med.ceiling.toFixed(0)} tok/s (samples ${Math.min(...allCeilings).toFixed(0)}-${Math.max(...allCeilings).toFixed(0)}); ` +
          `median of pairs against the decode ceiling: scheduler decode ${x(pairs("decode", "ceiling"))}, generation ceiling ${x(pairs("ceilingGeneration", "ceiling"))}, ` +
          `worker lock-step ${x(pairs("worker", "ceiling"))}, sustained ${x(pairs("workerSustained", "ceiling"))} (${x(pairs("workerSustained", "ceilingGeneration"))} of the generation ceiling), ` +
          `grouped by ${group} ${x(pairs("workerGrouped", "ceiling"))} (${x(pairs("workerGrouped", "ceilingGenerationGrouped"))} of its generation ceiling, itself ${x(pairs("ceilingGenerationGrouped", "ceiling"))})\n`,
      );
    }
  } finally {
    await runner.release();
  }
  return out;
}

async function trainerBench(shape: Shape): Promise<Record<string, unknown>> {
  const { config, weights } = shape;
  const model = await createJaxModel(config);
  const v = config.vocab_size;
  const n = TRAIN_B * TRAIN_T;
  const batch = {
    inputIds: Int32Array.from({ length: n }, (_, i) => (i * 7) % v),
    targets: Int32Array.from({ length: n }, (_, i) => (i * 5 + 3) % v),
    batch: TRAIN_B,
    seqLen: TRAIN_T,
  };
  const coef = new Float32Array(n).fill(-1 / n);
  const zero = new Float32Array(n);
  const specs = parameterSpecs(config);
  const w: Weights = Object.fromEntries(Object.entries(weights).map(([k, a]) => [k, Float32Array.from(a)]));
  const state = zeroOptimizerState(specs, w);
  const fb: number[] = [];
  const ad: number[] = [];
  const fw: number[] = [];
  for (let i = 0; i <= reps; i++) {
    const t0 = performance.now();
    const { grads } = model.gradient(w, batch, coef, zero, 1);
    const t1 = performance.now();
    adamwStep(specs, w, grads, state, { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0, clipGrad: 1 });
    const t2 = performance.now();
    model.forward(w, batch, 1);
    const t3 = performance.now();
    if (i > 0) {
      // The first round includes jit compilation.
      fb.push(t1 - t0);
      ad.push(t2 - t1);
      fw.push(t3 - t2);
    }
  }
  const fbMs = median(fb);
  const fwMs = median(fw);
  const adMs = median(ad);
  process.stderr.write(
    `${shape.name} trainer ${TRAIN_B}x${TRAIN_T}: fwd+bwd ${fbMs.toFixed(0)} ms = ${((n / fbMs) * 1000).toFixed(0)} tok/s; forward ${fwMs.toFixed(0)} ms\n`,
  );
  return {
    batch: TRAIN_B,
    seq_len: TRAIN_T,
    fwd_bwd_ms: round(fbMs, 1),
    fwd_bwd_tokens_per_s: round((n / fbMs) * 1000),
    forward_ms: round(fwMs, 1),
    forward_tokens_per_s: round((n / fwMs) * 1000),
    adamw_ms: round(adMs, 2),
    step_tokens_per_s: round((n / (fbMs + adMs)) * 1000),
    fwd_bwd_vs_forward_time: round(fbMs / fwMs, 2),
    runs_fwd_bwd_ms: fb.map((x) => round(x, 1)),
  };
}

const tmp = await mkdtemp(join(tmpdir(), "rlq-bench-model-"));
try {
  const demo = await readCheckpoint(join(repoRoot, "examples/demo/warm-start"));
  const kvConfig = parseModelConfig({ vocab_size: 32, context_length: 64, d_model: 64, n_heads: 4, n_layers: 2, d_mlp: 256 });
  const kvWeights = initWeights(kvConfig, 1);
  await writeCheckpoint(join(tmp, "onnx-kv"), { config: kvConfig, weights: kvWeights, version: 0, runId: "bench", step: -1 });
  const shapes: Shape[] = [
    {
      name: "demo",
      config: demo.config,
      weights: demo.weights,
      checkpointDir: join(repoRoot, "examples/demo/warm-start"),
      promptLen: 8,
      newTokens: demo.config.context_length - 8,
    },
    { name: "onnx-kv", config: kvConfig, weights: kvWeights, checkpointDir: join(tmp, "onnx-kv"), promptLen: 16, newTokens: 48 },
  ];
  const out: Record<string, unknown> = { bench: "embedded-model", reps, ort_threads: 1 };
  for (const shape of shapes) {
    out[shape.name] = {
      config: shape.config,
      prompt_tokens: shape.promptLen,
      new_tokens: shape.newTokens,
      engine: await engineBench(shape),
      trainer: await trainerBench(shape),
    };
  }
  await writeResult("embedded-model", out);
} finally {
  await rm(tmp, { recursive: true, force: true });
}
