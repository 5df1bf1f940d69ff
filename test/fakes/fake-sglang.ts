/**
 * TEST FAKE — a stand-in for an SGLang server run as its own process (never used
 * by `npm run demo`), as unkind as the real one on every point rlq depends on.
 * Each behaviour cites the SGLang file (paths under python/sglang/srt/ of
 * sgl-project/sglang) and the function it comes from, read in the server's own
 * source: 0.5.x at commit 0025436e (entrypoints/http_server.py,
 * managers/tokenizer_manager.py), tokenizer_communicator_mixin.py at 00096b5f,
 * utils/weight_versions.py at 19f93835 and managers/io_struct.py
 * PauseGenerationReqInput (newer main). docs/engines.md lists the same points.
 * This file is the command line and the routes; /generate is in sglang/generate.ts, weight
 * updates, health and the cache flush in sglang/weights.ts, the shared state in sglang/state.ts.
 *
 *   POST /generate {rid, input_ids, sampling_params, return_logprob, top_logprobs_num, stream}
 *     → {text, meta_info: {id, output_token_logprobs: [[logprob, id, null]…],
 *        output_top_logprobs?, finish_reason: {type: stop|length|abort, …} | null,
 *        weight_version, weight_versions? (--weight-versions-spans), prompt_tokens,
 *        completion_tokens, cached_tokens}}; with stream: SSE `data:` events, then `data: [DONE]`.
 *   Batch form (input_ids a list of lists, rid and sampling_params lists) → outputs in order.
 *   POST /abort_request {rid, abort_all}, /pause_generation {mode?}, /continue_generation,
 *     /release_memory_occupation {tags?}, /resume_memory_occupation {tags?} (sglang/weights.ts),
 *     /update_weights_from_disk, /init_weights_update_group, /update_weights_from_distributed,
 *     /update_weights_from_tensor; GET|POST /flush_cache; GET /health, /health_generate,
 *     /model_info, /server_info, /get_model_info, /get_server_info (newest), /get_weight_version
 *     (--api-layout 0.5 instead of the first two), /v1/loads; /stats (fake only).
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
 *   (http_server.py update_weights_from_disk). A request's last answer carries the version it
 *   ended on: tokenizer_manager.py _handle_batch_output writes server_args.weight_version into
 *   meta_info while the request still holds the lock's reader side, so a load waiting to write
 *   cannot change it first (the fake read it after letting the load in).
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
 * - info and version routes (python/sglang/srt/entrypoints/http_server.py, newest): /model_info
 *   (weight_version, is_generation, ...) and /server_info (server args, "frontend": "python");
 *   /get_model_info and /get_server_info still answer the same but log "deprecated and will be
 *   removed" on every call (counted in stats.deprecatedCalls); /get_weight_version is gone (404).
 *   --api-layout 0.5 serves 0.5.x's instead (http_server.py at 0025436e): /get_weight_version,
 *   /get_model_info and /get_server_info, each with weight_version; /model_info and /server_info 404.
 *   /server_info carries dp_size and enable_dp_attention (server args) on every layout.
 * - --frontend rust: the embedded Rust server (SGLANG_RUST_SERVER; managers/rust_server.py at
 *   02398cf1) in front of the same model: routes /generate, /health, /health_generate,
 *   /server_info ("frontend": "rust", rust/sglang-server/src/api_server/http/info.rs at 96510958),
 *   /model_info, /get_model_info and /v1/* (http/app.rs `router` at c847139d); every other route,
 *   /abort_request, the weight updates, pause, continue and flush included, is its fallback's empty
 *   404; /generate answers carry no weight_version, weight_versions or cached_tokens
 *   (generate.proto GenerateMetaInfo at 09d9c399). Its API-key layer (app.rs `serve`,
 *   ApiKeyAuthLayer) is held to the same key rule as the Python frontend's NORMAL routes.
 * - --dp-size N (N > 1) without --enable-dp-attention: /init_weights_update_group,
 *   /update_weights_from_distributed and /update_weights_from_tensor fail their assertion
 *   `dp_size == 1 or enable_dp_attention` (managers/tokenizer_control_mixin.py at 00a2ca2e), an
 *   unhandled AssertionError: HTTP 500 "Internal Server Error" in plain text (stats.dpAssertions).
 *   update_weights_from_disk has no such assertion.
 *   --weight-versions-spans adds meta_info.weight_versions = [{version, start, end}] and sets
 *   weight_version to the last span's (utils/weight_versions.py add_weight_versions_to_meta_info):
 *   a request that outlived an update (one paused in place) reports where the version changed.
 * - keys (python/sglang/srt/utils/auth.py decide_request_auth; each route's level is its
 *   `@auth_level` mark in http_server.py): OPTIONS and paths starting with /health, /ready or
 *   /metrics pass; the admin routes (ADMIN_OPTIONAL: /abort_request, /pause_generation,
 *   /continue_generation, /flush_cache, /init_weights_update_group, /update_weights_from_*) take
 *   only --admin-api-key when it is set (--api-key is NOT accepted there) and --api-key otherwise;
 *   every other route takes --api-key when it is set, and anything when only --admin-api-key is.
 *   The key comes as `Authorization: Bearer <key>` or `x-api-key: <key>`; a refusal is 401
 *   {"error": "Unauthorized"}. (0.5.x's utils/common.py add_api_key_middleware had one key, the
 *   first rule without the admin tier.)
 * - streamed error events (http_server.py generate_request's stream_results, newest):
 *   `data: {"error": {message, type, code: <HTTP status>, retryable}}` then [DONE]; 0.5.x sends
 *   {message} only.
 *
 * Failure injection, by flag at start or at run time through POST /_fault
 * {mode, afterTokens?, count?, version?, scope?, statusCode?, retryable?} (GET /_fault reads it):
 *   none | 5xx (count: how many answers, default all; scope "generate" or "all")
 *   hang (/health_generate stops answering; generation stalls once a request has
 *     afterTokens tokens, at once when afterTokens is 0)
 *   abort_mid (each request ends with finish_reason abort after afterTokens tokens)
 *   error_abort (the scheduler aborts each request with status_code `statusCode` after afterTokens
 *     tokens; what the client sees follows _wait_one_response above)
 *   error_event (the next `count` requests fail after afterTokens tokens with an exception that
 *     carries `statusCode` and `retryable`: streamed, the error event above; not streamed, HTTP
 *     `statusCode` with the same `error` member)
 *   reset (the next `count` /generate connections are destroyed before any token; the request
 *     stays in flight on the server for the disconnect-abort delay)
 *   die (exit(1) once any request has produced afterTokens tokens; 0 = now)
 *   stale_version (reports `version` whatever it loads)
 *
 *   tsx test/fakes/fake-sglang.ts --port 0 [--token-delay-ms 2] [--stop-prob 0.08]
 *     [--weight-version 0] [--logprob-mode scaled|original|truncated] [--load-delay-ms 0]
 *     [--api-key KEY] [--admin-api-key KEY] [--api-layout newest|0.5] [--context-length 32768] [--enable-deterministic-inference]
 *     [--incremental-streaming-output] [--stream-interval 1] [--weight-versions-spans]
 *     [--health-block-ms 20000] [--health-poll-ms 1000] [--tp-size 1]
 *     [--disconnect-abort-delay-ms 2000] [--fault MODE] [--fault-after-tokens N] [--fault-version V]
 *     [--model full|instant]   (instant: fake-lm.ts instantToken, for throughput benches)
 *     [--frontend python|rust] [--dp-size 1] [--enable-dp-attention]
 *     [--policy-url URL]   (the tokens and log-probs of a real model, test/fakes/hf-vlm-policy.py;
 *                           disk loads load its weights; a response is drawn whole, then answered
 *                           token by token, so faults, pauses and aborts act between its tokens)
 * prints "listening <port>" on stdout.
 */
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import type { LogprobMode } from "./fake-lm.ts";
import { readJson } from "./http-json.ts";
import { generate } from "./sglang/generate.ts";
import { groupNames, live, opts, reportedVersion, send, st, stats, type FaultMode } from "./sglang/state.ts";
import {
  flushCache,
  healthGenerate,
  loadWeights,
  releaseMemory,
  resumeMemory,
  sendValidationError,
  updateFromDistributed,
  updateFromTensor,
} from "./sglang/weights.ts";

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
    "admin-api-key": { type: "string" },
    "api-layout": { type: "string", default: "newest" },
    "context-length": { type: "string", default: "32768" },
    "enable-deterministic-inference": { type: "boolean", default: false },
    "incremental-streaming-output": { type: "boolean", default: false },
    "stream-interval": { type: "string", default: "1" },
    "weight-versions-spans": { type: "boolean", default: false },
    "health-block-ms": { type: "string", default: "20000" },
    "health-poll-ms": { type: "string", default: "1000" },
    "tp-size": { type: "string", default: "1" },
    "disconnect-abort-delay-ms": { type: "string", default: "2000" },
    fault: { type: "string", default: "none" },
    "fault-after-tokens": { type: "string", default: "0" },
    "fault-version": { type: "string", default: "0" },
    "fault-count": { type: "string", default: "-1" },
    frontend: { type: "string", default: "python" },
    "dp-size": { type: "string", default: "1" },
    "enable-dp-attention": { type: "boolean", default: false },
    "policy-url": { type: "string" },
  },
});
if (values.model !== "full" && values.model !== "instant") throw new Error(`--model: expected full or instant, got ${values.model}`);
if (values["api-layout"] !== "newest" && values["api-layout"] !== "0.5") throw new Error(`--api-layout: expected newest or 0.5, got ${values["api-layout"]}`);
Object.assign(opts, {
  tokenDelayMs: Number(values["token-delay-ms"]),
  stopProb: Number(values["stop-prob"]),
  logprobMode: values["logprob-mode"] as LogprobMode,
  loadDelayMs: Number(values["load-delay-ms"]),
  apiKey: values["api-key"],
  adminApiKey: values["admin-api-key"],
  contextLength: Number(values["context-length"]),
  isDeterministic: values["enable-deterministic-inference"] === true,
  isIncremental: values["incremental-streaming-output"] === true,
  streamInterval: Math.max(1, Number(values["stream-interval"])),
  hasSpans: values["weight-versions-spans"] === true,
  isOldLayout: values["api-layout"] === "0.5",
  healthBlockMs: Number(values["health-block-ms"]),
  healthPollMs: Number(values["health-poll-ms"]),
  tpSize: Number(values["tp-size"]),
  disconnectAbortDelayMs: Number(values["disconnect-abort-delay-ms"]),
  isInstant: values.model === "instant",
  isRustFrontend: values.frontend === "rust",
  dpSize: Number(values["dp-size"]),
  isDpAttention: values["enable-dp-attention"] === true,
  policyUrl: values["policy-url"],
});
if (values.frontend !== "python" && values.frontend !== "rust") throw new Error(`--frontend: expected python or rust, got ${values.frontend}`);
st.weightVersion = Number(values["weight-version"]);
st.fault = {
  mode: values.fault as FaultMode,
  afterTokens: Number(values["fault-after-tokens"]),
  count: Number(values["fault-count"]),
  version: Number(values["fault-version"]),
  scope: "generate",
  statusCode: 500,
  isRetryable: false,
};

/** The routes http_server.py marks `@auth_level(AuthLevel.ADMIN_OPTIONAL)` that rlq and its trainer call. */
const ADMIN_OPTIONAL_PATHS = new Set([
  "/abort_request",
  "/pause_generation",
  "/continue_generation",
  "/flush_cache",
  "/init_weights_update_group",
  "/update_weights_from_disk",
  "/update_weights_from_distributed",
  "/update_weights_from_tensor",
]);

/** The routes of the embedded Rust server (rust/sglang-server/src/api_server/http/app.rs `router` at c847139d). */
const RUST_ROUTES = new Set([
  "/generate",
  "/health",
  "/health_generate",
  "/server_info",
  "/get_model_info",
  "/model_info",
  "/v1/models",
  "/v1/completions",
  "/v1/chat/completions",
]);
/** The routes that assert dp_size == 1 or DP attention (managers/tokenizer_control_mixin.py at 00a2ca2e). */
const PUSH_PATHS = new Set(["/init_weights_update_group", "/update_weights_from_distributed", "/update_weights_from_tensor"]);

/** utils/auth.py decide_request_auth (the header documents the rule); /_fault and /stats are the fake's own. */
function isAuthorized(req: IncomingMessage, path: string): boolean {
  if (req.method === "OPTIONS") return true;
  if (path.startsWith("/health") || path.startsWith("/ready") || path.startsWith("/metrics") || path === "/_fault" || path === "/stats") return true;
  const carries = (key: string) => req.headers.authorization === `Bearer ${key}` || req.headers["x-api-key"] === key;
  if (ADMIN_OPTIONAL_PATHS.has(path)) {
    if (opts.adminApiKey !== undefined) {
      if (carries(opts.adminApiKey)) return true;
      stats.adminRefused++;
      return false;
    }
    return opts.apiKey === undefined || carries(opts.apiKey);
  }
  return opts.apiKey === undefined || carries(opts.apiKey);
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
      // The Rust frontend serves /generate, /health*, /server_info, /model_info, /get_model_info and
      // /v1/* only (app.rs `router` at c847139d); anything else is its fallback's empty 404.
      if (opts.isRustFrontend && !RUST_ROUTES.has(url) && url !== "/_fault" && url !== "/stats") return void res.writeHead(404).end();
      // tokenizer_control_mixin.py at 00a2ca2e: the three push routes assert `dp_size == 1 or
      // enable_dp_attention`; the AssertionError escapes the handler, and Starlette answers 500 in plain text.
      if (PUSH_PATHS.has(url) && opts.dpSize > 1 && !opts.isDpAttention) {
        stats.dpAssertions++;
        return void res.writeHead(500, { "content-type": "text/plain; charset=utf-8" }).end("Internal Server Error");
      }
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
      if ((req.method === "POST" || req.method === "GET") && url === "/release_memory_occupation") return releaseMemory(await readJson(req), res);
      if ((req.method === "POST" || req.method === "GET") && url === "/resume_memory_occupation") return resumeMemory(await readJson(req), res);
      if (req.method === "POST" && url === "/pause_generation") {
        const b = await readJson(req);
        const mode = b.mode ?? "abort";
        if (mode !== "abort" && mode !== "in_place" && mode !== "retract") {
          return sendValidationError(res, `Invalid mode: ${JSON.stringify(mode)}. Expected one of ['abort', 'retract', 'in_place'].`);
        }
        stats.pauses++;
        stats.calls.push("pause_generation");
        if (!st.paused) st.paused = new Promise<void>((r) => (st.resume = r));
        st.pauseMode = mode;
        if (mode === "abort") for (const s of live.values()) s.aborted = true;
        return send(res, 200, { message: "Generation st.paused successfully.", status: "ok" });
      }
      if (req.method === "POST" && url === "/continue_generation") {
        await readJson(req);
        stats.calls.push("continue_generation");
        const r = st.resume;
        st.paused = null;
        st.resume = null;
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
          st.fault = {
            mode: (b.mode as FaultMode | undefined) ?? "none",
            afterTokens: Number(b.afterTokens ?? 0),
            count: Number(b.count ?? -1),
            version: Number(b.version ?? 0),
            scope: b.scope === "all" ? "all" : "generate",
            statusCode: Number(b.statusCode ?? 500),
            isRetryable: b.retryable === true,
          };
          st.faultEpoch++;
          send(res, 200, st.fault);
          if (st.fault.mode === "die" && st.fault.afterTokens <= 0) setTimeout(() => process.exit(1), 10);
          return;
        }
        return send(res, 200, st.fault);
      }
      if (url === "/health_generate" || url === "/health") return await healthGenerate(res);
      if (url === "/get_weight_version") {
        if (!opts.isOldLayout) return send(res, 404, { detail: "Not Found" });
        return send(res, 200, { weight_version: String(reportedVersion()) });
      }
      if (url === "/model_info" || url === "/get_model_info") {
        if (url === "/model_info" && opts.isOldLayout) return send(res, 404, { detail: "Not Found" });
        if (url === "/get_model_info" && !opts.isOldLayout) stats.deprecatedCalls++;
        return send(res, 200, {
          model_path: "fake/model",
          tokenizer_path: "fake/model",
          is_generation: true,
          preferred_sampling_params: null,
          weight_version: String(reportedVersion()),
        });
      }
      if (url === "/server_info" || url === "/get_server_info") {
        if (url === "/server_info" && opts.isOldLayout) return send(res, 404, { detail: "Not Found" });
        if (url === "/get_server_info" && !opts.isOldLayout) stats.deprecatedCalls++;
        return send(res, 200, {
          model_path: "fake/model",
          weight_version: String(reportedVersion()),
          max_running_requests: 4096,
          context_length: opts.contextLength,
          enable_deterministic_inference: opts.isDeterministic,
          incremental_streaming_output: opts.isIncremental,
          stream_interval: opts.streamInterval,
          version: "fake-sglang",
          internal_states: [{}],
          dp_size: opts.dpSize,
          enable_dp_attention: opts.isDpAttention,
          ...(opts.isOldLayout ? {} : { frontend: opts.isRustFrontend ? "rust" : "python" }),
        });
      }
      if (url === "/v1/loads") return send(res, 200, { loads: [{ dp_rank: 0, num_running_reqs: live.size, num_waiting_reqs: 0 }] });
      if (url === "/stats") return send(res, 200, { ...stats, live: live.size, weightVersion: st.weightVersion, fault: st.fault });
      send(res, 404, { detail: "Not Found" });
    } catch (e) {
      if (!res.headersSent) send(res, 500, { error: { message: (e as Error).message } });
      else res.destroy();
    }
  })();
});
// Idle connections close after 5 s, as SGLang's do (http_server.py launch_server: uvicorn.run(..., timeout_keep_alive=5)).
server.keepAliveTimeout = 5_000;
server.on("connection", () => stats.connections++);
server.listen(Number(values.port), "127.0.0.1", () => {
  process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`);
  if (st.fault.mode === "die" && st.fault.afterTokens <= 0) process.exit(1);
});
process.on("SIGTERM", () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
