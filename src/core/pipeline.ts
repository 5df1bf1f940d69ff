/**
 * The asynchronous pipeline's rules (train_async, docs/architecture.md "Asynchronous mode"): admission, the
 * weight sync's intent and the end of the run. Pure: the controller reads
 * which rounds have landed and commits what these return.
 */

import { effectiveMaxStaleness, overSamplingBatchSize } from "../config/run-config.ts";
import type { Decision } from "./decisions.ts";
import { totalSteps, type RunState } from "./run-state.ts";

/**
 * Admission control, counted in groups (AReaL's rule): a new group starts
 * only while accepted + running < (k + v + 1) × rollout_batch_size, v the
 * engines' version; filtered-out groups free their place. No more than the
 * run's remaining steps can use. Returns how many groups to draw now (0: none),
 * at most one over-sampling batch.
 */
export function admission(s: RunState, weightVersion = s.weightVersion): number {
  const c = s.config;
  const k = effectiveMaxStaleness(c) ?? 1;
  const rbs = c.rollout_batch_size;
  const cap = Math.min((k + weightVersion + 1) * rbs, totalSteps(s) * rbs);
  const free = cap - s.acceptedGroups - s.inflight.size - s.draining.size;
  return free <= 0 ? 0 : Math.min(free, overSamplingBatchSize(c));
}

/**
 * Whether the engines should start loading the last trained version now
 * (every update_weights_interval steps, and the last; never while an eval pins
 * the version). Returns false when there is nothing new to load.
 */
export function isSyncDue(s: RunState): boolean {
  if (s.trainedVersion === s.weightVersion || s.pendingEval) return false;
  const next = s.lastTrainedStep + 1;
  return next % s.config.update_weights_interval === 0 || next >= totalSteps(s);
}

/**
 * The sync's intent: `weights.syncing`, and with weight_update_mode abort a
 * `group.aborted` for every in-flight round that has not landed (`landed`:
 * group ids whose current round has its fact). With drain nothing is aborted.
 */
export function syncDecisions(s: RunState, landed: ReadonlySet<number>): Decision[] {
  const c = s.config;
  const list: Decision[] = [{ kind: "weights.syncing", payload: { step: s.lastTrainedStep, weightVersion: s.trainedVersion, mode: c.weight_update_mode } }];
  if (c.weight_update_mode !== "abort") return list;
  for (const groupId of [...s.inflight].sort((a, b) => a - b)) {
    if (landed.has(groupId)) continue; // already landed: nothing to abort
    list.push({
      kind: "group.aborted",
      payload: { groupId, round: s.groups.get(groupId)?.round ?? 0, step: s.step, reason: `weight sync to version ${s.trainedVersion}` },
    });
  }
  return list;
}

/** Async mode: every step trained and synced, no eval pending, nothing in flight. */
export function isAsyncRunDone(s: RunState): boolean {
  return (
    s.trainedVersion === s.weightVersion &&
    s.lastTrainedStep + 1 >= totalSteps(s) &&
    s.training === null &&
    s.trainQueue.length === 0 &&
    !s.pendingEval &&
    s.inflight.size === 0 &&
    s.draining.size === 0
  );
}
