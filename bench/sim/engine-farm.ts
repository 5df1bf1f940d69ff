/**
 * BENCH FAKE: one process that plays N SGLang engines (bench/sim/model.ts's SimEngine: timers, no
 * CPU per token), each on its own port (GET /_ports on the control port lists them). Each speaks the part of SGLang's native
 * API rlq uses (src/engines/sglang.ts; behaviours from sglang's python/sglang/srt/entrypoints/http_server.py
 * and managers/tokenizer_manager.py, as test/fakes/fake-sglang.ts documents them):
 *   POST /generate {rid, input_ids, sampling_params, return_logprob, stream: false}, single or batch
 *     (lists; the answer is the list of outputs in order, sent when every item ended);
 *   POST /abort_request {rid}: that request ends now with its tokens so far, finish_reason abort; a
 *     request held behind a weight load is not reached (tokenizer_manager.py abort_request returns
 *     early for a rid not yet in rid_to_state) and runs after the load; {abort_all: true}: every
 *     running and waiting request ends so (rlq sends it only to servers set engine.exclusive);
 *   POST /update_weights_from_disk {model_path, weight_version}: new requests are held, the ones
 *     already in the server finish (the model update lock), then the load takes weightLoadMs;
 *   GET /health_generate and /health (one handler, http_server.py health_generate): a one-token
 *     generation, then a check every second whether anything came out since it began; 200 once
 *     something did, so never in under a second, and 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s)
 *     of nothing, as while a load holds the model update lock (the seconds are the engines', scaled);
 *   POST /pause_generation {mode: "in_place"}, /continue_generation: the requests stay through a load
 *     and go on at the new version; their answers then carry meta_info.weight_versions spans;
 *   GET /get_weight_version, /get_model_info, /get_server_info; POST /flush_cache.
 * GET /_stats (farm only): per-engine busy time, tokens, loads, first request and first decode per version, the
 *   slots held every 100 ms, when each abort arrived; GET /_totals: the sums now.
 *
 * A sample's length is fixed by its key (rid minus the segment index), so a resumed segment ends
 * where the sample would have. Generated token ids are 128..255 (the byte tokenizer's non-ASCII
 * bytes; prompts are ASCII), so a resumed request counts its earlier tokens in input_ids; EOS 257.
 *
 *   tsx bench/sim/engine-farm.ts --port 0 --engines N --params JSON   (prints "listening PORT")
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { readJson, sendJson } from "../../test/fakes/http-json.ts";
import { responseLength, SimEngine, wallClock, type SimParams } from "./model.ts";

const { values } = parseArgs({ options: { port: { type: "string", default: "0" }, engines: { type: "string", default: "8" }, params: { type: "string" } } });
if (!values.params) throw new Error("--params: the SimParams JSON is required");
const p = JSON.parse(values.params) as SimParams;
const n = Number(values.engines);
const clock = wallClock(p.timeScale);
const engines = Array.from({ length: n }, () => new SimEngine(p, clock));
const EOS = 257;
/** http_server.py health_generate: `await asyncio.sleep(1)` between its checks, and HEALTH_CHECK_TIMEOUT (env SGLANG_HEALTH_CHECK_TIMEOUT, default 20 s). */
const HEALTH_POLL_MS = 1000;
const HEALTH_TIMEOUT_MS = 20_000;
const stats = { generateCalls: 0, requests: 0, aborts: 0, abortAlls: 0, loads: 0, pauses: 0, healthChecks: 0, healthBusy: 0 };
// The slots holding a request across all engines, sampled every 100 wall ms: the bench reads how
// full the engines were around each weight sync.
const occupancy: Array<[number, number]> = [];
// When each /abort_request arrived (wall ms): the bench reads how long a weight sync's aborts took to reach the engines.
const abortsWallMs: number[] = [];
setInterval(() => occupancy.push([Date.now(), engines.reduce((a, e) => a + e.holding, 0) / (n * p.maxRunning)]), 100).unref();

interface Item {
  rid: string;
  ids: number[];
  maxNew: number;
}

/** Run one request on engine e; resolves with its SGLang output. */
function runOne(e: SimEngine, item: Item): Promise<unknown> {
  const key = item.rid.slice(0, item.rid.lastIndexOf("-"));
  let prev = 0;
  for (const t of item.ids) if (t >= 128 && t <= 255) prev++;
  const total = Math.ceil(responseLength(key, p) / p.tokenScale); // rlq tokens of the whole sample
  const left = Math.max(0, Math.min(total - prev, item.maxNew));
  const isStopAtEnd = prev + left === total && responseLength(key, p) < p.lenCap;
  stats.requests++;
  return new Promise((resolve) => {
    e.submit({
      rid: item.rid,
      target: left * p.tokenScale,
      inputTokens: p.promptTokens + prev * p.tokenScale,
      onDone(real, isAborted, version, spans) {
        const k = isAborted ? Math.floor(real / p.tokenScale) : left;
        const out: Array<[number, number, null]> = [];
        for (let i = 0; i < k; i++) out.push([-0.7, 128 + (((prev + i) * 37 + key.length) % 128), null]);
        let finish = isAborted ? "abort" : "length";
        if (!isAborted && isStopAtEnd && k > 0) {
          out[k - 1] = [-0.1, EOS, null];
          finish = "stop";
        }
        resolve({
          text: "",
          meta_info: {
            id: item.rid,
            output_token_logprobs: out,
            finish_reason: { type: finish, ...(finish === "abort" ? { message: "Abort before finishing." } : {}) },
            weight_version: String(version),
            // utils/weight_versions.py add_weight_versions_to_meta_info: where a request outlived an
            // in-place load, the versions of its output's spans (in rlq's tokens here), oldest first.
            ...(spans.length > 1 ? { weight_versions: versionSpans(spans, k) } : {}),
            prompt_tokens: item.ids.length,
            completion_tokens: out.length,
            cached_tokens: 0,
          },
        });
      },
    });
  });
}

/** Real-token spans as rlq-token spans over an output of k tokens: [{weight_version, start, end}]. */
function versionSpans(spans: Array<[number, number, number]>, k: number): Array<{ weight_version: string; start: number; end: number }> {
  const out: Array<{ weight_version: string; start: number; end: number }> = [];
  for (const [v, a, b] of spans) {
    const start = Math.min(k, Math.floor(a / p.tokenScale));
    const end = Math.min(k, Math.floor(b / p.tokenScale));
    const last = out[out.length - 1];
    if (last) last.end = start;
    if (end > start || out.length === 0) out.push({ weight_version: String(v), start, end });
  }
  const last = out[out.length - 1];
  if (last) last.end = k;
  return out.filter((x) => x.end > x.start || out.length === 1);
}

async function generate(e: SimEngine, b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (b.stream === true) return sendJson(res, 400, { error: { message: "the engine farm answers only stream: false (set engine.stream: false)" } });
  if (b.return_logprob !== true) return sendJson(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  stats.generateCalls++;
  const isBatch = Array.isArray(b.input_ids) && Array.isArray((b.input_ids as unknown[])[0]);
  const ids = (isBatch ? b.input_ids : [b.input_ids]) as number[][];
  const rids = (isBatch ? b.rid : [b.rid]) as string[];
  const sps = (isBatch ? b.sampling_params : [b.sampling_params]) as Array<Record<string, unknown>>;
  if (!Array.isArray(rids) || rids.length !== ids.length) return sendJson(res, 400, { error: { message: "rid must have one entry per input" } });
  const items: Item[] = ids.map((x, i) => ({ rid: String(rids[i]), ids: x, maxNew: Number((Array.isArray(sps) ? sps[i] : sps)?.max_new_tokens ?? 128) }));
  let isGone = false;
  res.on("close", () => {
    if (res.writableFinished) return;
    isGone = true;
    for (const it of items) e.disconnect(it.rid); // SGLang aborts the requests of a client that disconnected
  });
  const outs = await Promise.all(items.map((it) => runOne(e, it)));
  if (!isGone) sendJson(res, 200, isBatch ? outs : outs[0]);
}

const server = createServer((req, res) => {
  void (async () => {
    try {
      const url = (req.url ?? "/").split("?")[0] as string;
      if (url === "/_totals") {
        let busyMs = 0;
        let tokens = 0;
        let slotMs = 0;
        let idleMs = 0;
        for (const e of engines) {
          e.sync();
          idleMs += e.idleMs;
          busyMs += e.busyMs;
          tokens += e.tokens;
          slotMs += e.slotMs;
        }
        return sendJson(res, 200, { wallNowMs: Date.now(), busyMs, tokens, slotMs, idleMs, timerLateness: clock.lateness });
      }
      if (url === "/_stats") {
        return sendJson(res, 200, {
          ...stats,
          engines: engines.map((e) => ({
            busyMs: e.busyMs,
            tokens: e.tokens,
            loadMs: e.loadMs,
            version: e.version,
            isLoading: e.isLoading,
            firstDecodeWallMs: Object.fromEntries([...e.firstDecodeAt].map(([v, t]) => [v, clock.wallAt(t)])),
            firstRequestWallMs: Object.fromEntries([...e.firstRequestAt].map(([v, t]) => [v, clock.wallAt(t)])),
            firstFullWallMs: Object.fromEntries([...e.firstFullAt].map(([v, t]) => [v, clock.wallAt(t)])),
            loadsWallMs: e.loadsAt.map((l) => ({ version: l.version, askedAt: clock.wallAt(l.askedAt), doneAt: clock.wallAt(l.doneAt) })),
          })),
          occupancy,
          abortsWallMs,
          simNowMs: clock.now(),
          wallNowMs: Date.now(),
        });
      }
      if (url === "/_ports") return sendJson(res, 200, { ports: enginePorts });
      sendJson(res, 404, { error: { message: `no route ${url}: the engines listen on their own ports (GET /_ports)` } });
    } catch (err) {
      if (!res.headersSent) sendJson(res, 500, { error: { message: (err as Error).message } });
      else res.destroy();
    }
  })();
});

/** http_server.py health_generate, on the engine's clock (HEALTH_POLL_MS above). */
async function healthGenerate(e: SimEngine, res: ServerResponse): Promise<void> {
  stats.healthChecks++;
  const began = clock.now();
  for (;;) {
    const wait = Math.min(HEALTH_POLL_MS, Math.max(0, began + HEALTH_TIMEOUT_MS - clock.now()));
    await new Promise<void>((r) => clock.at(clock.now() + wait, r));
    if (e.hasOutputSince(began)) return void res.writeHead(200).end();
    if (clock.now() - began >= HEALTH_TIMEOUT_MS) {
      stats.healthBusy++;
      return void res.writeHead(503).end();
    }
  }
}

/** One engine's SGLang endpoints. */
async function serveEngine(e: SimEngine, path: string, req: IncomingMessage, res: ServerResponse): Promise<void> {
  if (req.method === "POST" && path === "/generate") return await generate(e, await readJson(req), res);
  if (req.method === "POST" && path === "/abort_request") {
    const b = await readJson(req);
    if (b.abort_all === true) {
      stats.abortAlls++;
      e.abortAll();
      return sendJson(res, 200, {});
    }
    stats.aborts++;
    abortsWallMs.push(Date.now());
    e.abort(String(b.rid));
    return sendJson(res, 200, {});
  }
  // pause_generation {mode} (io_struct.py PauseGenerationReqInput; scheduler.py pause_generation):
  // in_place keeps the running and waiting requests with their caches, making no tokens, and a load
  // from disk then starts at once (tokenizer_manager.py update_weights_from_disk: "Immediately update
  // the weights if the engine is in paused state", no model update lock). Only in_place is modelled.
  if (req.method === "POST" && path === "/pause_generation") {
    const b = await readJson(req);
    if (b.mode !== "in_place")
      return sendJson(res, 400, { error: { message: `the engine farm models pause_generation mode in_place only, not ${String(b.mode)}` } });
    stats.pauses++;
    e.pauseInPlace();
    return sendJson(res, 200, {});
  }
  if (req.method === "POST" && path === "/continue_generation") {
    e.resume();
    return sendJson(res, 200, {});
  }
  if (req.method === "POST" && path === "/update_weights_from_disk") {
    const b = await readJson(req);
    stats.loads++;
    await e.load(Number(b.weight_version));
    return sendJson(res, 200, { success: true, message: `loaded ${String(b.model_path)}`, num_paused_requests: 0 });
  }
  if (path === "/flush_cache") return sendJson(res, 200, {});
  if (path === "/health_generate" || path === "/health") return await healthGenerate(e, res);
  if (path === "/get_weight_version") return sendJson(res, 200, { weight_version: String(e.version) });
  if (path === "/get_model_info")
    return sendJson(res, 200, { model_path: "sim/8b", tokenizer_path: "sim/8b", is_generation: true, weight_version: String(e.version) });
  if (path === "/get_server_info")
    return sendJson(res, 200, { model_path: "sim/8b", weight_version: String(e.version), max_running_requests: p.maxRunning, version: "engine-farm" });
  sendJson(res, 404, { error: { message: `no route ${req.method} ${path}` } });
}

// Each engine also listens on its own port, as real engines are separate servers: a client's
// connection pool is per server (Node's http.Agent keeps and caps sockets per host:port), so one
// port for 64 engines would pool their connections as one. Idle connections close after 5 s, as
// SGLang's do (http_server.py launch_server: uvicorn.run(..., timeout_keep_alive=5)).
const enginePorts: number[] = [];
const engineServers = engines.map((e) => {
  const s = createServer((req, res) => {
    serveEngine(e, (req.url ?? "/").split("?")[0] as string, req, res).catch((err: unknown) => {
      if (!res.headersSent) sendJson(res, 500, { error: { message: (err as Error).message } });
      else res.destroy();
    });
  });
  s.keepAliveTimeout = 5_000;
  return s;
});
server.keepAliveTimeout = 60_000;
server.maxConnections = 100_000;
void (async () => {
  for (const s of engineServers) {
    await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
    enginePorts.push((s.address() as AddressInfo).port);
  }
  server.listen(Number(values.port), "127.0.0.1", () => process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`));
})();
process.on("SIGTERM", () => {
  for (const s of engineServers) {
    s.closeAllConnections();
    s.close();
  }
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
