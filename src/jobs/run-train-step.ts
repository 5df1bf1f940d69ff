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
import type { Trainer, TrainProgress, TrainSample } from "../trainer/trainer.ts";
import { sha256File } from "../lib/hash.ts";
import { stepVersionIn } from "../core/sample.ts";
import { stalenessHistogram } from "../core/staleness.ts";
import { checkpointRootFor, pruneCommittedCheckpoints } from "../trainer/checkpoint-retention.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import { ifMissing } from "../lib/if-missing.ts";

/**
 * The train job. A step commits once (docs/architecture.md "The fact model"): the attempt writes into its
 * own directory, then one transaction inserts the `train_steps` row (primary
 * key (run, step)) with the metrics and trained marks. The winner deletes the
 * other attempts' directories; a loser deletes its own.
 */
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
  const { batch, groupIds, numTokens, stagedGroups } = await loadTrainBatch(db, ctx, step, deps.stager?.take(ctx, step));
  deps.log?.debug({ runId, step, groups: groupIds.length, stagedGroups }, "train batch built");
  const attempt = `${attemptNo}-${randomUUID().slice(0, 8)}`;
  const root = checkpointRootFor(deps.checkpointRoot, ctx.config.checkpoint_dir);
  const dir = stepDir(root, runId, step);
  const outputDir = join(dir, `attempt-${attempt}`);
  await mkdir(outputDir, { recursive: true });

  const trainer = await deps.trainerFor(ctx);
  const controller = new AbortController();
  const stallMs = ctx.config.train_stall_timeout_s * 1000;
  let lastProgressAt = Date.now();
  // An outage (trainer unreachable) is not a stall: the watchdog pauses for it, and its length is
  // added back, so a step that makes no progress around an outage is still cancelled.
  let outageSince: number | null = null;
  const watchdog = setInterval(
    () => {
      if (outageSince === null && Date.now() - lastProgressAt > stallMs) controller.abort(`no progress for ${ctx.config.train_stall_timeout_s}s`);
    },
    Math.min(1000, stallMs / 4),
  );
  // A progress report only shows the job alive (the watchdog reads lastProgressAt): one that fails is told, and the next replaces it.
  const report = (p: TrainProgress) =>
    void deps.reportProgress(p).catch((e: unknown) => deps.log?.warn({ runId, step, phase: p.phase, err: errorMessage(e) }, "train progress not reported"));
  const onOutage = (waitedMs: number | null) => {
    if (waitedMs === null) {
      if (outageSince !== null) lastProgressAt += Date.now() - outageSince;
      outageSince = null;
      report({ done: 0, total: 1, phase: "the trainer answers again" });
      return;
    }
    outageSince ??= Date.now();
    report({ done: 0, total: 1, phase: `waiting for the trainer: unreachable for ${Math.round(waitedMs / 1000)} s` });
  };
  let result;
  try {
    result = await trainer.trainStep(
      { runId, step, attempt: attemptNo, weightVersionIn: dispatched.weightVersionIn, checkpointUriIn, outputDir, config: ctx.config, batch },
      (p) => {
        lastProgressAt = Date.now();
        report(p);
      },
      controller.signal,
      { shutdown: deps.shutdown, onOutage },
    );
  } catch (e) {
    // On shutdown the trainer may still be running this attempt (the job comes back with the same
    // attempt number and joins it), so its directory stays; the commit collects it if it loses.
    if (!(e instanceof RlqError && e.code === "worker_shutdown")) await rm(outputDir, { recursive: true, force: true });
    if (controller.signal.aborted)
      throw new RlqError("train_stalled", `train step ${step} attempt ${attempt}: ${String(controller.signal.reason)}`, { cause: e, isRetriable: true });
    throw e;
  } finally {
    clearInterval(watchdog);
  }
  if (result.weightVersionOut !== dispatched.weightVersionIn + 1) {
    throw new RlqError(
      "trainer_bad_response",
      `trainer returned weight version ${result.weightVersionOut} for step ${step}; expected ${dispatched.weightVersionIn + 1}`,
    );
  }
  // The trainer is idempotent per (run, step): it may answer with an earlier
  // attempt's finished checkpoint. Commit what it actually produced.
  const ckptPath = result.checkpointUri.startsWith("file:") ? fileURLToPath(result.checkpointUri) : result.checkpointUri;
  if (dirname(ckptPath) !== dir) {
    throw new RlqError("trainer_bad_response", `trainer wrote step ${step} to ${ckptPath}, outside the step's directory ${dir}`);
  }
  const checkpointSha256 = await sha256File(join(ckptPath, WEIGHTS_FILE));
  deps.crashPoint("train.before_commit");
  const { isWinner, row } = await commitTrainStep(db, {
    runId,
    step,
    attempt: basename(ckptPath).replace(/^attempt-/, ""),
    weightVersionIn: dispatched.weightVersionIn,
    weightVersionOut: result.weightVersionOut,
    numSamples: batch.samples.length,
    numTokens,
    checkpointUri: pathToFileURL(ckptPath).href,
    checkpointSha256,
    metrics: { ...result.metrics, ...stalenessMetrics(batch.samples, dispatched.weightVersionIn) },
    groupIds,
  });
  if (!isWinner) {
    // Another attempt committed first: remove whatever this attempt left that is not the committed checkpoint.
    const committed = fileURLToPath(row.checkpointUri);
    for (const d of new Set([outputDir, ckptPath])) if (d !== committed) await rm(d, { recursive: true, force: true });
    return;
  }
  await collectLosingAttempts(root, runId, step, basename(ckptPath));
  await pruneCommittedCheckpoints(root, runId, step, ctx.config);
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
