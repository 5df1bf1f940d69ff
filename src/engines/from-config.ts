/**
 * Build the engine pool a run's config describes: SGLang workers (listed,
 * or discovered from a router and re-read every router_refresh_s) or
 * OpenAI-compatible servers, with slime's concurrency and health-check
 * settings. API keys are read here, from the environment or a file named by
 * the config (config/secrets.ts); they are never logged or stored.
 */

import type { RemoteEngineConfig, EngineRuntimeKeys } from "./config-schema.ts";
import { createEnginePool, type EnginePool, type PoolLog } from "./pool.ts";
import type { TurnGate } from "./pool-types.ts";
import { createSglangServer } from "./sglang.ts";
import { listRouterWorkers } from "./sglang-router.ts";
import { createOpenAiCompatEngine } from "./openai-compat.ts";
import { createVllmInPlaceEngine } from "./vllm-in-place.ts";
import type { RemoteEngine } from "./remote.ts";
import { readOptionalSecret } from "../config/secrets.ts";
import { readEnv } from "../config/env.ts";
import { createLogger } from "../observability/logger.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

export interface EnginesFromConfigDeps {
  log?: PoolLog;
  /** OpenAI-compatible engines: the run's version of record (the lead wires the run's synced version). */
  fencedVersion?: () => Promise<number>;
  /** Where env secrets are read; default the process environment. */
  envSource?: Readonly<Record<string, string | undefined>>;
  /** Colocated mode, a rollout worker's pool: its health checks wait for the engines' turn (pool-types.ts `turnGate`). */
  turnGate?: TurnGate;
}

let defaultLog: PoolLog | null = null;
/** Engine deaths and admissions are logged in every process that has a pool (controller and workers). */
function engineLog(): PoolLog {
  defaultLog ??= createLogger(readEnv().RLQ_LOG_LEVEL, "rlq-engines");
  return defaultLog;
}

/** The run's weight_update_mode, where the caller has the whole run config: in_place picks vLLM's in-place adapter. */
/** multimodal_keys: the run's prompts carry images, which vLLM takes on /inference/v1/generate only. */
type PoolKeys = EngineRuntimeKeys & { weight_update_mode?: "abort" | "drain" | "in_place"; multimodal_keys?: Record<string, string> | null };

export async function createEnginesFromConfig(engine: RemoteEngineConfig, keys: PoolKeys, deps: EnginesFromConfigDeps = {}): Promise<EnginePool> {
  const timeoutMs = engine.request_timeout_s * 1000;
  const env = deps.envSource ?? process.env;
  const log = deps.log ?? engineLog();
  let members: RemoteEngine[];
  let refresh: (() => Promise<RemoteEngine[]>) | null = null;
  if (engine.kind === "sglang") {
    if (keys.lora_sync === "adapter")
      // run-config refuses it first; this guards callers that build a pool from parts.
      throw new RlqError(
        "config_invalid",
        "lora_sync: adapter with engine.kind sglang: rlq's SGLang adapter does not load LoRA adapters; use lora_sync: merged, or a vLLM engine (engine.kind: openai)",
        { isRetriable: false },
      );
    const apiKey = readOptionalSecret(engine.api_key, "engine.api_key", env);
    const adminApiKey = readOptionalSecret(engine.admin_api_key, "engine.admin_api_key", env);
    const routerKey = readOptionalSecret(engine.router_api_key, "engine.router_api_key", env) ?? apiKey;
    const make = (url: string) =>
      createSglangServer({
        url,
        requestTimeoutMs: timeoutMs,
        isStreaming: engine.stream,
        isBatchingGroups: engine.batch_group,
        apiKey,
        adminApiKey,
        weightSync: keys.weight_sync,
      });
    const urls = [...engine.urls];
    const routerUrl = engine.router_url;
    // A worker left out (not SGLang, not a regular HTTP worker) is logged once per URL, not at every refresh.
    const skipped = new Set<string>();
    const onSkipped = (url: string, reason: string) => {
      if (skipped.has(url)) return;
      skipped.add(url);
      log.warn({ router: routerUrl, worker: url, reason }, "router worker left out");
    };
    const list = (root: string) => listRouterWorkers(root, { apiKey: routerKey, onSkipped });
    if (routerUrl !== null) for (const u of await list(routerUrl)) if (!urls.includes(u)) urls.push(u);
    members = urls.map(make);
    if (routerUrl !== null && engine.router_refresh_s > 0) refresh = async () => (await list(routerUrl)).map(make);
  } else {
    const apiKey = readOptionalSecret(engine.api_key, "engine.api_key", env);
    // weight_update_mode in_place (run-config.ts allows it with weight_sync disk only): the adapter that
    // pauses keeping the requests and reads each token's version (vllm-in-place.ts).
    const make = keys.weight_update_mode === "in_place" && keys.weight_sync === "disk" ? createVllmInPlaceEngine : createOpenAiCompatEngine;
    members = engine.urls.map((url) =>
      make({
        url,
        model: engine.model,
        requestTimeoutMs: timeoutMs,
        logprobsMode: engine.logprobs_mode,
        // weight_sync disk and trainer_push: vLLM reports its own version (/weight_info); with none rlq's record is the fence.
        versionSource: keys.weight_sync === "none" ? deps.fencedVersion : undefined,
        loadsWeights: keys.weight_sync === "disk",
        // The trainer pushes through vLLM's weight transfer (rlq_torch/weight_push.py VllmPusher); rlq reads the version back.
        isPushed: keys.weight_sync === "trainer_push",
        loraSync: keys.lora_sync,
        apiKey,
        hasImages: keys.multimodal_keys != null,
        ...(engine.repetition_detection ? { repetitionDetection: engine.repetition_detection } : {}),
      }),
    );
  }
  const pool = createEnginePool({
    members,
    maxConcurrentPerEngine: keys.sglang_server_concurrency,
    healthIntervalMs: keys.rollout_health_check_interval * 1000,
    healthTimeoutMs: keys.rollout_health_check_timeout * 1000,
    warmupGraceMs: keys.rollout_health_check_first_wait * 1000,
    logprobCheck: engine.logprob_check,
    isExclusive: engine.kind === "sglang" && engine.exclusive,
    ...(deps.turnGate === undefined ? {} : { turnGate: deps.turnGate }),
    log,
  });
  if (refresh !== null && engine.kind === "sglang") {
    const read = refresh;
    const timer = setInterval(() => {
      read().then(
        (found) => pool.addMembers(found),
        (e: unknown) => log.warn({ router: engine.router_url, err: errorMessage(e) }, "reading the router's worker list failed; keeping the workers known"),
      );
    }, engine.router_refresh_s * 1000);
    timer.unref();
    const close = pool.close.bind(pool);
    pool.close = async () => {
      clearInterval(timer);
      await close();
    };
  }
  return pool;
}
