import type { RemoteEngineConfig, EngineRuntimeKeys } from "./config-schema.ts";
import { createEnginePool, type EnginePool, type PoolLog } from "./pool.ts";
import { createSglangServer } from "./sglang.ts";
import { listRouterWorkers } from "./sglang-router.ts";
import { createOpenAiCompatEngine } from "./openai-compat.ts";
import type { RemoteEngine } from "./remote.ts";

/**
 * Build the engine pool a run's config describes: SGLang workers (listed,
 * or discovered from a router) or OpenAI-compatible servers, with slime's
 * concurrency and health-check settings.
 */
export interface EnginesFromConfigDeps {
  log?: PoolLog;
  /** OpenAI-compatible engines: the run's version of record (the lead wires the run's synced version). */
  fencedVersion?: () => Promise<number>;
}

export async function createEnginesFromConfig(engine: RemoteEngineConfig, keys: EngineRuntimeKeys, deps: EnginesFromConfigDeps = {}): Promise<EnginePool> {
  const timeoutMs = engine.request_timeout_s * 1000;
  let members: RemoteEngine[];
  if (engine.kind === "sglang") {
    const urls = [...engine.urls];
    if (engine.router_url !== null) for (const u of await listRouterWorkers(engine.router_url)) if (!urls.includes(u)) urls.push(u);
    members = urls.map((url) => createSglangServer({ url, requestTimeoutMs: timeoutMs, isStreaming: engine.stream }));
  } else {
    members = engine.urls.map((url) =>
      createOpenAiCompatEngine({ url, model: engine.model, requestTimeoutMs: timeoutMs, logprobsMode: engine.logprobs_mode, versionSource: deps.fencedVersion }),
    );
  }
  return createEnginePool({
    members,
    maxConcurrentPerEngine: keys.sglang_server_concurrency,
    healthIntervalMs: keys.rollout_health_check_interval * 1000,
    healthTimeoutMs: keys.rollout_health_check_timeout * 1000,
    warmupGraceMs: keys.rollout_health_check_first_wait * 1000,
    logprobCheck: engine.logprob_check,
    log: deps.log,
  });
}
