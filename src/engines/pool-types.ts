/** @file The engine pool's public types (pool.ts) and the member records its parts share. */

import type { Engine } from "./engine.ts";
import type { EngineMetrics, EngineMetricsSnapshot } from "./metrics.ts";
import type { LogprobProbe } from "./logprob-check.ts";
import type { PartialOutput, RemoteEngine } from "./remote.ts";
import type { EngineMode, RouterEvent, RouterMode } from "../core/weight-sync.ts";
import type { MemoryTag } from "../core/decisions.ts";

/** An engine's mode in a pool: defined, with its transitions, in core/weight-sync.ts. */
export type MemberState = EngineMode;

export interface PoolLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

export interface EnginePoolOptions {
  members: readonly RemoteEngine[];
  /** slime sglang_server_concurrency. Default 512. */
  maxConcurrentPerEngine?: number;
  /** Default 5 s. */
  healthIntervalMs?: number;
  /** A /health_generate slower than this counts as failed. Default 10 s. */
  healthTimeoutMs?: number;
  /** After the pool starts, failing checks do not declare an engine dead for this long. Default 300 s. */
  warmupGraceMs?: number;
  /** How long `abort` waits for the server to answer aborted requests before cancelling them locally. Default 10 s. */
  abortWaitMs?: number;
  /**
   * The servers serve this pool's run alone (engine.exclusive): while admission is paused for a
   * weight sync, the controller's `abortAll` ends every request on them, so `abort` waits for the
   * answers before sending a per-request abort (it still sends one for a request not yet ended).
   */
  isExclusive?: boolean;
  /** Attempts per request across engines when a request fails before any token. Default 3. */
  maxAttempts?: number;
  /** How long a request waits for any routable engine before failing (retriable). Default 120 s. */
  noEngineWaitMs?: number;
  /** How long an engine may answer health checks with "busy" (loading weights) before it is declared dead. Default 15 min. */
  busyLimitMs?: number;
  /** "probe" (default): check each engine's log-prob semantics on admission (logprob-check.ts). */
  logprobCheck?: "probe" | "off";
  /** Input for the probe; any valid token ids of the model. Default [1..8]. */
  probeInputIds?: readonly number[];
  /**
   * Colocated mode, in a process that does not release the engines itself (a rollout worker): each
   * batch of health checks (a check may admit an engine, and an admission's log-prob probe
   * generates) asks it first and sends nothing unless it answers a hold. Unset: checks run freely
   * (the controller's pool, which holds them around its own release).
   */
  turnGate?: TurnGate;
  log?: PoolLog;
  now?: () => number;
}

/**
 * Whose turn it is on shared GPUs (store/colocate-turn.ts `enterEnginesTurn` behind it): a hold
 * while the run's log says the engines may generate, which the releasing controller waits for;
 * null when it says they are released or about to be.
 */
export interface TurnGate {
  enter(): Promise<{ leave(): Promise<void> } | null>;
}

export interface PoolSnapshot {
  currentVersion: number | null;
  isAdmissionPaused: boolean;
  queued: number;
  engines: EngineMetricsSnapshot[];
}

/**
 * The pool as the controller's loader uses it (controller/engine-admin.ts, engines/weight-sync.ts):
 * loads, pushes awaited, the version pinned. It sends no requests of the run.
 */
export interface LoaderPool {
  /**
   * Load a checkpoint into every live engine; `onEngineLoaded` hears of each engine as its load
   * ends. `keepRequests` (weight_update_mode in_place): each engine is paused around its load
   * keeping its requests (`InPlacePause`), which then go on at the new version. `maxLoadingEngines`
   * (with keepRequests): at most that many engines load at once, the others decoding meanwhile.
   */
  loadWeights(
    version: number,
    checkpointUri: string,
    onEngineLoaded?: (engineId: string) => void,
    options?: { keepRequests?: boolean; maxLoadingEngines?: number | null },
  ): Promise<void>;
  /** Route only to engines on `version` from now on (trainer_push: after the trainer reports it). */
  setCurrentVersion(version: number): void;
  /** Resolves when every live engine reports `version`; engines that die meanwhile are left out. */
  awaitVersion(version: number, timeoutMs: number): Promise<{ engines: string[] }>;
  /** End every request on every live engine that can (SGLang abort_all); errors are logged, not thrown. */
  abortAll(): Promise<void>;
  /** New requests wait (in-flight ones continue) until resumeAdmission: the router's `hold` until `resume`. */
  pauseAdmission(): void;
  resumeAdmission(): void;
  /** Colocated mode: every live engine releases `tags` of its GPU memory (see `MemoryRelease`); throws when one cannot. */
  releaseMemory(tags: readonly MemoryTag[]): Promise<void>;
  /** Colocated mode: every live engine resumes `tags`. */
  resumeMemory(tags: readonly MemoryTag[]): Promise<void>;
  /**
   * Colocated mode, a restarted controller: the log says `tags` are released (by the controller
   * before it), so this pool sends the engines no check until it resumes them. Calls no endpoint.
   */
  markReleased(tags: readonly MemoryTag[]): void;
  /** Run one health round now (tests and the controller use it; the monitor runs them on its own). */
  checkHealth(): Promise<void>;
  snapshot(): PoolSnapshot;
  close(): Promise<void>;
}

/**
 * The pool as a rollout worker uses it (runtime/engines.ts): an Engine whose requests its router
 * sends to engines on one version.
 */
export interface RequestPool extends Engine {
  currentVersion(): number | null;
  /**
   * Move this pool's router (core/weight-sync.ts `RouterMode`): the rollout workers' engine
   * provider feeds it what the decision log says and the versions jobs ask for
   * (runtime/engines.ts). Returns the mode after the event.
   */
  route(event: RouterEvent): RouterMode;
  routerMode(): RouterMode;
  /** Resolves once at least one engine is routable (or rejects after `timeoutMs`). */
  awaitReady(timeoutMs: number): Promise<void>;
  /** After a weight sync elsewhere: each stale engine's version read once; a match is routed to at once (pool-health.ts). */
  refreshVersions(): Promise<void>;
  /**
   * The log says a sync is loading: each stale engine's version is read once, and one that reports
   * the router's version is routed to at once; the others stay stale, unchecked (a full check would
   * block on their load). See pool-health.ts `HealthMonitor.refresh`.
   */
  refreshLoaded(): Promise<void>;
  /** Engines found later (an SGLang router's refreshed worker list); ones already here are ignored. */
  addMembers(engines: readonly RemoteEngine[]): void;
  snapshot(): PoolSnapshot;
  engineStates(): Record<string, MemberState>;
}

/** One pool object serves both roles; each user is typed by the role it plays. */
export interface EnginePool extends LoaderPool, RequestPool {
  loadWeights: LoaderPool["loadWeights"];
  snapshot(): PoolSnapshot;
  close(): Promise<void>;
}

/**
 * What the pool needs from an engine adapter for weight_update_mode in_place (core/weight-sync.ts
 * `SyncStrategy`). An adapter that has these methods can be loaded in place; one without is
 * refused by name at the load.
 */
export interface InPlacePause {
  /**
   * Stop scheduling, keeping every running request and its KV cache, and resolve once the engine
   * is paused (SGLang POST /pause_generation {"mode": "in_place"}; vLLM POST /pause?mode=keep).
   */
  pauseInPlace(): Promise<void>;
  /** Continue the requests `pauseInPlace` kept, at the weights loaded meanwhile (SGLang /continue_generation; vLLM /resume). */
  resumeInPlace(): Promise<void>;
}

/**
 * What the pool needs from an engine adapter for colocated mode (core/colocate.ts): give the
 * shared GPUs back to the trainer and take them again, by tag. An engine without these is refused
 * by name at the first release.
 */
export interface MemoryRelease {
  /** Free the engine's GPU memory for `tags` (SGLang POST /release_memory_occupation; vLLM POST /sleep). */
  releaseMemory(tags: readonly MemoryTag[]): Promise<void>;
  /** Take it again (SGLang POST /resume_memory_occupation; vLLM POST /wake_up?tags=). */
  resumeMemory(tags: readonly MemoryTag[]): Promise<void>;
}

export function canReleaseMemory(engine: RemoteEngine): engine is RemoteEngine & MemoryRelease {
  const e = engine as RemoteEngine & Partial<MemoryRelease>;
  return typeof e.releaseMemory === "function" && typeof e.resumeMemory === "function";
}

export function canPauseInPlace(engine: RemoteEngine): engine is RemoteEngine & InPlacePause {
  const e = engine as RemoteEngine & Partial<InPlacePause>;
  return typeof e.pauseInPlace === "function" && typeof e.resumeInPlace === "function";
}

export interface Inflight {
  rid: string;
  controller: AbortController;
  partial: PartialOutput;
  /** Why it was cancelled locally: the caller aborted, or the engine died. */
  cancelReason: "abort" | "dead" | null;
  settled: Promise<void>;
}

export interface Member {
  engine: RemoteEngine;
  /** Written only by PoolState.setEngineMode (pool-state.ts). */
  mode: EngineMode;
  version: number | null;
  probe: LogprobProbe | null;
  inflight: Map<string, Inflight>;
  metrics: EngineMetrics;
  isChecking: boolean;
  consecutiveErrors: number;
  /** Errors already counted in consecutiveErrors. */
  countedErrors: WeakSet<object>;
  /** Slots taken by requests routed here that have not started yet. */
  reserved: number;
  /** Since when its health checks answer "busy" (503 while loading weights or paused); null: not busy. */
  busySinceMs: number | null;
}

export interface PendingEntry {
  abortRequested: boolean;
  isSettled: boolean;
  inflight: Inflight | null;
  member: Member | null;
  done: Promise<void>;
}

export interface Waiter {
  sessionKey: string | undefined;
  /** The engines this request already failed on (it does not route there while others remain). */
  exclude: ReadonlySet<string>;
  /** The request's pending entry: an abort wakes its own waiter only. */
  entry: object;
  wake: () => void;
}
