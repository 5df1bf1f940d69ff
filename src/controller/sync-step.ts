/**
 * One rollout step in synchronous mode (docs/architecture.md "The loop"): collect (draw, dispatch,
 * filter completed groups) → seal → train, while the aborted rounds drain
 * (back to the buffer or discarded) → sync once both are done → next step.
 * Each call does what the state's phase allows and returns whether anything
 * happened.
 *
 * The train job goes out at the seal, not after the drain: the batch is the
 * sealed groups, which the drain does not touch, so building it overlaps the
 * engines' aborts coming back (at 64 engines the drain took 100-240 ms of the
 * seal → train-start bubble; bench/cluster-sim.ts). The sync still waits for
 * the drain: the next step draws the buffered groups first.
 */

import { loadRoundStatuses } from "../store/rollout-facts.ts";
import { loadGroupsWithRewards } from "../store/group-view.ts";
import { historyRows } from "../store/history.ts";
import { insertHistory } from "../store/projections.ts";
import { totalSteps } from "../core/run-state.ts";
import { sealDecision, shouldDrawMore } from "../core/decide-groups.ts";
import { groupLoad } from "../core/group-load.ts";
import { nextColocateAction } from "../core/colocate.ts";
import { memoryTags } from "../core/decisions.ts";
import { holdForRelease } from "../store/colocate-turn.ts";
import type { ControllerHost } from "./host.ts";
import type { RolloutFunctionDriver } from "./rollout-function.ts";
import { decideReady, dispatchRounds, drawAndDispatch, inflightRounds, landedRounds } from "./groups.ts";
import { isSftRun } from "../config/sft-keys.ts";
import { collectSft } from "./sft-collect.ts";
import { isReplayRun, isRolloutOnly } from "../config/debug-keys.ts";
import { collectRecorded } from "./recorded-collect.ts";
import { awaitEval, completeRun, dispatchEval, dispatchTrain, isEvalDue, isFirstEvalDue, recordTrained, syncEngines } from "./step-blocks.ts";

export async function tickSync(h: ControllerHost, rolloutFunction: RolloutFunctionDriver | null): Promise<boolean> {
  const s = h.state;
  // An eval pins the engines' version: nothing moves until its results land.
  if (s.pendingEval) return awaitEval(h);
  if (s.phase === "collect" && s.step === 0 && isFirstEvalDue(h)) return dispatchEval(h, 0, s.weightVersion);
  if (s.config.colocate && s.phase !== "collect") {
    const done = await tickColocated(h);
    if (done !== null) return done;
  }
  switch (s.phase) {
    case "collect":
      if (isSftRun(s.config)) return collectSft(h);
      if (isReplayRun(s.config)) return collectRecorded(h);
      return rolloutFunction ? rolloutFunction.tick() : collect(h);
    case "drain":
      if (isRolloutOnly(s.config)) return endRolloutOnlyStep(h);
      return dispatchTrain(h, s.step);
    case "train": {
      const drained = await drain(h);
      return (await recordTrained(h, s.step)) || drained;
    }
    case "sync":
      if (s.draining.size > 0) return drain(h);
      return sync(h);
    case "done":
      return false;
  }
}

async function collect(h: ControllerHost): Promise<boolean> {
  const c = h.state.config;
  const keys = inflightRounds(h);
  const { ready, redo } = await landedRounds(h, keys);
  // A round that ended unfinished without a seal (engine abort or failure): continue it as a new round.
  if (redo.length > 0) await dispatchRounds(h, redo);
  if (c.deterministic && ready.length < keys.length) return redo.length > 0;
  ready.sort((a, b) => a - b);
  await decideReady(h, ready);
  // The state after the outcomes just committed.
  const seal = sealDecision(h.state);
  if (seal) {
    await h.commit([seal]);
    h.deps.crashPoint("controller.after_seal");
    return true;
  }
  if (shouldDrawMore(h.state)) {
    await drawAndDispatch(h);
    return true;
  }
  return ready.length > 0 || redo.length > 0;
}

/** The sealed step's aborted rounds that landed: buffered (partial_rollout) or discarded. */
async function drain(h: ControllerHost): Promise<boolean> {
  const s = h.state;
  const c = s.config;
  if (s.draining.size === 0) return false;
  const keys = [...s.draining].map(([groupId, round]) => ({ groupId, round }));
  const statuses = await loadRoundStatuses(h.deps.db, s.runId, keys);
  const landed = keys.filter((k) => statuses.has(k.groupId)).sort((a, b) => a.groupId - b.groupId);
  // The landed groups' outcomes, 256 groups per commit (with their history rows when discarded).
  for (let i = 0; i < landed.length; i += 256) {
    const chunk = landed.slice(i, i + 256);
    const outcome = c.partial_rollout ? ("buffered" as const) : ("discarded" as const);
    const decisions = chunk.map((k) => ({ kind: "group.outcome" as const, payload: { groupId: k.groupId, step: s.step, outcome, reason: "aborted" } }));
    if (c.partial_rollout) {
      await h.commit(decisions);
      continue;
    }
    const loads = chunk.map((k) => groupLoad(c, { ...k, step: s.step, outcome: "aborted" }));
    const views = await loadGroupsWithRewards(h.deps.db, s.runId, loads, c.n_samples_per_prompt);
    const rows = [...views.values()].flatMap((g) => historyRows(s.runId, s.step, g, null, "discarded", "aborted", (ids) => h.ctx.tokenizer.decode(ids), null));
    await h.commit(decisions, (tx) => insertHistory(tx, rows));
  }
  return landed.length > 0;
}

/** After the step trained: sync the engines (every update_weights_interval steps, and the last), evals, then the next step. */
async function sync(h: ControllerHost): Promise<boolean> {
  const s = h.state;
  const c = s.config;
  const isLast = s.step + 1 >= totalSteps(s);
  // Evals run after the step's sync, on the synced version (weights.synced is then already recorded).
  if (s.weightVersion === s.trainedVersion && isEvalDue(h, s.step + 1)) return dispatchEval(h, s.step + 1, s.weightVersion);
  // weight_sync none: the engines keep version 0 for the whole run; nothing is synced. Nor in a
  // train-only run (debug_rollouts_from): it uses no engine.
  if (c.weight_sync !== "none" && !isReplayRun(c) && ((s.step + 1) % c.update_weights_interval === 0 || isLast) && s.weightVersion !== s.trainedVersion) {
    await syncEngines(h, s.step, s.trainedVersion, s.trainedCheckpointUri as string);
    if (isEvalDue(h, s.step + 1)) return dispatchEval(h, s.step + 1, h.state.weightVersion);
  }
  if (isLast) return completeRun(h);
  // The version the engines serve now: the sync above (if any) committed it.
  await h.commit([{ kind: "step.started", payload: { step: s.step + 1, weightVersion: h.state.weightVersion } }]);
  return true;
}

/**
 * Colocated mode's turns on the shared GPUs (core/colocate.ts `nextColocateAction`): after the
 * sealed step drained, the engines release their memory and the step trains (the trainer onloads
 * and offloads itself around it); then the engines resume their weights, load the trained
 * version, resume their KV cache, and the step ends as in a split run (`sync`). Each endpoint call
 * comes before its decision, each decision before the next call. Returns null where the split
 * run's block does the same (awaiting the train step, the step's end).
 */
async function tickColocated(h: ControllerHost): Promise<boolean | null> {
  const s = h.state;
  const action = nextColocateAction({
    phase: s.phase,
    engineMemory: s.engineMemory,
    drainingCount: s.draining.size,
    weightVersion: s.weightVersion,
    trainedVersion: s.trainedVersion,
  });
  switch (action) {
    case "drain":
      return drain(h);
    case "release":
      // Not while a rollout worker's health check or admission probe is under way: their pools
      // send none once the log says the step is sealed, and the release waits for those that
      // started before (store/colocate-turn.ts).
      await holdForRelease(h.deps.db, s.runId, () => h.engines.releaseMemory(memoryTags));
      h.deps.crashPoint("controller.before_release_decision");
      await h.commit([{ kind: "engines.released", payload: { step: s.step } }]);
      h.deps.crashPoint("controller.after_release");
      return true;
    case "train":
      return dispatchTrain(h, s.step);
    case "resume_weights":
      await h.engines.resumeMemory(["weights"]);
      h.deps.crashPoint("controller.before_resume_decision");
      await h.commit([{ kind: "engines.resumed", payload: { step: s.step, tag: "weights" } }]);
      h.deps.crashPoint("controller.after_resume_weights");
      return true;
    case "load":
      // The resumed weights hold nothing trained: the step's checkpoint loads now, whatever the interval.
      await syncEngines(h, s.step, s.trainedVersion, s.trainedCheckpointUri as string);
      return true;
    case "resume_kv_cache":
      await h.engines.resumeMemory(["kv_cache"]);
      await h.commit([{ kind: "engines.resumed", payload: { step: s.step, tag: "kv_cache" } }]);
      h.deps.crashPoint("controller.after_resume_kv_cache");
      return true;
    case "await_train":
    case "next":
    case "none":
      return null;
  }
}

/**
 * debug_rollout_only (slime's --debug-rollout-only, config/debug-keys.ts): the sealed step trains
 * nothing. Once its aborted rounds drained, the next step starts on the same weights (version 0
 * for the whole run: there is nothing to sync or to evaluate anew), or the run completes.
 */
async function endRolloutOnlyStep(h: ControllerHost): Promise<boolean> {
  const s = h.state;
  if (s.draining.size > 0) return drain(h);
  if (s.step + 1 >= totalSteps(s)) return completeRun(h);
  await h.commit([{ kind: "step.started", payload: { step: s.step + 1, weightVersion: s.weightVersion } }]);
  return true;
}
