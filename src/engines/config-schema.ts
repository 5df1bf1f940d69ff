import { z } from "zod";
import { secretRefSchema } from "../config/secrets.ts";

/**
 * Run-config pieces for remote engines, for src/config/run-config.ts to use
 * (the config folder owns the run config; these are here so that the engine
 * code and its schema change together). Keys follow slime's flag names.
 */
export const sglangEngineConfigSchema = z
  .object({
    kind: z.literal("sglang"),
    /** SGLang workers, addressed directly. May be empty when router_url is set. */
    urls: z.array(z.string().url()).default([]),
    /** An SGLang router: its /workers list is added to `urls` at start. */
    router_url: z.string().url().nullable().default(null),
    request_timeout_s: z.number().positive().default(600),
    /**
     * false (default, slime's default): one non-streamed /generate per sample, whose cost is linear
     * in the length. true: stream /generate so a server dying mid-request still returns its tokens;
     * SGLang repeats every token so far in each event (quadratic in the length) unless it runs
     * --incremental-streaming-output (rlq reads the deltas) or a large --stream-interval.
     */
    stream: z.boolean().default(false),
    /**
     * Without streaming: false (default) sends each sample as its own /generate, as slime's
     * generate_and_rm_group does (one task per sample), so a finished sample frees its slot at once.
     * true sends a group's samples as one batch /generate: fewer HTTP requests (it pays off only on
     * very fast engines), but the batch answers when its slowest sample ends, and one bad item fails it.
     */
    batch_group: z.boolean().default(false),
    /** The workers' (and router's) --api-key, from the environment or a file: {env: NAME} | {file: PATH}. Only the reference is stored. */
    api_key: secretRefSchema.optional(),
    /**
     * The workers' --admin-api-key, {env: NAME} | {file: PATH}; only the reference is stored. SGLang
     * started with both keys accepts only this one on its admin routes (abort, weight loads and
     * pushes, pause, flush: python/sglang/srt/utils/auth.py decide_request_auth, ADMIN_OPTIONAL) and
     * only api_key on the others; rlq sends each where it belongs. Unset: api_key goes everywhere.
     */
    admin_api_key: secretRefSchema.optional(),
    /** The router's key when it differs from the workers' (the router's own --api-key). */
    router_api_key: secretRefSchema.optional(),
    /** How often the router's worker list is read again (s); 0: only at start. */
    router_refresh_s: z.number().nonnegative().default(30),
    /** probe: check each server's log-prob semantics on admission (docs/engines.md). */
    logprob_check: z.enum(["probe", "off"]).default("probe"),
    /**
     * true: these servers serve this run alone (as slime's own servers do), so a weight sync ends
     * every request on them with one `/abort_request {abort_all: true}` per server, slime's
     * abort_server_until_idle, instead of one call per request (docs/engines.md). false (default):
     * other runs may share the servers, and rlq aborts only its own requests, by id.
     */
    exclusive: z.boolean().default(false),
  })
  .strict()
  .refine((e) => e.urls.length > 0 || e.router_url !== null, { message: "set urls or router_url", path: ["urls"] });

export const openAiEngineConfigSchema = z
  .object({
    kind: z.literal("openai"),
    urls: z.array(z.string().url()).min(1),
    /** The served model name sent as `model`. */
    model: z.string().min(1),
    request_timeout_s: z.number().positive().default(600),
    /** vLLM --logprobs-mode the servers run with. */
    logprobs_mode: z.enum(["raw_logprobs", "processed_logprobs"]).default("raw_logprobs"),
    /** The servers' --api-key, from the environment or a file: {env: NAME} | {file: PATH}. Only the reference is stored. */
    api_key: secretRefSchema.optional(),
    logprob_check: z.enum(["probe", "off"]).default("probe"),
    /**
     * vLLM's repetition_detection, sent with every request (vllm/sampling_params.py
     * RepetitionDetectionParams): a sample whose output ends in an n-gram of min_pattern_size..
     * max_pattern_size tokens repeated min_count times in a row stops there (finish_reason
     * "repetition"), a complete sample whose stop reason is recorded. Unset: off, vLLM's default.
     */
    repetition_detection: z
      .object({
        max_pattern_size: z.number().int().positive(),
        min_pattern_size: z.number().int().nonnegative().default(0),
        min_count: z.number().int().min(2),
      })
      .strict()
      .optional(),
  })
  .strict();

/** Top-level run-config keys (slime names; rlq keeps health monitoring always on). */
export const engineRuntimeKeys = {
  /** slime --sglang-server-concurrency: in-flight requests per engine. */
  sglang_server_concurrency: z.number().int().positive().default(512),
  /** slime --rollout-health-check-interval (s). */
  rollout_health_check_interval: z.number().positive().default(30),
  /** slime --rollout-health-check-timeout (s). */
  rollout_health_check_timeout: z.number().positive().default(30),
  /** slime --rollout-health-check-first-wait (s): rlq's warm-up grace after the pool starts. */
  rollout_health_check_first_wait: z.number().nonnegative().default(0),
  /**
   * disk: rlq asks engines to load each committed checkpoint; trainer_push: the trainer pushes, rlq
   * fences and records; none: the engines keep the weights they started with (version 0) for the
   * whole run, every token is recorded at version 0, and step k trains on samples k versions stale.
   */
  weight_sync: z.enum(["disk", "trainer_push", "none"]).default("disk"),
  /** trainer_push: how long rlq waits for every live engine to report the new version (s). */
  weight_sync_timeout_s: z.number().positive().default(600),
  /**
   * A LoRA run's disk sync (lora_rank > 0): merged, the engine reloads the whole model from the
   * checkpoint's merged weights; adapter, the engine loads the checkpoint's peft adapter (adapter/)
   * alone, under a name of its version, and each request names the adapter of the version it reads
   * (vLLM's /v1/load_lora_adapter; docs/engines.md "LoRA adapters").
   */
  lora_sync: z.enum(["merged", "adapter"]).default("merged"),
};

export type SglangEngineConfig = z.infer<typeof sglangEngineConfigSchema>;
export type OpenAiEngineConfig = z.infer<typeof openAiEngineConfigSchema>;
export type RemoteEngineConfig = SglangEngineConfig | OpenAiEngineConfig;

const runtimeKeysSchema = z.object(engineRuntimeKeys);
export type EngineRuntimeKeys = z.infer<typeof runtimeKeysSchema>;
/** Fill the top-level keys' defaults for a config that does not have them yet. */
export function engineRuntimeDefaults(partial: Partial<EngineRuntimeKeys>): EngineRuntimeKeys {
  return runtimeKeysSchema.parse(partial);
}
