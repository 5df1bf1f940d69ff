/**
 * The blocks the sync step and the async pipeline share: dispatching a train
 * step and recording its commit, loading a version into the engines, the
 * evals, completing the run. Each is one decision (or two) and its job.
 */

import { loadTrainStep } from "../store/train-facts.ts";
import { loadEvalResults } from "../store/eval-facts.ts";
import { totalSteps } from "../core/run-state.ts";
import type { ControllerHost } from "./host.ts";

/** `train.dispatched` for `step` (from the last trained version), then the train job. */
export async function dispatchTrain(h: ControllerHost, step: number): Promise<boolean> {
  await h.commitThenEnqueue([{ kind: "train.dispatched", payload: { step, weightVersionIn: h.state.trainedVersion } }], {
    crashPoint: "controller.after_train_dispatch",
  });
  return true;
}

/** Once the train job committed `step`, record it (`step.trained`). False: not committed yet. */
export async function recordTrained(h: ControllerHost, step: number): Promise<boolean> {
  const s = h.state;
  const row = await loadTrainStep(h.deps.db, s.runId, step);
  if (!row) return false;
  await h.commit([{ kind: "step.trained", payload: { step, weightVersionOut: row.weightVersionOut, checkpointUri: row.checkpointUri } }]);
  h.deps.log.info({ runId: s.runId, step, version: row.weightVersionOut }, "train step committed");
  return true;
}

/** The engines load `weightVersion` (step `step`'s checkpoint), then `weights.synced`. */
export async function syncEngines(h: ControllerHost, step: number, weightVersion: number, checkpointUri: string): Promise<void> {
  await h.engines.loadWeights(weightVersion, checkpointUri);
  await h.commit([{ kind: "weights.synced", payload: { step, weightVersion, checkpointUri } }]);
  h.deps.crashPoint("controller.after_sync");
}

export async function completeRun(h: ControllerHost): Promise<boolean> {
  await h.commit([{ kind: "run.status", payload: { status: "completed", reason: null } }]);
  h.deps.log.info({ runId: h.state.runId, steps: totalSteps(h.state) }, "run completed");
  return true;
}

/** An eval is due at step boundary `boundary` (0: before training; every eval_interval steps; the last). */
export function isEvalDue(h: ControllerHost, boundary: number): boolean {
  const c = h.state.config;
  if (c.eval_interval === null || c.eval_prompt_data === null || h.state.evalsDispatched.has(boundary)) return false;
  return boundary === 0 || boundary % c.eval_interval === 0 || boundary === totalSteps(h.state);
}

/** Before the first step trains: the step-0 eval, unless skip_eval_before_train. */
export function isFirstEvalDue(h: ControllerHost): boolean {
  return isEvalDue(h, 0) && !h.state.config.skip_eval_before_train;
}

export async function dispatchEval(h: ControllerHost, boundary: number, weightVersion: number): Promise<boolean> {
  await h.commitThenEnqueue([{ kind: "eval.dispatched", payload: { step: boundary, weightVersion } }]);
  return true;
}

/** The pending eval's results landed: record them (`eval.recorded`), which unpins the engines' version. */
export async function awaitEval(h: ControllerHost): Promise<boolean> {
  const pending = h.state.pendingEval;
  if (!pending) return false;
  const rows = await loadEvalResults(h.deps.db, h.state.runId, pending.step);
  if (rows.length === 0) return false;
  await h.commit([{ kind: "eval.recorded", payload: { step: pending.step } }]);
  for (const r of rows)
    h.deps.log.info({ runId: h.state.runId, step: r.step, dataset: r.dataset, meanReward: r.meanReward, passAtK: r.passAtK }, "eval recorded");
  return true;
}
