/**
 * @file The engine pool: several remote engines behind one Engine, in named pieces.
 *
 * - PoolState (pool-state.ts): the members and each one's mode, the router's mode, the checkpoint
 *   last loaded, the wait queue; the one writer of those modes, whose transitions
 *   core/weight-sync.ts defines.
 * - HealthMonitor (pool-health.ts): /health_generate every `healthIntervalMs`; admission,
 *   re-admission of a dead engine that answers again (after loading the checkpoint the pool last
 *   loaded, when it knows one), busy engines during a sync.
 * - RequestRunner (pool-requests.ts): routing (least outstanding requests, a per-engine cap,
 *   `maxConcurrentPerEngine`, slime's sglang_server_concurrency = 512, prefix affinity by
 *   `sessionKey`), retries on another engine, aborts. A dead engine's in-flight requests are
 *   cancelled locally: those with tokens come back as aborted partials, which the rollout resumes
 *   as new segments; those without are retried elsewhere.
 * - pool-versions.ts: loads, pushes awaited, the version pinned.
 *
 * Versions: the pool routes only to engines on its router's version: the version of the last
 * load, pin or push, or else the highest version its healthy engines report. An engine behind it
 * is `stale`.
 */
import { HealthMonitor } from "./pool-health.ts";
import { RequestRunner } from "./pool-requests.ts";
import { PoolState } from "./pool-state.ts";
import { canReleaseMemory, type EnginePool, type EnginePoolOptions, type MemoryRelease, type PoolLog } from "./pool-types.ts";
import type { MemoryTag } from "../core/decisions.ts";
import { awaitVersion, loadWeights, setCurrentVersion } from "./pool-versions.ts";
import type { RemoteEngine } from "./remote.ts";
import { isLive } from "../core/weight-sync.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

export type { EnginePool, EnginePoolOptions, MemberState, PoolLog, PoolSnapshot } from "./pool-types.ts";
export { serverRid } from "./pool-requests.ts";

const silentLog: PoolLog = { info: () => undefined, warn: () => undefined };

export function createEnginePool(options: EnginePoolOptions): EnginePool {
  const now = options.now ?? (() => Date.now());
  const healthIntervalMs = options.healthIntervalMs ?? 5_000;
  const state = new PoolState(options.log ?? silentLog, now, options.maxConcurrentPerEngine ?? 512);
  for (const engine of options.members) state.add(engine);
  const health = new HealthMonitor(state, options, {
    healthIntervalMs,
    healthTimeoutMs: options.healthTimeoutMs ?? 10_000,
    busyLimitMs: options.busyLimitMs ?? 900_000,
    probeInput: options.probeInputIds ?? [1, 2, 3, 4, 5, 6, 7, 8],
  });
  const requests = new RequestRunner(state, health, options);
  const isAnyRoutable = () => state.members.some((m) => state.isRoutable(m));
  return {
    id: `pool(${state.members.map((m) => m.engine.id).join(",")})`,
    generate: (request) => requests.generate(request),
    async abort(requestIds) {
      await Promise.all(requestIds.map((rid) => requests.abort(rid)));
    },
    async health() {
      health.ensureStarted();
      return isAnyRoutable();
    },
    loadWeights(version, uri, onEngineLoaded, loadOptions) {
      health.ensureStarted();
      return loadWeights(state, version, uri, onEngineLoaded, loadOptions);
    },
    setCurrentVersion: (version) => setCurrentVersion(state, version),
    awaitVersion(version, timeoutMs) {
      health.ensureStarted();
      return awaitVersion(state, version, timeoutMs, Math.min(500, healthIntervalMs));
    },
    async weightVersion() {
      health.ensureStarted();
      if (state.current !== null) return state.current;
      await health.runRound();
      if (state.current === null) throw new RlqError("engine_unavailable", "no engine in the pool reported a weight version", { isRetriable: true });
      return state.current;
    },
    currentVersion: () => state.current,
    abortAll: () => abortAll(state),
    releaseMemory: (tags) => onEveryLiveEngine(state, health, "release", tags),
    resumeMemory: (tags) => onEveryLiveEngine(state, health, "resume", tags),
    markReleased(tags) {
      for (const t of tags) state.releasedTags.add(t);
    },
    pauseAdmission: () => void state.moveRouter({ kind: "hold", until: null }),
    resumeAdmission: () => void state.moveRouter({ kind: "resume" }),
    route: (event) => state.moveRouter(event),
    routerMode: () => state.router,
    async awaitReady(timeoutMs) {
      health.ensureStarted();
      const deadline = now() + timeoutMs;
      while (!isAnyRoutable()) {
        if (now() > deadline) {
          const states = state.members.map((m) => `${m.engine.id}=${m.mode}: ${m.metrics.lastError ?? ""}`).join("; ");
          throw new RlqError("engine_unavailable", `no engine became ready within ${timeoutMs} ms (${states})`, { isRetriable: true });
        }
        await health.runRound();
        if (!isAnyRoutable()) await new Promise((r) => setTimeout(r, 100).unref?.());
      }
    },
    checkHealth: () => {
      health.ensureStarted();
      return health.runRound();
    },
    refreshVersions: () => health.refresh(),
    refreshLoaded: () => health.refresh(true),
    addMembers: (engines) => addMembers(state, health, engines),
    snapshot() {
      const t = now();
      return {
        currentVersion: state.current,
        isAdmissionPaused: state.router.kind === "held",
        queued: state.queue.length,
        engines: state.members.map((m) => ({ ...m.metrics.snapshot(m.engine.id, m.mode, m.version, t), seedHonoured: m.engine.seedHonoured ?? null })),
      };
    },
    engineStates: () => Object.fromEntries(state.members.map((m) => [m.engine.id, m.mode])),
    async close() {
      state.isClosed = true;
      health.stop();
      for (const m of state.members) for (const f of m.inflight.values()) f.controller.abort(new Error("pool closed"));
      state.queue.wakeAll();
      await Promise.all([...requests.pending.values()].map((e) => e.done));
      await Promise.all(state.members.map((m) => m.engine.close()));
    },
  };
}

/** End every request on every live engine that can (SGLang abort_all); a failure is logged: the requests are then aborted by id. */
async function abortAll(state: PoolState): Promise<void> {
  await Promise.all(
    state.members.map(async (m) => {
      if (!isLive(m.mode) || !m.engine.abortAll) return;
      await m.engine
        .abortAll()
        .catch((e: unknown) => state.log.warn({ engine: m.engine.id, err: errorMessage(e) }, "abort_all failed; the requests are aborted by id"));
    }),
  );
}

/**
 * Colocated mode: release or resume `tags` on every live engine, all at once. Any failure fails the
 * call (the controller tries again next tick): a run whose engines hold the GPUs must not train.
 * A release first stops this pool's health checks and waits for those under way: a check admitting
 * an engine ends in a log-prob probe (three generations), which must not reach a released engine.
 * They start again once every tag is resumed. A restarted controller learns the tags released
 * before it from the log (`markReleased`): without them its checks reach engines whose KV cache
 * is still released while it resumes their weights and loads.
 */
async function onEveryLiveEngine(state: PoolState, health: HealthMonitor, action: "release" | "resume", tags: readonly MemoryTag[]): Promise<void> {
  const live = state.members.filter((m) => isLive(m.mode));
  const cannot = live.filter((m) => !canReleaseMemory(m.engine)).map((m) => m.engine.id);
  if (cannot.length > 0)
    throw new RlqError(
      "engine_cannot_load",
      `colocate: engine(s) ${cannot.join(", ")} cannot release their GPU memory (no release endpoint in their adapter)`,
      {
        isRetriable: false,
      },
    );
  if (live.length === 0) throw new RlqError("engine_unavailable", `colocate: no live engine to ${action} ${tags.join(", ")}`, { isRetriable: true });
  if (action === "release") {
    for (const t of tags) state.releasedTags.add(t);
    await health.settled();
  }
  await Promise.all(
    live.map((m) => {
      const e = m.engine as RemoteEngine & MemoryRelease;
      return action === "release" ? e.releaseMemory(tags) : e.resumeMemory(tags);
    }),
  );
  if (action === "resume") for (const t of tags) state.releasedTags.delete(t);
}

/** Engines found later (an SGLang router's refreshed worker list); ones already here are ignored. */
function addMembers(state: PoolState, health: HealthMonitor, engines: readonly RemoteEngine[]): void {
  for (const engine of engines) {
    if (state.byId.has(engine.id) || state.isClosed) continue;
    const m = state.add(engine);
    state.log.info({ engine: engine.id }, "engine added to the pool");
    if (state.startedAtMs !== null) void health.check(m);
  }
}
