/**
 * TEST FAKE — a stand-in for an SGLang server (0.5.x) run as its own process
 * (never used by `npm run demo`), as unkind as the real one on every point rlq
 * depends on. Each behaviour names the SGLang file it comes from (paths under
 * python/sglang/srt/ of sgl-project/sglang, 0.5.x).
 *
 *   POST /generate {rid, input_ids, sampling_params, return_logprob, top_logprobs_num, stream}
 *     → {text, meta_info: {id, output_token_logprobs: [[logprob, id, null]…],
 *        output_top_logprobs?, finish_reason: {type: stop|length|abort, …} | null,
 *        weight_version, weight_versions? (--weight-versions-spans), prompt_tokens,
 *        completion_tokens}}; with stream: SSE `data:` events, then `data: [DONE]`.
 *   Batch form (input_ids a list of lists, rid and sampling_params lists) → outputs in order.
 *   POST /abort_request {rid, abort_all}, /pause_generation, /continue_generation, /flush_cache,
 *     /update_weights_from_disk, /init_weights_update_group, /update_weights_from_distributed,
 *     /update_weights_from_tensor; GET /health, /health_generate, /get_weight_version,
 *     /model_info (--new-version-api), /get_model_info, /get_server_info, /v1/loads; /stats (fake only).
 *
 * Quirks reproduced (each is a way a real server hurt rlq):
 * - greedy path: a request with top_k 1 (or temperature 0) gets log_softmax(logits) WITHOUT
 *   temperature (layers/sampler.py: when every request of the batch is greedy the sampler takes
 *   argmax and returns logprobs = log_softmax(logits)); the fake decides per request.
 * - streaming (entrypoints/http_server.py generate_request → stream_results;
 *   managers/tokenizer_manager.py _handle_batch_output): one event every --stream-interval tokens,
 *   each carrying EVERY token so far (cumulative), unless --incremental-streaming-output, whose
 *   events carry only the new tokens (the final abort event stays cumulative).
 * - request errors: a prompt of --context-length tokens or more is refused
 *   (tokenizer_manager.py _validate_one_request, "is longer than the model's context length");
 *   a refused request answers HTTP 400 {"error": {"message"}} without streaming, and HTTP 200 with
 *   one `data: {"error": {...}}` event when streamed (http_server.py stream_results catches the
 *   ValueError after the response began). A batch with one refused item is refused whole (400).
 * - error aborts: fault error_abort ends requests with finish_reason {type: abort, message,
 *   status_code} (managers/schedule_batch.py FINISH_ABORT carries a status_code for server-side
 *   errors: 400 invalid input, 500 internal, 503 overloaded).
 * - duplicate rid: a rid still in flight is refused with "Duplicate request ID" (tokenizer_manager.py
 *   _send_one_request / rid_to_state); a request whose client disconnected stays in flight for
 *   --disconnect-abort-delay-ms (2 s; tokenizer_manager.py create_abort_task waits before aborting).
 * - /abort_request matches rids by prefix (scheduler.py abort_request: `req.rid.startswith(recv_req.rid)`);
 *   an aborted request answers with its tokens so far and finish_reason abort.
 * - sampling_seed is honoured only with --enable-deterministic-inference (layers/sampler.py uses the
 *   per-request seeds only in deterministic mode); otherwise the draw is unseeded. The seed lives in
 *   an int32 tensor (sampling/sampling_batch_info.py): a seed of 2^31 or more is refused here
 *   (the real server fails inside the scheduler).
 * - weight loads (http_server.py update_weights_from_disk; tokenizer_manager.py model_update_lock):
 *   a load waits for in-flight requests and holds new ones; a failed load answers HTTP 400
 *   {success: false, message}; while a load runs or generation is paused, /health_generate blocks
 *   for --health-block-ms (20 s) and then answers 503 (http_server.py health_generate), while
 *   /get_weight_version and /model_info still answer.
 * - versions: /get_weight_version (0.5.x); with --new-version-api it answers 404 and /model_info
 *   carries weight_version instead (newer main). --weight-versions-spans adds
 *   meta_info.weight_versions, one version per output token (utils/weight_versions.py in newer
 *   main: a request that spans an update reports where the version changed).
 * - --api-key: every route but /health, /health_generate and /metrics answers 401 without
 *   `Authorization: Bearer <key>` (utils/common.py add_api_key_middleware).
 * - pause_generation aborts in-flight requests (mode "abort", http_server.py pause_generation);
 *   new requests wait until continue_generation.
 *
 * Failure injection, by flag at start or at run time through POST /_fault
 * {mode, afterTokens?, count?, version?, scope?, statusCode?} (GET /_fault reads it):
 *   none | 5xx (count: how many answers, default all; scope "generate" or "all")
 *   hang (/health_generate stops answering; generation stalls once a request has
 *     afterTokens tokens, at once when afterTokens is 0)
 *   abort_mid (each request ends with finish_reason abort after afterTokens tokens)
 *   error_abort (each request ends with an abort carrying status_code `statusCode` after afterTokens)
 *   reset (the next `count` /generate connections are destroyed before any token; the request
 *     stays in flight on the server for the disconnect-abort delay)
 *   die (exit(1) once any request has produced afterTokens tokens; 0 = now)
 *   stale_version (reports `version` whatever it loads)
 *
 *   tsx test/fakes/fake-sglang.ts --port 0 [--token-delay-ms 2] [--stop-prob 0.08]
 *     [--weight-version 0] [--logprob-mode scaled|original|truncated] [--load-delay-ms 0]
 *     [--api-key KEY] [--context-length 32768] [--enable-deterministic-inference]
 *     [--incremental-streaming-output] [--stream-interval 1] [--weight-versions-spans]
 *     [--new-version-api] [--health-block-ms 20000] [--disconnect-abort-delay-ms 2000]
 *     [--fault MODE] [--fault-after-tokens N] [--fault-version V]
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
  /** The last update_weights_from_distributed / _from_tensor body's names, dtypes and shapes. */
  lastPush: null as null | { names: unknown; dtypes: unknown; shapes: unknown; group_name: unknown },
  groups: [] as unknown[],
  seedsSeen: [] as number[],
};
/** Loads wait for in-flight requests; new requests wait for a load (SGLang's model update lock). */
let loading: Promise<void> | null = null;
let drained: (() => void) | null = null;
let paused: Promise<void> | null = null;
let resume: (() => void) | null = null;

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
  if (sp.top_k === 0) return "top_k must be -1 (disable), or at least 1, got 0.";
  if (
    sp.sampling_seed !== undefined &&
    (!Number.isInteger(sp.sampling_seed) || (sp.sampling_seed as number) > 0x7fffffff || (sp.sampling_seed as number) < 0)
  ) {
    return `sampling_seed ${JSON.stringify(sp.sampling_seed)} does not fit the int32 seed tensor`;
  }
  if (live.has(rid)) {
    stats.duplicates++;
    return `Duplicate request ID: ${rid}`;
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

function finishReason(f: Finish | null) {
  if (f === null) return null;
  if (f === "abort") return { type: "abort", message: "Abort before finishing." };
  if (f === "error_abort") return { type: "abort", message: `injected server-side error ${fault.statusCode}`, status_code: fault.statusCode };
  return { type: f };
}

/** meta_info for tokens [from, g.out.length): from 0 (cumulative) or from the last event (incremental). */
function metaInfo(rid: string, promptTokens: number, g: Generated, finish: Finish | null, from = 0) {
  return {
    id: rid,
    output_token_logprobs: from === 0 ? g.out : g.out.slice(from),
    ...(g.top.length > 0 ? { output_top_logprobs: from === 0 ? g.top : g.top.slice(from) } : {}),
    finish_reason: finishReason(finish),
    weight_version: String(reportedVersion()),
    ...(hasSpans ? { weight_versions: (from === 0 ? g.versions : g.versions.slice(from)).map(String) } : {}),
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
  const outs = await Promise.all(
    ids.map(async (x, i) => {
      const rid = String(rids[i]);
      const g = await generateOne(x as number[], spOf(i), topN, rid, states[i] as LiveRequest, null);
      return { text: "", meta_info: metaInfo(rid, (x as number[]).length, g, g.finish) };
    }),
  );
  if (!isGone()) send(res, 200, outs);
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
  if (isStream) {
    write(g, g.finish);
    res.end("data: [DONE]\n\n");
  } else {
    send(res, 200, { text: "", meta_info: metaInfo(rid, ids.length, g, g.finish) });
  }
}

async function loadWeights(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (take5xx("health")) return send(res, 503, { error: { message: "injected 5xx" } });
  while (loading) await loading;
  let done!: () => void;
  loading = new Promise<void>((r) => (done = r));
  try {
    if (live.size > 0) await new Promise<void>((r) => (drained = r));
    drained = null;
    if (loadDelayMs > 0) await sleep(loadDelayMs);
    if (typeof b.model_path !== "string" || b.model_path.includes("missing")) {
      // http_server.py update_weights_from_disk: a failed load is HTTP 400.
      return send(res, 400, { success: false, message: `Failed to update weights: cannot load ${String(b.model_path)}` });
    }
    weightVersion = Number(b.weight_version);
    stats.loads++;
    send(res, 200, { success: true, message: `Succeeded to update model weights from ${String(b.model_path)}`, num_paused_requests: 0 });
  } finally {
    loading = null;
    done();
  }
}

/** http_server.py health_generate: blocks while a load runs or generation is paused, 503 after the wait. */
async function healthGenerate(res: ServerResponse): Promise<void> {
  if (isHanging()) return hangWhileFaulted().then(() => send(res, 200, {}));
  if (take5xx("health")) return send(res, 503, { error: { message: "injected 5xx" } });
  if (loading || paused) {
    const busy = Promise.all([loading, paused].filter((p) => p !== null));
    const gaveUp = await Promise.race([busy.then(() => false), sleep(healthBlockMs).then(() => true)]);
    if (gaveUp) {
      stats.healthBusy++;
      return send(res, 503, {});
    }
  }
  return send(res, 200, {});
}

function isAuthorized(req: IncomingMessage, path: string): boolean {
  if (apiKey === undefined) return true;
  if (path === "/health" || path === "/health_generate" || path === "/metrics" || path === "/_fault" || path === "/stats") return true;
  return req.headers.authorization === `Bearer ${apiKey}`;
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
        if (b.abort_all === true) return send(res, 400, { error: { message: "rlq must never abort_all" } });
        stats.abortRequests++;
        // scheduler.py abort_request: every request whose rid starts with the given one.
        const prefix = String(b.rid);
        for (const [rid, s] of live) if (rid.startsWith(prefix)) s.aborted = true;
        res.writeHead(200).end();
        return;
      }
      if (req.method === "POST" && url === "/update_weights_from_disk") return await loadWeights(await readJson(req), res);
      if (req.method === "POST" && url === "/pause_generation") {
        await readJson(req);
        stats.pauses++;
        if (!paused) paused = new Promise<void>((r) => (resume = r));
        for (const s of live.values()) s.aborted = true; // mode "abort" (the default)
        return send(res, 200, {});
      }
      if (req.method === "POST" && url === "/continue_generation") {
        await readJson(req);
        const r = resume;
        paused = null;
        resume = null;
        r?.();
        return send(res, 200, {});
      }
      if (req.method === "POST" && url === "/flush_cache") {
        stats.flushes++;
        return send(res, 200, {});
      }
      if (req.method === "POST" && url === "/init_weights_update_group") {
        const b = await readJson(req);
        stats.groups.push(b);
        return send(res, 200, { success: true, message: "Succeeded to initialize custom process group." });
      }
      if (req.method === "POST" && (url === "/update_weights_from_distributed" || url === "/update_weights_from_tensor")) {
        // A trainer push (slime: pause_generation, flush_cache, NCCL broadcast, continue_generation):
        // requests paused, not drained, continue on the new weights.
        const b = await readJson(req);
        stats.lastPush = { names: b.names, dtypes: b.dtypes, shapes: b.shapes, group_name: b.group_name };
        if (b.weight_version !== undefined && b.weight_version !== null) weightVersion = Number(b.weight_version);
        stats.loads++;
        return send(res, 200, { success: true, message: "Succeeded to update parameter online." });
      }
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
      if (url === "/health_generate") return await healthGenerate(res);
      if (url === "/health") return send(res, 200, {});
      if (url === "/get_weight_version") {
        if (isNewVersionApi) return send(res, 404, { detail: "Not Found" });
        return send(res, 200, { weight_version: String(reportedVersion()) });
      }
      if (url === "/model_info") {
        if (!isNewVersionApi) return send(res, 404, { detail: "Not Found" });
        return send(res, 200, { model_path: "fake/model", is_generation: true, weight_version: String(reportedVersion()) });
      }
      if (url === "/get_model_info") return send(res, 200, { model_path: "fake/model", tokenizer_path: "fake/model", is_generation: true });
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
