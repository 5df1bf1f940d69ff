import type { RunConfig } from "../config/run-config.ts";
import { createSglangEngine } from "../engines/sglang.ts";

/**
 * What the controller does to engines directly: weight sync. Remote engines
 * are told to load a committed checkpoint; embedded engines live inside the
 * rollout workers and load the version a job asks for before generating.
 */
export interface EngineAdmin {
  loadWeights(version: number, checkpointUri: string): Promise<void>;
}

export function createEngineAdmin(config: RunConfig): EngineAdmin {
  if (config.engine.kind === "sglang") {
    const engine = createSglangEngine({ urls: config.engine.urls, requestTimeoutMs: config.engine.request_timeout_s * 1000 });
    return { loadWeights: (v, uri) => engine.loadWeights(v, uri) };
  }
  return { loadWeights: async () => undefined };
}
