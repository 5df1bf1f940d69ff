import { pathToFileURL } from "node:url";
import type { Db } from "../store/db.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { loadAbortingSyncTarget, loadRunWeightVersion } from "../store/run-facts.ts";
import { enterEnginesTurn } from "../store/colocate-turn.ts";
import type { Engine } from "../engines/engine.ts";
import { createEnginesFromConfig } from "../engines/from-config.ts";
import type { RequestPool } from "../engines/pool-types.ts";
import type { Trainer } from "../trainer/trainer.ts";
import { createRemoteTrainerFor, ensureCheckpointHere } from "./trainer-access.ts";
import type { RunContext } from "./run-context.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";
import { createLogger, type Logger } from "../observability/logger.ts";
import type { RouterMode } from "../core/weight-sync.ts";

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

/**
 * One run's router in a rollout worker process: it feeds the run's engine pool's router
 * (core/weight-sync.ts `RouterMode`, written by engines/pool-state.ts) the two things that move it
 * from here: what the decision log says at each "the log advanced" hint (store/notify.ts
 * `rlq_weights`), and the version each job asks for. Forward only: a hint read late never moves
 * the pool back; the jobs' own versions stay the authority.
 */
class RunRouter {
  /** One refresh of loading engines at a time; hints during one make one more. */
  private refreshing: { again: boolean } | null = null;

  constructor(
    private readonly db: Db,
    private readonly runId: string,
    readonly pool: RequestPool,
    private readonly log: Logger,
  ) {}

  /**
   * The log advanced (weights.syncing or weights.synced recorded, or the controller's loads ended on
   * some engines). During an abort-mode sync every round in flight is being aborted and the
   * engines are loading (controller/engine-admin.ts `beginLoad`), so the pool holds new requests
   * until the sync's version. Without it, the slots the aborts freed went to requests of rounds
   * whose abort this process had not yet applied; each reached an engine whose load was waiting,
   * was held there, ran on the new weights after the load, and its round landed only at the next
   * abort resend (~5 such requests a sync at 64 simulated engines, docs/performance.md, "Cluster scale"). The pool holds at once, before the jobs' abort watchers free any slot, then reads the
   * log: a hint that finds no abort-mode sync (a synced one, one replayed after a reconnect) lets
   * go again. A held request that a job aborts ends at once.
   */
  async onLogAdvanced(): Promise<void> {
    const pool = this.pool;
    const isNew = pool.routerMode().kind === "open";
    if (isNew) pool.route({ kind: "hold", until: Number.MAX_SAFE_INTEGER });
    let read: [number | null, number | null];
    try {
      read = await Promise.all([loadAbortingSyncTarget(this.db, this.runId), loadRunWeightVersion(this.db, this.runId)]);
    } catch (e) {
      if (isNew) pool.route({ kind: "resume" });
      throw e;
    }
    const before = pool.routerMode();
    this.follow(before, pool.route({ kind: "logRead", target: read[0], version: read[1] }));
  }

  /**
   * A job at `version`: the run's version of record (the controller synced the engines, or began
   * loading them, before dispatching): route only to engines serving it. Their versions are read
   * now, not at the next health round, and not awaited: each engine takes this process's requests
   * as soon as it reports the version (the pool wakes them), not once all have. Never back while
   * the engines load a sync's version (the router's `awaitingLoad`): a job of the old version that
   * started just before its round's abort was recorded must not mark the loaded engines stale.
   */
  onJob(version: number): void {
    const before = this.pool.routerMode();
    if (before.version === version) return;
    this.follow(before, this.pool.route({ kind: "pinned", version }));
  }

  /** After the router moved: read the engines that may now serve its version. */
  private follow(before: RouterMode, after: RouterMode): void {
    if (after.kind !== "open") {
      // A sync in progress: only engines that finished loading are read; a full check would wait
      // behind a load (pool-health.ts `refresh`).
      this.refreshLoading();
      return;
    }
    // The sync has ended (every engine loaded), or the router moved: one still stale gets the full check.
    if (before.kind !== "open" || before.version !== after.version) {
      void this.pool
        .refreshVersions()
        .catch((e: unknown) => this.log.warn({ runId: this.runId, err: errorMessage(e) }, "engine version refresh failed; the health monitor retries"));
    }
  }

  private refreshLoading(): void {
    if (this.refreshing) {
      this.refreshing.again = true;
      return;
    }
    const state = { again: false };
    this.refreshing = state;
    void (async () => {
      do {
        state.again = false;
        await this.pool
          .refreshLoaded()
          .catch((e: unknown) =>
            this.log.warn({ runId: this.runId, err: errorMessage(e) }, "reading loaded engines' versions failed; the health monitor retries"),
          );
      } while (state.again);
      this.refreshing = null;
    })();
  }
}

export function createEngineProvider(db: Db, embedded: EmbeddedFactories | null, log: Logger = createLogger("info", "rlq-engines")): EngineProvider {
  return new EngineProvider(db, embedded, log);
}

/**
 * Each run's engine in this worker process: a pool of remote engines with its router (the
 * router follows the run's weight sync from the log and its rlq_weights hints), or an embedded
 * engine that loads the version each job asks for, one load at a time.
 */
export class EngineProvider {
  private readonly engines = new Map<string, Promise<Engine>>();
  private readonly routers = new Map<string, RunRouter>();
  /** Embedded engines only: the version each run's engine in this process has loaded. */
  private readonly embeddedVersions = new Map<string, number>();
  /** Embedded engines only: each run's chain of loads (one at a time). */
  private readonly locks = new Map<string, Promise<void>>();
  private readonly unsubscribes: Array<() => void> = [];

  constructor(
    private readonly db: Db,
    private readonly embedded: EmbeddedFactories | null,
    private readonly log: Logger,
  ) {}

  async engineFor(ctx: RunContext, version: number): Promise<Engine> {
    const e = ctx.config.engine;
    let p = this.engines.get(ctx.runId);
    if (!p) {
      if (e.kind === "sglang" || e.kind === "openai") p = this.createPool(ctx);
      else if (this.embedded) p = this.embedded.createEngine(ctx);
      else throw new RlqError("config_invalid", "engine.kind 'embedded' is not available in this build");
      this.engines.set(ctx.runId, p);
    }
    const engine = await p;
    this.routers.get(ctx.runId)?.onJob(version);
    if (e.kind === "embedded" && this.embeddedVersions.get(ctx.runId) !== version) await this.loadEmbedded(ctx, engine, version);
    return engine;
  }

  /** Per-engine metrics of this process's pools (requests, tokens/s, errors, latency percentiles), by run. */
  metrics(): Array<{ runId: string; snapshot: ReturnType<RequestPool["snapshot"]> }> {
    return [...this.routers].map(([runId, router]) => ({ runId, snapshot: router.pool.snapshot() }));
  }

  async close(): Promise<void> {
    for (const unsubscribe of this.unsubscribes.splice(0)) unsubscribe();
    for (const [runId, p] of this.engines) {
      await (await p).close().catch((err: unknown) => this.log.warn({ runId, err: errorMessage(err) }, "closing a run's engine failed"));
    }
  }

  /** A run's pool of remote engines, with its router subscribed to the run's weight hints. */
  private async createPool(ctx: RunContext): Promise<Engine> {
    const e = ctx.config.engine;
    if (e.kind === "embedded") throw new RlqError("config_invalid", "engine.kind 'embedded' has no pool");
    const pool = await createEnginesFromConfig(e, ctx.config, {
      fencedVersion: async () => this.routers.get(ctx.runId)?.pool.currentVersion() ?? 0,
      // Colocated: the controller releases these engines between rollouts. This process's checks
      // and admission probes go out only in the engines' turn, and the release waits for those
      // under way (store/colocate-turn.ts).
      ...(ctx.config.colocate ? { turnGate: { enter: () => enterEnginesTurn(this.db, ctx.runId) } } : {}),
    });
    const router = new RunRouter(this.db, ctx.runId, pool, this.log);
    this.routers.set(ctx.runId, router);
    const onHint = () =>
      void router
        .onLogAdvanced()
        .catch((err: unknown) =>
          this.log.warn({ runId: ctx.runId, err: errorMessage(err) }, "reading the weight sync from the log failed; the next hint or job retries"),
        );
    this.unsubscribes.push(this.db.notifications.subscribe("rlq_weights", ctx.runId, onHint));
    return pool;
  }

  /** Embedded engine: one load at a time; concurrent jobs for the same version wait for it. */
  private async loadEmbedded(ctx: RunContext, engine: Engine, version: number): Promise<void> {
    const prev = this.locks.get(ctx.runId) ?? Promise.resolve();
    const next = prev.then(async () => {
      if (this.embeddedVersions.get(ctx.runId) === version) return;
      const uri = await checkpointForVersion(this.db, ctx, version);
      if (uri) await engine.loadWeights(version, await ensureCheckpointHere(this.db, ctx, version, uri));
      this.embeddedVersions.set(ctx.runId, version);
    });
    // Nothing lost: the failure is thrown to this job by `await next`; the chain only orders loads.
    const ordered = next.catch(() => undefined);
    this.locks.set(ctx.runId, ordered);
    await next;
  }
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
      // Nothing lost: the process is shutting down and a trainer client holds no state of the run.
      for (const p of trainers.values()) await (await p).close().catch(() => undefined);
    },
  };
}
