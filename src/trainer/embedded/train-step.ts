/**
 * One train step of the embedded trainer (runs inside the trainer's worker
 * thread; pure compute plus reading the input checkpoint and writing the output).
 *
 *  1. start weights: checkpointUriIn, else ref_load, else init from seed;
 *     optimizer state beside it (zeros for a warm start);
 *  2. old log-probs under the start weights for every sample (and reference
 *     log-probs when a KL term needs them); train_rollout_logprob_abs_diff;
 *  3. advantages over the whole batch (group-normalised rewards for GRPO);
 *  4. num_optimizer_steps AdamW steps, each over global_batch_size samples in
 *     (groupIndex, sampleIndex) order, loss from src/algorithms;
 *  5. write weight version v+1 and its optimizer state to outputDir.
 * The metrics include the step-time split, tokens/s, TFLOP/s and MFU (efficiency.ts).
 * Deterministic: the same request gives bit-identical files.
 */

import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { computeAdvantagesAndReturns } from "../../algorithms/advantages.ts";
import { postProcessRewards, type PostProcessedRewards } from "../../algorithms/rewards.ts";
import { readCheckpoint, readOptimizerState, writeCheckpoint, writeFileAtomic, type OptimizerState } from "../../model/checkpoint.ts";
import type { ModelConfig } from "../../model/config.ts";
import { initWeights, parameterSpecs, type ParameterSpec, type Weights } from "../../model/weights.ts";
import { RlqError } from "../../lib/errors.ts";
import { trainResultSchema, type TrainProgress, type TrainRequest, type TrainResult, type TrainSample } from "../trainer.ts";
import { adamwStep, zeroOptimizerState } from "./adamw.ts";
import { bucketSeqLen, microBatchRows, packBatch, packResponses, unpackResponses } from "./batching.ts";
import type { JaxModel } from "./jax-model.ts";
import { learningRate } from "./lr-schedule.ts";
import { lossAndGrad, sftObjective, type ObjectiveOutput } from "./policy-objective.ts";
import { optimizerStepPlan, parseTrainConfig, type ParsedTrainConfig } from "./train-config.ts";
import { ifMissing } from "../../lib/if-missing.ts";
import { devicePeakFlops, efficiencyMetrics, modelFlops, modelShape, StepClock } from "./efficiency.ts";

export interface TrainStepDeps {
  /** The compiled network for a model config (built once per config by the caller). */
  modelFor(config: ModelConfig): Promise<JaxModel>;
  /** Model config used when there is no checkpoint to start from. */
  initConfig: ModelConfig | null;
  /** Reference weights for KL terms (cached by the caller). */
  loadReference(uri: string): Promise<Weights>;
}

export const RESULT_FILE = "train-result.json";

interface StartPoint {
  config: ModelConfig;
  weights: Weights;
  optimizer: OptimizerState | null;
  version: number;
}

async function loadStart(req: TrainRequest, refLoad: string | null, seed: number, initConfig: ModelConfig | null): Promise<StartPoint> {
  const uri = req.checkpointUriIn ?? refLoad;
  if (uri !== null) {
    const ckpt = await readCheckpoint(uri);
    const optimizer = req.checkpointUriIn !== null ? await readOptimizerState(ckpt.path, ckpt.config) : null;
    return { config: ckpt.config, weights: ckpt.weights, optimizer, version: ckpt.version };
  }
  if (initConfig === null) {
    throw new RlqError("trainer_no_initial_weights", "train step has no checkpointUriIn, no ref_load and the trainer has no model config to initialise from");
  }
  return { config: initConfig, weights: initWeights(initConfig, seed), optimizer: null, version: 0 };
}

function forwardResponses(
  model: JaxModel,
  weights: Weights,
  samples: readonly TrainSample[],
  rows: number,
  seqLen: number,
  temperature: number,
): { logp: Float64Array[]; entropy: Float64Array[] } {
  const logp: Float64Array[] = [];
  const entropy: Float64Array[] = [];
  // Fixed-size chunks: one compiled shape for the whole step.
  for (let i = 0; i < samples.length; i += rows) {
    const chunk = samples.slice(i, i + rows);
    const out = model.forward(weights, packBatch(chunk, seqLen), temperature);
    logp.push(...unpackResponses(out.logProbs, chunk, seqLen));
    entropy.push(...unpackResponses(out.entropy, chunk, seqLen));
  }
  return { logp, entropy };
}

/** d loss / d weights over `samples`, micro-batch by micro-batch (rows samples each), summed. */
export function microBatchGradient(
  model: JaxModel,
  weights: Weights,
  samples: readonly TrainSample[],
  rows: number,
  seqLen: number,
  dLogp: readonly Float64Array[],
  dEntropy: readonly Float64Array[],
  temperature: number,
): Weights {
  let sum: Weights | null = null;
  for (let i = 0; i < samples.length; i += rows) {
    const chunk = samples.slice(i, i + rows);
    const { grads } = model.gradient(
      weights,
      packBatch(chunk, seqLen),
      packResponses(dLogp.slice(i, i + rows), chunk, seqLen),
      packResponses(dEntropy.slice(i, i + rows), chunk, seqLen),
      temperature,
    );
    if (sum === null) {
      sum = Object.fromEntries(Object.entries(grads).map(([name, g]) => [name, Float32Array.from(g)]));
      continue;
    }
    for (const [name, g] of Object.entries(grads)) {
      const acc = sum[name] as Float32Array;
      for (let k = 0; k < g.length; k++) acc[k] = (acc[k] as number) + (g[k] as number);
    }
  }
  if (sum === null) throw new RlqError("trainer_empty_batch", "microBatchGradient: no samples");
  return sum;
}

function maskedMeanAbsDiff(a: readonly Float64Array[], samples: readonly TrainSample[]): number {
  let sum = 0;
  let count = 0;
  samples.forEach((s, i) => {
    const x = a[i] as Float64Array;
    for (let t = 0; t < s.responseLength; t++) {
      if (s.lossMask[t] === 0) continue;
      sum += Math.abs((x[t] as number) - (s.rolloutLogProbs[t] as number));
      count++;
    }
  });
  return count === 0 ? 0 : sum / count;
}

export async function runEmbeddedTrainStep(req: TrainRequest, deps: TrainStepDeps, onProgress: (p: TrainProgress) => void): Promise<TrainResult> {
  const clock = new StepClock();
  const resultPath = join(req.outputDir, RESULT_FILE);
  const finished = await readFinishedResult(resultPath, req);
  if (finished) return finished;
  const loaded = await loadStep(req, deps);
  clock.mark("load_s");
  const plan = planBatch(req, loaded);
  onProgress({ done: 0, total: plan.numOptimizerSteps, phase: "old_logprobs" });
  const inputs = await lossInputs(loaded, plan, deps, clock);
  clock.mark("prepare_s");
  const trained = runOptimizerSteps(loaded, plan, inputs, clock, onProgress);

  const version = req.weightVersionIn + 1;
  const { uri } = await writeCheckpoint(
    req.outputDir,
    { config: loaded.start.config, weights: loaded.start.weights, version, runId: req.runId, step: req.step },
    loaded.optimizer,
  );
  clock.mark("save_s");
  const metrics = stepMetrics(loaded, plan, inputs, trained);
  const { samples } = plan;
  const numTokens = samples.reduce((a, s) => a + s.lossMask.reduce((x, y) => x + y, 0), 0);
  // As the torch trainer counts: one forward and backward per sample, plus each whole-batch forward alone
  // (old, reference); the current log-probs of later minibatches are recomputation and count nothing.
  const lengths = samples.map((s) => Math.max(s.tokens.length - 1, 1));
  const shape = modelShape(loaded.start.config);
  const flops = modelFlops(shape, lengths) + modelFlops(shape, lengths, true) * (inputs.ref ? 2 : 1);
  const tokens = samples.reduce((a, s) => a + s.tokens.length, 0);
  clock.mark("other_s");
  // The result file below holds these metrics, so its write falls outside the step's measured time.
  Object.assign(metrics, efficiencyMetrics(clock, tokens, flops, devicePeakFlops()));
  // The old log-probs back in the request's order (the plan sorts its samples by group and index).
  const planned = new Map(samples.map((s, i) => [s, i]));
  const oldLogProbs = req.batch.samples.map((s) => Array.from(inputs.old.logp[planned.get(s) as number] as Float64Array));
  const result = trainResultSchema.parse({ weightVersionOut: version, checkpointUri: uri, numSamples: samples.length, numTokens, metrics, oldLogProbs });
  await writeFileAtomic(resultPath, JSON.stringify({ runId: req.runId, step: req.step, weightVersionIn: req.weightVersionIn, result }));
  return result;
}

/** Idempotent per (run, step): the result of this attempt directory's finished step, if it holds one for this request. */
async function readFinishedResult(resultPath: string, req: TrainRequest): Promise<TrainResult | null> {
  const previous = await readFile(resultPath, "utf8").catch(ifMissing(null));
  if (previous === null) return null;
  const saved = JSON.parse(previous) as { runId: string; step: number; weightVersionIn: number; result: unknown };
  if (saved.runId === req.runId && saved.step === req.step && saved.weightVersionIn === req.weightVersionIn) return trainResultSchema.parse(saved.result);
  return null;
}

/** The step's config, start weights and optimizer state (both updated in place by the optimizer steps), and its compiled model. */
interface LoadedStep extends ParsedTrainConfig {
  /** loss_type sft_loss (docs/sft.md): the rows' responses' NLL instead of the policy loss. */
  isSft: boolean;
  start: StartPoint;
  model: JaxModel;
  specs: ParameterSpec[];
  optimizer: OptimizerState;
}

async function loadStep(req: TrainRequest, deps: TrainStepDeps): Promise<LoadedStep> {
  const { train, algorithm } = parseTrainConfig(req.config);
  const isSft = (req.config as { loss_type?: unknown }).loss_type === "sft_loss";
  if (algorithm.advantage_estimator === "ppo")
    throw new RlqError("trainer_unsupported", "the embedded trainer has no critic: advantage_estimator ppo is not supported");
  const start = await loadStart(req, train.ref_load, train.seed, deps.initConfig);
  if (start.version !== req.weightVersionIn) {
    throw new RlqError("trainer_version_mismatch", `checkpoint holds weight version ${start.version}, the request says weightVersionIn ${req.weightVersionIn}`);
  }
  const model = await deps.modelFor(start.config);
  const specs = parameterSpecs(start.config);
  const optimizer = start.optimizer ?? zeroOptimizerState(specs, start.weights);
  return { train, algorithm, isSft, start, model, specs, optimizer };
}

/** The batch in (groupIndex, sampleIndex) order and its shapes: optimizer steps, padded length, rows per micro-batch. */
interface BatchPlan {
  samples: TrainSample[];
  globalBatchSize: number;
  numOptimizerSteps: number;
  seqLen: number;
  rows: number;
  temperature: number;
}

function planBatch(req: TrainRequest, { train, start }: LoadedStep): BatchPlan {
  const samples = [...req.batch.samples].sort((a, b) => a.groupIndex - b.groupIndex || a.sampleIndex - b.sampleIndex);
  if (samples.length === 0) throw new RlqError("trainer_empty_batch", `train step ${req.step} has no samples`);
  const { globalBatchSize, numOptimizerSteps } = optimizerStepPlan(train, samples.length);
  const seqLen = bucketSeqLen(samples, start.config.context_length);
  const rows = microBatchRows(train.max_tokens_per_gpu, seqLen, globalBatchSize);
  return { samples, globalBatchSize, numOptimizerSteps, seqLen, rows, temperature: train.rollout_temperature };
}

/** What the loss reads besides the current log-probs, per sample `[samples][response]`. */
interface LossInputs {
  lossMask: Float64Array[];
  /** The mask before rlq zeroed off-policy/stale tokens (docs/architecture.md "The loop"): the denominators. */
  denomMask: Float64Array[];
  rolloutLogProbs: Float64Array[];
  /** Under the start weights. */
  old: { logp: Float64Array[]; entropy: Float64Array[] };
  /** Under the reference weights, when a KL term needs them. */
  ref: Float64Array[] | undefined;
  rewards: PostProcessedRewards;
  advantages: Float64Array[];
}

/** Steps 2 and 3: old (and reference) log-probs over the whole batch, then advantages. */
async function lossInputs(loaded: LoadedStep, plan: BatchPlan, deps: TrainStepDeps, clock: StepClock): Promise<LossInputs> {
  const { train, algorithm, model, start } = loaded;
  const { samples, rows, seqLen, temperature } = plan;
  const lossMask = samples.map((s) => Float64Array.from(s.lossMask));
  const denomMask = samples.map((s) => Float64Array.from(s.denomMask ?? s.lossMask));
  const rolloutLogProbs = samples.map((s) => Float64Array.from(s.rolloutLogProbs));
  clock.mark("prepare_s");
  const old = forwardResponses(model, start.weights, samples, rows, seqLen, temperature);
  clock.mark("old_logprobs_s");
  let ref: Float64Array[] | undefined;
  if (algorithm.use_kl_loss || algorithm.kl_coef !== 0) {
    if (train.ref_load === null) throw new RlqError("trainer_config", "use_kl_loss / kl_coef need ref_load (the reference checkpoint)");
    ref = forwardResponses(model, await deps.loadReference(train.ref_load), samples, rows, seqLen, temperature).logp;
    clock.mark("ref_logprobs_s");
  }
  const rewards = postProcessRewards(
    samples.map((s) => s.reward),
    samples.map((s) => s.groupIndex),
    algorithm,
  );
  const teacherLogProbs = algorithm.use_opd ? opdTeacherLogProbs(samples) : undefined;
  const { advantages } = computeAdvantagesAndReturns(
    {
      rewards: rewards.normalized,
      lossMask,
      oldLogProbs: old.logp,
      rolloutLogProbs,
      ...(ref && { refLogProbs: ref }),
      ...(teacherLogProbs && { teacherLogProbs }),
    },
    algorithm,
  );
  return { lossMask, denomMask, rolloutLogProbs, old, ref, rewards, advantages };
}

/** What the optimizer steps leave for the metrics: loss metrics and grad norms summed over the steps, the last learning rate. */
interface Trained {
  sums: Record<string, number>;
  gradNormSum: number;
  lr: number;
}

/** Step 4: num_optimizer_steps AdamW steps, each over global_batch_size samples in order. */
function runOptimizerSteps(loaded: LoadedStep, plan: BatchPlan, inputs: LossInputs, clock: StepClock, onProgress: (p: TrainProgress) => void): Trained {
  const { train, model, specs, optimizer, start } = loaded;
  const { samples, globalBatchSize, numOptimizerSteps, rows, seqLen, temperature } = plan;
  const weights = start.weights;
  const out: Trained = { sums: {}, gradNormSum: 0, lr: 0 };
  for (let j = 0; j < numOptimizerSteps; j++) {
    const lo = j * globalBatchSize;
    const hi = lo + globalBatchSize;
    const mb = samples.slice(lo, hi);
    // The first minibatch sees the start weights: its current log-probs are the old ones.
    const current =
      j === 0
        ? { logp: inputs.old.logp.slice(lo, hi), entropy: inputs.old.entropy.slice(lo, hi) }
        : forwardResponses(model, weights, mb, rows, seqLen, temperature);
    const objective = minibatchObjective(loaded, inputs, current, lo, hi);
    const grads = microBatchGradient(model, weights, mb, rows, seqLen, objective.dLossDLogp, objective.dLossDEntropy, temperature);
    clock.mark("fwd_bwd_s");
    out.lr = learningRate(
      {
        lr: train.lr,
        minLr: train.min_lr,
        style: train.lr_decay_style,
        warmupIters: train.lr_warmup_iters,
        decayIters: train.lr_decay_iters ?? (train.num_rollout === null ? null : train.num_rollout * numOptimizerSteps),
      },
      optimizer.iteration,
    );
    out.gradNormSum += adamwStep(specs, weights, grads, optimizer, {
      lr: out.lr,
      beta1: train.adam_beta1,
      beta2: train.adam_beta2,
      eps: train.adam_eps,
      weightDecay: train.weight_decay,
      clipGrad: train.clip_grad,
    });
    for (const [k, v] of Object.entries(objective.metrics)) out.sums[k] = (out.sums[k] ?? 0) + v;
    onProgress({ done: j + 1, total: numOptimizerSteps, phase: "optimizer_step" });
    clock.mark("optimizer_s");
  }
  return out;
}

/** The loss of samples [lo, hi) and its gradient by log-prob and entropy: the SFT NLL or the policy loss (src/algorithms). */
function minibatchObjective(
  { isSft, algorithm }: LoadedStep,
  inputs: LossInputs,
  current: { logp: Float64Array[]; entropy: Float64Array[] },
  lo: number,
  hi: number,
): ObjectiveOutput {
  if (isSft) return sftObjective(current.logp, inputs.lossMask.slice(lo, hi), inputs.denomMask.slice(lo, hi), algorithm.calculate_per_token_loss);
  return lossAndGrad(
    current.logp,
    current.entropy,
    {
      oldLogProbs: inputs.old.logp.slice(lo, hi),
      rolloutLogProbs: inputs.rolloutLogProbs.slice(lo, hi),
      advantages: inputs.advantages.slice(lo, hi),
      lossMask: inputs.lossMask.slice(lo, hi),
      denomMask: inputs.denomMask.slice(lo, hi),
      ...(inputs.ref && { refLogProbs: inputs.ref.slice(lo, hi) }),
    },
    algorithm,
  );
}

/** The step's metrics: loss metrics averaged over the optimizer steps, grad norm, lr, and the batch's own. */
function stepMetrics(loaded: LoadedStep, plan: BatchPlan, inputs: LossInputs, trained: Trained): Record<string, number> {
  const { samples, numOptimizerSteps } = plan;
  const metrics: Record<string, number> = {};
  for (const [k, v] of Object.entries(trained.sums)) metrics[k] = v / numOptimizerSteps;
  Object.assign(metrics, {
    grad_norm: trained.gradNormSum / numOptimizerSteps,
    lr: trained.lr,
    // Engine vs trainer on the same tokens and weights, over every trained token of the step.
    train_rollout_logprob_abs_diff: maskedMeanAbsDiff(inputs.old.logp, samples),
    raw_reward: inputs.rewards.raw.reduce((a, b) => a + b, 0) / samples.length,
    response_length: samples.reduce((a, s) => a + s.responseLength, 0) / samples.length,
    num_optimizer_steps: numOptimizerSteps,
  });
  return metrics;
}

/** use_opd: each sample's teacher log-probs (the reward job stored them beside its reward); a sample without them is a bug upstream. */
function opdTeacherLogProbs(samples: readonly TrainSample[]): Float64Array[] {
  return samples.map((s) => {
    if (s.teacherLogProbs === undefined)
      throw new RlqError("trainer_bad_batch", `use_opd: sample ${s.sampleIndex} of group ${s.groupIndex} has no teacher log-probs`);
    return Float64Array.from(s.teacherLogProbs);
  });
}
