/**
 * Asynchronous mode (train_async, docs/architecture.md "Asynchronous mode"): generation, training and weight
 * sync overlap. Each tick runs four independent parts, each a few decisions:
 * collect, train, sync, admission. The rules are pure (core/pipeline.ts,
 * core/decide-groups.ts); this file reads the facts they need.
 */

import { loadRoundStatuses } from "../store/rollout-facts.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { admission, isAsyncRunDone, isSyncDue, syncDecisions } from "../core/pipeline.ts";
import { RlqError } from "../lib/errors.ts";
import type { ControllerHost } from "./host.ts";
import { decideReady, dispatchRounds, drawAndDispatch, inflightRounds, landedRounds, liveRounds } from "./groups.ts";
import { awaitEval, completeRun, dispatchEval, dispatchTrain, isEvalDue, isFirstEvalDue, recordTrained, syncEngines } from "./step-blocks.ts";

export async function tickAsync(h: ControllerHost): Promise<boolean> {
  const s = h.state;
  if (s.step === 0 && s.lastTrainedStep < 0 && isFirstEvalDue(h)) return dispatchEval(h, 0, s.weightVersion);
  let progressed = false;
  if (s.pendingEval) progressed = (await awaitEval(h)) || progressed;
  // Each part reads the state the parts before it committed (h.state), not `s`.
  progressed = (await collectAsync(h)) || progressed;
  progressed = (await trainAsync(h)) || progressed;
  const wasSyncing = h.state.syncing !== null;
  progressed = (await syncAsync(h)) || progressed;
  // A sync just ended: the rounds it aborted go back out before any new group is drawn, so their
  // requests queue ahead of the new groups'. Drawn first, the new groups took the engines' slots
  // and the resumed long tails waited behind them; the groups in flight then held half the
  // unfinished samples, and at 64 engines with max_staleness 4 the engines ran short of requests
  // late in every step (bench/cluster-sim.ts; docs/performance.md, "Cluster scale").
  if (wasSyncing && h.state.syncing === null) progressed = (await collectAsync(h)) || progressed;
  if (h.state.status === "running" && h.state.syncing === null) progressed = (await admitAsync(h)) || progressed;
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
 * to abort (weight_update_mode abort) or none (drain, in_place), wait until every round
 * of the old version landed (abort, drain) and the engines loaded the new weights, then
 * record weights.synced. With abort the loads start at once, overlapping the
 * aborts (the engines hold them until their requests ended); with drain,
 * once the rounds landed: no request spans two versions. With in_place the loads start
 * at once, each engine paused keeping its requests, and the rounds in flight go on across
 * the load: their tokens' versions split at the boundary (one segment per version,
 * engines/sglang-answer.ts and jobs/generate-group-round.ts `splitAtVersions`), and the staleness
 * bound applies per token as for any segment.
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
    if (h.engines.isEarlyDispatch && s.config.weight_update_mode === "abort") {
      const { isLanded, progressed } = await continueDuringSync(h, target.weightVersion);
      if (!isLanded) return progressed;
    } else if (s.config.weight_update_mode !== "in_place") {
      const keys = liveRounds(h);
      const statuses = await loadRoundStatuses(h.deps.db, s.runId, keys);
      if (keys.some((k) => !statuses.has(k.groupId))) return false;
    }
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
  // The load is asked for with the intent, not a tick later; the next ticks ask again, a no-op
  // (engine-admin.ts `beginLoad`).
  const { syncing: started, trainedCheckpointUri } = h.state;
  if (started !== null && trainedCheckpointUri !== null) h.engines.beginLoad(started.weightVersion, trainedCheckpointUri);
  return true;
}

/**
 * An abort-mode sync whose loads began with it (EngineAdmin `isEarlyDispatch`): each aborted round
 * is continued at the new version as soon as it lands, and once every one has landed the groups the
 * new version admits are drawn, all before `weights.synced`. The rollout workers hold these requests
 * until an engine reports the new version (runtime/engines.ts; the controller says when each load
 * ends, store/notify.ts `rlq_weights`), so each engine takes its share the moment its own load ends,
 * instead of after the slowest load, the synced commit and the dispatch (~250 ms a step at 64
 * simulated engines, docs/performance.md, "Cluster scale"). The resumed rounds still go out before the
 * new groups ("Session 15"). Returns true once every round of the old version has landed: the sync
 * may end when the loads do. Rounds dispatched at the new version are not waited for.
 */
async function continueDuringSync(h: ControllerHost, version: number): Promise<{ isLanded: boolean; progressed: boolean }> {
  const { redo, unlanded } = await landedRounds(h, liveRounds(h));
  if (redo.length > 0) await dispatchRounds(h, redo, version);
  // The state after the continued rounds' dispatch: they left `draining`, and admission counts them.
  const s = h.state;
  if ([...s.draining.keys()].some((groupId) => unlanded.has(groupId))) return { isLanded: false, progressed: redo.length > 0 };
  const want = s.status === "running" ? admission(s, version) : 0;
  if (want > 0) await drawAndDispatch(h, want, version);
  h.deps.crashPoint("controller.during_sync"); // rounds running at the new version, the loads not all done
  return { isLanded: true, progressed: true };
}

/** Admission control (core/pipeline.ts `admission`): draw what the bound allows. */
async function admitAsync(h: ControllerHost): Promise<boolean> {
  const want = admission(h.state);
  if (want <= 0) return false;
  await drawAndDispatch(h, want);
  return true;
}
