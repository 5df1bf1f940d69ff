import { pathToFileURL } from "node:url";
import type { Db } from "../store/db.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { loadAbortingSyncTarget, loadRunWeightVersion } from "../store/run-facts.ts";
import type { Engine } from "../engines/engine.ts";
import { createEnginesFromConfig } from "../engines/from-config.ts";
import type { EnginePool } from "../engines/pool.ts";
import type { Trainer } from "../trainer/trainer.ts";
import { createRemoteTrainerFor, ensureCheckpointHere } from "./trainer-access.ts";
import type { RunContext } from "./run-context.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * Engine and trainer per run, in a worker process. Remote engines are
 * synced by the controller; an embedded engine lives here, so it loads the
 * committed checkpoint of the version a job asks for before generating.
 */
export async function checkpointForVersion(db: Db, ctx: RunContext, version: number): Promise<string | null> {
  if (version === 0) return ctx.config.ref_load ? pathToFileURL(ctx.config.ref_load).href : null;
  const row = await loadTrainStep(db, ctx.runId, version - 1);
  if (!row) throw new RlqError("version_unavailable", `run ${ctx.runId}: weight version ${version} has no committed checkpoint`, { isRetriable: true });
  return row.checkpointUri;
}

export interface EmbeddedFactories {
  createEngine(ctx: RunContext): Promise<Engine>;
  createTrainer(ctx: RunContext): Promise<Trainer>;
}

export function createEngineProvider(db: Db, embedded: EmbeddedFactories | null) {
  const engines = new Map<string, Promise<Engine>>();
  const pools = new Map<string, EnginePool>();
  const versions = new Map<string, number>();
  const locks = new Map<string, Promise<void>>();
  const unsubscribes: Array<() => void> = [];
  /** Per run: the version a sync in progress loads, while this process's pool holds new requests. */
  const holding = new Map<string, number>();
  /** Stop holding once the pool has reached the version the sync loads. */
  const release = (runId: string, pool: EnginePool, version: number) => {
    const target = holding.get(runId);
    if (target === undefined || version < target) return;
    holding.delete(runId);
    pool.resumeAdmission();
  };
  /**
   * The controller's load ended on some engines (store/notify.ts `rlq_loaded`): if this pool routes
   * to the new version already (jobs at it came during the sync, controller/async-pipeline.ts), its
   * stale engines' versions are read and those that report it take the held requests at once. One
   * read at a time per pool; hints during one make one more.
   */
  const refreshing = new Map<EnginePool, { again: boolean }>();
  const learnLoaded = (pool: EnginePool) => {
    const running = refreshing.get(pool);
    if (running) {
      running.again = true;
      return;
    }
    const state = { again: false };
    refreshing.set(pool, state);
    void (async () => {
      do {
        state.again = false;
        await pool.refreshLoaded().catch(() => undefined);
      } while (state.again);
      refreshing.delete(pool);
    })();
  };
  /** Route `runId`'s pool to `version` and ask its engines for theirs (each takes requests once it reports it). */
  const moveTo = (runId: string, pool: EnginePool, version: number) => {
    // Moved by a job dispatched during the sync (controller/async-pipeline.ts): the engines are
    // still loading, so each is read once now and again at each `rlq_loaded`; a full check would
    // wait behind its load.
    const isLoading = holding.has(runId);
    versions.set(runId, version);
    pool.setCurrentVersion(version);
    release(runId, pool, version);
    if (isLoading) {
      // Until the sync ends (learnSynced): the pool moved to a sync's version while the engines load it.
      pool.setAwaitingLoad(true);
      learnLoaded(pool);
    } else void pool.refreshVersions().catch(() => undefined);
  };
  /**
   * The controller recorded weights.syncing with mode abort (store/notify.ts `rlq_syncing`): every
   * round in flight is being aborted and the engines are loading (controller/engine-admin.ts
   * beginLoad), so the pool holds new requests until the sync's version. Without it, the slots the
   * aborts freed went to requests of rounds whose abort this process had not yet applied; each
   * reached an engine whose load was waiting, was held there, ran on the new weights after the load,
   * and its round landed only at the next abort resend (~5 such requests a sync at 64 simulated
   * engines, docs/performance.md "Session 19"). The pool holds at once, before the jobs' abort
   * watchers free any slot, then checks the log: a hint replayed after a reconnect outside a sync
   * lets go again. A held request that a job aborts ends at once.
   */
  const learnSyncing = async (runId: string, pool: EnginePool) => {
    const isNew = !holding.has(runId);
    if (isNew) {
      holding.set(runId, Number.MAX_SAFE_INTEGER);
      pool.pauseAdmission();
    }
    let target: number | null = null;
    try {
      target = await loadAbortingSyncTarget(db, runId);
    } finally {
      const current = pool.currentVersion();
      if (target === null || (current !== null && current >= target)) {
        if (isNew) release(runId, pool, Number.MAX_SAFE_INTEGER);
      } else holding.set(runId, target);
    }
  };
  /**
   * The controller recorded weights.synced (store/notify.ts `rlq_synced`): the pool learns the run's
   * version now, while the next step's jobs are still being fetched from the queue (at 64 engines
   * that fetch took 60-90 ms of the sync bubble, bench/cluster-sim.ts). Forward only: a hint read
   * late never moves the pool back; the jobs' own versions stay the authority (engineFor).
   */
  const learnSynced = async (runId: string, pool: EnginePool) => {
    const version = await loadRunWeightVersion(db, runId);
    const current = pool.currentVersion();
    if (version !== null && (current === null || version > current)) moveTo(runId, pool, version);
    else if (version !== null) release(runId, pool, version);
    if (version !== null && (current === null || version >= current) && pool.isAwaitingLoad()) {
      // The sync has ended: every engine has loaded, so one still stale (its `rlq_loaded` hint
      // lost, its read failed) gets the full check.
      pool.setAwaitingLoad(false);
      void pool.refreshVersions().catch(() => undefined);
    }
  };
  return {
    async engineFor(ctx: RunContext, version: number): Promise<Engine> {
      const e = ctx.config.engine;
      let p = engines.get(ctx.runId);
      if (!p) {
        if (e.kind === "sglang" || e.kind === "openai") {
          p = createEnginesFromConfig(e, ctx.config, { fencedVersion: async () => versions.get(ctx.runId) ?? 0 }).then((pool) => {
            pools.set(ctx.runId, pool);
            unsubscribes.push(db.notifications.subscribe("rlq_synced", ctx.runId, () => void learnSynced(ctx.runId, pool).catch(() => undefined)));
            unsubscribes.push(db.notifications.subscribe("rlq_syncing", ctx.runId, () => void learnSyncing(ctx.runId, pool).catch(() => undefined)));
            unsubscribes.push(db.notifications.subscribe("rlq_loaded", ctx.runId, () => learnLoaded(pool)));
            return pool;
          });
        } else if (embedded) p = embedded.createEngine(ctx);
        else throw new RlqError("config_invalid", "engine.kind 'embedded' is not available in this build");
        engines.set(ctx.runId, p);
      }
      const engine = await p;
      const pool = pools.get(ctx.runId);
      if (pool) {
        // The job's version is the run's version of record (the controller synced the engines, or
        // began loading them, before dispatching): route only to engines serving it. Learn their
        // versions now, not at the next health round. Not awaited: each engine takes this process's
        // requests as soon as it reports the version (the pool wakes them), not once all have.
        // Never back while the engines load a sync's version: a job of the old version that started
        // just before its round's abort was recorded must not mark the loaded engines stale (its
        // requests go to the new version's engines and are recorded with it).
        const current = pool.currentVersion();
        const isBack = current !== null && version < current && pool.isAwaitingLoad();
        if (!isBack) versions.set(ctx.runId, version);
        if (current !== version && !isBack) moveTo(ctx.runId, pool, version);
      }
      if (e.kind === "embedded" && versions.get(ctx.runId) !== version) {
        // One load at a time; concurrent jobs for the same version wait for it.
        const prev = locks.get(ctx.runId) ?? Promise.resolve();
        const next = prev.then(async () => {
          if (versions.get(ctx.runId) === version) return;
          const uri = await checkpointForVersion(db, ctx, version);
          if (uri) await engine.loadWeights(version, await ensureCheckpointHere(db, ctx, version, uri));
          versions.set(ctx.runId, version);
        });
        locks.set(
          ctx.runId,
          next.catch(() => undefined),
        );
        await next;
      }
      return engine;
    },
    /** Per-engine metrics of this process's pools (requests, tokens/s, errors, latency percentiles), by run. */
    metrics() {
      return [...pools].map(([runId, pool]) => ({ runId, snapshot: pool.snapshot() }));
    },
    async close() {
      for (const unsubscribe of unsubscribes.splice(0)) unsubscribe();
      for (const p of engines.values()) await (await p).close().catch(() => undefined);
    },
  };
}

export function createTrainerProvider(embedded: EmbeddedFactories | null) {
  const trainers = new Map<string, Promise<Trainer>>();
  return {
    async trainerFor(ctx: RunContext): Promise<Trainer> {
      let p = trainers.get(ctx.runId);
      if (!p) {
        const t = ctx.config.trainer;
        if (t.kind === "remote") p = Promise.resolve(createRemoteTrainerFor(ctx.config));
        else if (embedded) p = embedded.createTrainer(ctx);
        else throw new RlqError("config_invalid", "trainer.kind 'embedded' is not available in this build");
        trainers.set(ctx.runId, p);
      }
      return p;
    },
    async close() {
      for (const p of trainers.values()) await (await p).close().catch(() => undefined);
    },
  };
}
