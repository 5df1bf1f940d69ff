/**
 * @file The weight sync as one state machine, in four views that share one vocabulary. Pure: no
 * I/O, no clock. Each view has one writer (docs/architecture.md "Weight sync" lists them):
 *
 * - the run's sync, folded from the decision log (`foldRunSync`): what the controller decided;
 * - each engine's mode inside one process's pool (`nextEngineMode`): what that engine serves;
 * - the controller's loader (`nextLoaderMode`): the load it sends to the engines;
 * - a process's router (`nextRouterMode`): which version its requests go to, and whether they wait.
 *
 * ```
 * run (log):     synced(v) ──weights.syncing──▶ syncing(v→w, abort|drain) ──weights.synced──▶ synced(w)
 *                synced(v) ──weights.synced (sync mode: nothing in flight)───────────────────▶ synced(w)
 * loader:        idle ──begin(w)──▶ loading(w) ──ended──▶ loaded(w)      (failed: back to idle)
 * engine:        starting ──admitted──▶ healthy ──versionMoved──▶ stale ──loadStarted──▶ loading
 *                loading ──loadEnded──▶ healthy     any ──died──▶ dead ──admitted──▶ healthy
 * router:        open(v) ──hold──▶ held(v, until w) ──pinned(w)──▶ awaitingLoad(w) ──syncEnded──▶ open(w)
 * ```
 *
 * Adding a mode or an event without handling it everywhere fails `tsc` (`unreachable`).
 */

import { RlqError } from "../lib/errors.ts";
import type { LoggedDecision } from "./decisions.ts";

/**
 * What happens to the rounds in flight when the engines load new weights (run config
 * weight_update_mode):
 * - `abort`: they are aborted (`group.aborted`) and continue as new rounds at the new version;
 * - `drain`: they finish on the old version first, then the engines load;
 * - `in_place`: each engine pauses generation keeping its requests and their caches (vLLM
 *   `/pause?mode=keep`), loads, and continues: the requests go on at the new version and their
 *   tokens' versions split at the boundary (rlq records spans). Nothing is aborted or drained, and
 *   no router holds: a request waits only for its engine's load. vLLM with weight_sync disk does
 *   this (engines/vllm-in-place.ts); config/run-config.ts `refineInPlace` says what the others lack
 *   (SGLang's load from disk waits for every request to end, the paused ones too).
 */
export type SyncStrategy = "abort" | "drain" | "in_place";

function unreachable(x: never, what: string): never {
  throw new RlqError("invariant_violated", `weight sync: unhandled ${what} ${JSON.stringify(x)}`);
}

// ---------------------------------------------------------------------------------------------
// The run's sync, from the decision log.

/**
 * - `synced`: the engines serve `version` (0 before any sync) and no sync is in progress.
 * - `syncing`: `weights.syncing` is recorded (async mode): the rounds in flight are aborted
 *   (`abort`: the engines may start loading `to` at once, and a round continued at `to` may run
 *   before `weights.synced`) or drain on `from` first (`drain`).
 */
export type RunSyncMode =
  { kind: "synced"; version: number; checkpointUri: string | null } | { kind: "syncing"; from: number; to: number; strategy: SyncStrategy; step: number };

export const initialRunSync: RunSyncMode = { kind: "synced", version: 0, checkpointUri: null };

/**
 * The run's sync after one decision. Decisions that do not touch the weights leave it as it is.
 * A transition the controller never writes (a second `weights.syncing` before `weights.synced`, a
 * `weights.synced` for another version than the one syncing, a version going back) is a corrupt log.
 */
export function nextRunSync(mode: RunSyncMode, d: LoggedDecision): RunSyncMode {
  switch (d.kind) {
    case "weights.syncing": {
      if (mode.kind === "syncing") corrupt(d, `a sync to version ${mode.to} is still in progress`);
      if (d.payload.weightVersion <= mode.version) corrupt(d, `version ${d.payload.weightVersion} is not after ${mode.version}`);
      return { kind: "syncing", from: mode.version, to: d.payload.weightVersion, strategy: d.payload.mode, step: d.payload.step };
    }
    case "weights.synced": {
      if (mode.kind === "syncing" && mode.to !== d.payload.weightVersion) corrupt(d, `the sync in progress loads version ${mode.to}`);
      // A synced version equal to the current one is a restarted controller's repeated sync.
      if (mode.kind === "synced" && d.payload.weightVersion < mode.version) corrupt(d, `version ${d.payload.weightVersion} is before ${mode.version}`);
      return { kind: "synced", version: d.payload.weightVersion, checkpointUri: d.payload.checkpointUri };
    }
    default:
      return mode;
  }
}

function corrupt(d: LoggedDecision, why: string): never {
  throw new RlqError("decision_log_corrupt", `decision ${d.seq} (${d.kind}): ${why}`);
}

/** The run's sync after the whole log, with each transition (seq, mode after it) for replay checks. */
export function foldRunSync(log: Iterable<LoggedDecision>): { mode: RunSyncMode; transitions: Array<{ seq: number; mode: RunSyncMode }> } {
  let mode = initialRunSync;
  const transitions: Array<{ seq: number; mode: RunSyncMode }> = [];
  for (const d of log) {
    const next = nextRunSync(mode, d);
    if (next !== mode) transitions.push({ seq: d.seq, mode: next });
    mode = next;
  }
  return { mode, transitions };
}

/** The version new requests of the run are recorded with: the sync's target once its loads may serve it (abort). */
export function runServingVersion(mode: RunSyncMode): number {
  switch (mode.kind) {
    case "synced":
      return mode.version;
    case "syncing":
      return mode.from;
    default:
      return unreachable(mode, "run sync mode");
  }
}

/**
 * The version a rollout worker holds new requests for: the target of an abort-mode sync in
 * progress, else null (drain: the old version serves until the load; in_place: the engines keep
 * their requests through the load, so nothing is held).
 */
export function abortingSyncTarget(mode: RunSyncMode): number | null {
  return mode.kind === "syncing" && mode.strategy === "abort" ? mode.to : null;
}

// ---------------------------------------------------------------------------------------------
// One engine, as one process's pool sees it.

/**
 * - `starting`: never answered a health check since the pool started (a warm-up grace applies).
 * - `healthy`: answers and serves the version the pool routes to: it takes requests.
 * - `stale`: answers, on another version: no requests until it reports the pool's version.
 * - `loading`: this process is loading a checkpoint into it (disk sync, or re-admission).
 * - `dead`: out of the rotation (failed checks, failed loads, repeated request errors); its
 *   requests were cancelled locally. A health check that passes admits it again.
 * - `refused`: its log-prob semantics do not match the run's (logprob-check.ts); never admitted.
 */
export type EngineMode = "starting" | "healthy" | "stale" | "loading" | "dead" | "refused";

export type EngineEvent =
  /** A health check passed and the engine reports the pool's version. */
  | { kind: "admitted" }
  /** It answers on another version than the pool's (a health check, a version read, a pool that moved). */
  | { kind: "behind" }
  /** The pool moved to another version: a healthy engine not on it stops taking requests. */
  | { kind: "versionMoved"; isOnVersion: boolean }
  | { kind: "loadStarted" }
  | { kind: "loadEnded" }
  | { kind: "loadFailed" }
  /** trainer_push: every live engine reports the pushed version. */
  | { kind: "reported" }
  | { kind: "died" }
  | { kind: "refused" };

/**
 * The engine's mode after `event`. `refused` is final; a `dead` engine comes back only through a
 * health check (`admitted`/`behind`) or a load into it. Returns `mode` itself when nothing changes.
 */
export function nextEngineMode(mode: EngineMode, event: EngineEvent): EngineMode {
  if (mode === "refused") return mode;
  switch (event.kind) {
    case "admitted":
    case "loadEnded":
      return "healthy";
    case "behind":
      return "stale";
    case "versionMoved":
      return mode === "healthy" && !event.isOnVersion ? "stale" : mode;
    case "loadStarted":
      return "loading";
    case "loadFailed":
      // The load's own failure: the engine answers on its old weights (or is declared dead next).
      return mode === "loading" ? "stale" : mode;
    case "reported":
      return mode === "stale" || mode === "starting" ? "healthy" : mode;
    case "died":
      return "dead";
    case "refused":
      return "refused";
    default:
      return unreachable(event, "engine event");
  }
}

/** Whether an engine in `mode` is asked for anything (loads, aborts, version reads). */
export function isLive(mode: EngineMode): boolean {
  switch (mode) {
    case "starting":
    case "healthy":
    case "stale":
    case "loading":
      return true;
    case "dead":
    case "refused":
      return false;
    default:
      return unreachable(mode, "engine mode");
  }
}

// ---------------------------------------------------------------------------------------------
// The controller's loader.

/**
 * - `idle`: no load in progress; `loaded` is the version this process last loaded into every
 *   engine (null: none yet), so asking for it again sends nothing (a restarted controller's
 *   resumed sync would otherwise drain the requests already running on it).
 * - `loading`: a load of `version` is in flight; asking for it again waits for that one.
 */
export type LoaderMode = { kind: "idle"; loaded: number | null } | { kind: "loading"; version: number; loaded: number | null };

/** How the loader sends a load to one engine for `strategy`: in_place pauses it around the load, keeping its requests. */
export function loadKeepsRequests(strategy: SyncStrategy): boolean {
  switch (strategy) {
    case "abort":
    case "drain":
      return false;
    case "in_place":
      return true;
    default:
      return unreachable(strategy, "sync strategy");
  }
}

export type LoaderEvent =
  | { kind: "begin"; version: number }
  | { kind: "ended"; version: number }
  | { kind: "failed"; version: number }
  /** Every live engine reports `version` already (a resumed sync whose loads ended). */
  | { kind: "found"; version: number };

export const initialLoader: LoaderMode = { kind: "idle", loaded: null };

export function nextLoaderMode(mode: LoaderMode, event: LoaderEvent): LoaderMode {
  switch (event.kind) {
    case "begin":
      return mode.kind === "loading" && mode.version === event.version ? mode : { kind: "loading", version: event.version, loaded: mode.loaded };
    case "ended":
    case "found":
      return { kind: "idle", loaded: event.version };
    case "failed":
      return { kind: "idle", loaded: mode.loaded };
    default:
      return unreachable(event, "loader event");
  }
}

/** Whether a load of `version` must be sent (false: it is in flight, or every engine has it). */
export function shouldSendLoad(mode: LoaderMode, version: number): boolean {
  if (mode.loaded === version) return false;
  switch (mode.kind) {
    case "idle":
      return true;
    case "loading":
      return mode.version !== version;
    default:
      return unreachable(mode, "loader mode");
  }
}

// ---------------------------------------------------------------------------------------------
// A process's router: where its requests go.

/**
 * - `open`: requests go to healthy engines on `version`. `version` null: the first version an
 *   engine reports; not `isPinned`: it follows the highest version healthy engines report.
 *   Pinned (a load, a job's version, a sync): only an explicit `pinned` moves it.
 * - `held`: new requests wait, in-flight ones go on: a sync is starting. `until`: the version whose
 *   pinning lets them go (an abort-mode sync seen in the log); null: an explicit `resume` does
 *   (a trainer push held by this process).
 * - `awaitingLoad`: pinned to `version` while the engines load it (a job at a sync's version came
 *   before `weights.synced`): requests wait for the loads without the no-engine deadline, and a
 *   failing health check counts as busy. Never moved back to an older version.
 */
export type RouterMode =
  | { kind: "open"; version: number | null; isPinned: boolean }
  | { kind: "held"; version: number | null; isPinned: boolean; until: number | null }
  | { kind: "awaitingLoad"; version: number };

export type RouterEvent =
  /** An engine reported `version` (a health check, an answer): followed unless pinned. */
  | { kind: "reported"; version: number }
  /** Route to `version` only (a load, a job's version, a pushed version). */
  | { kind: "pinned"; version: number }
  /** Hold new requests until `until` is pinned (null: until `resume`). */
  | { kind: "hold"; until: number | null }
  | { kind: "resume" }
  /** The log says: the sync in progress aborts rounds for `target` (null: none), and `version` is synced. */
  | { kind: "logRead"; target: number | null; version: number | null };

export const initialRouter: RouterMode = { kind: "open", version: null, isPinned: false };

export function nextRouterMode(mode: RouterMode, event: RouterEvent): RouterMode {
  switch (event.kind) {
    case "reported":
      if (mode.kind === "awaitingLoad" || mode.isPinned || (mode.version !== null && event.version <= mode.version)) return mode;
      return { ...mode, version: event.version };
    case "pinned":
      return pin(mode, event.version);
    case "hold":
      if (mode.kind === "held") return { ...mode, until: maxOrNull(mode.until, event.until) };
      return { kind: "held", version: mode.version, isPinned: mode.kind === "awaitingLoad" || mode.isPinned, until: event.until };
    case "resume":
      return mode.kind === "held" ? { kind: "open", version: mode.version, isPinned: mode.isPinned } : mode;
    case "logRead":
      return readLog(mode, event.target, event.version);
    default:
      return unreachable(event, "router event");
  }
}

function maxOrNull(a: number | null, b: number | null): number | null {
  return a === null || b === null ? null : Math.max(a, b);
}

function pin(mode: RouterMode, version: number): RouterMode {
  switch (mode.kind) {
    case "open":
      return { kind: "open", version, isPinned: true };
    case "held":
      // The sync's version arrived (a job at it): its engines are loading it.
      if (mode.until !== null && version >= mode.until) return { kind: "awaitingLoad", version };
      return { ...mode, version, isPinned: true };
    case "awaitingLoad":
      // A job of the old version that started just before its round's abort: never back.
      return version > mode.version ? { kind: "awaitingLoad", version } : mode;
    default:
      return unreachable(mode, "router mode");
  }
}

function readLog(mode: RouterMode, target: number | null, synced: number | null): RouterMode {
  const version = mode.version;
  const isAhead = synced !== null && (version === null || synced > version);
  switch (mode.kind) {
    case "open":
      if (target !== null && (version === null || version < target))
        return { kind: "held", version: isAhead ? synced : version, isPinned: true, until: target };
      return isAhead ? { kind: "open", version: synced, isPinned: true } : mode;
    case "held": {
      const next = isAhead ? synced : version;
      if (mode.until === null) return { ...mode, version: next, isPinned: mode.isPinned || isAhead };
      // An abort-mode sync: held until its target; a hint about no sync (replayed after a reconnect) lets go.
      if (target === null || (next !== null && next >= target)) return { kind: "open", version: next, isPinned: true };
      return { kind: "held", version: next, isPinned: true, until: target };
    }
    case "awaitingLoad":
      // weights.synced at (or past) the version being loaded: every engine has loaded it.
      if (synced !== null && synced >= mode.version) return { kind: "open", version: synced, isPinned: true };
      return mode;
    default:
      return unreachable(mode, "router mode");
  }
}

/** Whether new requests may be sent now. */
export function isAdmitting(mode: RouterMode): boolean {
  return mode.kind !== "held";
}

/** Whether the engines are (or may be) busy with a sync: failing health checks count as busy, not dead. */
export function isSyncBusy(mode: RouterMode): boolean {
  return mode.kind !== "open";
}
