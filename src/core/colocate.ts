/**
 * @file Colocated mode (run config `colocate`, slime's --colocate): the engines and the trainer share
 * GPUs and take turns. Pure: the engines' memory as the decision log says it is, and what the
 * controller does next in a synchronous step. The one writer of the mode is `nextEngineMemory`,
 * folded by run-state.ts; docs/architecture.md "Colocated mode" draws the same machine.
 *
 * ```
 * resident ──engines.released──▶ released ──engines.resumed(weights)──▶ weights ──engines.resumed(kv_cache)──▶ resident
 *  (rollout)                    (train.dispatched, step.trained)        (load: weights.synced)
 * ```
 *
 * The step's phases, each a point a restarted controller resumes from (`nextColocateAction`):
 * - rollout: `phase` collect, memory resident;
 * - released: sealed, every aborted round drained, `engines.released`: the trainer's turn;
 * - training: `train.dispatched` until `step.trained`;
 * - pushing: `engines.resumed` weights, then the trained version loaded (`weights.synced`);
 * - resuming: `engines.resumed` kv_cache, then `step.started` (or the run completes).
 *
 * Each endpoint call comes before its decision: a controller killed between the two finds the log
 * one transition behind the engines and sends it again (controller/engine-admin.ts says how a
 * repeated resume stays valid for SGLang, whose resume of a tag not released raises).
 *
 * The rollout workers read the same log for whose turn it is (`ColocateTurn`, one writer:
 * `nextColocateTurn`): their pools send the engines no health check or probe outside the engines'
 * turn (store/colocate-turn.ts, docs/engines.md "Colocated mode").
 */

import { RlqError } from "../lib/errors.ts";
import type { LoggedDecision, MemoryTag } from "./decisions.ts";

/**
 * - `resident`: the engines hold their weights and KV cache and may generate (the rollout).
 * - `released`: they hold neither; the trainer holds the GPUs.
 * - `weights`: weights resumed (their content is stale until the trained version loads), KV cache not.
 */
export type EngineMemory = "resident" | "released" | "weights";

export const initialEngineMemory: EngineMemory = "resident";

function corrupt(d: LoggedDecision, why: string): never {
  throw new RlqError("decision_log_corrupt", `decision ${d.seq} (${d.kind}): ${why}`);
}

/** The engines' memory after one decision; a transition the controller never writes is a corrupt log. */
export function nextEngineMemory(mode: EngineMemory, d: LoggedDecision): EngineMemory {
  switch (d.kind) {
    case "engines.released":
      if (mode !== "resident") corrupt(d, `the engines are ${mode}, not resident`);
      return "released";
    case "engines.resumed":
      if (d.payload.tag === "weights") {
        if (mode !== "released") corrupt(d, `weights resumed while the engines are ${mode}`);
        return "weights";
      }
      if (mode !== "weights") corrupt(d, `KV cache resumed while the engines are ${mode}`);
      return "resident";
    default:
      return mode;
  }
}

/** The memory tags released on the engines in `memory` (what a resume has still to take back). */
export function releasedMemoryTags(memory: EngineMemory): MemoryTag[] {
  switch (memory) {
    case "resident":
      return [];
    case "released":
      return ["weights", "kv_cache"];
    case "weights":
      return ["kv_cache"];
  }
}

/** The parts of the run's state the colocated step reads. */
export interface ColocateView {
  phase: "collect" | "drain" | "train" | "sync" | "done";
  engineMemory: EngineMemory;
  /** Aborted rounds of the sealed step still to land. */
  drainingCount: number;
  weightVersion: number;
  trainedVersion: number;
}

/**
 * What a synchronous colocated step does next, from the log alone:
 * - `drain`: the sealed step's aborted rounds land first (SGLang's release asserts no request is running);
 * - `release`: every engine releases weights and KV cache, then `engines.released`;
 * - `train`: `train.dispatched` (the train job);
 * - `await_train`: the train job has not committed;
 * - `resume_weights`: every engine resumes its weights, then `engines.resumed` weights;
 * - `load`: the trained version loads (the weights resumed hold stale content), then `weights.synced`;
 * - `resume_kv_cache`: every engine resumes its KV cache, then `engines.resumed` kv_cache;
 * - `next`: the engines are resident on the trained version: evals, the next step or the end, as in
 *   a split run.
 */
export type ColocateAction = "drain" | "release" | "train" | "await_train" | "resume_weights" | "load" | "resume_kv_cache" | "next" | "none";

export function nextColocateAction(v: ColocateView): ColocateAction {
  switch (v.phase) {
    case "collect":
    case "done":
      return "none";
    case "drain":
      if (v.drainingCount > 0) return "drain";
      return v.engineMemory === "resident" ? "release" : "train";
    case "train":
      return "await_train";
    case "sync":
      if (v.engineMemory === "released") return "resume_weights";
      if (v.engineMemory === "weights") return v.weightVersion === v.trainedVersion ? "resume_kv_cache" : "load";
      return "next";
  }
}

/**
 * What a restarted controller loads into the engines before anything else. The engines' memory as
 * the log says it: released engines take no load (their turn comes after training), nor do engines
 * about to be released (a sealed step); engines whose weights are resumed get the trained version
 * through the step's own `load`. Otherwise (the rollout) they load the synced version as in a split run.
 */
export function shouldLoadOnStart(v: Pick<ColocateView, "phase" | "engineMemory">): boolean {
  return v.engineMemory === "resident" && v.phase !== "drain" && v.phase !== "train";
}

/**
 * Whose turn on the shared GPUs it is, as a process that does not release the engines reads the
 * log: a rollout worker's pool, which sends generations of its own (`/health_generate` and the
 * log-prob probe of an admission) that no drain of the run's rounds waits for.
 * - `engines`: the engines hold their memory and no release is due before the log advances;
 * - `release_due`: a step is sealed; the controller releases the engines once its aborted rounds
 *   have landed, and may be doing so now (the release's endpoint call comes before
 *   `engines.released`);
 * - `released`, `weights`: the engines' memory (`EngineMemory`) while it is not resident.
 *
 * ```
 * engines ──step.sealed──▶ release_due ──engines.released──▶ released ──engines.resumed(weights)──▶ weights
 *    ▲                        │                                                                       │
 *    └──────step.started──────┘ (a sealed step that trains nothing)    engines.resumed(kv_cache) ─────┘ ──▶ engines
 * ```
 */
export type ColocateTurn = "engines" | "release_due" | "released" | "weights";

export const initialColocateTurn: ColocateTurn = "engines";

/**
 * The turn after one decision: the one writer of `ColocateTurn`. The memory's part goes through
 * `nextEngineMemory`, so a worker and the controller read the same transitions (and the same corrupt
 * logs) from the same decisions.
 */
export function nextColocateTurn(turn: ColocateTurn, d: LoggedDecision): ColocateTurn {
  switch (d.kind) {
    case "step.sealed":
      return turn === "engines" ? "release_due" : turn;
    case "step.started":
      if (turn === "released" || turn === "weights") corrupt(d, `a step started while the engines are ${turn}`);
      return "engines";
    case "engines.released":
    case "engines.resumed": {
      const memory = nextEngineMemory(turn === "engines" || turn === "release_due" ? "resident" : turn, d);
      return memory === "resident" ? "engines" : memory;
    }
    default:
      return turn;
  }
}

/**
 * The turn after `tail`: the run's `step.started`, `step.sealed`, `engines.released` and
 * `engines.resumed` decisions from its last `step.started` on (all of them when there is none), in
 * order. A colocated step starts with the engines resident (its predecessor resumed their KV cache
 * before `step.started`), so the fold may begin there instead of at the start of the log.
 */
export function foldColocateTurn(tail: Iterable<LoggedDecision>): ColocateTurn {
  let turn = initialColocateTurn;
  for (const d of tail) turn = nextColocateTurn(turn, d);
  return turn;
}

/** The decision kinds `foldColocateTurn` reads (store/colocate-turn.ts loads these). */
export const colocateTurnKinds = ["step.started", "step.sealed", "engines.released", "engines.resumed"] as const;
