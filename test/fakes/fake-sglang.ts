/**
 * TEST FAKE — a stand-in for an SGLang server run as its own process (never used
 * by `npm run demo`), as unkind as the real one on every point rlq depends on.
 * Each behaviour cites the SGLang file (paths under python/sglang/srt/ of
 * sgl-project/sglang) and the function it comes from, read in the server's own
 * source: 0.5.x at commit 0025436e (entrypoints/http_server.py,
 * managers/tokenizer_manager.py), tokenizer_communicator_mixin.py at 00096b5f,
 * utils/weight_versions.py at 19f93835 and managers/io_struct.py
 * PauseGenerationReqInput (newer main). docs/engines.md lists the same points.
 *
 *   POST /generate {rid, input_ids, sampling_params, return_logprob, top_logprobs_num, stream}
 *     → {text, meta_info: {id, output_token_logprobs: [[logprob, id, null]…],
 *        output_top_logprobs?, finish_reason: {type: stop|length|abort, …} | null,
 *        weight_version, weight_versions? (--weight-versions-spans), prompt_tokens,
 *        completion_tokens, cached_tokens}}; with stream: SSE `data:` events, then `data: [DONE]`.
 *   Batch form (input_ids a list of lists, rid and sampling_params lists) → outputs in order.
 *   POST /abort_request {rid, abort_all}, /pause_generation {mode?}, /continue_generation,
 *     /update_weights_from_disk, /init_weights_update_group, /update_weights_from_distributed,
 *     /update_weights_from_tensor; GET|POST /flush_cache; GET /health, /health_generate,
 *     /get_weight_version, /model_info (--new-version-api), /get_model_info, /get_server_info,
 *     /v1/loads; /stats (fake only).
 *
 * Quirks reproduced (each is a way a real server hurt rlq):
 * - greedy path (layers/sampler.py Sampler.forward: `if sampling_info.is_all_greedy:` argmax and
 *   logprobs = log_softmax(logits), no temperature; sampling/sampling_batch_info.py:
 *   is_all_greedy = all(top_k <= 1); sampling_params.py turns temperature 0 into top_k 1). The real
 *   decision is per batch; the fake decides per request, so a greedy request is never scaled here
 *   (a real one is, when it shares a batch with a sampling request): a client must not rely on it.
 * - streaming (http_server.py generate_request → stream_results; tokenizer_manager.py
 *   _handle_batch_output): one event every --stream-interval tokens, each carrying EVERY token
 *   so far (cumulative), unless --incremental-streaming-output, whose events carry only the new
 *   tokens (the final abort event stays cumulative).
 * - request errors (tokenizer_manager.py _validate_one_request): input of context_len tokens or
 *   more: "The input (N tokens) is longer than the model's context length (C tokens)."; input +
 *   max_new_tokens >= context_len: "Requested token count exceeds the model's maximum context
 *   length of C tokens. …". A ValueError becomes HTTP 400 {"error": {"message"}} without
 *   streaming (http_server.py _create_error_response) and one `data: {"error": {"message"}}`
 *   event of an HTTP 200, then `data: [DONE]`, when streamed (stream_results catches ValueError).
 *   Every item of a batch is validated before any runs: one bad item fails the batch (400).
 * - error aborts (tokenizer_manager.py _wait_one_response): a finish_reason {type: abort,
 *   status_code} never reaches the client as such for 400, 500 and 503: status 400 is raised as a
 *   ValueError (the request error above), 500/503 as fastapi.HTTPException: HTTP 500/503 with
 *   {object: "error", message, type, param, code} (http_server.py validation_exception_handler),
 *   and when streamed the exception escapes stream_results after the 200 went out, so the
 *   stream is cut without [DONE]. Other status codes are passed on in finish_reason.
 * - abort (tokenizer_manager.py abort_request: `if not abort_all and rid not in rid_to_state:
 *   return`, so the rid must be exactly a live one; scheduler.py abort_request then aborts every
 *   request whose rid startswith it). A running request answers with its tokens so far and
 *   finish_reason abort; one aborted before its first token (the waiting queue:
 *   tokenizer_manager.py _handle_abort_req) answers {text: "", meta_info: {id, finish_reason:
 *   {type: abort, message: "Abort before prefill"}, prompt_tokens: 0, completion_tokens: 0}}:
 *   no output_token_logprobs, no weight_version.
 * - duplicate rid: refused with "Duplicate request ID detected: <rid>" (newer main's
 *   tokenizer_manager.py checks rid_to_state; 0.5.x at 0025436 _send_one_request silently
 *   overwrites the first request's state, which then never answers: no kinder). A request whose
 *   client disconnected stays in flight for --disconnect-abort-delay-ms (tokenizer_manager.py
 *   create_abort_task: `await asyncio.sleep(2)` before abort_request).
 * - sampling_seed is honoured only with --enable-deterministic-inference (layers/sampler.py uses the
 *   per-request seeds only in deterministic mode); otherwise the draw is unseeded. The seed lives in
 *   an int32 tensor (sampling/sampling_batch_info.py): a seed of 2^31 or more is refused here
 *   (the real server fails inside the scheduler).
 * - weight loads (tokenizer_manager.py update_weights_from_disk: `async with
 *   model_update_lock.writer_lock`): a load waits for in-flight requests and holds new ones; a
 *   failed load answers HTTP 400 {success: false, message, num_paused_requests}
 *   (http_server.py update_weights_from_disk).
 * - pushes (tokenizer_communicator_mixin.py update_weights_from_distributed /
 *   update_weights_from_tensor): unless generation is paused they take the same writer lock
 *   (wait for in-flight requests); when paused they apply at once. Failure: HTTP 400
 *   {success: false, message}. update_weights_from_distributed needs names, dtypes and shapes
 *   (io_struct.py UpdateWeightsFromDistributedReqInput; a missing field is FastAPI's 400) and a
 *   group made by /init_weights_update_group. update_weights_from_tensor takes
 *   serialized_named_tensors, one per TP rank (tp_worker.py: `serialized_named_tensors[self.tp_rank]`
 *   through MultiprocessingSerializer.deserialize: base64 of a pickle when a string), load_format
 *   (null | direct | flattened_bucket), flush_cache (default true), weight_version. The fake
 *   cannot map the tensors (torch shared memory); it checks each entry is base64 of a pickle.
 * - /flush_cache (http_server.py flush_cache): HTTP 400 (plain text) while any request is
 *   running or waiting ("When there are running or waiting requests, the operation will not be
 *   performed"); slime retries it (backends/sglang_utils/sglang_engine.py flush_cache, 60 tries).
 * - /health and /health_generate are one handler (http_server.py health_generate): it runs a
 *   one-token generation and polls every second (--health-poll-ms) for any output, so it never
 *   answers in under a second; while a load runs or generation is paused nothing comes out, and
 *   it answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s, --health-block-ms), while
 *   /get_weight_version and /model_info still answer.
 * - pause_generation {mode} (io_struct.py PauseGenerationReqInput, newer main; 0.5.x takes no
 *   body and always aborts: tokenizer_manager.py pause_generation): abort (default) aborts every
 *   request; in_place and retract keep them, to continue after /continue_generation. New requests
 *   wait until then either way.
 * - versions: /get_weight_version and /get_model_info (both carry weight_version in 0.5.x); with
 *   --new-version-api /get_weight_version answers 404 and /model_info carries it (newer main).
 *   --weight-versions-spans adds meta_info.weight_versions = [{version, start, end}] and sets
 *   weight_version to the last span's (utils/weight_versions.py add_weight_versions_to_meta_info):
 *   a request that outlived an update (one paused in place) reports where the version changed.
 * - --api-key (utils/common.py add_api_key_middleware): every route whose path does not start
 *   with /health or /metrics (and every method but OPTIONS) answers 401 {"error": "Unauthorized"}
 *   without `Authorization: Bearer <key>`.
 *
 * Failure injection, by flag at start or at run time through POST /_fault
 * {mode, afterTokens?, count?, version?, scope?, statusCode?} (GET /_fault reads it):
 *   none | 5xx (count: how many answers, default all; scope "generate" or "all")
 *   hang (/health_generate stops answering; generation stalls once a request has
 *     afterTokens tokens, at once when afterTokens is 0)
 *   abort_mid (each request ends with finish_reason abort after afterTokens tokens)
 *   error_abort (the scheduler aborts each request with status_code `statusCode` after afterTokens
 *     tokens; what the client sees follows _wait_one_response above)
 *   reset (the next `count` /generate connections are destroyed before any token; the request
 *     stays in flight on the server for the disconnect-abort delay)
 *   die (exit(1) once any request has produced afterTokens tokens; 0 = now)
 *   stale_version (reports `version` whatever it loads)
 *
 *   tsx test/fakes/fake-sglang.ts --port 0 [--token-delay-ms 2] [--stop-prob 0.08]
 *     [--weight-version 0] [--logprob-mode scaled|original|truncated] [--load-delay-ms 0]
 *     [--api-key KEY] [--context-length 32768] [--enable-deterministic-inference]
 *     [--incremental-streaming-output] [--stream-interval 1] [--weight-versions-spans]
 *     [--new-version-api] [--health-block-ms 20000] [--health-poll-ms 1000] [--tp-size 1]
 *     [--disconnect-abort-delay-ms 2000] [--fault MODE] [--fault-after-tokens N] [--fault-version V]
 *     [--model full|instant]   (instant: fake-lm.ts instantToken, for throughput benches)
 * prints "listening <port>" on stdout.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { EOS, instantToken, sampleToken, type LogprobMode } from "./fake-lm.ts";
import { readJson } from "./http-json.ts";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "token-delay-ms": { type: "string", default: "0" },
    "stop-prob": { type: "string", default: "0.08" },
    "weight-version": { type: "string", default: "0" },
    "logprob-mode": { type: "string", default: "scaled" },
    "load-delay-ms": { type: "string", default: "0" },
    model: { type: "string", default: "full" },
    "api-key": { type: "string" },
    "context-length": { type: "string", default: "32768" },
    "enable-deterministic-inference": { type: "boolean", default: false },
    "incremental-streaming-output": { type: "boolean", default: false },
    "stream-interval": { type: "string", default: "1" },
    "weight-versions-spans": { type: "boolean", default: false },
    "new-version-api": { type: "boolean", default: false },
    "health-block-ms": { type: "string", default: "20000" },
    "health-poll-ms": { type: "string", default: "1000" },
    "tp-size": { type: "string", default: "1" },
    "disconnect-abort-delay-ms": { type: "string", default: "2000" },
    fault: { type: "string", default: "none" },
    "fault-after-tokens": { type: "string", default: "0" },
    "fault-version": { type: "string", default: "0" },
    "fault-count": { type: "string", default: "-1" },
  },
});
const tokenDelayMs = Number(values["token-delay-ms"]);
const stopProb = Number(values["stop-prob"]);
const logprobMode = values["logprob-mode"] as LogprobMode;
const loadDelayMs = Number(values["load-delay-ms"]);
const apiKey = values["api-key"];
const contextLength = Number(values["context-length"]);
const isDeterministic = values["enable-deterministic-inference"] === true;
const isIncremental = values["incremental-streaming-output"] === true;
const streamInterval = Math.max(1, Number(values["stream-interval"]));
const hasSpans = values["weight-versions-spans"] === true;
const isNewVersionApi = values["new-version-api"] === true;
const healthBlockMs = Number(values["health-block-ms"]);
const healthPollMs = Number(values["health-poll-ms"]);
const tpSize = Number(values["tp-size"]);
const disconnectAbortDelayMs = Number(values["disconnect-abort-delay-ms"]);
if (values.model !== "full" && values.model !== "instant") throw new Error(`--model: expected full or instant, got ${values.model}`);
const isInstant = values.model === "instant";
let weightVersion = Number(values["weight-version"]);

type FaultMode = "none" | "5xx" | "hang" | "abort_mid" | "error_abort" | "reset" | "die" | "stale_version";
interface Fault {
  mode: FaultMode;
  afterTokens: number;
  /** 5xx / reset: answers left to fail; -1 = all. */
  count: number;
  version: number;
  scope: "generate" | "all";
  statusCode: number;
}
let fault: Fault = {
  mode: values.fault as FaultMode,
  afterTokens: Number(values["fault-after-tokens"]),
  count: Number(values["fault-count"]),
  version: Number(values["fault-version"]),
  scope: "generate",
  statusCode: 500,
};
let faultEpoch = 0;
interface LiveRequest {
  aborted: boolean;
}
const live = new Map<string, LiveRequest>();
const stats = {
  generate: 0,
  batches: 0,
  aborted: 0,
  loads: 0,
  abortRequests: 0,
  failed5xx: 0,
  maxLive: 0,
  refused: 0,
  duplicates: 0,
  unauthorized: 0,
  bytesSent: 0,
  /** Tokens decoded so far, all requests: tests wait on it instead of sleeping. */
  tokensGenerated: 0,
  healthBusy: 0,
  pauses: 0,
  flushes: 0,
  /** The last update_weights_from_distributed body's names, dtypes and shapes. */
  lastPush: null as null | { names: unknown; dtypes: unknown; shapes: unknown; group_name: unknown },
  /** The last update_weights_from_tensor body, as checked (the tensors themselves stay opaque). */
  lastTensorPush: null as null | { count: number; bytes: number[]; load_format: unknown; flush_cache: boolean; weight_version: unknown },
  /** Every push and load in order, with whether requests were live when it applied (tests read the order). */
  calls: [] as string[],
  groups: [] as unknown[],
  /** /abort_request with abort_all (rlq must never send one: other runs share the server). */
  abortAlls: 0,
  /** /flush_cache answers: refused while requests ran, done. */
  flushRefused: 0,
  cacheFlushes: 0,
  seedsSeen: [] as number[],
};
/** Loads wait for in-flight requests; new requests wait for a load (SGLang's model update lock). */
let loading: Promise<void> | null = null;
let drained: (() => void) | null = null;
let paused: Promise<void> | null = null;
let pauseMode: "abort" | "in_place" | "retract" = "abort";
let resume: (() => void) | null = null;
/** Groups made by /init_weights_update_group (model_runner.py keeps them by group_name). */
const groupNames = new Set<string>();

const reportedVersion = () => (fault.mode === "stale_version" ? fault.version : weightVersion);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const isHanging = () => fault.mode === "hang";

function send(res: ServerResponse, status: number, obj: unknown): void {
  const text = JSON.stringify(obj);
  stats.bytesSent += Buffer.byteLength(text);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

function take5xx(scope: "generate" | "health"): boolean {
  if (fault.mode !== "5xx") return false;
  if (scope === "health" && fault.scope !== "all") return false;
  if (fault.count === 0) return false;
  if (fault.count > 0) fault.count--;
  stats.failed5xx++;
  return true;
}

async function hangWhileFaulted(): Promise<void> {
  const epoch = faultEpoch;
  while (isHanging() && faultEpoch === epoch) await sleep(20);
}

type Finish = "stop" | "length" | "abort" | "error_abort";
interface Generated {
  out: Array<[number, number, null]>;
  top: Array<Array<[number, number, null]>>;
  versions: number[];
  finish: Finish;
}

/** Why SGLang would refuse this request before generating (tokenizer_manager.py _validate_one_request), or null. */
function refusal(ids: unknown, sp: Record<string, unknown>, rid: string): string | null {
  if (!Array.isArray(ids) || ids.length === 0) return "input_ids required";
  if (ids.length >= contextLength) return `The input (${ids.length} tokens) is longer than the model's context length (${contextLength} tokens).`;
  const maxNew = sp.max_new_tokens;
  if (typeof maxNew === "number" && maxNew + ids.length >= contextLength) {
    return (
      `Requested token count exceeds the model's maximum context length of ${contextLength} tokens. ` +
      `You requested a total of ${maxNew + ids.length} tokens: ${ids.length} tokens from the input messages and ${maxNew} tokens for the completion. ` +
      `Please reduce the number of tokens in the input messages or the completion to fit within the limit.`
    );
  }
  if (sp.top_k === 0) return "top_k must be -1 (disable), or at least 1, got 0.";
  if (
    sp.sampling_seed !== undefined &&
    (!Number.isInteger(sp.sampling_seed) || (sp.sampling_seed as number) > 0x7fffffff || (sp.sampling_seed as number) < 0)
  ) {
    return `sampling_seed ${JSON.stringify(sp.sampling_seed)} does not fit the int32 seed tensor`;
  }
  if (live.has(rid)) {
    stats.duplicates++;
    return `Duplicate request ID detected: ${rid}`;
  }
  return null;
}

/** One request's (or one batch item's) generation; `onToken` sees the tokens as they come (streaming). */
async function generateOne(
  ids: number[],
  sp: Record<string, unknown>,
  topN: number,
  rid: string,
  state: LiveRequest,
  onToken: ((g: Generated) => void) | null,
): Promise<Generated> {
  const maxNew = Number(sp.max_new_tokens ?? 128);
  const seed = Number(sp.sampling_seed ?? 0);
  if (sp.sampling_seed !== undefined) stats.seedsSeen.push(seed);
  const temperature = Number(sp.temperature ?? 1);
  const topP = Number(sp.top_p ?? 1);
  const topK = Number(sp.top_k ?? -1);
  const ignoreEos = sp.ignore_eos === true;
  const stopIds = new Set((sp.stop_token_ids as number[] | undefined) ?? []);
  if (!ignoreEos) stopIds.add(EOS);
  // layers/sampler.py: greedy path when every request has top_k <= 1 (top_k -1 means "all" and is turned
  // into the vocabulary size, temperature 0 into top_k 1: sampling/sampling_params.py).
  const isGreedyPath = topK === 1 || temperature < 1e-5;
  stats.maxLive = Math.max(stats.maxLive, live.size);
  stats.generate++;
  const g: Generated = { out: [], top: [], versions: [], finish: "length" };
  let prev = ids[ids.length - 1] ?? 0;
  try {
    for (let i = 0; i < maxNew; i++) {
      if (tokenDelayMs > 0) await sleep(tokenDelayMs);
      if (isHanging() && g.out.length >= fault.afterTokens) await hangWhileFaulted();
      while (paused && !state.aborted) await paused;
      if (fault.mode === "error_abort" && g.out.length >= fault.afterTokens) {
        g.finish = "error_abort";
        break;
      }
      if (state.aborted || (fault.mode === "abort_mid" && g.out.length >= fault.afterTokens)) {
        g.finish = "abort";
        break;
      }
      const version = weightVersion;
      const x = {
        seed,
        version,
        position: ids.length + i,
        prev,
        temperature,
        topP,
        topK,
        stopProb,
        isEosAllowed: i > 0 && !ignoreEos,
        mode: isGreedyPath && logprobMode === "scaled" ? ("original" as const) : logprobMode,
        topN,
        ...(isDeterministic ? {} : { unseeded: Math.random() }),
      };
      const d = isInstant ? { ...instantToken(x), top: [] as Array<[number, number]> } : sampleToken(x);
      g.out.push([d.logProb, d.token, null]);
      stats.tokensGenerated++;
      if (topN > 0) g.top.push(d.top.map(([lp, t]) => [lp, t, null]));
      g.versions.push(version);
      prev = d.token;
      if (fault.mode === "die" && g.out.length >= fault.afterTokens) {
        process.stderr.write(`fake-sglang: injected death after ${g.out.length} tokens of ${rid}\n`);
        process.exit(1);
      }
      if (stopIds.has(d.token)) {
        g.finish = "stop";
        break;
      }
      if (onToken && i + 1 < maxNew) onToken(g);
    }
  } finally {
    live.delete(rid);
    if (live.size === 0 && drained) drained();
  }
  if (g.finish === "abort" || g.finish === "error_abort") stats.aborted++;
  return g;
}

const errorAbortMessage = () => `injected server-side error ${fault.statusCode}`;

function finishReason(f: Finish | null) {
  if (f === null) return null;
  if (f === "abort") return { type: "abort", message: "Abort before finishing." };
  if (f === "error_abort") return { type: "abort", message: errorAbortMessage(), status_code: fault.statusCode };
  return { type: f };
}

/**
 * What tokenizer_manager.py _wait_one_response makes of a finished request whose finish_reason is
 * an abort with status_code: 400 raises ValueError (a request error), 500 and 503 raise
 * fastapi.HTTPException; other codes are passed on in finish_reason.
 */
function raisedBy(g: Generated): { kind: "value_error" | "http_exception"; status: number; message: string } | null {
  if (g.finish !== "error_abort") return null;
  if (fault.statusCode === 400) return { kind: "value_error", status: 400, message: errorAbortMessage() };
  if (fault.statusCode === 500 || fault.statusCode === 503) return { kind: "http_exception", status: fault.statusCode, message: errorAbortMessage() };
  return null;
}

/** http_server.py: a ValueError is _create_error_response (400 {"error": {"message"}}); an HTTPException goes through validation_exception_handler. */
function sendRaised(res: ServerResponse, r: { kind: "value_error" | "http_exception"; status: number; message: string }): void {
  if (r.kind === "value_error") return send(res, 400, { error: { message: r.message } });
  send(res, r.status, { object: "error", message: r.message, type: String(r.status), param: null, code: r.status });
}

/** utils/weight_versions.py compute_weight_version_spans / add_weight_versions_to_meta_info: [{version, start, end}]. */
function spansOf(versions: number[]): Array<{ version: string; start: number; end: number }> {
  const spans: Array<{ version: string; start: number; end: number }> = [];
  versions.forEach((raw, i) => {
    const v = String(fault.mode === "stale_version" ? fault.version : raw);
    const last = spans[spans.length - 1];
    if (last && last.version === v) last.end = i + 1;
    else spans.push({ version: v, start: i, end: i + 1 });
  });
  return spans.length > 0 ? spans : [{ version: String(reportedVersion()), start: 0, end: 0 }];
}

/** meta_info for tokens [from, g.out.length): from 0 (cumulative) or from the last event (incremental). */
function metaInfo(rid: string, promptTokens: number, g: Generated, finish: Finish | null, from = 0) {
  if (finish === "abort" && g.out.length === 0) {
    // tokenizer_manager.py _handle_abort_req: the scheduler dropped it from the waiting queue.
    return { id: rid, finish_reason: { type: "abort", message: "Abort before prefill" }, prompt_tokens: 0, completion_tokens: 0 };
  }
  const spans = hasSpans ? spansOf(g.versions) : null;
  return {
    id: rid,
    output_token_logprobs: from === 0 ? g.out : g.out.slice(from),
    ...(g.top.length > 0 ? { output_top_logprobs: from === 0 ? g.top : g.top.slice(from) } : {}),
    finish_reason: finishReason(finish),
    weight_version: spans !== null ? (spans[spans.length - 1] as { version: string }).version : String(reportedVersion()),
    ...(spans !== null ? { weight_versions: spans } : {}),
    prompt_tokens: promptTokens,
    completion_tokens: g.out.length,
    cached_tokens: 0,
  };
}

/** Marks the request gone when its client disconnects, but (like SGLang) aborts it only after a delay. */
function watchDisconnect(res: ServerResponse, states: LiveRequest[]): () => boolean {
  let isGone = false;
  res.on("close", () => {
    if (res.writableFinished) return;
    isGone = true;
    setTimeout(() => {
      for (const s of states) s.aborted = true;
    }, disconnectAbortDelayMs).unref();
  });
  return () => isGone;
}

async function waitForTurn(): Promise<void> {
  while (loading) await loading;
  while (paused) await paused;
}

async function generateBatch(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const ids = b.input_ids as unknown[];
  const rids = b.rid;
  const sps = b.sampling_params;
  if (b.stream === true) return send(res, 400, { error: { message: "the fake answers batch requests only without streaming" } });
  if (!Array.isArray(rids) || rids.length !== ids.length || (Array.isArray(sps) && sps.length !== ids.length)) {
    return send(res, 400, { error: { message: "rid (and a sampling_params list) must have one entry per input" } });
  }
  if (b.return_logprob !== true) return send(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  if (take5xx("generate")) return send(res, 503, { error: { message: "injected 5xx" } });
  await waitForTurn();
  if (isHanging() && fault.afterTokens <= 0) await hangWhileFaulted();
  const spOf = (i: number) => ((Array.isArray(sps) ? sps[i] : sps) ?? {}) as Record<string, unknown>;
  // tokenizer_manager.py validates every item before any is scheduled: one bad item fails the batch.
  for (let i = 0; i < ids.length; i++) {
    const why = refusal(ids[i], spOf(i), String(rids[i]));
    if (why !== null) {
      stats.refused++;
      return send(res, 400, { error: { message: why } });
    }
  }
  stats.batches++;
  const states = ids.map((_, i) => {
    const s = { aborted: false };
    live.set(String(rids[i]), s);
    return s;
  });
  const isGone = watchDisconnect(res, states);
  const topN = Number(b.top_logprobs_num ?? 0);
  const gens = await Promise.all(ids.map((x, i) => generateOne(x as number[], spOf(i), topN, String(rids[i]), states[i] as LiveRequest, null)));
  if (isGone()) return;
  // tokenizer_manager.py _handle_batch_request: asyncio.gather of the items, so one raising item fails the batch.
  const raised = gens.map(raisedBy).find((r) => r !== null);
  if (raised) return sendRaised(res, raised);
  send(
    res,
    200,
    gens.map((g, i) => ({ text: "", meta_info: metaInfo(String(rids[i]), (ids[i] as number[]).length, g, g.finish) })),
  );
}

async function generate(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const ids = b.input_ids as number[];
  const sp = (b.sampling_params ?? {}) as Record<string, unknown>;
  if (Array.isArray(ids) && Array.isArray(ids[0])) return generateBatch(b, res);
  if (b.return_logprob !== true) return send(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  if (take5xx("generate")) return send(res, 503, { error: { message: "injected 5xx" } });
  await waitForTurn();
  if (isHanging() && fault.afterTokens <= 0) await hangWhileFaulted();
  const isStream = b.stream === true;
  const rid = typeof b.rid === "string" ? b.rid : String(Math.random());
  const why = refusal(ids, sp, rid);
  if (why !== null) {
    stats.refused++;
    if (!isStream) return send(res, 400, { error: { message: why } });
    // http_server.py stream_results: the error becomes an event of a 200 response.
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const ev = `data: ${JSON.stringify({ error: { message: why } })}\n\n`;
    stats.bytesSent += ev.length + 14;
    res.write(ev);
    res.end("data: [DONE]\n\n");
    return;
  }
  const state: LiveRequest = { aborted: false };
  live.set(rid, state);
  if (fault.mode === "reset" && fault.count !== 0) {
    if (fault.count > 0) fault.count--;
    // The connection dies mid-answer (a proxy, a network blip); the server keeps the request until its delayed abort.
    watchDisconnect(res, [state]);
    res.writeHead(200, { "content-type": b.stream === true ? "text/event-stream" : "application/json" });
    res.flushHeaders();
    setTimeout(() => res.socket?.destroy(), 20);
    await generateOne(ids, sp, 0, rid, state, null);
    return;
  }
  const isGone = watchDisconnect(res, [state]);
  const topN = Number(b.top_logprobs_num ?? 0);
  if (isStream) res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  let sent = 0;
  const write = (g: Generated, finish: Finish | null) => {
    // --incremental-streaming-output: only the new tokens; the final abort event stays cumulative.
    const from = isIncremental && !(finish === "abort" || finish === "error_abort") ? sent : 0;
    const ev = `data: ${JSON.stringify({ text: "", meta_info: metaInfo(rid, ids.length, g, finish, from) })}\n\n`;
    stats.bytesSent += ev.length;
    res.write(ev);
    sent = g.out.length;
  };
  const onToken = isStream
    ? (g: Generated) => {
        if (!isGone() && g.out.length % streamInterval === 0) write(g, null);
      }
    : null;
  const g = await generateOne(ids, sp, topN, rid, state, onToken);
  if (isGone()) return;
  const raised = raisedBy(g);
  if (isStream) {
    if (raised?.kind === "http_exception") {
      // The HTTPException escapes stream_results (it catches ValueError only) after the 200 went out.
      res.destroy();
      return;
    }
    if (raised) {
      const ev = `data: ${JSON.stringify({ error: { message: raised.message } })}\n\n`;
      stats.bytesSent += ev.length;
      res.write(ev);
    } else write(g, g.finish);
    res.end("data: [DONE]\n\n");
  } else if (raised) {
    sendRaised(res, raised);
  } else {
    send(res, 200, { text: "", meta_info: metaInfo(rid, ids.length, g, g.finish) });
  }
}

/**
 * tokenizer_manager.py model_update_lock.writer_lock: wait for every in-flight request (each holds
 * the reader lock for its whole generation) and hold new ones until `fn` is done.
 */
async function underWriterLock<T>(fn: () => Promise<T>): Promise<T> {
  while (loading) await loading;
  let done!: () => void;
  loading = new Promise<void>((r) => (done = r));
  try {
    if (live.size > 0) await new Promise<void>((r) => (drained = r));
    drained = null;
    return await fn();
  } finally {
    loading = null;
    done();
  }
}

async function loadWeights(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (take5xx("health")) return send(res, 503, { error: { message: "injected 5xx" } });
  await underWriterLock(async () => {
    if (loadDelayMs > 0) await sleep(loadDelayMs);
    if (typeof b.model_path !== "string" || b.model_path.includes("missing")) {
      // http_server.py update_weights_from_disk: a failed load is HTTP 400.
      return send(res, 400, { success: false, message: `Failed to update weights: cannot load ${String(b.model_path)}` });
    }
    weightVersion = Number(b.weight_version);
    stats.loads++;
    stats.calls.push("update_weights_from_disk");
    send(res, 200, { success: true, message: `Succeeded to update model weights from ${String(b.model_path)}`, num_paused_requests: 0 });
  });
}

/** FastAPI's RequestValidationError answer (http_server.py validation_exception_handler): 400. */
function sendValidationError(res: ServerResponse, message: string): void {
  send(res, 400, { object: "error", message, type: "Bad Request", param: null, code: 400 });
}

/** tokenizer_communicator_mixin.py: under the writer lock unless generation is paused, then at once. */
async function push(apply: () => { success: boolean; message: string }, b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (b.abort_all_requests === true) for (const s of live.values()) s.aborted = true;
  const run = async () => apply();
  const { success, message } = paused ? await run() : await underWriterLock(run);
  if (!success) return send(res, 400, { success: false, message });
  // http_server.py / tokenizer_communicator_mixin.py _update_weight_version_if_provided.
  if (b.weight_version !== undefined && b.weight_version !== null) weightVersion = Number(b.weight_version);
  stats.loads++;
  // io_struct.py: flush_cache defaults to true (the radix cache is flushed after the update; the fake counts it).
  if (b.flush_cache !== false) stats.cacheFlushes++;
  send(res, 200, {
    success: true,
    message: `${message}${b.weight_version == null ? "" : ` Weight version updated to ${typeof b.weight_version === "string" ? b.weight_version : JSON.stringify(b.weight_version)}.`}`,
  });
}

function updateFromDistributed(b: Record<string, unknown>, res: ServerResponse): Promise<void> | void {
  const names = b.names;
  const dtypes = b.dtypes;
  const shapes = b.shapes;
  if (!Array.isArray(names) || !Array.isArray(dtypes) || !Array.isArray(shapes)) {
    return sendValidationError(res, "names, dtypes and shapes are required (UpdateWeightsFromDistributedReqInput)");
  }
  const group = typeof b.group_name === "string" ? b.group_name : "weight_update_group";
  return push(
    () => {
      if (!groupNames.has(group))
        return { success: false, message: `Failed to update parameter online: group ${group} not found. Call init_weights_update_group first.` };
      if (names.length !== dtypes.length || names.length !== shapes.length) return { success: false, message: "names, dtypes and shapes differ in length" };
      stats.lastPush = { names, dtypes, shapes, group_name: group };
      stats.calls.push("update_weights_from_distributed");
      return { success: true, message: "Succeeded to update parameter online." };
    },
    b,
    res,
  );
}

/** One serialized_named_tensors entry: MultiprocessingSerializer.deserialize base64-decodes a string, then unpickles. */
function pickledBytes(x: unknown): number | null {
  if (typeof x !== "string" || x.length === 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(x)) return null;
  const raw = Buffer.from(x, "base64");
  // A pickle of protocol 2 or later starts with PROTO (0x80) and ends with STOP ('.').
  return raw[0] === 0x80 && raw[raw.length - 1] === 0x2e ? raw.length : null;
}

function updateFromTensor(b: Record<string, unknown>, res: ServerResponse): Promise<void> | void {
  const blobs = b.serialized_named_tensors;
  if (!Array.isArray(blobs)) return sendValidationError(res, "serialized_named_tensors is required (UpdateWeightsFromTensorReqInput)");
  const format = b.load_format ?? null;
  return push(
    () => {
      if (blobs.length < tpSize)
        return { success: false, message: `serialized_named_tensors has ${blobs.length} entries for tp_size ${tpSize} (one per TP rank)` };
      const bytes = blobs.map(pickledBytes);
      if (bytes.some((n) => n === null))
        return { success: false, message: "Failed to update weights: serialized_named_tensors entries must be base64 of a pickle" };
      if (format !== null && format !== "direct" && format !== "flattened_bucket")
        return { success: false, message: `unknown load_format ${JSON.stringify(format)}` };
      stats.lastTensorPush = {
        count: blobs.length,
        bytes: bytes as number[],
        load_format: format,
        flush_cache: b.flush_cache !== false,
        weight_version: b.weight_version,
      };
      stats.calls.push("update_weights_from_tensor");
      return { success: true, message: "Succeeded to update model weights." };
    },
    b,
    res,
  );
}

/**
 * http_server.py health_generate (also /health): sends a one-token generation, then every second
 * checks whether anything came out since it began; 200 once something did, 503 (empty body) after
 * SGLANG_HEALTH_CHECK_TIMEOUT. While a load runs or generation is paused nothing comes out.
 */
async function healthGenerate(res: ServerResponse): Promise<void> {
  if (isHanging()) return hangWhileFaulted().then(() => void res.writeHead(200).end());
  if (take5xx("health")) return send(res, 503, { error: { message: "injected 5xx" } });
  const began = Date.now();
  for (;;) {
    await sleep(Math.min(healthPollMs, Math.max(0, began + healthBlockMs - Date.now())));
    if (!loading && !paused) return void res.writeHead(200).end();
    if (Date.now() - began >= healthBlockMs) {
      stats.healthBusy++;
      return void res.writeHead(503).end();
    }
  }
}

/** utils/common.py add_api_key_middleware: OPTIONS and paths starting with /health or /metrics pass; /_fault and /stats are the fake's own. */
function isAuthorized(req: IncomingMessage, path: string): boolean {
  if (apiKey === undefined || req.method === "OPTIONS") return true;
  if (path.startsWith("/health") || path.startsWith("/metrics") || path === "/_fault" || path === "/stats") return true;
  return req.headers.authorization === `Bearer ${apiKey}`;
}

/** http_server.py flush_cache (GET or POST): 200 or 400, plain text; the scheduler refuses while requests run or wait. */
function flushCache(res: ServerResponse): void {
  // An aborted request still counts until the scheduler's next step drops it: flush right after an
  // abort can fail, which is why slime retries.
  const isBusy = live.size > 0 && !(paused && pauseMode === "retract");
  const text =
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";
  if (isBusy) stats.flushRefused++;
  else stats.flushes++;
  res.writeHead(isBusy ? 400 : 200, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

const server = createServer((req, res) => {
  void (async () => {
    try {
      const url = (req.url ?? "/").split("?")[0] as string;
      if (!isAuthorized(req, url)) {
        stats.unauthorized++;
        return send(res, 401, { error: "Unauthorized" });
      }
      if (req.method === "POST" && url === "/generate") return await generate(await readJson(req), res);
      if (req.method === "POST" && url === "/abort_request") {
        const b = await readJson(req);
        stats.abortRequests++;
        if (b.abort_all === true) {
          stats.abortAlls++;
          for (const s of live.values()) s.aborted = true;
          return void res.writeHead(200).end();
        }
        // tokenizer_manager.py abort_request: nothing unless the rid is exactly a live one; then
        // scheduler.py abort_request aborts every request whose rid starts with it.
        const prefix = typeof b.rid === "string" ? b.rid : "";
        if (live.has(prefix)) for (const [rid, s] of live) if (rid.startsWith(prefix)) s.aborted = true;
        res.writeHead(200).end();
        return;
      }
      if (req.method === "POST" && url === "/update_weights_from_disk") return await loadWeights(await readJson(req), res);
      if (req.method === "POST" && url === "/pause_generation") {
        const b = await readJson(req);
        const mode = b.mode ?? "abort";
        if (mode !== "abort" && mode !== "in_place" && mode !== "retract") {
          return sendValidationError(res, `Invalid mode: ${JSON.stringify(mode)}. Expected one of ['abort', 'retract', 'in_place'].`);
        }
        stats.pauses++;
        stats.calls.push("pause_generation");
        if (!paused) paused = new Promise<void>((r) => (resume = r));
        pauseMode = mode;
        if (mode === "abort") for (const s of live.values()) s.aborted = true;
        return send(res, 200, { message: "Generation paused successfully.", status: "ok" });
      }
      if (req.method === "POST" && url === "/continue_generation") {
        await readJson(req);
        stats.calls.push("continue_generation");
        const r = resume;
        paused = null;
        resume = null;
        r?.();
        return send(res, 200, { message: "Generation continued successfully.", status: "ok" });
      }
      if ((req.method === "POST" || req.method === "GET") && url === "/flush_cache") {
        await readJson(req);
        stats.calls.push("flush_cache");
        return flushCache(res);
      }
      if (req.method === "POST" && url === "/init_weights_update_group") {
        const b = await readJson(req);
        if (
          typeof b.master_address !== "string" ||
          typeof b.master_port !== "number" ||
          typeof b.rank_offset !== "number" ||
          typeof b.world_size !== "number"
        ) {
          return sendValidationError(res, "master_address, master_port, rank_offset and world_size are required (InitWeightsUpdateGroupReqInput)");
        }
        stats.groups.push(b);
        stats.calls.push("init_weights_update_group");
        // The fake joins no process group (it receives no tensors): it remembers the name.
        groupNames.add(typeof b.group_name === "string" ? b.group_name : "weight_update_group");
        return send(res, 200, { success: true, message: "Succeeded to initialize custom process group." });
      }
      if (req.method === "POST" && url === "/update_weights_from_distributed") return await updateFromDistributed(await readJson(req), res);
      if (req.method === "POST" && url === "/update_weights_from_tensor") return await updateFromTensor(await readJson(req), res);
      if (url === "/_fault") {
        if (req.method === "POST") {
          const b = await readJson(req);
          fault = {
            mode: (b.mode as FaultMode | undefined) ?? "none",
            afterTokens: Number(b.afterTokens ?? 0),
            count: Number(b.count ?? -1),
            version: Number(b.version ?? 0),
            scope: b.scope === "all" ? "all" : "generate",
            statusCode: Number(b.statusCode ?? 500),
          };
          faultEpoch++;
          send(res, 200, fault);
          if (fault.mode === "die" && fault.afterTokens <= 0) setTimeout(() => process.exit(1), 10);
          return;
        }
        return send(res, 200, fault);
      }
      if (url === "/health_generate" || url === "/health") return await healthGenerate(res);
      if (url === "/get_weight_version") {
        if (isNewVersionApi) return send(res, 404, { detail: "Not Found" });
        return send(res, 200, { weight_version: String(reportedVersion()) });
      }
      if (url === "/model_info") {
        if (!isNewVersionApi) return send(res, 404, { detail: "Not Found" });
        return send(res, 200, { model_path: "fake/model", is_generation: true, weight_version: String(reportedVersion()) });
      }
      if (url === "/get_model_info") {
        // 0.5.x http_server.py get_model_info carries weight_version too.
        return send(res, 200, {
          model_path: "fake/model",
          tokenizer_path: "fake/model",
          is_generation: true,
          preferred_sampling_params: null,
          ...(isNewVersionApi ? {} : { weight_version: String(reportedVersion()) }),
        });
      }
      if (url === "/get_server_info") {
        return send(res, 200, {
          model_path: "fake/model",
          weight_version: String(reportedVersion()),
          max_running_requests: 4096,
          context_length: contextLength,
          enable_deterministic_inference: isDeterministic,
          incremental_streaming_output: isIncremental,
          stream_interval: streamInterval,
          version: "fake-sglang",
          internal_states: [{}],
        });
      }
      if (url === "/v1/loads") return send(res, 200, { loads: [{ dp_rank: 0, num_running_reqs: live.size, num_waiting_reqs: 0 }] });
      if (url === "/stats") return send(res, 200, { ...stats, live: live.size, weightVersion, fault });
      send(res, 404, { detail: "Not Found" });
    } catch (e) {
      if (!res.headersSent) send(res, 500, { error: { message: (e as Error).message } });
      else res.destroy();
    }
  })();
});
server.keepAliveTimeout = 60_000;
server.listen(Number(values.port), "127.0.0.1", () => {
  process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`);
  if (fault.mode === "die" && fault.afterTokens <= 0) process.exit(1);
});
process.on("SIGTERM", () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
