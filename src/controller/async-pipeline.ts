import { loadRoundStatuses } from "../store/rollout-facts.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { admission, isAsyncRunDone, isSyncDue, syncDecisions } from "../core/pipeline.ts";
import { RlqError } from "../lib/errors.ts";
import type { ControllerHost } from "./host.ts";
import { decideReady, dispatchRounds, drawAndDispatch, inflightRounds, landedRounds, liveRounds } from "./groups.ts";
import { awaitEval, completeRun, dispatchEval, dispatchTrain, isEvalDue, isFirstEvalDue, recordTrained, syncEngines } from "./step-blocks.ts";

/**
 * Asynchronous mode (train_async, DESIGN §1): generation, training and weight
 * sync overlap. Each tick runs four independent parts, each a few decisions:
 * collect, train, sync, admission. The rules are pure (core/pipeline.ts,
 * core/decide-groups.ts); this file reads the facts they need.
 */
export async function tickAsync(h: ControllerHost): Promise<boolean> {
  const s = h.state;
  if (s.step === 0 && s.lastTrainedStep < 0 && isFirstEvalDue(h)) return dispatchEval(h, 0, s.weightVersion);
  let progressed = false;
  if (s.pendingEval) progressed = (await awaitEval(h)) || progressed;
  progressed = (await collectAsync(h)) || progressed;
  progressed = (await trainAsync(h)) || progressed;
  const wasSyncing = s.syncing !== null;
  progressed = (await syncAsync(h)) || progressed;
  // A sync just ended: the rounds it aborted go back out before any new group is drawn, so their
  // requests queue ahead of the new groups'. Drawn first, the new groups took the engines' slots
  // and the resumed long tails waited behind them; the groups in flight then held half the
  // unfinished samples, and at 64 engines with max_staleness 4 the engines ran short of requests
  // late in every step (bench/cluster-sim.ts; docs/performance.md "Session 15").
  if (wasSyncing && s.syncing === null) progressed = (await collectAsync(h)) || progressed;
  if (s.status === "running" && s.syncing === null) progressed = (await admitAsync(h)) || progressed;
  return progressed;
}

/**
 * Completed groups join the earliest unsealed step (decideGroups seals
 * full steps); a round that ended unfinished (aborted for a weight sync,
 * or an engine failure) continues as a new round at the current version.
 * While a sync is in progress nothing is decided or dispatched: it only
 * waits for the old version's rounds to land.
 */
async function collectAsync(h: ControllerHost): Promise<boolean> {
  if (h.state.syncing !== null) return false;
  const keys = liveRounds(h);
  if (keys.length === 0) return false;
  const { ready, redo } = await landedRounds(h, keys);
  if (redo.length > 0) await dispatchRounds(h, redo);
  ready.sort((a, b) => a - b);
  await decideReady(h, ready);
  return ready.length > 0 || redo.length > 0;
}

/** Steps train one at a time, in order, while generation goes on. */
async function trainAsync(h: ControllerHost): Promise<boolean> {
  const s = h.state;
  if (s.training !== null) return recordTrained(h, s.training);
  const next = s.trainQueue[0];
  if (next === undefined) return false;
  return dispatchTrain(h, next);
}

/**
 * Weight sync: record the intent (weights.syncing) with the in-flight rounds
 * to abort (weight_update_mode abort) or none (drain), wait until every round
 * of the old version landed and the engines loaded the new weights, then
 * record weights.synced. With abort the loads start at once, overlapping the
 * aborts (the engines hold them until their requests ended); with drain,
 * once the rounds landed. No request spans two versions: one segment, one version.
 */
async function syncAsync(h: ControllerHost): Promise<boolean> {
  const s = h.state;
  if (s.syncing !== null) {
    const target = s.syncing;
    const row = await loadTrainStep(h.deps.db, s.runId, target.step);
    if (!row) throw new RlqError("batch_inconsistent", `run ${s.runId}: syncing to step ${target.step}'s weights, which never committed`);
    // The engines start loading while the aborted rounds land (engine-admin.ts `beginLoad`: each
    // engine's load waits for its own requests to end); weights.synced still waits for both.
    h.engines.beginLoad(target.weightVersion, row.checkpointUri);
    const keys = liveRounds(h);
    const statuses = await loadRoundStatuses(h.deps.db, s.runId, keys);
    if (keys.some((k) => !statuses.has(k.groupId))) return false;
    await syncEngines(h, target.step, target.weightVersion, row.checkpointUri);
    if (isEvalDue(h, target.step + 1)) await dispatchEval(h, target.step + 1, target.weightVersion);
    return true;
  }
  if (s.trainedVersion === s.weightVersion) return isAsyncRunDone(s) ? completeRun(h) : false;
  if (!isSyncDue(s)) return false;
  let landed = new Set<number>();
  if (s.config.weight_update_mode === "abort") {
    const statuses = await loadRoundStatuses(h.deps.db, s.runId, inflightRounds(h));
    landed = new Set(statuses.keys());
  }
  await h.commit(syncDecisions(s, landed));
  return true;
}

/** Admission control (core/pipeline.ts `admission`): draw what the bound allows. */
async function admitAsync(h: ControllerHost): Promise<boolean> {
  const want = admission(h.state);
  if (want <= 0) return false;
  await drawAndDispatch(h, want);
  return true;
}
