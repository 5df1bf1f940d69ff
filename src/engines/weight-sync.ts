/**
 * The controller's side of weight sync (docs/architecture.md "Engines and weight versions").
 *
 * disk: after train step s commits version v at `checkpointUri`, rlq tells
 *   every live engine to load it (SGLang update_weights_from_disk carrying
 *   weight_version = v) and resolves once each reports v. Engines that fail
 *   leave the rotation; the pool reloads them with v when they come back.
 * trainer_push: the trainer pushes the weights itself (e.g. NCCL
 *   update_weights_from_distributed carrying weight_version = v into SGLang, or vLLM's weight
 *   transfer ending with /finish_weight_update {weight_version: v}). rlq does not
 *   send weights: it waits until every live engine reports v, then routes to v
 *   only. Fenced engines (OpenAI-compatible servers that do not know versions)
 *   take v as recorded when the trainer or operator reports it.
 * none: the engines keep the weights they started with (version 0); the
 *   controller never syncs (sync-step.ts), and `sync` only reports.
 *
 * In both modes the step's successors must not generate before `sync`
 * resolves; the controller commits `weights.synced` with the report.
 * Before an engine's weights change, this run's in-flight requests on it must
 * be aborted by id (sync mode has none by then: the step was sealed).
 */

import type { LoaderPool, PoolSnapshot } from "./pool-types.ts";
import { loadKeepsRequests, type SyncStrategy } from "../core/weight-sync.ts";
import { RlqError } from "../lib/errors.ts";

export type WeightSyncMode = "disk" | "trainer_push" | "none";

export interface WeightSyncReport {
  mode: WeightSyncMode;
  version: number;
  /** Engines serving `version` when sync resolved. */
  engines: string[];
  /** Engines out of the rotation at that moment (they are re-admitted on the current version later). */
  absent: string[];
  durationMs: number;
}

export interface WeightSync {
  readonly mode: WeightSyncMode;
  /** `onEngineLoaded` (disk): hears of each engine as its own load ends, before the others'. */
  sync(version: number, checkpointUri: string | null, onEngineLoaded?: (engineId: string) => void): Promise<WeightSyncReport>;
  /**
   * trainer_push: hold new requests in this process's pool until the next sync resolves (the
   * router's `hold` until `resume`). The controller's loader does not call it: its pool serves no
   * requests; the rollout workers' pools hold through the log instead (runtime/engines.ts).
   */
  beginPush(): void;
  snapshot(): PoolSnapshot;
  close(): Promise<void>;
}

export interface WeightSyncOptions {
  mode: WeightSyncMode;
  /** weight_update_mode: `in_place` loads each engine paused keeping its requests (core/weight-sync.ts `SyncStrategy`). Default abort. */
  updateMode?: SyncStrategy;
  /** weight_load_max_engines: with `in_place`, at most this many engines load at once (core/staggered-load.ts); null or unset: all. */
  maxLoadingEngines?: number | null;
  pushTimeoutMs?: number;
  now?: () => number;
}

export function createWeightSync(pool: LoaderPool, options: WeightSyncOptions): WeightSync {
  const now = options.now ?? (() => Date.now());
  const report = (version: number, t0: number): WeightSyncReport => {
    const states = pool.snapshot().engines;
    return {
      mode: options.mode,
      version,
      engines: states.filter((e) => e.state === "healthy" && e.weightVersion === version).map((e) => e.engineId),
      absent: states.filter((e) => !(e.state === "healthy" && e.weightVersion === version)).map((e) => e.engineId),
      durationMs: now() - t0,
    };
  };
  return {
    mode: options.mode,
    async sync(version, checkpointUri, onEngineLoaded) {
      const t0 = now();
      if (options.mode === "none") return report(version, t0);
      if (options.mode === "disk") {
        if (checkpointUri === null) throw new RlqError("version_unavailable", `weight sync (disk): version ${version} has no checkpoint URI`);
        await pool.loadWeights(version, checkpointUri, onEngineLoaded, {
          keepRequests: loadKeepsRequests(options.updateMode ?? "abort"),
          maxLoadingEngines: options.maxLoadingEngines ?? null,
        });
      } else {
        try {
          await pool.awaitVersion(version, options.pushTimeoutMs ?? 600_000);
        } finally {
          pool.resumeAdmission();
        }
      }
      return report(version, t0);
    },
    beginPush() {
      pool.pauseAdmission();
    },
    snapshot: () => pool.snapshot(),
    close: () => pool.close(),
  };
}
