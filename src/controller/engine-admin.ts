import type { RunConfig } from "../config/run-config.ts";
import { createEnginesFromConfig } from "../engines/from-config.ts";
import { createWeightSync, type WeightSync } from "../engines/weight-sync.ts";
import type { EnginePool } from "../engines/pool.ts";

/**
 * What the controller does to engines directly: weight sync. Remote engines
 * are told to load a committed checkpoint (weight_sync: disk), or the
 * trainer pushes and rlq waits for every live engine to report the version
 * (trainer_push). Embedded engines live inside the rollout workers and load
 * the version a job asks for before generating.
 */
export interface EngineAdmin {
  loadWeights(version: number, checkpointUri: string): Promise<void>;
  /** The weight versions the live engines report now (empty for the embedded engine). */
  reportedVersions(): Promise<number[]>;
  close(): Promise<void>;
}

export function createEngineAdmin(config: RunConfig): EngineAdmin {
  const e = config.engine;
  if (e.kind === "embedded") return { loadWeights: async () => undefined, reportedVersions: async () => [], close: async () => undefined };
  let state: Promise<{ pool: EnginePool; sync: WeightSync }> | null = null;
  const get = () => {
    state ??= createEnginesFromConfig(e, config).then((pool) => ({
      pool,
      sync: createWeightSync(pool, { mode: config.weight_sync, pushTimeoutMs: config.weight_sync_timeout_s * 1000 }),
    }));
    return state;
  };
  return {
    async loadWeights(version, uri) {
      await (await get()).sync.sync(version, uri);
    },
    async reportedVersions() {
      const { pool } = await get();
      await pool.checkHealth();
      return pool.snapshot().engines.flatMap((m) => (m.weightVersion === null ? [] : [m.weightVersion]));
    },
    async close() {
      if (state) await (await state).pool.close();
    },
  };
}
