import type { RunConfig } from "../config/run-config.ts";
import { createEnginesFromConfig } from "../engines/from-config.ts";
import { createWeightSync, type WeightSync } from "../engines/weight-sync.ts";
import type { LoaderPool } from "../engines/pool-types.ts";
import { initialLoader, nextLoaderMode, shouldSendLoad, type LoaderEvent, type LoaderMode } from "../core/weight-sync.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";
import type { MemoryTag } from "../core/decisions.ts";
import { releasedMemoryTags, type EngineMemory } from "../core/colocate.ts";
import { createLogger } from "../observability/logger.ts";

const log = createLogger("info", "rlq-engine-admin");

/**
 * What the controller does to engines directly: weight sync. Remote engines
 * are told to load a committed checkpoint (weight_sync: disk), or the
 * trainer pushes and rlq waits for every live engine to report the version
 * (trainer_push). Embedded engines live inside the rollout workers and load
 * the version a job asks for before generating.
 */
export interface EngineAdmin {
  /**
   * During an abort-mode sync the rounds it aborted may be continued, and new groups admitted, at the
   * new version before `weights.synced`: the loads began with the sync, and a rollout worker sends
   * those requests only to an engine that reports the new version (runtime/engines.ts). SGLang
   * only: an engine that cannot report its version (vLLM, fenced) would be taken at its word.
   */
  readonly isEarlyDispatch: boolean;
  /**
   * Start loading `version` now, without waiting (a no-op where a load cannot start before the
   * aborted rounds have landed); `loadWeights` then waits for this load. See `createEngineAdmin`.
   */
  beginLoad(version: number, checkpointUri: string): void;
  loadWeights(version: number, checkpointUri: string): Promise<void>;
  /**
   * A restarted controller resuming a sync that dispatched early: load `version` unless every live
   * engine reports it already (the interrupted sync's loads ended); then `beginLoad` and
   * `loadWeights` of it send nothing.
   */
  resumeLoad(version: number, checkpointUri: string): Promise<void>;
  /**
   * A controller starting or restarting: bring the engines to the run's committed `version`
   * (`checkpointUri` holds it). weight_sync disk: `loadWeights`. trainer_push: the trainer pushes a
   * version once, after its step, and nothing will push this one again, so the engines that do not
   * report it (another run's weights, a server restarted while the controller was down) load it
   * from disk; where every live engine reports it, nothing is sent.
   */
  restoreVersion(version: number, checkpointUri: string): Promise<void>;
  /** Colocated mode (core/colocate.ts): every live engine releases `tags` of the shared GPUs. */
  releaseMemory(tags: readonly MemoryTag[]): Promise<void>;
  /**
   * Colocated mode: every live engine resumes `tags`. The first resume this process sends follows a
   * release of the same tags: see `Loader.resumeMemory`.
   */
  resumeMemory(tags: readonly MemoryTag[]): Promise<void>;
  /**
   * Colocated mode, a restarted controller: the engines' memory as the log says it is
   * (core/colocate.ts `EngineMemory`). The pool sends the engines no check while any of it is
   * released, as it would had this process released it (`LoaderPool.markReleased`).
   */
  adoptLoggedMemory(memory: EngineMemory): Promise<void>;
  /** The weight versions the live engines report now (empty for the embedded engine). */
  reportedVersions(): Promise<number[]>;
  close(): Promise<void>;
}

export interface EngineAdminHooks {
  /**
   * An early load (see `Loader` below) ended on some engine, before the others': the rollout
   * workers may send it the requests they hold for the new version (store/notify.ts `rlq_weights`).
   */
  onEngineLoaded?(version: number): void;
}

export function createEngineAdmin(config: RunConfig, hooks: EngineAdminHooks = {}): EngineAdmin {
  const e = config.engine;
  if (e.kind === "embedded")
    return {
      isEarlyDispatch: false,
      beginLoad: () => undefined,
      loadWeights: async () => undefined,
      resumeLoad: async () => undefined,
      restoreVersion: async () => undefined,
      reportedVersions: async () => [],
      releaseMemory: () => refuseColocate("the embedded engine"),
      resumeMemory: () => refuseColocate("the embedded engine"),
      adoptLoggedMemory: () => refuseColocate("the embedded engine"),
      close: async () => undefined,
    };
  let state: Promise<{ pool: LoaderPool; sync: WeightSync }> | null = null;
  const get = () => {
    state ??= createEnginesFromConfig(e, config).then((pool) => ({
      pool,
      sync: createWeightSync(pool, {
        mode: config.weight_sync,
        updateMode: config.weight_update_mode,
        maxLoadingEngines: config.weight_load_max_engines,
        pushTimeoutMs: config.weight_sync_timeout_s * 1000,
      }),
    }));
    return state;
  };
  if (config.weight_sync === "none") return frozenEngineAdmin(get, () => state !== null);
  return new Loader(config, get, () => state !== null, hooks);
}

/**
 * The controller's one loader of remote engines (disk and trainer_push). Its mode is
 * core/weight-sync.ts `LoaderMode`, written only by `move`.
 *
 * A load that may start while this run's aborted requests are still ending (weight_sync disk,
 * weight_update_mode abort): SGLang's update_weights_from_disk takes the model update lock's
 * writer side (tokenizer_manager.py `model_update_lock.writer_lock`), which waits for every
 * request in the server to end and holds new ones until the load is done, so no request spans two
 * versions, and each answer's meta_info.weight_version names the version that generated it (rlq
 * records that one per segment). So the load need not wait for the aborted rounds to land in
 * Postgres: each engine starts it as soon as its own requests have ended, while the rollout
 * workers record them. In drain mode the in-flight rounds finish on the old version, and a
 * request retried after the load asked would not, so the load waits for them.
 * On exclusive servers (engine.exclusive) the sync also ends every request on them itself, one
 * abort_all per server (slime's abort_server_until_idle), instead of waiting for the rollout
 * workers' one abort per request; the workers' aborts by id stay the fallback.
 */
class Loader implements EngineAdmin {
  readonly isEarlyDispatch: boolean;
  private readonly isEarlyLoad: boolean;
  /** weight_sync trainer_push: the trainer brings the engines to each new version, rlq only waits for it. */
  private readonly isPushed: boolean;
  private readonly isAbortAll: boolean;
  private mode: LoaderMode = initialLoader;
  /** The load in flight while `mode` is `loading` (its failure is reported by `loadWeights`). */
  private inFlight: Promise<void> | null = null;
  /** Colocated mode: this process resumed the engines' memory since its last release (see `resumeMemory`). */
  private hasResumed = false;

  constructor(
    config: RunConfig,
    private readonly get: () => Promise<{ pool: LoaderPool; sync: WeightSync }>,
    private readonly isStarted: () => boolean,
    private readonly hooks: EngineAdminHooks,
  ) {
    const e = config.engine;
    // in_place: nothing to wait for, each engine pauses keeping its requests for its load.
    this.isEarlyLoad = config.weight_sync === "disk" && config.weight_update_mode !== "drain";
    const isAbort = config.weight_update_mode === "abort";
    this.isPushed = config.weight_sync === "trainer_push";
    this.isAbortAll = this.isEarlyLoad && isAbort && e.kind === "sglang" && e.exclusive;
    this.isEarlyDispatch = this.isEarlyLoad && isAbort && e.kind === "sglang";
  }

  private move(event: LoaderEvent): void {
    this.mode = nextLoaderMode(this.mode, event);
  }

  /** The load of `version`: the one in flight, or a new one. */
  private begin(version: number, uri: string): Promise<void> {
    if (this.mode.kind === "loading" && this.mode.version === version && this.inFlight !== null) return this.inFlight;
    const onEngineLoaded = this.isEarlyLoad && this.hooks.onEngineLoaded ? () => this.hooks.onEngineLoaded?.(version) : undefined;
    const done = this.get().then(({ sync }) => sync.sync(version, uri, onEngineLoaded).then(() => undefined));
    // Nothing lost: `loadWeights` awaits this promise and reports its failure.
    done.catch(() => undefined);
    this.move({ kind: "begin", version });
    this.inFlight = done;
    return done;
  }

  beginLoad(version: number, uri: string): void {
    if (!this.isEarlyLoad || !shouldSendLoad(this.mode, version)) return;
    // Sent before the load, on the same pool; a pool that failed to start is reported by the load.
    if (this.isAbortAll)
      void this.get()
        .then(({ pool }) => pool.abortAll())
        .catch((e: unknown) => log.warn({ version, err: errorMessage(e) }, "abort_all before a load failed; the rollout workers abort by id"));
    void this.begin(version, uri);
  }

  async loadWeights(version: number, uri: string): Promise<void> {
    // Loaded already, and not being loaded again: nothing to send or wait for.
    if (this.mode.loaded === version && !(this.mode.kind === "loading" && this.mode.version === version)) return;
    try {
      await this.begin(version, uri);
      this.move({ kind: "ended", version });
    } catch (e) {
      this.move({ kind: "failed", version });
      throw e;
    } finally {
      this.inFlight = null;
    }
  }

  async resumeLoad(version: number, uri: string): Promise<void> {
    if (!(await this.isFound(version))) await this.loadWeights(version, uri);
  }

  async restoreVersion(version: number, uri: string): Promise<void> {
    if (!this.isPushed) return this.loadWeights(version, uri);
    if (await this.isFound(version)) return;
    const { pool } = await this.get();
    // The pool's own load (core/weight-sync.ts engine modes), not the sync: in trainer_push mode
    // the sync waits for a push, and none will come for this version.
    await pool.loadWeights(version, uri);
    pool.setCurrentVersion(version);
    this.move({ kind: "found", version });
  }

  /** Every live engine reports `version` already: route to it, and record it as loaded. */
  private async isFound(version: number): Promise<boolean> {
    const { pool } = await this.get();
    await pool.checkHealth();
    const live = pool.snapshot().engines.filter((m) => m.state !== "dead" && m.state !== "refused");
    if (!(live.length > 0 && live.every((m) => m.weightVersion === version))) return false;
    pool.setCurrentVersion(version);
    this.move({ kind: "found", version });
    return true;
  }

  async releaseMemory(tags: readonly MemoryTag[]): Promise<void> {
    const { pool } = await this.get();
    await pool.releaseMemory(tags);
    this.hasResumed = false;
  }

  /**
   * A controller killed between a resume and its decision finds the log saying "released" while the
   * engines hold `tags` again; SGLang's resume of a tag it does not hold raises (its scheduler's
   * `offload_tags.remove`), where a release of a tag already released only adds it to the set again
   * (scheduler_update_weights_mixin.py). So until this process has resumed once it sends a release
   * first: valid whichever side of the resume the last controller died on. After it, the log and
   * the engines agree.
   */
  async resumeMemory(tags: readonly MemoryTag[]): Promise<void> {
    const { pool } = await this.get();
    if (!this.hasResumed) await pool.releaseMemory(tags);
    await pool.resumeMemory(tags);
    this.hasResumed = true;
  }

  async adoptLoggedMemory(memory: EngineMemory): Promise<void> {
    const { pool } = await this.get();
    pool.markReleased(releasedMemoryTags(memory));
  }

  async reportedVersions(): Promise<number[]> {
    const { pool } = await this.get();
    await pool.checkHealth();
    return pool.snapshot().engines.flatMap((m) => (m.weightVersion === null ? [] : [m.weightVersion]));
  }

  async close(): Promise<void> {
    if (this.isStarted()) await (await this.get()).pool.close();
  }
}

/**
 * weight_sync none: the engines serve the weights they started with, version 0, for the whole run.
 * Nothing is ever loaded; the controller's "load version 0" at start routes the pool to it.
 */
function frozenEngineAdmin(get: () => Promise<{ pool: LoaderPool }>, isStarted: () => boolean): EngineAdmin {
  const atZero = async (version: number) => {
    if (version !== 0)
      throw new RlqError("engine_cannot_load", `weight_sync: none keeps the engines at version 0, but version ${version} was to be loaded`, {
        isRetriable: false,
      });
    const { pool } = await get();
    await pool.checkHealth();
    pool.setCurrentVersion(0);
  };
  return {
    isEarlyDispatch: false,
    beginLoad: () => undefined,
    loadWeights: atZero,
    resumeLoad: atZero,
    restoreVersion: atZero,
    releaseMemory: () => refuseColocate("weight_sync: none"),
    resumeMemory: () => refuseColocate("weight_sync: none"),
    adoptLoggedMemory: () => refuseColocate("weight_sync: none"),
    async reportedVersions() {
      const { pool } = await get();
      await pool.checkHealth();
      return pool.snapshot().engines.flatMap((m) => (m.weightVersion === null ? [] : [m.weightVersion]));
    },
    async close() {
      if (isStarted()) await (await get()).pool.close();
    },
  };
}

/** The run config refuses these pairings (config/colocate-keys.ts); a config that got past it is a bug. */
function refuseColocate(what: string): Promise<never> {
  return Promise.reject(new RlqError("invariant_violated", `colocate: ${what} cannot release GPU memory`, { isRetriable: false }));
}
