/**
 * The train job. A step commits once (docs/architecture.md "The fact model"): the attempt writes into its
 * own directory, then one transaction inserts the `train_steps` row (primary
 * key (run, step)) with the metrics and trained marks. The winner deletes the
 * other attempts' directories; a loser deletes its own.
 */

import { randomUUID } from "node:crypto";
import { mkdir, readdir, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { Db } from "../store/db.ts";
import { findDecisions } from "../store/run-facts.ts";
import type { BatchStager } from "./batch-stager.ts";
import { loadTrainBatch } from "./train-batch.ts";
import { commitTrainStep, loadTrainStep } from "../store/train-facts.ts";
import type { TrainJob } from "../queue/payloads.ts";
import type { RunContext } from "../runtime/run-context.ts";
import type { Trainer, TrainProgress, TrainRequest, TrainResult, TrainSample } from "../trainer/trainer.ts";
import { sha256File } from "../lib/hash.ts";
import { stepVersionIn } from "../core/sample.ts";
import { stalenessHistogram } from "../core/staleness.ts";
import { checkpointRootFor, pruneCommittedCheckpoints } from "../trainer/checkpoint-retention.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import { ifMissing } from "../lib/if-missing.ts";

export interface TrainDeps {
  db: Db;
  checkpointRoot: string;
  trainerFor(ctx: RunContext): Promise<Trainer>;
  /** Progress to the queue (keeps the job visibly alive). */
  reportProgress(p: TrainProgress): Promise<void>;
  /** Test-only crash points. */
  crashPoint(name: string): void;
  /** Fires when the worker shuts down: stop waiting for an unreachable trainer. */
  shutdown: AbortSignal;
  /** Kept groups read while their step collected (jobs/batch-stager.ts); without it the job reads the whole batch. */
  stager?: BatchStager;
  log?: { debug(obj: object, msg: string): void; warn(obj: object, msg: string): void };
}

export function stepDir(root: string, runId: string, step: number): string {
  return join(root, runId, `step-${step}`);
}

export const WEIGHTS_FILE = "weights.safetensors";

export async function runTrainStep(deps: TrainDeps, ctx: RunContext, job: TrainJob, attemptNo: number): Promise<void> {
  const { db } = deps;
  const { runId, step } = job;
  const dispatched = (await findDecisions(db, runId, "train.dispatched", { step }))[0];
  if (!dispatched) throw new RlqError("no_decision_behind_job", `train job for run ${runId} step ${step}: no train.dispatched decision`);
  if (await loadTrainStep(db, runId, step)) return;
  // Checked before the trainer is asked: a step from the wrong version would spend a GPU step on
  // weights that can never commit.
  if (dispatched.weightVersionIn !== stepVersionIn(step)) {
    throw new RlqError(
      "batch_inconsistent",
      `train step ${step} was dispatched with weight_version_in ${dispatched.weightVersionIn}; step ${step} starts from version ${stepVersionIn(step)}`,
    );
  }
  const prev = step === 0 ? null : await loadTrainStep(db, runId, step - 1);
  const checkpointUriIn = prev ? prev.checkpointUri : ctx.config.ref_load ? pathToFileURL(ctx.config.ref_load).href : null;
  const loaded = await loadTrainBatch(db, ctx, step, deps.stager?.take(ctx, step));
  deps.log?.debug({ runId, step, groups: loaded.groupIds.length, stagedGroups: loaded.stagedGroups }, "train batch built");
  const attempt = `${attemptNo}-${randomUUID().slice(0, 8)}`;
  const root = checkpointRootFor(deps.checkpointRoot, ctx.config.checkpoint_dir);
  const dir = stepDir(root, runId, step);
  const outputDir = join(dir, `attempt-${attempt}`);
  await mkdir(outputDir, { recursive: true });
  const request: TrainRequest = {
    runId,
    step,
    attempt: attemptNo,
    weightVersionIn: dispatched.weightVersionIn,
    checkpointUriIn,
    outputDir,
    config: ctx.config,
    batch: loaded.batch,
  };
  const result = await trainAttempt(deps, ctx, request, attempt);
  if (result.weightVersionOut !== dispatched.weightVersionIn + 1) {
    throw new RlqError(
      "trainer_bad_response",
      `trainer returned weight version ${result.weightVersionOut} for step ${step}; expected ${dispatched.weightVersionIn + 1}`,
    );
  }
  await commitAttempt(deps, ctx, { request, result, loaded, root, dir });
}

/**
 * The trainer's step for one attempt under the stall watchdog. A failed attempt's directory is
 * removed, except on shutdown: the trainer may still be running it (the job comes back with the
 * same attempt number and joins it), and the commit collects it if it loses.
 */
async function trainAttempt(deps: TrainDeps, ctx: RunContext, request: TrainRequest, attempt: string): Promise<TrainResult> {
  const { runId, step } = request;
  const trainer = await deps.trainerFor(ctx);
  // A progress report only shows the job alive (the watchdog reads its own clock): one that fails is told, and the next replaces it.
  const report = (p: TrainProgress) =>
    void deps.reportProgress(p).catch((e: unknown) => deps.log?.warn({ runId, step, phase: p.phase, err: errorMessage(e) }, "train progress not reported"));
  const watchdog = new StallWatchdog(ctx.config.train_stall_timeout_s, report);
  try {
    return await trainer.trainStep(
      request,
      (p) => {
        watchdog.progressed();
        report(p);
      },
      watchdog.signal,
      { shutdown: deps.shutdown, onOutage: (waitedMs) => watchdog.outage(waitedMs) },
    );
  } catch (e) {
    if (!(e instanceof RlqError && e.code === "worker_shutdown")) await rm(request.outputDir, { recursive: true, force: true });
    if (watchdog.signal.aborted)
      throw new RlqError("train_stalled", `train step ${step} attempt ${attempt}: ${String(watchdog.signal.reason)}`, { cause: e, isRetriable: true });
    throw e;
  } finally {
    watchdog.stop();
  }
}

/**
 * Cancels a train attempt that reports no progress for train_stall_timeout_s. Its modes: watching
 * (`outageSince` null) and paused for an outage (the trainer unreachable, which is not a stall);
 * the outage's length is added back to `lastProgressAt` when it ends, so a step that makes no
 * progress around an outage is still cancelled.
 */
class StallWatchdog {
  private readonly controller = new AbortController();
  private readonly timer: NodeJS.Timeout;
  private lastProgressAt = Date.now();
  private outageSince: number | null = null;

  constructor(
    private readonly stallS: number,
    private readonly report: (p: TrainProgress) => void,
  ) {
    const stallMs = stallS * 1000;
    this.timer = setInterval(
      () => {
        if (this.outageSince === null && Date.now() - this.lastProgressAt > stallMs) this.controller.abort(`no progress for ${this.stallS}s`);
      },
      Math.min(1000, stallMs / 4),
    );
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  progressed(): void {
    this.lastProgressAt = Date.now();
  }

  /** The trainer's outage hook: `waitedMs` how long it has been unreachable, null when it answers again. */
  outage(waitedMs: number | null): void {
    if (waitedMs === null) {
      if (this.outageSince !== null) this.lastProgressAt += Date.now() - this.outageSince;
      this.outageSince = null;
      this.report({ done: 0, total: 1, phase: "the trainer answers again" });
      return;
    }
    this.outageSince ??= Date.now();
    this.report({ done: 0, total: 1, phase: `waiting for the trainer: unreachable for ${Math.round(waitedMs / 1000)} s` });
  }

  stop(): void {
    clearInterval(this.timer);
  }
}

/**
 * Commit what the trainer produced (it is idempotent per (run, step): it may answer with an earlier
 * attempt's finished checkpoint). The winner collects the other attempts and prunes old
 * checkpoints; a loser removes whatever it left that is not the committed checkpoint.
 */
async function commitAttempt(
  deps: TrainDeps,
  ctx: RunContext,
  a: { request: TrainRequest; result: TrainResult; loaded: Awaited<ReturnType<typeof loadTrainBatch>>; root: string; dir: string },
): Promise<void> {
  const { runId, step, weightVersionIn, outputDir } = a.request;
  const ckptPath = a.result.checkpointUri.startsWith("file:") ? fileURLToPath(a.result.checkpointUri) : a.result.checkpointUri;
  if (dirname(ckptPath) !== a.dir) {
    throw new RlqError("trainer_bad_response", `trainer wrote step ${step} to ${ckptPath}, outside the step's directory ${a.dir}`);
  }
  const checkpointSha256 = await sha256File(join(ckptPath, WEIGHTS_FILE));
  deps.crashPoint("train.before_commit");
  const { batch, numTokens, groupIds } = a.loaded;
  const { isWinner, row } = await commitTrainStep(deps.db, {
    runId,
    step,
    attempt: basename(ckptPath).replace(/^attempt-/, ""),
    weightVersionIn,
    weightVersionOut: a.result.weightVersionOut,
    numSamples: batch.samples.length,
    numTokens,
    checkpointUri: pathToFileURL(ckptPath).href,
    checkpointSha256,
    metrics: { ...a.result.metrics, ...stalenessMetrics(batch.samples, weightVersionIn) },
    groupIds,
    ...(a.result.oldLogProbs && { logProbs: trainedLogProbs(batch.samples, groupIds, a.result.oldLogProbs) }),
  });
  if (!isWinner) {
    const committed = fileURLToPath(row.checkpointUri);
    for (const d of new Set([outputDir, ckptPath])) if (d !== committed) await rm(d, { recursive: true, force: true });
    return;
  }
  await collectLosingAttempts(a.root, runId, step, basename(ckptPath));
  await pruneCommittedCheckpoints(a.root, runId, step, ctx.config);
}

/** The trainer's per-sample old log-probs keyed by sample, checked against the batch it was sent. */
function trainedLogProbs(
  samples: readonly TrainSample[],
  groupIds: readonly number[],
  oldLogProbs: readonly number[][],
): Array<{ groupId: number; sampleIndex: number; logProbs: number[] }> {
  if (oldLogProbs.length !== samples.length) {
    throw new RlqError("trainer_bad_response", `trainer returned oldLogProbs for ${oldLogProbs.length} samples; the batch has ${samples.length}`);
  }
  return samples.map((s, i) => {
    const logProbs = oldLogProbs[i] as number[];
    const groupId = groupIds[s.groupIndex];
    if (groupId === undefined || logProbs.length !== s.responseLength) {
      throw new RlqError(
        "trainer_bad_response",
        `trainer returned ${logProbs.length} old log-probs for sample ${i} of the batch (group index ${s.groupIndex}); it has ${s.responseLength} response tokens`,
      );
    }
    return { groupId, sampleIndex: s.sampleIndex, logProbs };
  });
}

/** Delete every attempt directory of a committed step except the committed one. */
export async function collectLosingAttempts(root: string, runId: string, step: number, keep: string): Promise<void> {
  const dir = stepDir(root, runId, step);
  const entries = await readdir(dir).catch(ifMissing([] as string[]));
  await Promise.all(entries.filter((e) => e !== keep && e.startsWith("attempt-")).map((e) => rm(join(dir, e), { recursive: true, force: true })));
}

/**
 * The step's staleness as train metrics: staleness_mean / _max over its
 * samples and `staleness_hist_<k>` (how many samples are k versions stale).
 */
export function stalenessMetrics(samples: readonly TrainSample[], versionIn: number): Record<string, number> {
  const hist = stalenessHistogram(samples, versionIn);
  const out: Record<string, number> = {};
  let sum = 0;
  let n = 0;
  for (const [k, count] of hist) {
    out[`staleness_hist_${k}`] = count;
    sum += k * count;
    n += count;
  }
  out.staleness_mean = n === 0 ? 0 : sum / n;
  out.staleness_max = hist.size === 0 ? 0 : Math.max(...hist.keys());
  return out;
}
