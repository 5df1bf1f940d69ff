/**
 * TEST FAKE — a protocol-faithful stand-in for an SGLang server, run as its
 * own process (never used by `npm run demo`). SGLang's native API:
 *   POST /generate {rid, input_ids, sampling_params, return_logprob, stream}
 *     → {text, meta_info: {id, output_token_logprobs: [[logprob, id, null]…],
 *        finish_reason: {type: stop|length|abort} | null, weight_version,
 *        prompt_tokens, completion_tokens}}; with stream: SSE `data:` events
 *        carrying the cumulative token list, then `data: [DONE]`.
 *     Batch form without streaming: input_ids a list of lists, rid and
 *     sampling_params lists → the list of outputs in order (stats.batches).
 *   POST /abort_request {rid}  (abort_all is refused: rlq must never send it)
 *   POST /update_weights_from_disk {model_path, weight_version}: like SGLang it
 *     waits for in-flight requests and holds new ones until loaded.
 *   POST /update_weights_from_distributed {weight_version, …}: a trainer push;
 *     in-flight requests continue on the new weights (slime pauses, not drains).
 *   GET /health_generate, /health, /get_weight_version, /get_model_info,
 *     /get_server_info, /v1/loads, and /stats (fake only).
 * Tokens come from fake-lm.ts. Printable bytes 32..126; EOS 257.
 *
 * Failure injection, by flag at start or at run time through POST /_fault
 * {mode, afterTokens?, count?, version?, scope?} (GET /_fault reads it):
 *   none | 5xx (count: how many answers, default all; scope "generate" or "all")
 *   hang (/health_generate stops answering; generation stalls once a request has
 *     afterTokens tokens, at once when afterTokens is 0)
 *   abort_mid (each request ends with finish_reason abort after afterTokens tokens)
 *   die (exit(1) once any request has produced afterTokens tokens; 0 = now)
 *   stale_version (reports `version` whatever it loads)
 *
 *   tsx test/fakes/fake-sglang.ts --port 0 [--token-delay-ms 2] [--stop-prob 0.08]
 *     [--weight-version 0] [--logprob-mode scaled|original|truncated]
 *     [--fault MODE] [--fault-after-tokens N] [--fault-version V] [--load-delay-ms 0]
 *     [--model full|instant]   (instant: fake-lm.ts instantToken, for throughput benches)
 * prints "listening <port>" on stdout.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { EOS, instantToken, sampleToken, type LogprobMode } from "./fake-lm.ts";
import { readJson, sendJson } from "./http-json.ts";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "token-delay-ms": { type: "string", default: "0" },
    "stop-prob": { type: "string", default: "0.08" },
    "weight-version": { type: "string", default: "0" },
    "logprob-mode": { type: "string", default: "scaled" },
    "load-delay-ms": { type: "string", default: "0" },
    model: { type: "string", default: "full" },
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
if (values.model !== "full" && values.model !== "instant") throw new Error(`--model: expected full or instant, got ${values.model}`);
const drawToken = values.model === "instant" ? instantToken : sampleToken;
let weightVersion = Number(values["weight-version"]);

type FaultMode = "none" | "5xx" | "hang" | "abort_mid" | "die" | "stale_version";
interface Fault {
  mode: FaultMode;
  afterTokens: number;
  /** 5xx: answers left to fail; -1 = all. */
  count: number;
  version: number;
  scope: "generate" | "all";
}
let fault: Fault = {
  mode: values.fault as FaultMode,
  afterTokens: Number(values["fault-after-tokens"]),
  count: Number(values["fault-count"]),
  version: Number(values["fault-version"]),
  scope: "generate",
};
let faultEpoch = 0;
const live = new Map<string, { aborted: boolean }>();
const stats = { generate: 0, batches: 0, aborted: 0, loads: 0, abortRequests: 0, failed5xx: 0, maxLive: 0 };
/** Loads wait for in-flight requests; new requests wait for a load (SGLang's model update lock). */
let loading: Promise<void> | null = null;
let drained: (() => void) | null = null;

const reportedVersion = () => (fault.mode === "stale_version" ? fault.version : weightVersion);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const isHanging = () => fault.mode === "hang";

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

type Finish = "stop" | "length" | "abort";
interface Generated {
  out: Array<[number, number, null]>;
  finish: Finish;
}

/** One request's (or one batch item's) generation; `onToken` sees each token but the last (streaming). */
async function generateOne(
  ids: number[],
  sp: Record<string, unknown>,
  rid: string,
  isClientGone: () => boolean,
  onToken: ((g: Generated) => void) | null,
): Promise<Generated> {
  const maxNew = Number(sp.max_new_tokens ?? 128);
  const seed = Number(sp.sampling_seed ?? 0);
  const temperature = Number(sp.temperature ?? 1);
  const topP = Number(sp.top_p ?? 1);
  const topK = Number(sp.top_k ?? -1);
  const ignoreEos = sp.ignore_eos === true;
  const stopIds = new Set((sp.stop_token_ids as number[] | undefined) ?? []);
  if (!ignoreEos) stopIds.add(EOS);
  const state = { aborted: false };
  live.set(rid, state);
  stats.maxLive = Math.max(stats.maxLive, live.size);
  stats.generate++;
  const g: Generated = { out: [], finish: "length" };
  let prev = ids[ids.length - 1] ?? 0;
  try {
    for (let i = 0; i < maxNew; i++) {
      if (tokenDelayMs > 0) await sleep(tokenDelayMs);
      if (isHanging() && g.out.length >= fault.afterTokens) await hangWhileFaulted();
      if (state.aborted || isClientGone() || (fault.mode === "abort_mid" && g.out.length >= fault.afterTokens)) {
        g.finish = "abort";
        break;
      }
      const version = weightVersion;
      const { token, logProb } = drawToken({
        seed,
        version,
        position: ids.length + i,
        prev,
        temperature,
        topP,
        topK,
        stopProb,
        isEosAllowed: i > 0 && !ignoreEos,
        mode: logprobMode,
      });
      g.out.push([logProb, token, null]);
      prev = token;
      if (fault.mode === "die" && g.out.length >= fault.afterTokens) {
        process.stderr.write(`fake-sglang: injected death after ${g.out.length} tokens of ${rid}\n`);
        process.exit(1);
      }
      if (stopIds.has(token)) {
        g.finish = "stop";
        break;
      }
      if (onToken && i + 1 < maxNew) onToken(g);
    }
  } finally {
    live.delete(rid);
    if (live.size === 0 && drained) drained();
  }
  if (g.finish === "abort") stats.aborted++;
  return g;
}

function metaInfo(rid: string, promptTokens: number, g: Generated, finishType: string | null) {
  return {
    id: rid,
    output_token_logprobs: g.out,
    finish_reason: finishType === null ? null : { type: finishType, ...(finishType === "abort" ? { message: "Abort before finishing." } : {}) },
    weight_version: String(reportedVersion()),
    prompt_tokens: promptTokens,
    completion_tokens: g.out.length,
    cached_tokens: 0,
  };
}

/**
 * SGLang's batch form (input_ids a list of lists, rid and sampling_params
 * lists): every item is its own request (abortable by its rid); the answer is
 * the list of outputs in order. Only without streaming: rlq batches only then.
 */
async function generateBatch(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const ids = b.input_ids as number[][];
  const rids = b.rid;
  const sps = b.sampling_params;
  if (b.stream === true) return sendJson(res, 400, { error: { message: "the fake answers batch requests only without streaming" } });
  if (!Array.isArray(rids) || rids.length !== ids.length || (Array.isArray(sps) && sps.length !== ids.length)) {
    return sendJson(res, 400, { error: { message: "rid (and a sampling_params list) must have one entry per input" } });
  }
  if (ids.some((x) => !Array.isArray(x) || x.length === 0)) return sendJson(res, 400, { error: { message: "input_ids required" } });
  if (b.return_logprob !== true) return sendJson(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  if (take5xx("generate")) return sendJson(res, 503, { error: { message: "injected 5xx" } });
  while (loading) await loading;
  if (isHanging() && fault.afterTokens <= 0) await hangWhileFaulted();
  stats.batches++;
  let isClientGone = false;
  res.on("close", () => {
    if (!res.writableFinished) isClientGone = true;
  });
  const outs = await Promise.all(
    ids.map(async (x, i) => {
      const sp = ((Array.isArray(sps) ? sps[i] : sps) ?? {}) as Record<string, unknown>;
      const rid = String(rids[i]);
      const g = await generateOne(x, sp, rid, () => isClientGone, null);
      return { text: "", meta_info: metaInfo(rid, x.length, g, g.finish) };
    }),
  );
  if (!isClientGone) sendJson(res, 200, outs);
}

async function generate(b: Record<string, unknown>, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const ids = b.input_ids as number[];
  const sp = (b.sampling_params ?? {}) as Record<string, unknown>;
  if (Array.isArray(ids) && Array.isArray(ids[0])) return generateBatch(b, res);
  if (!Array.isArray(ids) || ids.length === 0) return sendJson(res, 400, { error: { message: "input_ids required" } });
  if (b.return_logprob !== true) return sendJson(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  if (take5xx("generate")) return sendJson(res, 503, { error: { message: "injected 5xx" } });
  while (loading) await loading;
  if (isHanging() && fault.afterTokens <= 0) await hangWhileFaulted();
  const isStream = b.stream === true;
  const rid = typeof b.rid === "string" ? b.rid : String(Math.random());
  let isClientGone = false;
  res.on("close", () => {
    // SGLang aborts a request whose client disconnected.
    if (!res.writableFinished) isClientGone = true;
  });
  if (isStream) res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  const onToken = isStream ? (g: Generated) => void res.write(`data: ${JSON.stringify({ text: "", meta_info: metaInfo(rid, ids.length, g, null) })}\n\n`) : null;
  const g = await generateOne(ids, sp, rid, () => isClientGone, onToken);
  if (isClientGone) return;
  if (isStream) {
    res.write(`data: ${JSON.stringify({ text: "", meta_info: metaInfo(rid, ids.length, g, g.finish) })}\n\n`);
    res.end("data: [DONE]\n\n");
  } else {
    sendJson(res, 200, { text: "", meta_info: metaInfo(rid, ids.length, g, g.finish) });
  }
}

async function loadWeights(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (take5xx("health")) return sendJson(res, 503, { error: { message: "injected 5xx" } });
  while (loading) await loading;
  let done!: () => void;
  loading = new Promise<void>((r) => (done = r));
  try {
    if (live.size > 0) await new Promise<void>((r) => (drained = r));
    drained = null;
    if (loadDelayMs > 0) await sleep(loadDelayMs);
    if (typeof b.model_path !== "string" || b.model_path.includes("missing")) {
      return sendJson(res, 200, { success: false, message: `cannot load ${String(b.model_path)}` });
    }
    weightVersion = Number(b.weight_version);
    stats.loads++;
    sendJson(res, 200, { success: true, message: `loaded ${String(b.model_path)}`, num_paused_requests: 0 });
  } finally {
    loading = null;
    done();
  }
}

const server = createServer((req, res) => {
  void (async () => {
    try {
      const url = (req.url ?? "/").split("?")[0];
      if (req.method === "POST" && url === "/generate") return await generate(await readJson(req), req, res);
      if (req.method === "POST" && url === "/abort_request") {
        const b = await readJson(req);
        if (b.abort_all === true) return sendJson(res, 400, { error: { message: "rlq must never abort_all" } });
        stats.abortRequests++;
        const s = live.get(String(b.rid));
        if (s) s.aborted = true;
        return sendJson(res, 200, {});
      }
      if (req.method === "POST" && url === "/update_weights_from_disk") return await loadWeights(await readJson(req), res);
      if (req.method === "POST" && url === "/update_weights_from_distributed") {
        // A trainer push (slime: pause_generation, NCCL broadcast, continue_generation): in-flight
        // requests are paused, not drained, and continue on the new weights.
        const b = await readJson(req);
        weightVersion = Number(b.weight_version);
        stats.loads++;
        return sendJson(res, 200, { success: true, message: "updated" });
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
          };
          faultEpoch++;
          sendJson(res, 200, fault);
          if (fault.mode === "die" && fault.afterTokens <= 0) setTimeout(() => process.exit(1), 10);
          return;
        }
        return sendJson(res, 200, fault);
      }
      if (url === "/health_generate" || url === "/health") {
        if (isHanging()) return await hangWhileFaulted().then(() => sendJson(res, 200, {}));
        if (take5xx("health")) return sendJson(res, 503, { error: { message: "injected 5xx" } });
        return sendJson(res, 200, {});
      }
      if (url === "/get_weight_version") return sendJson(res, 200, { weight_version: String(reportedVersion()) });
      if (url === "/get_model_info") return sendJson(res, 200, { model_path: "fake/model", tokenizer_path: "fake/model", is_generation: true, weight_version: String(reportedVersion()) });
      if (url === "/get_server_info") {
        return sendJson(res, 200, { model_path: "fake/model", weight_version: String(reportedVersion()), max_running_requests: 4096, version: "fake-sglang", internal_states: [{}] });
      }
      if (url === "/v1/loads") return sendJson(res, 200, { loads: [{ dp_rank: 0, num_running_reqs: live.size, num_waiting_reqs: 0 }] });
      if (url === "/stats") return sendJson(res, 200, { ...stats, live: live.size, weightVersion, fault });
      sendJson(res, 404, { error: { message: `no route ${req.method} ${url}` } });
    } catch (e) {
      if (!res.headersSent) sendJson(res, 500, { error: { message: (e as Error).message } });
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
