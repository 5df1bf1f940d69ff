/**
 * `rlq retrain RUN --step S`: slime's --load-debug-rollout-data. The step's
 * batch is rebuilt from recorded facts (the same code the train job runs),
 * fed to the run's trainer from step S-1's committed checkpoint, and the
 * result is compared with what step S committed: the weights' sha256 (equal
 * in deterministic mode with a deterministic trainer) and the metrics. For
 * debugging a loss and reproducing a step; nothing is recorded.
 */

import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, open, rm } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Db } from "../store/db.ts";
import { findDecisions } from "../store/run-facts.ts";
import { listTrainSteps, loadTrainMetrics, loadTrainStep } from "../store/train-facts.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { sha256File } from "../lib/hash.ts";
import { RlqError } from "../lib/errors.ts";
import type { Trainer, TrainProgress } from "../trainer/trainer.ts";
import { checkpointRootFor } from "../trainer/checkpoint-retention.ts";
import { stepDir, WEIGHTS_FILE } from "./run-train-step.ts";
import { loadTrainBatch } from "./train-batch.ts";

export interface RetrainResult {
  step: number;
  checkpointUriIn: string | null;
  /** Where the retrained weights are (removed unless the caller chose the directory). */
  outputDir: string;
  sha256: string;
  /** null: step S never committed (a failed step can be retrained too). */
  committedSha256: string | null;
  /**
   * The safetensors tensor bytes (the file minus its JSON header, which may name the run)
   * compared with the committed file's: null when either is not a safetensors file or the
   * committed file is gone.
   */
  sameTensors: boolean | null;
  metrics: Record<string, number>;
  committedMetrics: Record<string, number> | null;
}

export interface RetrainDeps {
  db: Db;
  /** RLQ_HOME/checkpoints (the run's checkpoint_dir is resolved against RLQ_HOME). */
  checkpointRoot: string;
  trainerFor(ctx: RunContext): Promise<Trainer>;
  onProgress?(p: TrainProgress): void;
  signal?: AbortSignal;
}

const asFilePath = (uri: string) => (uri.startsWith("file:") ? fileURLToPath(uri) : uri);

/**
 * The safetensors format's own bound on the JSON header (its reference implementation refuses a
 * larger one); it also keeps the first 8 bytes of a file that is not safetensors from asking for a
 * read of gigabytes.
 */
const MAX_SAFETENSORS_HEADER_BYTES = 100_000_000;

/** Where a safetensors file's tensor bytes start (after the 8-byte length and the JSON header), or null if it is not one. */
async function safetensorsDataOffset(path: string): Promise<number | null> {
  const fh = await open(path, "r");
  try {
    const { size } = await fh.stat();
    const len = Buffer.alloc(8);
    if (size < 8 || (await fh.read(len, 0, 8, 0)).bytesRead < 8) return null;
    const n = Number(len.readBigUInt64LE(0));
    if (n > MAX_SAFETENSORS_HEADER_BYTES || 8 + n > size) return null;
    const header = Buffer.alloc(n);
    if ((await fh.read(header, 0, n, 8)).bytesRead < n) return null;
    try {
      JSON.parse(header.toString("utf8"));
    } catch {
      // Not JSON: not a safetensors file, which the caller reports as "tensors not compared".
      return null;
    }
    return 8 + n;
  } finally {
    await fh.close();
  }
}

/** sha256 of a safetensors file's tensor bytes (after the 8-byte length and the JSON header), read as a stream, or null if it is not one. */
export async function safetensorsDataSha256(path: string): Promise<string | null> {
  const offset = await safetensorsDataOffset(path);
  return offset === null ? null : sha256File(path, offset);
}

export async function retrainStep(deps: RetrainDeps, ctx: RunContext, step: number, options: { outputDir?: string } = {}): Promise<RetrainResult> {
  const { db } = deps;
  const { runId } = ctx;
  const dispatched = (await findDecisions(db, runId, "train.dispatched", { step }))[0];
  if (!dispatched) {
    const steps = (await listTrainSteps(db, runId)).map((r) => r.step);
    throw new RlqError(
      "retrain_no_step",
      `run ${runId} never dispatched step ${step} for training; its committed steps are ${steps.length > 0 ? `${steps[0]}..${steps[steps.length - 1]}` : "none"}`,
    );
  }
  const committed = await loadTrainStep(db, runId, step);
  const prev = step === 0 ? null : await loadTrainStep(db, runId, step - 1);
  if (step > 0 && prev === null)
    throw new RlqError("retrain_no_step", `run ${runId} step ${step - 1} never committed, so step ${step} has no starting checkpoint`);
  const checkpointUriIn = prev !== null ? prev.checkpointUri : ctx.config.ref_load;
  if (prev !== null && !existsSync(join(asFilePath(prev.checkpointUri), WEIGHTS_FILE))) {
    throw new RlqError(
      "checkpoint_not_kept",
      `step ${step - 1}'s committed checkpoint ${asFilePath(prev.checkpointUri)} is gone${ctx.config.save_interval !== null ? ` (save_interval ${ctx.config.save_interval} keeps step t when (t+1) % ${ctx.config.save_interval} == 0)` : ""}: retrain a step whose previous step's checkpoint was kept`,
    );
  }
  const { batch } = await loadTrainBatch(db, ctx, step);
  const tag = `retrain-${randomUUID().slice(0, 8)}`;
  const outputDir = options.outputDir ?? join(stepDir(checkpointRootFor(deps.checkpointRoot, ctx.config.checkpoint_dir), runId, step), tag);
  await mkdir(outputDir, { recursive: true });
  const trainer = await deps.trainerFor(ctx);
  const signal = deps.signal ?? new AbortController().signal;
  let result;
  try {
    // A remote trainer answers a (run_id, step) it has seen with its earlier checkpoint
    // (docs/trainer-protocol.md), so it gets a distinct run id; the embedded trainer is
    // idempotent per output directory only, and keeps the run id its checkpoint header names.
    const requestRunId = ctx.config.trainer.kind === "embedded" ? runId : `${runId}-${tag}`;
    result = await trainer.trainStep(
      {
        runId: requestRunId,
        step,
        attempt: 0,
        weightVersionIn: dispatched.weightVersionIn,
        checkpointUriIn,
        outputDir,
        config: ctx.config,
        batch: { ...batch, runId: requestRunId },
      },
      (p) => deps.onProgress?.(p),
      signal,
      { shutdown: signal },
    );
  } catch (e) {
    if (options.outputDir === undefined) await rm(outputDir, { recursive: true, force: true });
    throw e;
  }
  const weightsFile = join(asFilePath(result.checkpointUri), WEIGHTS_FILE);
  const sha256 = await sha256File(weightsFile);
  const data = await safetensorsDataSha256(weightsFile);
  if (options.outputDir === undefined) await rm(outputDir, { recursive: true, force: true });
  const committedFile = committed === null ? null : join(asFilePath(committed.checkpointUri), WEIGHTS_FILE);
  const committedData = committedFile !== null && existsSync(committedFile) ? await safetensorsDataSha256(committedFile) : null;
  return {
    step,
    checkpointUriIn,
    outputDir,
    sha256,
    committedSha256: committed?.checkpointSha256 ?? null,
    sameTensors: data === null || committedData === null ? null : data === committedData,
    metrics: result.metrics,
    committedMetrics: committed === null ? null : await loadTrainMetrics(db, runId, step),
  };
}

/** A retrain reproduced the commit: the same file, or the same tensors under another header. */
export function reproducesCommit(r: RetrainResult): boolean {
  return r.committedSha256 === null || r.sha256 === r.committedSha256 || r.sameTensors === true;
}

/** The report `rlq retrain` prints: the hashes, then each metric committed vs retrained. */
export function formatRetrain(runId: string, r: RetrainResult, deterministic: boolean): string {
  const lines = [`retrain ${runId} step ${r.step} from ${r.checkpointUriIn ?? "the seed"}`];
  if (r.committedSha256 === null) lines.push(`  weights sha256 ${r.sha256} (step ${r.step} never committed: nothing to compare)`);
  else {
    const same = r.sha256 === r.committedSha256;
    const note = same
      ? ""
      : r.sameTensors === true
        ? "  (same tensors; the header differs)"
        : deterministic
          ? "  MISMATCH (deterministic mode)"
          : "  (not deterministic mode: may differ)";
    lines.push(`  weights sha256 ${r.sha256} ${same ? "==" : "!="} committed ${r.committedSha256}${note}`);
    if (!same && r.sameTensors === false) lines.push("  tensors differ from the committed checkpoint's");
  }
  const names = [...new Set([...Object.keys(r.committedMetrics ?? {}), ...Object.keys(r.metrics)])].sort();
  const fmt = (v: number | undefined) => (v === undefined ? "-" : String(v));
  for (const n of names) lines.push(`  ${n}: committed ${fmt(r.committedMetrics?.[n])}  retrained ${fmt(r.metrics[n])}`);
  return lines.join("\n") + "\n";
}
