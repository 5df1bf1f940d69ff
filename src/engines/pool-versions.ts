/**
 * @file The pool's weight-version operations: `loadWeights` (disk sync: the pool loads a
 * checkpoint into every live engine), `awaitVersion` (trainer_push: wait for every live engine to
 * report a version) and `setCurrentVersion`. Each changes modes only through PoolState
 * (pool-state.ts), as core/weight-sync.ts defines them.
 */
import type { PoolState } from "./pool-state.ts";
import { canPauseInPlace, type InPlacePause, type Member } from "./pool-types.ts";
import type { RemoteEngine } from "./remote.ts";
import { isLive } from "../core/weight-sync.ts";
import { nextEnginesToLoad } from "../core/staggered-load.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

/** Route only to `version` from now on: healthy engines on another are stale; health checks no longer move it. */
export function setCurrentVersion(pool: PoolState, version: number): void {
  pool.moveRouter({ kind: "pinned", version });
}

/**
 * Load a checkpoint into every live engine that can load; `onEngineLoaded` hears of each as its own
 * load ends. `keepRequests` (weight_update_mode in_place): each engine is paused around its load
 * keeping its requests, and an engine that cannot pause so is refused by name before any load.
 */
export async function loadWeights(
  pool: PoolState,
  version: number,
  uri: string,
  onEngineLoaded?: (engineId: string) => void,
  options: { keepRequests?: boolean; maxLoadingEngines?: number | null } = {},
): Promise<void> {
  const live = pool.members.filter((m) => isLive(m.mode) && m.engine.canLoadWeights);
  const isInPlace = options.keepRequests === true;
  const cannot = isInPlace ? live.filter((m) => !canPauseInPlace(m.engine)).map((m) => m.engine.id) : [];
  if (cannot.length > 0) {
    throw new RlqError(
      "engine_cannot_load",
      `weight_update_mode in_place: engine(s) ${cannot.join(", ")} cannot pause keeping their requests (no in-place pause in their adapter); use weight_update_mode abort or drain`,
      { isRetriable: false },
    );
  }
  pool.recordLoad(version, uri);
  const loadOne = async (m: Member): Promise<void> => {
    pool.setEngineMode(m, { kind: "loadStarted" });
    try {
      await (isInPlace && canPauseInPlace(m.engine) ? loadInPlace(m.engine, version, uri) : m.engine.loadWeights(version, uri));
    } catch (e) {
      pool.setEngineMode(m, { kind: "loadFailed" });
      throw e;
    }
    m.version = version;
    pool.setEngineMode(m, { kind: "loadEnded" });
    onEngineLoaded?.(m.engine.id);
  };
  // Staggered (in place only): a few engines pause and load at a time while the rest decode.
  const maxLoading = isInPlace ? (options.maxLoadingEngines ?? null) : null;
  const results = maxLoading === null ? await Promise.allSettled(live.map(loadOne)) : await loadStaggered(live, loadOne, maxLoading);
  const failures = results.flatMap((r, i) => (r.status === "rejected" ? [{ m: live[i] as Member, e: r.reason as unknown }] : []));
  for (const { m, e } of failures) pool.markDead(m, `loading version ${version} failed: ${errorMessage(e)}`);
  setCurrentVersion(pool, version);
  if (failures.length === live.length && live.length > 0) {
    const first = failures[0]?.e;
    throw new RlqError("engine_load_failed", `no engine loaded version ${version} (${uri}): ${errorMessage(first)}`, {
      cause: first,
      isRetriable: !(first instanceof RlqError) || first.isRetriable,
    });
  }
}

/** Load `live` with at most `maxLoading` at once (core/staggered-load.ts), in the pool's order; results in that order. */
async function loadStaggered(live: readonly Member[], loadOne: (m: Member) => Promise<void>, maxLoading: number): Promise<PromiseSettledResult<void>[]> {
  const ids = live.map((m) => m.engine.id);
  const byId = new Map(live.map((m) => [m.engine.id, m]));
  const loading = new Set<string>();
  const done = new Set<string>();
  const results = new Map<string, PromiseSettledResult<void>>();
  await new Promise<void>((resolve) => {
    const startDue = () => {
      if (done.size === ids.length) return resolve();
      for (const id of nextEnginesToLoad(ids, loading, done, maxLoading)) {
        loading.add(id);
        loadOne(byId.get(id) as Member)
          .then(
            () => results.set(id, { status: "fulfilled", value: undefined }),
            (reason: unknown) => results.set(id, { status: "rejected", reason }),
          )
          .finally(() => {
            loading.delete(id);
            done.add(id);
            startDue();
          });
      }
    };
    startDue();
  });
  return ids.map((id) => results.get(id) as PromiseSettledResult<void>);
}

/** Pause keeping the requests, load, continue: the requests go on at `version` (their tokens' versions split there). */
async function loadInPlace(engine: RemoteEngine & InPlacePause, version: number, uri: string): Promise<void> {
  await engine.pauseInPlace();
  try {
    await engine.loadWeights(version, uri);
  } finally {
    await engine.resumeInPlace();
  }
}

/**
 * trainer_push: resolves when every live engine reports `version` (engines that die meanwhile are
 * left out); fenced engines cannot report versions, so the trainer's report is taken for theirs.
 */
export async function awaitVersion(pool: PoolState, version: number, timeoutMs: number, pollMs: number): Promise<{ engines: string[] }> {
  const deadline = pool.now() + timeoutMs;
  for (const m of pool.members) m.engine.setVersion?.(version);
  // Awaited: the engines in the rotation when the sync began. One already behind (`stale`: a server
  // restarted at its launch weights, or one a push missed) may have been out of the trainer's reach
  // for this push (down when it was sent, or without the trainer's transfer group yet), and
  // waiting on it would hold the run until the timeout with nothing left to send it the version; it
  // joins once a push reaches it and it reports the pool's version, as any behind engine does.
  const inRotation = new Set(pool.members.filter((m) => isLive(m.mode) && m.mode !== "stale"));
  for (;;) {
    await Promise.all(
      pool.members.map(async (m) => {
        if (!isLive(m.mode)) return;
        try {
          m.version = await m.engine.weightVersion();
        } catch (e) {
          pool.markDead(m, errorMessage(e));
        }
      }),
    );
    const live = pool.members.filter((m) => isLive(m.mode));
    const awaited = live.some((m) => inRotation.has(m)) ? live.filter((m) => inRotation.has(m)) : live;
    if (awaited.length > 0 && awaited.every((m) => m.version === version)) {
      pool.moveRouter({ kind: "pinned", version });
      for (const m of live) if (m.version === version) pool.setEngineMode(m, { kind: "reported" });
      pool.queue.wakeAll();
      return { engines: live.filter((m) => m.version === version).map((m) => m.engine.id) };
    }
    if (pool.now() > deadline) {
      const states = pool.members.map((m) => `${m.engine.id}=${m.mode}@v${m.version ?? "?"}`).join(", ");
      throw new RlqError("engine_version_timeout", `engines did not all report version ${version} within ${timeoutMs} ms: ${states}`, {
        isRetriable: true,
      });
    }
    await new Promise((r) => setTimeout(r, pollMs).unref?.());
  }
}
