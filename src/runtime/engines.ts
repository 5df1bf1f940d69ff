import { pathToFileURL } from "node:url";
import type { Db } from "../store/db.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { loadRunWeightVersion } from "../store/run-facts.ts";
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
  /** Route `runId`'s pool to `version` and ask its engines for theirs (each takes requests once it reports it). */
  const moveTo = (runId: string, pool: EnginePool, version: number) => {
    versions.set(runId, version);
    pool.setCurrentVersion(version);
    void pool.refreshVersions().catch(() => undefined);
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
            return pool;
          });
        } else if (embedded) p = embedded.createEngine(ctx);
        else throw new RlqError("config_invalid", "engine.kind 'embedded' is not available in this build");
        engines.set(ctx.runId, p);
      }
      const engine = await p;
      const pool = pools.get(ctx.runId);
      if (pool) {
        // The job's version is the run's version of record (the controller synced
        // the engines before dispatching): route only to engines serving it.
        versions.set(ctx.runId, version);
        // The controller has just synced the engines: learn their versions now, not at the next
        // health round. Not awaited: each engine takes this process's requests as soon as it
        // reports the version (the pool wakes them), not once all have.
        if (pool.currentVersion() !== version) moveTo(ctx.runId, pool, version);
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
