import { randomUUID } from "node:crypto";
import { generateRequestSchema, type Engine, type GenerateRequest, type GenerateResult } from "./engine.ts";
import { callJson, isLocalCancel, postStream } from "./http.ts";
import { classifyProbe, type LogprobProbe } from "./logprob-check.ts";
import { abortedResult, emptyPartial, parseWeightVersion, type GenerateHooks, type PartialOutput, type RemoteEngine } from "./remote.ts";
import { createEnginePool } from "./pool.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * One SGLang server through its native API (slime-semantics.md §1b):
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
 */
export function readSglangAnswer(payload: unknown, where: string): SglangMetaInfo {
  const bad = (what: string, path: string): never => {
    throw new RlqError("engine_bad_response", `${where}: unexpected answer: ${what} at ${path}`, { isRetriable: true });
  };
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
  const isCount = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v) && v >= 0;
  if (!isObject(payload)) return bad("expected an object", "(answer)");
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
  return meta; // checked field by field above
}

/**
 * Fold one /generate answer (a stream event or the whole non-streamed body)
 * into `partial`. SGLang sends the cumulative token list in every event
 * (whatever --incremental-streaming-output says, which only affects
 * output_ids and text); `completion_tokens` tells the two apart if a server
 * ever sends deltas. Returns the finish reason once the server gives one.
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

export interface SglangServerOptions {
  url: string;
  /** Whole-request limit for one /generate (run config engine.request_timeout_s). */
  requestTimeoutMs: number;
  /** abort, health, version and info calls. Default 10 s. */
  adminTimeoutMs?: number;
  /** update_weights_from_disk. Default 600 s. */
  loadTimeoutMs?: number;
  /**
   * Default true; false sends one request (one batch request for the requests of an event-loop turn)
   * and loses the tokens of a server that dies mid-request.
   */
  isStreaming?: boolean;
}

export function createSglangServer(options: SglangServerOptions): RemoteEngine {
  const url = options.url.replace(/\/+$/, "");
  const adminMs = options.adminTimeoutMs ?? 10_000;
  const isStreaming = options.isStreaming ?? true;
  let lastVersion = 0;

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
      ...(s.seed === undefined ? {} : { sampling_seed: s.seed }),
    };
  }

  /** Fold one answer (a stream event, a whole body, or one output of a batch) into `partial`. */
  function applyAnswer(partial: PartialOutput, payload: unknown, where: string): "stop" | "length" | "abort" | null {
    const meta = readSglangAnswer(payload, where);
    if (partial.weightVersion !== null && meta.weight_version !== undefined && parseWeightVersion(meta.weight_version, where) !== partial.weightVersion) {
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
      throw new RlqError("engine_unreachable", `${where}: the stream ended without a finish_reason after ${partial.tokenIds.length} token(s)`, { isRetriable: true });
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
      await postStream(`${url}/generate`, body, { timeoutMs: options.requestTimeoutMs, signal: hooks.signal }, (payload) => {
        finish = applyAnswer(partial, payload, where) ?? finish;
      });
    } catch (e) {
      if (isLocalCancel(e, hooks.signal)) return abortedResult(partial, url, lastVersion);
      if (e instanceof VersionChanged) {
        await engine.abort([req.requestId]).catch(() => undefined);
        return abortedResult(partial, url, lastVersion);
      }
      throw e;
    }
    return resultOf(partial, finish, hooks.signal, where);
  }

  const batcher = createBatcher({
    url,
    timeoutMs: options.requestTimeoutMs,
    samplingParams,
    finish: (item, payload) => resultOf(item.hooks.partial, applyAnswer(item.hooks.partial, payload, item.where), item.hooks.signal, item.where),
    aborted: (item) => abortedResult(item.hooks.partial, url, lastVersion),
  });

  const engine: RemoteEngine = {
    kind: "sglang",
    id: url,
    url,
    canAbortById: true,
    canLoadWeights: true,
    generate: (request) => generateWith(generateRequestSchema.parse(request), { partial: emptyPartial() }),
    generateWith,
    async abort(requestIds) {
      // The server answers each aborted request with its tokens so far; the
      // caller (the pool) waits for those answers.
      await Promise.all(requestIds.map((rid) => callJson("POST", `${url}/abort_request`, { rid, abort_all: false }, { timeoutMs: adminMs })));
    },
    async health(timeoutMs = adminMs) {
      try {
        const res = await fetch(`${url}/health_generate`, { signal: AbortSignal.timeout(timeoutMs) });
        await res.arrayBuffer().catch(() => undefined);
        return res.ok;
      } catch {
        return false;
      }
    },
    async weightVersion() {
      const body = (await callJson("GET", `${url}/get_weight_version`, undefined, { timeoutMs: adminMs })) as { weight_version?: unknown };
      lastVersion = parseWeightVersion(body.weight_version, `SGLang ${url}/get_weight_version`);
      return lastVersion;
    },
    async loadWeights(version, uri) {
      const modelPath = uri.startsWith("file://") ? decodeURIComponent(new URL(uri).pathname) : uri;
      const res = (await callJson(
        "POST",
        `${url}/update_weights_from_disk`,
        { model_path: modelPath, weight_version: String(version) },
        { timeoutMs: options.loadTimeoutMs ?? 600_000 },
      )) as { success?: boolean; message?: string };
      if (res.success === false) {
        throw new RlqError("engine_load_failed", `SGLang ${url}: update_weights_from_disk(${modelPath}, version ${version}) failed: ${res.message ?? "no message"}`, { isRetriable: false });
      }
      const now = await engine.weightVersion();
      if (now !== version) {
        throw new RlqError("engine_version_mismatch", `SGLang ${url}: loaded ${modelPath} as version ${version} but it reports version ${now}`, { isRetriable: true });
      }
    },
    async probeLogProbs(inputIds) {
      const run = async (temperature: number) => {
        const res = await callJson(
          "POST",
          `${url}/generate`,
          {
            rid: `rlq-probe-${randomUUID()}`,
            input_ids: inputIds,
            return_logprob: true,
            sampling_params: { temperature, top_p: 1, top_k: 1, max_new_tokens: 8, ignore_eos: true, stop_token_ids: [], no_stop_trim: true },
          },
          { timeoutMs: options.requestTimeoutMs },
        );
        const where = `SGLang ${url} probe`;
        const p = emptyPartial();
        applySglangMeta(p, readSglangAnswer(res, where), where);
        return p;
      };
      const a = await run(1);
      const b = await run(0.5);
      return classifyProbe(a, b);
    },
    async checkServer() {
      await checkSglangModel(url, adminMs);
    },
    async close() {},
  };
  return engine;
}

/** GET /get_model_info: refuse a server that does not generate (an embedding or reward model). */
export async function checkSglangModel(url: string, timeoutMs = 10_000): Promise<{ modelPath: string | null }> {
  const info = (await callJson("GET", `${url}/get_model_info`, undefined, { timeoutMs })) as { model_path?: string; is_generation?: boolean };
  if (info.is_generation === false) {
    throw new RlqError("engine_not_generative", `SGLang ${url} serves ${info.model_path ?? "a model"} with is_generation = false; rlq needs a generation model`, { isRetriable: false });
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
      const answer = await callJson("POST", `${deps.url}/generate`, body, { timeoutMs: deps.timeoutMs, signal: http.signal });
      const outputs = one ? [answer] : answer;
      if (!Array.isArray(outputs) || outputs.length !== live.length) {
        throw new RlqError("engine_bad_response", `SGLang ${deps.url}/generate: a batch of ${live.length} was answered with ${JSON.stringify(answer)?.slice(0, 200)}`, { isRetriable: true });
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
      for (const item of live) settle(item, () => (isLocalCancel(e, item.hooks.signal) ? item.resolve(deps.aborted(item)) : item.reject(e)));
    } finally {
      for (const d of detach) d();
    }
  }

  function flush(): void {
    isScheduled = false;
    const all = queued;
    queued = [];
    for (let i = 0; i < all.length; i += MAX_BATCH) void send(all.slice(i, i + MAX_BATCH));
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
