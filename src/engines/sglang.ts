import { randomUUID } from "node:crypto";
import { generateRequestSchema, type Engine, type GenerateRequest, type GenerateResult } from "./engine.ts";
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
import { createEnginePool } from "./pool.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";

/**
 * One SGLang server through its native API (as slime/rollout/sglang_rollout.py at 624b824 uses it):
 * POST /generate {rid, input_ids, sampling_params, return_logprob, stream};
 * POST /abort_request {rid} (never abort_all: other runs and evals share the
 * server); GET /health_generate; GET /get_weight_version; POST
 * /update_weights_from_disk {model_path, weight_version}; GET /get_model_info.
 *
 * Generation streams by default: SGLang's stream events carry the cumulative
 * meta_info.output_token_logprobs, so if the server dies mid-generation the
 * tokens received so far are kept and the request comes back as an aborted
 * partial (the rollout resumes it) instead of being lost. Without streaming,
 * the requests of one event-loop turn go out as one batch /generate
 * (`createBatcher` below).
 */
export interface SglangMetaInfo {
  id?: string;
  /** [logprob, token_id, (text)] per generated token. */
  output_token_logprobs?: Array<[number, number, ...unknown[]]>;
  finish_reason?: null | ({ type: string } & Record<string, unknown>);
  weight_version?: string | number;
  completion_tokens?: number;
  [key: string]: unknown;
}

/**
 * Check one /generate answer (a stream event, a body, or one output of a
 * batch) and return its meta_info; a bad answer throws `engine_bad_response`
 * naming the field. Hand-written rather than zod: it runs for every answer,
 * streamed ones carry the cumulative token list in every event, and zod's
 * per-tuple checks cost ~10x JSON.parse for short answers and ~1.6x for 4k
 * tokens (bench/control-plane.ts showed it in rlq up's profile).
 *
 * A request-level error comes as `{"error": {...}}` instead of an answer:
 * SGLang streams it as an SSE event of an HTTP 200 response when the request
 * fails after the stream began (http_server.py generate_request's
 * stream_results: `yield b"data: " + dumps({"error": {"message": str(e)}})`),
 * e.g. a prompt over the context length (tokenizer_manager.py
 * _validate_one_request). That is the request's fault, never the engine's:
 * EngineRequestError.
 */
export function readSglangAnswer(payload: unknown, where: string): SglangMetaInfo {
  const bad = (what: string, path: string): never => {
    throw new RlqError("engine_bad_response", `${where}: unexpected answer: ${what} at ${path}`, { isRetriable: true });
  };
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
  const isCount = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v) && v >= 0;
  if (!isObject(payload)) return bad("expected an object", "(answer)");
  if (payload.error !== undefined && payload.meta_info === undefined) {
    throw new EngineRequestError(`${where}: the server refused the request: ${errorText(payload.error)}`);
  }
  if (payload.text !== undefined && typeof payload.text !== "string") bad("expected a string", "text");
  const meta = payload.meta_info;
  if (!isObject(meta)) return bad("expected an object", "meta_info");
  if (meta.id !== undefined && typeof meta.id !== "string") bad("expected a string", "meta_info.id");
  const lps = meta.output_token_logprobs;
  if (lps !== undefined) {
    if (!Array.isArray(lps)) bad("expected an array", "meta_info.output_token_logprobs");
    const list = lps as unknown[];
    for (let i = 0; i < list.length; i++) {
      const t = list[i];
      if (!Array.isArray(t) || t.length < 2) bad("expected [logprob, token_id, ...]", `meta_info.output_token_logprobs.${i}`);
      const pair = t as unknown[];
      if (typeof pair[0] !== "number") bad("expected a number", `meta_info.output_token_logprobs.${i}.0`);
      if (!isCount(pair[1])) bad("expected a non-negative integer token id", `meta_info.output_token_logprobs.${i}.1`);
    }
  }
  const fr = meta.finish_reason;
  if (fr !== undefined && fr !== null && !(isObject(fr) && typeof fr.type === "string")) bad("expected null or {type: string}", "meta_info.finish_reason");
  const wv = meta.weight_version;
  if (wv !== undefined && typeof wv !== "string" && typeof wv !== "number") bad("expected a string or a number", "meta_info.weight_version");
  if (meta.completion_tokens !== undefined && !isCount(meta.completion_tokens)) bad("expected a non-negative integer", "meta_info.completion_tokens");
  if (meta.weight_versions !== undefined && meta.weight_versions !== null && !Array.isArray(meta.weight_versions))
    bad("expected an array", "meta_info.weight_versions");
  return meta; // checked field by field above
}

/** The message of an `error` member ({message} or a string), for the sample's failure reason. */
function errorText(e: unknown): string {
  if (typeof e === "string") return e;
  if (typeof e === "object" && e !== null && typeof (e as { message?: unknown }).message === "string") return (e as { message: string }).message;
  return JSON.stringify(e)?.slice(0, 300) ?? String(e);
}

/**
 * The versions of a response's tokens from meta_info.weight_versions, where
 * the server gives them: one entry per output token (a version each), or spans
 * `{weight_version, start, end}` / `[weight_version, start, end]` over the
 * output (end exclusive). null: the server gave none (every token is labelled
 * with meta_info.weight_version, the version at the end of the request).
 */
export function tokenVersionSpans(raw: unknown, numTokens: number, where: string): Array<{ version: number; start: number; end: number }> | null {
  if (!Array.isArray(raw) || raw.length === 0) return null;
  const spans: Array<{ version: number; start: number; end: number }> = [];
  const isSpan = (x: unknown) => (Array.isArray(x) && x.length === 3) || (typeof x === "object" && x !== null && !Array.isArray(x));
  if (raw.every(isSpan)) {
    for (const x of raw) {
      const [v, a, b] = Array.isArray(x)
        ? x
        : [
            (x as Record<string, unknown>).weight_version ?? (x as Record<string, unknown>).version,
            (x as Record<string, unknown>).start,
            (x as Record<string, unknown>).end,
          ];
      if (typeof a !== "number" || typeof b !== "number")
        throw new RlqError("engine_bad_response", `${where}: meta_info.weight_versions span ${JSON.stringify(x)} has no numeric start/end`, {
          isRetriable: true,
        });
      spans.push({ version: parseWeightVersion(v, where), start: a, end: b });
    }
  } else {
    if (raw.length !== numTokens) return null; // per-token list of another length: a delta event; the caller keeps the single version
    for (let i = 0; i < raw.length; i++) {
      const v = parseWeightVersion(raw[i], where);
      const last = spans[spans.length - 1];
      if (last && last.version === v) last.end = i + 1;
      else spans.push({ version: v, start: i, end: i + 1 });
    }
  }
  return spans;
}

/**
 * Fold one /generate answer (a stream event or the whole non-streamed body)
 * into `partial`. SGLang sends the cumulative token list in every event
 * unless the server runs --incremental-streaming-output, whose events carry
 * only the new tokens (tokenizer_manager.py _handle_batch_output: with
 * incremental_streaming_output the logprob lists are sliced from the last
 * sent offset; the final abort event stays cumulative); `completion_tokens`
 * (always the running total) tells the two apart. Returns the finish reason
 * once the server gives one.
 *
 * An abort carrying `status_code` is an error the server raised for this
 * request (scheduler.py abort_request with a status: over the context length,
 * invalid input = 400; internal error = 500; overloaded = 503), not a
 * resumable partial: 4xx is the request's fault (EngineRequestError), 5xx the
 * server's (engine_server_abort, retriable from scratch elsewhere).
 *
 * meta_info.weight_versions (where the server gives per-token versions): the
 * answer is cut at the first version boundary and returned as an abort at
 * that point, so one segment holds one version; the rollout continues the
 * sample from there.
 */
export function applySglangMeta(partial: PartialOutput, meta: SglangMetaInfo, where: string): "stop" | "length" | "abort" | null {
  const lps = meta.output_token_logprobs ?? [];
  const total = meta.completion_tokens;
  const isDelta = total !== undefined && lps.length !== total && partial.tokenIds.length + lps.length === total;
  if (!isDelta) {
    partial.tokenIds.length = 0;
    partial.logProbs.length = 0;
  }
  for (const t of lps) {
    partial.tokenIds.push(t[1]);
    // log p <= 0; a float rounding of p = 1 can give +1e-8.
    partial.logProbs.push(Math.min(0, t[0]));
  }
  if (meta.weight_version !== undefined) partial.weightVersion = parseWeightVersion(meta.weight_version, where);
  const fr = meta.finish_reason;
  if (fr !== null && fr !== undefined && fr.type === "abort" && fr.status_code !== undefined && fr.status_code !== null) {
    const status = Number(fr.status_code);
    const message = typeof fr.message === "string" ? fr.message : JSON.stringify(fr);
    if (status >= 400 && status < 500) throw new EngineRequestError(`${where}: the server aborted the request with status ${status}: ${message}`);
    throw new RlqError("engine_server_abort", `${where}: the server aborted the request with status ${status}: ${message}`, { isRetriable: true });
  }
  const spans = isDelta ? null : tokenVersionSpans(meta.weight_versions, partial.tokenIds.length, where);
  if (spans !== null && spans.length > 0) {
    const first = spans[0] as { version: number; start: number; end: number };
    partial.weightVersion = first.version;
    if (spans.length > 1 && first.end < partial.tokenIds.length) {
      partial.tokenIds.length = first.end;
      partial.logProbs.length = first.end;
      return "abort";
    }
  }
  if (fr === null || fr === undefined) return null;
  if (fr.type === "stop" || fr.type === "length" || fr.type === "abort") return fr.type;
  throw new RlqError("engine_bad_response", `${where}: unknown finish_reason ${JSON.stringify(fr)}`, { isRetriable: true });
}

/** Internal: stops consuming a stream whose weight version changed (an RlqError so http.ts passes it through). */
class VersionChanged extends RlqError {
  constructor() {
    super("engine_version_changed", "weight version changed mid-request", { isRetriable: true });
  }
}

/** A non-2xx /generate answer: 400 (and 413/422) is the request's fault (http_server.py answers ValueError with 400); 401/403 a missing key. */
function generateHttpError(e: unknown, where: string): unknown {
  if (e instanceof EngineHttpError && e.status !== null && (e.status === 400 || e.status === 413 || e.status === 422)) {
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
   * Default false (slime's default, one batch /generate per event-loop turn): an SGLang stream
   * repeats every token so far in each event at --stream-interval 1, so its cost grows with the
   * square of the length. true streams (keeps a dying server's tokens); use it with a server
   * started with --incremental-streaming-output or a large --stream-interval.
   */
  isStreaming?: boolean;
  /** The server's --api-key: sent as `Authorization: Bearer` on every call. */
  apiKey?: string;
}

/** Where the version is read, newest first (get_weight_version is deprecated in favour of model_info). */
const VERSION_ENDPOINTS = ["/model_info", "/get_model_info", "/get_weight_version"] as const;

export function createSglangServer(options: SglangServerOptions): RemoteEngine {
  const url = options.url.replace(/\/+$/, "");
  const adminMs = options.adminTimeoutMs ?? 10_000;
  const isStreaming = options.isStreaming ?? false;
  const headers = bearer(options.apiKey);
  let lastVersion = 0;
  let versionEndpoint: (typeof VERSION_ENDPOINTS)[number] | null = null;
  let healthFailure: "busy" | "down" = "down";
  let seedHonoured: boolean | null = null;

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
    return applySglangMeta(partial, meta, where);
  }

  /** The result once the answer is in (or the request was cancelled locally). */
  function resultOf(partial: PartialOutput, finish: "stop" | "length" | "abort" | null, signal: AbortSignal | undefined, where: string): GenerateResult {
    if (finish === null) {
      if (signal?.aborted) return abortedResult(partial, url, lastVersion);
      throw new RlqError("engine_unreachable", `${where}: the stream ended without a finish_reason after ${partial.tokenIds.length} token(s)`, {
        isRetriable: true,
      });
    }
    if (partial.weightVersion !== null) lastVersion = partial.weightVersion;
    return {
      tokenIds: [...partial.tokenIds],
      logProbs: [...partial.logProbs],
      finishReason: finish,
      weightVersion: partial.weightVersion ?? lastVersion,
      engineId: url,
    };
  }

  /** `request` is already validated: by `generate` below, or by the pool that calls this (validated once per request). */
  async function generateWith(req: GenerateRequest, hooks: GenerateHooks): Promise<GenerateResult> {
    const where = `SGLang ${url}/generate (rid ${req.requestId})`;
    if (!isStreaming) return batcher.submit(req, hooks, where);
    const body = { rid: req.requestId, input_ids: req.inputIds, return_logprob: true, stream: true, sampling_params: samplingParams(req.sampling) };
    const partial = hooks.partial;
    let finish: "stop" | "length" | "abort" | null = null;
    try {
      await postStream(`${url}/generate`, body, { timeoutMs: options.requestTimeoutMs, signal: hooks.signal, headers }, (payload) => {
        finish = applyAnswer(partial, payload, where) ?? finish;
      });
    } catch (e) {
      if (isLocalCancel(e, hooks.signal)) return abortedResult(partial, url, lastVersion);
      if (e instanceof VersionChanged) {
        await engine.abort([req.requestId]).catch(() => undefined);
        return abortedResult(partial, url, lastVersion);
      }
      throw generateHttpError(e, where);
    }
    return resultOf(partial, finish, hooks.signal, where);
  }

  const batcher = createBatcher({
    url,
    timeoutMs: options.requestTimeoutMs,
    headers,
    samplingParams,
    finish: (item, payload) => resultOf(item.hooks.partial, applyAnswer(item.hooks.partial, payload, item.where), item.hooks.signal, item.where),
    aborted: (item) => abortedResult(item.hooks.partial, url, lastVersion),
    httpError: (e, item) => generateHttpError(e, item.where),
  });

  async function readVersion(): Promise<number> {
    const order = versionEndpoint === null ? VERSION_ENDPOINTS : [versionEndpoint, ...VERSION_ENDPOINTS.filter((x) => x !== versionEndpoint)];
    let lastError: unknown = null;
    for (const path of order) {
      let body: { weight_version?: unknown };
      try {
        body = (await callJson("GET", `${url}${path}`, undefined, { timeoutMs: adminMs, headers })) as { weight_version?: unknown };
      } catch (e) {
        // 404: this build does not have it (yet, or any more): try the next one.
        if (e instanceof EngineHttpError && e.status === 404) {
          lastError = e;
          continue;
        }
        throw e;
      }
      if (body.weight_version === undefined) continue;
      versionEndpoint = path;
      return parseWeightVersion(body.weight_version, `SGLang ${url}${path}`);
    }
    throw new RlqError(
      "engine_no_version",
      `SGLang ${url}: none of ${VERSION_ENDPOINTS.join(", ")} reports weight_version${lastError ? ` (${errorMessage(lastError)})` : ""}`,
      { isRetriable: true },
    );
  }

  const engine: RemoteEngine = {
    kind: "sglang",
    id: url,
    url,
    canAbortById: true,
    canLoadWeights: true,
    get seedHonoured() {
      return seedHonoured;
    },
    generate: (request) => generateWith(generateRequestSchema.parse(request), { partial: emptyPartial() }),
    generateWith,
    async abort(requestIds) {
      // The server answers each aborted request with its tokens so far; the
      // caller (the pool) waits for those answers.
      await Promise.all(requestIds.map((rid) => callJson("POST", `${url}/abort_request`, { rid, abort_all: false }, { timeoutMs: adminMs, headers })));
    },
    async health(timeoutMs = adminMs) {
      try {
        const res = await fetch(`${url}/health_generate`, { signal: AbortSignal.timeout(timeoutMs), headers });
        await res.arrayBuffer().catch(() => undefined);
        if (res.ok) return true;
        // 503 while weights load or generation is paused (http_server.py health_generate): busy if the
        // server still answers its version endpoint, which takes no model lock.
        healthFailure =
          res.status === 503 &&
          (await readVersion().then(
            () => true,
            () => false,
          ))
            ? "busy"
            : "down";
        return false;
      } catch {
        healthFailure = "down";
        return false;
      }
    },
    lastHealthFailure: () => healthFailure,
    async weightVersion() {
      lastVersion = await readVersion();
      return lastVersion;
    },
    async loadWeights(version, uri) {
      const modelPath = uri.startsWith("file://") ? decodeURIComponent(new URL(uri).pathname) : uri;
      let res: { success?: boolean; message?: string };
      try {
        res = (await callJson(
          "POST",
          `${url}/update_weights_from_disk`,
          { model_path: modelPath, weight_version: String(version) },
          { timeoutMs: options.loadTimeoutMs ?? 600_000, headers },
        )) as typeof res;
      } catch (e) {
        // A failed load is HTTP 400 {success: false, message} (http_server.py update_weights_from_disk).
        if (e instanceof EngineHttpError && e.status === 400) res = { success: false, message: e.message };
        else throw e;
      }
      if (res.success === false) {
        throw new RlqError(
          "engine_load_failed",
          `SGLang ${url}: update_weights_from_disk(${modelPath}, version ${version}) failed: ${res.message ?? "no message"}`,
          { isRetriable: false },
        );
      }
      const now = await engine.weightVersion();
      if (now !== version) {
        throw new RlqError("engine_version_mismatch", `SGLang ${url}: loaded ${modelPath} as version ${version} but it reports version ${now}`, {
          isRetriable: true,
        });
      }
    },
    async probeLogProbs(inputIds) {
      // On the sampling path (top_k -1): with top_k <= 1 SGLang takes the greedy path and returns
      // log_softmax(logits) without temperature (layers/sampler.py), which would hide the scaling.
      const run = async (temperature: number, topK: number) => {
        const res = await callJson(
          "POST",
          `${url}/generate`,
          {
            rid: `rlq-probe-${randomUUID()}`,
            input_ids: inputIds,
            return_logprob: true,
            top_logprobs_num: 2,
            sampling_params: { temperature, top_p: 1, top_k: topK, max_new_tokens: 1, ignore_eos: true, stop_token_ids: [], no_stop_trim: true },
          },
          { timeoutMs: options.requestTimeoutMs, headers },
        );
        const where = `SGLang ${url} probe`;
        const meta = readSglangAnswer(res, where);
        return readTopLogprobs(meta.output_top_logprobs, where);
      };
      const a = await run(1, -1);
      const b = await run(0.5, -1);
      const c = await run(1, 2);
      return classifySamplingProbe(a, b, c);
    },
    async checkServer() {
      await checkSglangModel(url, adminMs, headers);
      const info = (await callJson("GET", `${url}/get_server_info`, undefined, { timeoutMs: adminMs, headers }).catch(() => null)) as {
        enable_deterministic_inference?: unknown;
      } | null;
      seedHonoured = info === null ? null : info.enable_deterministic_inference === true;
    },
    async close() {},
  };
  return engine;
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

/** GET /get_model_info: refuse a server that does not generate (an embedding or reward model). */
export async function checkSglangModel(url: string, timeoutMs = 10_000, headers?: Record<string, string>): Promise<{ modelPath: string | null }> {
  const info = (await callJson("GET", `${url}/get_model_info`, undefined, { timeoutMs, headers })) as { model_path?: string; is_generation?: boolean };
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

interface BatchItem {
  req: GenerateRequest;
  hooks: GenerateHooks;
  where: string;
  resolve(r: GenerateResult): void;
  reject(e: unknown): void;
  isSettled: boolean;
}

/** Most requests in one batch /generate. */
const MAX_BATCH = 64;

/**
 * Non-streaming requests to one server that arrive in the same event-loop
 * turn (a rollout job sends its group's samples together) go out as ONE
 * SGLang batch /generate: input_ids, rid and sampling_params as lists; the
 * answer is the list of outputs in order. A lone request keeps the single
 * form. Each item stays its own request everywhere else: the pool routes,
 * counts, retries and aborts it by its rid (SGLang aborts one item of a batch
 * by rid and answers it with its tokens so far), so nothing above this adapter
 * changes. A local cancel (the pool giving up on an abort, an engine declared
 * dead) resolves that item at once as an aborted partial; the HTTP request is
 * cancelled when every item of it is. A failed batch fails each item with the
 * same error; the pool retries each, and counts the failure once toward the
 * engine's consecutive errors.
 *
 * Why: against an instant engine the per-request HTTP cost was the largest
 * cost of a rollout job after its queries (bench/control-plane.ts). With
 * streaming on, requests stay one per sample: a streamed batch interleaves its
 * items' events, and the per-request stream is what keeps a dying server's
 * tokens.
 */
function createBatcher(deps: {
  url: string;
  timeoutMs: number;
  headers: Record<string, string> | undefined;
  httpError(e: unknown, item: BatchItem): unknown;
  samplingParams(s: GenerateRequest["sampling"]): Record<string, unknown>;
  finish(item: BatchItem, payload: unknown): GenerateResult;
  aborted(item: BatchItem): GenerateResult;
}) {
  let queued: BatchItem[] = [];
  let isScheduled = false;

  function settle(item: BatchItem, fn: () => void): void {
    if (item.isSettled) return;
    item.isSettled = true;
    fn();
  }

  async function send(items: BatchItem[]): Promise<void> {
    const live = items.filter((item) => {
      if (!item.hooks.signal?.aborted) return true;
      settle(item, () => item.resolve(deps.aborted(item)));
      return false;
    });
    if (live.length === 0) return;
    const http = new AbortController();
    const detach: Array<() => void> = [];
    for (const item of live) {
      const signal = item.hooks.signal;
      if (!signal) continue;
      const onAbort = () => {
        settle(item, () => item.resolve(deps.aborted(item)));
        if (live.every((x) => x.isSettled)) http.abort();
      };
      signal.addEventListener("abort", onAbort, { once: true });
      detach.push(() => signal.removeEventListener("abort", onAbort));
    }
    const one = live.length === 1 ? live[0] : undefined;
    const body = one
      ? { rid: one.req.requestId, input_ids: one.req.inputIds, return_logprob: true, stream: false, sampling_params: deps.samplingParams(one.req.sampling) }
      : {
          rid: live.map((x) => x.req.requestId),
          input_ids: live.map((x) => x.req.inputIds),
          return_logprob: true,
          stream: false,
          sampling_params: live.map((x) => deps.samplingParams(x.req.sampling)),
        };
    try {
      let answer: unknown;
      try {
        answer = await callJson("POST", `${deps.url}/generate`, body, { timeoutMs: deps.timeoutMs, signal: http.signal, headers: deps.headers });
      } catch (e) {
        // One invalid item fails the whole batch with 400 (tokenizer_manager.py validates every item
        // before sending any): resend the items one by one, so only the bad one fails.
        if (!one && e instanceof EngineHttpError && e.status === 400) {
          for (const d of detach.splice(0)) d();
          await Promise.all(live.map((item) => send([item])));
          return;
        }
        throw e;
      }
      const outputs = one ? [answer] : answer;
      if (!Array.isArray(outputs) || outputs.length !== live.length) {
        throw new RlqError(
          "engine_bad_response",
          `SGLang ${deps.url}/generate: a batch of ${live.length} was answered with ${JSON.stringify(answer)?.slice(0, 200)}`,
          { isRetriable: true },
        );
      }
      live.forEach((item, i) =>
        settle(item, () => {
          try {
            item.resolve(deps.finish(item, outputs[i]));
          } catch (e) {
            item.reject(e);
          }
        }),
      );
    } catch (e) {
      for (const item of live)
        settle(item, () => (isLocalCancel(e, item.hooks.signal) ? item.resolve(deps.aborted(item)) : item.reject(deps.httpError(e, item))));
    } finally {
      for (const d of detach) d();
    }
  }

  function flush(): void {
    isScheduled = false;
    const all = queued;
    queued = [];
    // One batch per batchKey (a group), in arrival order; requests without a key batch together.
    const byKey = new Map<string, BatchItem[]>();
    for (const item of all) {
      const key = item.req.batchKey ?? "";
      const list = byKey.get(key);
      if (list) list.push(item);
      else byKey.set(key, [item]);
    }
    for (const items of byKey.values()) for (let i = 0; i < items.length; i += MAX_BATCH) void send(items.slice(i, i + MAX_BATCH));
  }

  return {
    submit(req: GenerateRequest, hooks: GenerateHooks, where: string): Promise<GenerateResult> {
      return new Promise<GenerateResult>((resolve, reject) => {
        queued.push({ req, hooks, where, resolve, reject, isSettled: false });
        if (!isScheduled) {
          isScheduled = true;
          // After the current turn's microtasks: every sample of a job has reached here by then.
          setImmediate(flush);
        }
      });
    },
  };
}

/**
 * Compatibility entry point (src/runtime/engines.ts and
 * src/controller/engine-admin.ts call it): several SGLang URLs as one pooled
 * Engine with default pool settings. New code should build the pool with
 * createEnginesFromConfig (engines/from-config.ts).
 */
export function createSglangEngine(options: { urls: readonly string[]; requestTimeoutMs: number }): Engine {
  return createEnginePool({
    members: options.urls.map((u) => createSglangServer({ url: u, requestTimeoutMs: options.requestTimeoutMs })),
  });
}
