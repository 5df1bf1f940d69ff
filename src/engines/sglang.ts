/**
 * One SGLang server through its native API (as slime/rollout/sglang_rollout.py at 624b824 uses it):
 * POST /generate {rid, input_ids, sampling_params, return_logprob, stream};
 * POST /abort_request {rid} (abort_all only with engine.exclusive: otherwise other runs and evals share the
 * server); GET /health_generate; GET /model_info (the version; /get_model_info, /get_weight_version
 * on servers without it); POST /update_weights_from_disk {model_path, weight_version};
 * GET /server_info (/get_server_info on servers without it).
 *
 * Keys (python/sglang/srt/utils/auth.py decide_request_auth; the routes' levels are the
 * `@auth_level` marks in python/sglang/srt/entrypoints/http_server.py): /health* take none;
 * NORMAL routes (/generate, /model_info, /server_info) take --api-key; ADMIN_OPTIONAL routes
 * (/abort_request, /update_weights_*, /pause_generation, /continue_generation, /flush_cache) take
 * only --admin-api-key when the server has one, and --api-key otherwise. A refused admin call is
 * engine_admin_unauthorized, naming engine.admin_api_key.
 *
 * Without streaming (the default, engine.stream false) each request is one
 * /generate, as slime sends them; with engine.batch_group the samples of one
 * group that arrive in one event-loop turn go out as one batch /generate
 * (engines/sglang-batcher.ts `SglangBatcher`). Streamed (engine.stream true), SGLang's events carry
 * the cumulative meta_info.output_token_logprobs, so if the server dies
 * mid-generation the tokens received so far are kept and the request comes
 * back as an aborted partial (the rollout resumes it) instead of being lost.
 */

import { randomUUID } from "node:crypto";
import { generateRequestSchema, type GenerateRequest, type GenerateResult } from "./engine.ts";
import { bearer, callJson, EngineHttpError, isLocalCancel, postStream } from "./http.ts";
import { classifySamplingProbe, type LogprobProbe, type TopLogprob } from "./logprob-check.ts";
import {
  abortedResult,
  EngineRequestError,
  emptyPartial,
  parseWeightVersion,
  seed31,
  type GenerateHooks,
  type PartialOutput,
  type RemoteEngine,
} from "./remote.ts";
import { applySglangMeta, readSglangAnswer } from "./sglang-answer.ts";
import { SglangBatcher } from "./sglang-batcher.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import { requestText } from "../lib/http-client.ts";
import type { MemoryTag } from "../core/decisions.ts";

/** Internal: stops consuming a stream whose weight version changed (an RlqError so http.ts passes it through). */
class VersionChanged extends RlqError {
  constructor() {
    super("engine_version_changed", "weight version changed mid-request", { isRetriable: true });
  }
}

/** A non-2xx /generate answer: 400 (and 413/422) is the request's fault (http_server.py answers ValueError with 400); 401/403 a missing key. */
function generateHttpError(e: unknown, where: string): unknown {
  if (e instanceof EngineHttpError && !e.isRetriable && e.status !== null && (e.status === 400 || e.status === 413 || e.status === 422)) {
    return new EngineRequestError(`${where}: the server refused the request: ${e.message}`, { cause: e });
  }
  return e;
}

export interface SglangServerOptions {
  url: string;
  /** Whole-request limit for one /generate (run config engine.request_timeout_s). */
  requestTimeoutMs: number;
  /** abort, health, version and info calls. Default 10 s. */
  adminTimeoutMs?: number;
  /** update_weights_from_disk. Default 600 s. */
  loadTimeoutMs?: number;
  /**
   * Default false (slime's default, one non-streamed /generate per sample): an SGLang stream
   * repeats every token so far in each event at --stream-interval 1, so its cost grows with the
   * square of the length. true streams (keeps a dying server's tokens); use it with a server
   * started with --incremental-streaming-output or a large --stream-interval.
   */
  isStreaming?: boolean;
  /**
   * Without streaming: true sends the samples of one group (GenerateRequest.batchKey) that arrive in
   * one event-loop turn as one batch /generate; false (default, as slime) one /generate per sample.
   */
  isBatchingGroups?: boolean;
  /** The server's --api-key: sent as `Authorization: Bearer` on every call but the admin ones when adminApiKey is set. */
  apiKey?: string;
  /** The server's --admin-api-key: sent on the admin routes (abort, weight loads) instead of apiKey. */
  adminApiKey?: string;
  /**
   * The run's weight_sync (default disk): what admission asks of the server. disk and trainer_push
   * need the Python frontend's weight routes; trainer_push also needs --dp-size 1 or DP attention.
   */
  weightSync?: "disk" | "trainer_push" | "none";
}

/**
 * Where the version is read, newest first: newest SGLang serves /model_info, keeps /get_model_info
 * as a deprecated alias that logs "will be removed" on every call, and has no /get_weight_version
 * (python/sglang/srt/entrypoints/http_server.py); 0.5.x has only the last two.
 */
const VERSION_ENDPOINTS = ["/model_info", "/get_model_info", "/get_weight_version"] as const;

/**
 * GET the first of `paths` that the server has: a 404 means a server older (or newer) than the
 * route, and the next one is asked; any other failure is the answer.
 */
async function getFirstServed(url: string, paths: readonly string[], options: { timeoutMs: number; headers?: Record<string, string> }): Promise<unknown> {
  let notFound: unknown = null;
  for (const path of paths) {
    try {
      return await callJson("GET", `${url}${path}`, undefined, options);
    } catch (e) {
      if (!(e instanceof EngineHttpError && e.status === 404)) throw e;
      notFound = e;
    }
  }
  throw notFound;
}

/**
 * An admin call (utils/auth.py ADMIN_OPTIONAL): a 401/403 names the admin key, since a server
 * with --admin-api-key refuses --api-key there while it takes it on /generate.
 */
async function adminCall(
  url: string,
  path: string,
  body: unknown,
  options: { timeoutMs: number; headers?: Record<string, string>; lane?: "control"; hasAdminKey: boolean },
): Promise<unknown> {
  const { hasAdminKey, ...callOptions } = options;
  try {
    return await callJson("POST", `${url}${path}`, body, callOptions);
  } catch (e) {
    if (!(e instanceof EngineHttpError && e.code === "engine_unauthorized")) throw e;
    const fix = hasAdminKey
      ? "engine.admin_api_key is not the key the server was started with (--admin-api-key)"
      : "the server runs --admin-api-key, which alone opens its admin routes: set engine.admin_api_key to {env: NAME} or {file: PATH}";
    throw new EngineHttpError("engine_admin_unauthorized", `SGLang ${url}${path}: HTTP ${e.status}: admin call refused: ${fix}`, {
      cause: e,
      isRetriable: false,
      status: e.status,
    });
  }
}

export function createSglangServer(options: SglangServerOptions): RemoteEngine {
  return new SglangServer(options);
}

/** SGLang's sampling_params for one request (python/sglang/srt/sampling/sampling_params.py names). */
function samplingParams(s: GenerateRequest["sampling"]): Record<string, unknown> {
  return {
    temperature: s.temperature,
    top_p: s.topP,
    top_k: s.topK,
    max_new_tokens: s.maxNewTokens,
    stop_token_ids: s.stopTokenIds,
    ...(s.stop && s.stop.length > 0 ? { stop: s.stop } : {}),
    // Token ids are never trimmed; this keeps the text in step with them (slime sets it too).
    no_stop_trim: true,
    skip_special_tokens: s.skipSpecialTokens ?? false,
    spaces_between_special_tokens: false,
    ...(s.ignoreEos ? { ignore_eos: true } : {}),
    ...(s.seed === undefined ? {} : { sampling_seed: seed31(s.seed) }),
  };
}

/** Fold one answer (a stream event, a whole body, or one output of a batch) into `partial`. */
function applyAnswer(partial: PartialOutput, payload: unknown, where: string): "stop" | "length" | "abort" | null {
  const meta = readSglangAnswer(payload, where);
  if (
    partial.weightVersion !== null &&
    meta.weight_version !== undefined &&
    meta.weight_versions === undefined &&
    parseWeightVersion(meta.weight_version, where) !== partial.weightVersion
  ) {
    // Weights changed under this request (a trainer push with generation paused, not
    // stopped): one segment holds one version, so it ends at the last event of the old one.
    throw new VersionChanged();
  }
  const finish = applySglangMeta(partial, meta, where);
  // Cut at a version boundary mid-stream (spans that do not tile the output): the tokens past it
  // belong to the next segment, and later delta events would be appended to a cut output, so the
  // stream stops here. Spans that tile it are kept whole and the stream runs on.
  if (partial.isVersionCut === true && (meta.finish_reason === null || meta.finish_reason === undefined)) throw new VersionChanged();
  return finish;
}

/**
 * One SGLang server. What it learns of the server lives in its fields, each with one writer:
 * `lastVersion` (the last version it reported: an answer's, or the version endpoint's),
 * `versionEndpoint` (the route that answered, asked first next time), `healthFailure` (set by
 * `health`), `seedHonoured` and `isRustFrontend` (set by `checkServer` at admission).
 */
class SglangServer implements RemoteEngine {
  readonly kind = "sglang" as const;
  readonly id: string;
  readonly url: string;
  private readonly adminMs: number;
  private readonly isStreaming: boolean;
  private readonly headers: Record<string, string> | undefined;
  private readonly adminHeaders: Record<string, string> | undefined;
  private readonly hasAdminKey: boolean;
  private readonly batcher: SglangBatcher;
  private lastVersion = 0;
  private versionEndpoint: (typeof VERSION_ENDPOINTS)[number] | null = null;
  private healthFailure: "busy" | "down" = "down";
  private seedAnswer: boolean | null = null;
  /** /server_info `frontend` is "rust" (SGLANG_RUST_SERVER): no /abort_request, so the pool closes connections instead. */
  private isRustFrontend = false;

  constructor(private readonly options: SglangServerOptions) {
    this.url = options.url.replace(/\/+$/, "");
    this.id = this.url;
    this.adminMs = options.adminTimeoutMs ?? 10_000;
    this.isStreaming = options.isStreaming ?? false;
    this.headers = bearer(options.apiKey);
    this.adminHeaders = bearer(options.adminApiKey ?? options.apiKey);
    this.hasAdminKey = options.adminApiKey !== undefined;
    this.batcher = new SglangBatcher({
      url: this.url,
      isBatching: options.isBatchingGroups ?? false,
      timeoutMs: options.requestTimeoutMs,
      headers: this.headers,
      samplingParams,
      finish: (item, payload) => this.resultOf(item.hooks.partial, applyAnswer(item.hooks.partial, payload, item.where), item.hooks.signal, item.where),
      aborted: (item) => abortedResult(item.hooks.partial, this.url, this.lastVersion),
      httpError: (e, item) => generateHttpError(e, item.where),
    });
  }

  get canAbortById(): boolean {
    return !this.isRustFrontend;
  }

  get canLoadWeights(): boolean {
    return !this.isRustFrontend;
  }

  get seedHonoured(): boolean | null {
    return this.seedAnswer;
  }

  generate(request: GenerateRequest): Promise<GenerateResult> {
    return this.generateWith(generateRequestSchema.parse(request), { partial: emptyPartial() });
  }

  /** `request` is already validated: by `generate` above, or by the pool that calls this (validated once per request). */
  async generateWith(req: GenerateRequest, hooks: GenerateHooks): Promise<GenerateResult> {
    const where = `SGLang ${this.url}/generate (rid ${req.requestId})`;
    if (!this.isStreaming) return this.batcher.submit(req, hooks, where);
    const body = {
      rid: req.requestId,
      input_ids: req.inputIds,
      return_logprob: true,
      stream: true,
      sampling_params: samplingParams(req.sampling),
      // python/sglang/srt/managers/io_struct.py GenerateReqInput.image_data: a list of images for one request.
      ...(req.imageData?.length ? { image_data: req.imageData } : {}),
    };
    const partial = hooks.partial;
    let finish: "stop" | "length" | "abort" | null = null;
    try {
      await postStream(`${this.url}/generate`, body, { timeoutMs: this.options.requestTimeoutMs, signal: hooks.signal, headers: this.headers }, (payload) => {
        finish = applyAnswer(partial, payload, where) ?? finish;
      });
    } catch (e) {
      if (isLocalCancel(e, hooks.signal)) return abortedResult(partial, this.url, this.lastVersion);
      if (e instanceof VersionChanged) {
        // The abort by id only frees the server's slot sooner: the tokens kept are in `partial`, and
        // SGLang aborts a request whose client went away 2 s later (tokenizer_manager.py create_abort_task).
        await this.abort([req.requestId]).catch(() => undefined); // nothing lost: the stream is closed already

        return abortedResult(partial, this.url, this.lastVersion);
      }
      throw generateHttpError(e, where);
    }
    return this.resultOf(partial, finish, hooks.signal, where);
  }

  async abort(requestIds: readonly string[]): Promise<void> {
    // The server answers each aborted request with its tokens so far; the
    // caller (the pool) waits for those answers.
    // The control lane: a sync's burst of aborts shares a few connections to this server (lib/http-client.ts).
    await Promise.all(requestIds.map((rid) => this.admin("/abort_request", { rid, abort_all: false }, this.adminMs, "control")));
  }

  async abortAll(): Promise<void> {
    // tokenizer_manager.py abort_request(abort_all=True): the scheduler ends every waiting and
    // running request, each answering with its tokens so far; a request held behind a load's
    // model update lock is not in the scheduler yet and runs after the load.
    await this.admin("/abort_request", { abort_all: true }, this.adminMs, "control");
  }

  /**
   * Colocated mode. http_server.py release_memory_occupation / resume_memory_occupation take
   * ReleaseMemoryOccupationReqInput {tags} (io_struct.py); the scheduler
   * (managers/scheduler_update_weights_mixin.py) asserts no request is running before a release,
   * adds each tag to its `offload_tags` set and pauses that memory; a resume removes each tag from
   * the set (a KeyError for a tag not released) and resumes it. The server needs
   * --enable-memory-saver for the memory to be freed at all.
   */
  async releaseMemory(tags: readonly MemoryTag[]): Promise<void> {
    await this.admin("/release_memory_occupation", { tags: [...tags] }, this.options.loadTimeoutMs ?? 600_000);
  }

  async resumeMemory(tags: readonly MemoryTag[]): Promise<void> {
    await this.admin("/resume_memory_occupation", { tags: [...tags] }, this.options.loadTimeoutMs ?? 600_000);
  }

  async health(timeoutMs = this.adminMs): Promise<boolean> {
    try {
      const res = await requestText("GET", `${this.url}/health_generate`, undefined, { timeoutMs, headers: this.headers });
      if (res.status >= 200 && res.status < 300) return true;
      // 503 while weights load or generation is paused (http_server.py health_generate): busy if the
      // server still answers its version endpoint, which takes no model lock.
      this.healthFailure =
        res.status === 503 &&
        (await this.readVersion().then(
          () => true,
          () => false,
        ))
          ? "busy"
          : "down";
      return false;
    } catch {
      // No answer is the check's answer ("down"): the pool counts it and logs the engine's death.
      this.healthFailure = "down";
      return false;
    }
  }

  lastHealthFailure(): "busy" | "down" {
    return this.healthFailure;
  }

  async weightVersion(): Promise<number> {
    this.lastVersion = await this.readVersion();
    return this.lastVersion;
  }

  /**
   * weight_update_mode in_place (engines/pool-types.ts `InPlacePause`): POST /pause_generation
   * {mode: "in_place"} keeps every running and waiting request with its KV cache and stops
   * scheduling (io_struct.py PauseGenerationReqInput, scheduler.py pause_generation); a load from disk
   * sent while paused skips the model update lock the requests hold and starts at once
   * (tokenizer_manager.py update_weights_from_disk: "Immediately update the weights if the engine is
   * in paused state"). The kept requests' answers then carry meta_info.weight_versions spans
   * (utils/weight_versions.py), and rlq records one segment per version (sglang-answer.ts).
   */
  async pauseInPlace(): Promise<void> {
    await this.admin("/pause_generation", { mode: "in_place" }, this.adminMs, "control");
  }

  /** POST /continue_generation: the requests kept by `pauseInPlace` go on at the weights loaded meanwhile. */
  async resumeInPlace(): Promise<void> {
    await this.admin("/continue_generation", {}, this.adminMs, "control");
  }

  async loadWeights(version: number, uri: string): Promise<void> {
    const modelPath = uri.startsWith("file://") ? decodeURIComponent(new URL(uri).pathname) : uri;
    let res: { success?: boolean; message?: string };
    try {
      res = (await this.admin(
        "/update_weights_from_disk",
        { model_path: modelPath, weight_version: String(version) },
        this.options.loadTimeoutMs ?? 600_000,
      )) as typeof res;
    } catch (e) {
      // A failed load is HTTP 400 {success: false, message} (http_server.py update_weights_from_disk).
      if (e instanceof EngineHttpError && e.status === 400) res = { success: false, message: e.message };
      else throw e;
    }
    if (res.success === false) {
      throw new RlqError(
        "engine_load_failed",
        `SGLang ${this.url}: update_weights_from_disk(${modelPath}, version ${version}) failed: ${res.message ?? "no message"}`,
        { isRetriable: false },
      );
    }
    const now = await this.weightVersion();
    if (now !== version) {
      throw new RlqError("engine_version_mismatch", `SGLang ${this.url}: loaded ${modelPath} as version ${version} but it reports version ${now}`, {
        isRetriable: true,
      });
    }
  }

  async probeLogProbs(inputIds: number[]): Promise<LogprobProbe> {
    const a = await this.probeOnce(inputIds, 1, -1);
    const b = await this.probeOnce(inputIds, 0.5, -1);
    const c = await this.probeOnce(inputIds, 1, 2);
    return classifySamplingProbe(a, b, c);
  }

  async checkServer(): Promise<void> {
    await checkSglangModel(this.url, this.adminMs, this.headers);
    // /server_info, or /get_server_info on servers without it. A server that answers neither
    // leaves the seed question open (null) and the frontend and DP checks below unasked: 0.5.x
    // builds without them run the Python frontend, and their pushes are checked by the push.
    const info = (await getFirstServed(this.url, ["/server_info", "/get_server_info"], { timeoutMs: this.adminMs, headers: this.headers }).catch(
      (e: unknown) => {
        if (e instanceof EngineHttpError && e.status === 404) return null;
        throw e;
      },
    )) as ServerInfo | null;
    this.seedAnswer = info === null ? null : info.enable_deterministic_inference === true;
    this.isRustFrontend = info?.frontend === "rust";
    refuseUnfit(this.url, info, this.options.weightSync ?? "disk");
  }

  async close(): Promise<void> {}

  /** One generated token's top log-probs at `temperature` and `topK`: one step of the sampling probe. */
  private async probeOnce(inputIds: number[], temperature: number, topK: number): Promise<TopLogprob[]> {
    // On the sampling path (top_k -1): with top_k <= 1 SGLang takes the greedy path and returns
    // log_softmax(logits) without temperature (layers/sampler.py), which would hide the scaling.
    const res = await callJson(
      "POST",
      `${this.url}/generate`,
      {
        rid: `rlq-probe-${randomUUID()}`,
        input_ids: inputIds,
        return_logprob: true,
        top_logprobs_num: 2,
        sampling_params: { temperature, top_p: 1, top_k: topK, max_new_tokens: 1, ignore_eos: true, stop_token_ids: [], no_stop_trim: true },
      },
      { timeoutMs: this.options.requestTimeoutMs, headers: this.headers },
    );
    const where = `SGLang ${this.url} probe`;
    const meta = readSglangAnswer(res, where);
    return readTopLogprobs(meta.output_top_logprobs, where);
  }

  /** An admin route, with the admin key (adminCall names it when refused). */
  private admin(path: string, body: unknown, timeoutMs: number, lane?: "control"): Promise<unknown> {
    return adminCall(this.url, path, body, {
      timeoutMs,
      headers: this.adminHeaders,
      hasAdminKey: this.hasAdminKey,
      ...(lane === undefined ? {} : { lane }),
    });
  }

  /** The result once the answer is in (or the request was cancelled locally). */
  private resultOf(partial: PartialOutput, finish: "stop" | "length" | "abort" | null, signal: AbortSignal | undefined, where: string): GenerateResult {
    if (finish === null) {
      if (signal?.aborted) return abortedResult(partial, this.url, this.lastVersion);
      throw new RlqError("engine_unreachable", `${where}: the stream ended without a finish_reason after ${partial.tokenIds.length} token(s)`, {
        isRetriable: true,
      });
    }
    // The server's version now: the newest span's where a load in place ran under the request.
    const newest = partial.versionSpans?.at(-1)?.version ?? partial.weightVersion;
    if (newest !== null) this.lastVersion = newest;
    return {
      tokenIds: [...partial.tokenIds],
      logProbs: [...partial.logProbs],
      finishReason: finish,
      weightVersion: partial.weightVersion ?? this.lastVersion,
      engineId: this.url,
      ...(partial.versionSpans ? { versionSpans: partial.versionSpans.map((x) => ({ ...x })) } : {}),
    };
  }

  private async readVersion(): Promise<number> {
    const endpoint = this.versionEndpoint;
    const order = endpoint === null ? VERSION_ENDPOINTS : [endpoint, ...VERSION_ENDPOINTS.filter((x) => x !== endpoint)];
    let lastError: unknown = null;
    for (const path of order) {
      let body: { weight_version?: unknown };
      try {
        body = (await callJson("GET", `${this.url}${path}`, undefined, { timeoutMs: this.adminMs, headers: this.headers })) as { weight_version?: unknown };
      } catch (e) {
        // 404: this build does not have it (yet, or any more): try the next one.
        if (e instanceof EngineHttpError && e.status === 404) {
          lastError = e;
          continue;
        }
        throw e;
      }
      if (body.weight_version === undefined) continue;
      this.versionEndpoint = path;
      return parseWeightVersion(body.weight_version, `SGLang ${this.url}${path}`);
    }
    throw new RlqError(
      "engine_no_version",
      `SGLang ${this.url}: none of ${VERSION_ENDPOINTS.join(", ")} reports weight_version${lastError ? ` (${errorMessage(lastError)})` : ""}`,
      { isRetriable: true },
    );
  }
}

/** The /server_info fields admission reads (the resolved server args, plus `frontend` on newest SGLang). */
interface ServerInfo {
  enable_deterministic_inference?: unknown;
  frontend?: unknown;
  dp_size?: unknown;
  enable_dp_attention?: unknown;
}

/**
 * Refuse a server the run's weight sync cannot drive, naming why:
 * - The Rust frontend (`SGLANG_RUST_SERVER`; /server_info `frontend: "rust"`,
 *   rust/sglang-server/src/api_server/http/info.rs at 96510958) serves /generate, the info and
 *   health routes and the OpenAI ones only (http/app.rs at c847139d `router`): no /abort_request,
 *   /update_weights_from_*, /init_weights_update_group or /pause_generation, and its /generate
 *   answers carry no weight_version (generate.proto GenerateMetaInfo at 09d9c399). rlq could neither
 *   load nor push a version into it nor learn which version made a token: refused unless the run
 *   keeps its weights (weight_sync none).
 * - A push (init_weights_update_group, update_weights_from_distributed, update_weights_from_tensor)
 *   asserts `dp_size == 1 or enable_dp_attention` (managers/tokenizer_control_mixin.py at 00a2ca2e):
 *   with --dp-size > 1 and no DP attention each sync is an HTTP 500. update_weights_from_disk has
 *   no such assertion, so weight_sync disk is not refused.
 */
function refuseUnfit(url: string, info: ServerInfo | null, weightSync: "disk" | "trainer_push" | "none"): void {
  if (info === null) return;
  if (info.frontend === "rust" && weightSync !== "none")
    throw new RlqError(
      "engine_cannot_load",
      `SGLang ${url} runs the Rust frontend (/server_info frontend "rust", SGLANG_RUST_SERVER), which has no /abort_request, weight-update ` +
        `(/update_weights_from_disk, /update_weights_from_distributed, /update_weights_from_tensor) or /pause_generation route and puts no ` +
        `weight_version in its answers, so weight_sync ${weightSync} cannot load versions into it or tell which version made a token: ` +
        "start the server without SGLANG_RUST_SERVER (the Python frontend), or use weight_sync: none",
      { isRetriable: false },
    );
  const dpSize = typeof info.dp_size === "number" ? info.dp_size : 1;
  if (weightSync === "trainer_push" && dpSize > 1 && info.enable_dp_attention !== true)
    throw new RlqError(
      "engine_cannot_load",
      `SGLang ${url} runs --dp-size ${dpSize} without --enable-dp-attention, and SGLang's push routes (init_weights_update_group, ` +
        "update_weights_from_distributed, update_weights_from_tensor) assert dp_size == 1 or DP attention (tokenizer_control_mixin.py), " +
        "so every trainer_push would fail with HTTP 500: start one server per data-parallel rank (--dp-size 1), add --enable-dp-attention, " +
        "or use weight_sync: disk",
      { isRetriable: false },
    );
}

/** meta_info.output_top_logprobs[0]: [[logprob, token_id, text], ...] for the first output position. */
function readTopLogprobs(raw: unknown, where: string): TopLogprob[] {
  const first = Array.isArray(raw) ? (raw[0] as unknown) : undefined;
  if (!Array.isArray(first))
    throw new RlqError("engine_bad_response", `${where}: no meta_info.output_top_logprobs[0] (the probe asks for top_logprobs_num 2)`, { isRetriable: true });
  return first.map((t: unknown) => {
    const x = t as [unknown, unknown];
    if (!Array.isArray(t) || typeof x[0] !== "number" || typeof x[1] !== "number")
      throw new RlqError("engine_bad_response", `${where}: output_top_logprobs entry ${JSON.stringify(t)}`, { isRetriable: true });
    return { logProb: x[0], tokenId: x[1] };
  });
}

/** GET /model_info (/get_model_info on servers without it): refuse a server that does not generate (an embedding or reward model). */
export async function checkSglangModel(url: string, timeoutMs = 10_000, headers?: Record<string, string>): Promise<{ modelPath: string | null }> {
  const info = (await getFirstServed(url, ["/model_info", "/get_model_info"], { timeoutMs, headers })) as { model_path?: string; is_generation?: boolean };
  if (info.is_generation === false) {
    throw new RlqError(
      "engine_not_generative",
      `SGLang ${url} serves ${info.model_path ?? "a model"} with is_generation = false; rlq needs a generation model`,
      { isRetriable: false },
    );
  }
  return { modelPath: info.model_path ?? null };
}

export type { LogprobProbe };
