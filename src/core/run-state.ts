/**
 * The run's state, folded from its decision log. Pure: no I/O. The controller
 * applies each decision it writes with the same `apply` (through `applyDecisions`,
 * a new state per commit), so a controller restarted from the log reaches exactly
 * the state it had.
 */

import { RlqError } from "../lib/errors.ts";
import type { RunConfig } from "../config/run-config.ts";
import { applyRecordedChanges, decodeRecordedConfig } from "../config/recorded-config.ts";
import type { Cursor, LoggedDecision } from "./decisions.ts";
import { initialEngineMemory, nextEngineMemory, type EngineMemory } from "./colocate.ts";

export type RunStatus = "created" | "running" | "paused" | "cancelled" | "completed";
export type StepPhase = "collect" | "drain" | "train" | "sync" | "done";
export type GroupPhase = "inflight" | "kept" | "filtered" | "buffered" | "discarded" | "draining";

export interface GroupState {
  groupId: number;
  /** Latest dispatched round (-1: drawn, not dispatched yet). */
  round: number;
  /** Rounds that regenerated stale samples (staleness_policy drop). */
  regenerations: number;
  /** Step of the latest dispatch or outcome. */
  step: number;
  phase: GroupPhase;
}

export interface RunState {
  runId: string;
  name: string;
  config: RunConfig;
  status: RunStatus;
  statusReason: string | null;
  /** seq of the last applied decision (-1 before any). */
  seq: number;
  datasetSize: number;
  datasetFingerprint: string;
  pluginFingerprints: Record<string, string>;
  cursor: Cursor;
  /** The rollout step being collected or trained. */
  step: number;
  phase: StepPhase;
  /** Version the engines serve (and the next train step starts from). */
  weightVersion: number;
  checkpointUri: string | null;
  /** Version the last committed train step produced (>= weightVersion). */
  trainedVersion: number;
  trainedCheckpointUri: string | null;
  /** Partial-rollout buffer: group ids, FIFO. */
  buffer: number[];
  /**
   * The groups a later decision can still refer to: in flight, draining, buffered, or decided in the
   * current step. A group kept, filtered or discarded in an earlier step is done (its facts are in
   * the log and the tables) and leaves the map at the next `step.started` (`forgetDecidedGroups`).
   */
  groups: Map<number, GroupState>;
  /** Kept groups of the current step, in decision order. */
  kept: number[];
  /** Groups dispatched in the current step with no outcome yet. */
  inflight: Set<number>;
  /** Aborted rounds of the sealed step whose round fact has not been seen yet. */
  draining: Map<number, number>;
  /** Kept groups of the sealed step, in training order. */
  sealed: number[];
  /** Steps whose eval was dispatched; the one not yet recorded blocks the loop. */
  evalsDispatched: Set<number>;
  pendingEval: { step: number; weightVersion: number } | null;
  /** Groups kept so far, over the whole run (async admission control counts them). */
  acceptedGroups: number;
  /** Async mode: sealed steps not yet dispatched to the trainer, in order. */
  trainQueue: number[];
  /** Async mode: the step the trainer is on (dispatched, not committed). */
  training: number | null;
  /** The last step whose training committed (-1: none). */
  lastTrainedStep: number;
  /** Async mode: a weight sync in progress (in-flight rounds aborted or draining). */
  syncing: { step: number; weightVersion: number } | null;
  /** Colocated mode: what the engines hold of the shared GPUs (core/colocate.ts); resident otherwise. */
  engineMemory: EngineMemory;
}

/** Async mode (train_async): generation, training and weight sync overlap. */
export function isAsync(state: RunState): boolean {
  return state.config.train_async;
}

export function emptyState(runId: string): RunState {
  return {
    runId,
    name: "",
    config: undefined as unknown as RunConfig,
    status: "created",
    statusReason: null,
    seq: -1,
    datasetSize: 0,
    datasetFingerprint: "",
    pluginFingerprints: {},
    cursor: { epoch: 0, offset: 0, nextOrdinal: 0 },
    step: 0,
    phase: "collect",
    weightVersion: 0,
    checkpointUri: null,
    trainedVersion: 0,
    trainedCheckpointUri: null,
    buffer: [],
    groups: new Map(),
    kept: [],
    inflight: new Set(),
    draining: new Map(),
    sealed: [],
    evalsDispatched: new Set(),
    pendingEval: null,
    acceptedGroups: 0,
    trainQueue: [],
    training: null,
    lastTrainedStep: -1,
    syncing: null,
    engineMemory: initialEngineMemory,
  };
}

/**
 * Groups decided for good (kept, filtered or discarded) drop out of the state: no decision refers to
 * them again (a new draw is a new group id; only buffered and in-flight groups come back). A 1M-sample
 * run drew 125k groups: as objects in the state they were most of a restart from a snapshot
 * (bench/recovery.ts) and memory that grows with the run.
 */
function forgetDecidedGroups(state: RunState): void {
  for (const [id, g] of state.groups) if (g.phase === "kept" || g.phase === "filtered" || g.phase === "discarded") state.groups.delete(id);
}

function group(state: RunState, groupId: number): GroupState {
  const g = state.groups.get(groupId);
  if (!g) throw new RlqError("decision_log_corrupt", `run ${state.runId}: decision refers to unknown group ${groupId}`);
  return g;
}

/**
 * A group's next value: a new object in the map, never a change to the old one, so a copy of the
 * state (`copyState`) can share the group objects with the state it was copied from.
 */
function setGroup(state: RunState, groupId: number, change: Partial<Omit<GroupState, "groupId">>): GroupState {
  const g = { ...group(state, groupId), ...change };
  state.groups.set(groupId, g);
  return g;
}

/**
 * A copy of `state` that `apply` may change without changing `state`: its own maps, sets and
 * arrays; the values in them (group objects, the config, the cursor) are shared, as `apply`
 * replaces them and never changes them in place.
 */
export function copyState(state: RunState): RunState {
  return {
    ...state,
    pluginFingerprints: { ...state.pluginFingerprints },
    buffer: [...state.buffer],
    groups: new Map(state.groups),
    kept: [...state.kept],
    inflight: new Set(state.inflight),
    draining: new Map(state.draining),
    sealed: [...state.sealed],
    evalsDispatched: new Set(state.evalsDispatched),
    trainQueue: [...state.trainQueue],
  };
}

/**
 * The state after `decisions`, as a new value: `state` itself is left as it was. What the
 * controller commits through, so a part that read the state before an `await h.commit(...)` holds
 * the state as of its read, not one changed under it halfway through its work.
 */
export function applyDecisions(state: RunState, decisions: Iterable<LoggedDecision>): RunState {
  const next = copyState(state);
  for (const d of decisions) apply(next, d);
  return next;
}

/**
 * Apply one decision to a state the caller owns alone (a fold's, or a copy from `copyState`):
 * changes and returns `state`. A state others hold goes through `applyDecisions`.
 */
export function apply(state: RunState, d: LoggedDecision): RunState {
  if (d.seq !== state.seq + 1) throw new RlqError("decision_log_corrupt", `run ${state.runId}: decision seq ${d.seq} after ${state.seq}`);
  state.seq = d.seq;
  switch (d.kind) {
    case "run.created": {
      const p = d.payload;
      // Through the version chain: a config recorded by an older rlq folds under this one.
      state.config = decodeRecordedConfig(p.config, `run ${state.runId} stored config`);
      state.name = p.name;
      state.datasetSize = p.datasetSize;
      state.datasetFingerprint = p.datasetFingerprint;
      state.pluginFingerprints = p.pluginFingerprints;
      break;
    }
    case "run.status":
      state.status = d.payload.status;
      state.statusReason = d.payload.reason;
      if (d.payload.status === "completed") state.phase = "done";
      break;
    case "run.amended":
      state.config = applyRecordedChanges(state.config, d.payload.changes, `run ${state.runId} amended config`);
      break;
    case "step.started":
      state.step = d.payload.step;
      state.kept = [];
      forgetDecidedGroups(state);
      if (isAsync(state)) break; // in-flight groups carry over: they join whichever step is unsealed when they complete
      state.phase = "collect";
      state.sealed = [];
      state.inflight.clear();
      state.draining.clear();
      break;
    case "prompts.drawn": {
      const p = d.payload;
      const taken = new Set(p.fromBuffer);
      state.buffer = state.buffer.filter((id) => !taken.has(id));
      for (const f of p.fresh) {
        state.groups.set(f.groupId, { groupId: f.groupId, round: -1, regenerations: 0, step: p.step, phase: "inflight" });
      }
      state.cursor = p.cursor;
      break;
    }
    case "group.dispatched": {
      const g = setGroup(state, d.payload.groupId, { round: d.payload.round, step: d.payload.step, phase: "inflight" });
      state.inflight.add(g.groupId);
      state.draining.delete(g.groupId);
      break;
    }
    case "group.filtered":
      break;
    // No state of its own: the rollout-function driver reads the step's calls back from the log
    // when it replays the function (src/controller/rollout-function.ts).
    case "rollout_fn.called":
      break;
    case "group.cut":
      setGroup(state, d.payload.groupId, { regenerations: group(state, d.payload.groupId).regenerations + 1 });
      break;
    case "group.aborted": {
      const g = setGroup(state, d.payload.groupId, { phase: "draining" });
      state.inflight.delete(g.groupId);
      state.draining.set(g.groupId, d.payload.round);
      break;
    }
    case "group.outcome": {
      const g = setGroup(state, d.payload.groupId, { phase: d.payload.outcome, step: d.payload.step });
      state.inflight.delete(g.groupId);
      state.draining.delete(g.groupId);
      if (d.payload.outcome === "kept") {
        state.kept.push(g.groupId);
        state.acceptedGroups++;
      }
      if (d.payload.outcome === "buffered") state.buffer.push(g.groupId);
      break;
    }
    case "step.sealed":
      if (isAsync(state)) {
        state.trainQueue.push(d.payload.step);
        break;
      }
      state.phase = "drain";
      state.sealed = [...d.payload.kept];
      for (const a of d.payload.aborted) {
        state.inflight.delete(a.groupId);
        state.draining.set(a.groupId, a.round);
        setGroup(state, a.groupId, { phase: "draining" });
      }
      break;
    case "train.dispatched":
      state.training = d.payload.step;
      state.trainQueue = state.trainQueue.filter((x) => x !== d.payload.step);
      if (!isAsync(state)) state.phase = "train";
      break;
    case "step.trained":
      state.training = null;
      state.lastTrainedStep = d.payload.step;
      state.trainedVersion = d.payload.weightVersionOut;
      state.trainedCheckpointUri = d.payload.checkpointUri;
      if (!isAsync(state)) state.phase = "sync";
      break;
    case "weights.syncing":
      state.syncing = { step: d.payload.step, weightVersion: d.payload.weightVersion };
      break;
    case "eval.dispatched":
      state.evalsDispatched.add(d.payload.step);
      state.pendingEval = { step: d.payload.step, weightVersion: d.payload.weightVersion };
      break;
    case "eval.recorded":
      if (state.pendingEval?.step === d.payload.step) state.pendingEval = null;
      break;
    case "weights.synced":
      state.weightVersion = d.payload.weightVersion;
      state.checkpointUri = d.payload.checkpointUri;
      state.syncing = null;
      break;
    case "engines.released":
    case "engines.resumed":
      state.engineMemory = nextEngineMemory(state.engineMemory, d);
      break;
    default: {
      // Every kind of core/decisions.ts has its case: a new kind without one fails tsc here.
      const unhandled: never = d;
      throw new RlqError("decision_log_corrupt", `run ${state.runId}: no fold for decision ${JSON.stringify(unhandled)}`);
    }
  }
  return state;
}

export function fold(runId: string, decisions: Iterable<LoggedDecision>): RunState {
  const state = emptyState(runId);
  for (const d of decisions) apply(state, d);
  return state;
}

/** Total rollout steps: num_rollout, else num_epoch × dataset size / rollout_batch_size (slime). */
export function totalSteps(state: RunState): number {
  const c = state.config;
  if (c.num_rollout !== null) return c.num_rollout;
  return Math.max(1, Math.floor(((c.num_epoch ?? 1) * state.datasetSize) / c.rollout_batch_size));
}
