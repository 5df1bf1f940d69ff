/**
 * save_interval as a retention policy for committed checkpoints (slime saves
 * every --save-interval rollouts, slime/utils/misc.py should_run_periodic_action:
 * when (rollout_id + 1) % interval == 0, and at the last rollout). rlq must
 * commit every step's checkpoint (the next step starts from it), so instead of
 * not writing the others it deletes them once nothing can load them again.
 *
 * Kept: step t when (t + 1) % save_interval == 0; the newest 2 + k steps (k
 * the staleness bound in force: a rollout or eval job may still ask an
 * embedded engine for a version that old); the steps whose version an eval
 * runs on ((t + 1) % eval_interval == 0). save_interval null keeps everything.
 */

import { readdir, rm } from "node:fs/promises";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { effectiveMaxStaleness, type RunConfig } from "../config/run-config.ts";
import { ifMissing } from "../lib/if-missing.ts";

export type RetentionConfig = Pick<RunConfig, "save_interval" | "eval_interval" | "max_staleness" | "train_async">;

export function isCheckpointKept(step: number, latestStep: number, c: RetentionConfig): boolean {
  if (c.save_interval === null) return true;
  if ((step + 1) % c.save_interval === 0) return true;
  if (step > latestStep - (2 + (effectiveMaxStaleness(c) ?? 0))) return true;
  return c.eval_interval !== null && (step + 1) % c.eval_interval === 0;
}

/** Delete the committed step directories under `root/runId` that save_interval does not keep. Returns the steps removed. */
export async function pruneCommittedCheckpoints(root: string, runId: string, latestStep: number, c: RetentionConfig): Promise<number[]> {
  if (c.save_interval === null) return [];
  const entries = await readdir(join(root, runId)).catch(ifMissing([] as string[]));
  const steps = entries.map((e) => /^step-(\d+)$/.exec(e)).flatMap((m) => (m ? [Number(m[1])] : []));
  const doomed = steps.filter((s) => s < latestStep && !isCheckpointKept(s, latestStep, c)).sort((a, b) => a - b);
  await Promise.all(doomed.map((s) => rm(join(root, runId, `step-${s}`), { recursive: true, force: true })));
  return doomed;
}

/**
 * The run's checkpoint directory: `checkpoint_dir` (slime's --save), relative
 * to RLQ_HOME when relative. `defaultRoot` is RLQ_HOME/checkpoints, the
 * default's resolution, which the worker already knows.
 */
export function checkpointRootFor(defaultRoot: string, checkpointDir: string): string {
  if (isAbsolute(checkpointDir)) return checkpointDir;
  return resolve(dirname(defaultRoot), checkpointDir);
}
