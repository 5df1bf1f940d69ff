/**
 * TEST FAKE — a protocol-faithful stand-in for an SGLang server, run as its
 * own process (never used by `npm run demo`). It speaks SGLang's native API:
 * POST /generate (input_ids, sampling_params, return_logprob, rid) answering
 * meta_info.output_token_logprobs as [logprob, token_id] pairs, finish_reason
 * and weight_version; POST /abort_request {rid}; POST
 * /update_weights_from_disk; GET /health_generate and /get_weight_version.
 * Tokens are a pure function of (sampling_seed, weight version, position,
 * previous token), so runs are reproducible. Printable bytes 32..126; EOS 257.
 *
 *   tsx test/fakes/fake-sglang.ts --port 0 [--token-delay-ms 2] [--stop-prob 0.08]
 * prints "listening <port>" on stdout.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "token-delay-ms": { type: "string", default: "0" },
    "stop-prob": { type: "string", default: "0.08" },
    "weight-version": { type: "string", default: "0" },
  },
});
const tokenDelayMs = Number(values["token-delay-ms"]);
const stopProb = Number(values["stop-prob"]);
let weightVersion = Number(values["weight-version"]);
const EOS = 257;
const live = new Map<string, { aborted: boolean }>();
let stats = { generate: 0, aborted: 0, loads: 0 };

function mix(...xs: number[]): number {
  let h = 0x9e3779b9;
  for (const x of xs) {
    h ^= x >>> 0;
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b) >>> 0;
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
    h ^= h >>> 16;
  }
  return (h >>> 0) / 4294967296;
}

async function body(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? (JSON.parse(text) as Record<string, unknown>) : {};
}

function send(res: ServerResponse, status: number, obj: unknown): void {
  const text = JSON.stringify(obj);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

async function generate(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const ids = b.input_ids as number[];
  const sp = (b.sampling_params ?? {}) as Record<string, unknown>;
  if (!Array.isArray(ids) || ids.length === 0) return send(res, 400, { error: { message: "input_ids required" } });
  if (b.return_logprob !== true) return send(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  const maxNew = Number(sp.max_new_tokens ?? 16);
  const seed = Number(sp.sampling_seed ?? 0);
  const stopIds = new Set((sp.stop_token_ids as number[] | undefined) ?? [EOS]);
  const rid = String(b.rid ?? Math.random());
  const state = { aborted: false };
  live.set(rid, state);
  stats.generate++;
  const version = weightVersion;
  const out: Array<[number, number, null]> = [];
  let finish: "stop" | "length" | "abort" = "length";
  let prev = ids[ids.length - 1] ?? 0;
  try {
    for (let i = 0; i < maxNew; i++) {
      if (tokenDelayMs > 0) await new Promise((r) => setTimeout(r, tokenDelayMs));
      if (state.aborted) {
        finish = "abort";
        break;
      }
      const pos = ids.length + i;
      const u = mix(seed, version, pos, prev);
      const isStop = i > 0 && mix(seed, version, pos, prev, 7) < stopProb;
      const tok = isStop ? EOS : 32 + Math.floor(u * 95);
      out.push([-(0.05 + mix(seed, pos, 3) * 2), tok, null]);
      prev = tok;
      if (stopIds.has(tok)) {
        finish = "stop";
        break;
      }
    }
  } finally {
    live.delete(rid);
  }
  if (finish === "abort") stats.aborted++;
  send(res, 200, {
    text: "",
    meta_info: { id: rid, output_token_logprobs: out, finish_reason: { type: finish }, weight_version: String(version), prompt_tokens: ids.length, completion_tokens: out.length },
  });
}

const server = createServer((req, res) => {
  void (async () => {
    try {
      const url = req.url ?? "/";
      if (req.method === "POST" && url === "/generate") return await generate(await body(req), res);
      if (req.method === "POST" && url === "/abort_request") {
        const b = await body(req);
        if (b.abort_all) return send(res, 400, { error: { message: "rlq must never abort_all" } });
        const s = live.get(String(b.rid));
        if (s) s.aborted = true;
        return send(res, 200, { success: true });
      }
      if (req.method === "POST" && url === "/update_weights_from_disk") {
        const b = await body(req);
        weightVersion = Number(b.weight_version);
        stats.loads++;
        return send(res, 200, { success: true, message: `loaded ${String(b.model_path)}` });
      }
      if (url === "/health_generate" || url === "/health") return send(res, 200, {});
      if (url === "/get_weight_version") return send(res, 200, { weight_version: String(weightVersion) });
      if (url === "/stats") return send(res, 200, { ...stats, live: live.size, weightVersion });
      send(res, 404, { error: { message: `no route ${req.method} ${url}` } });
    } catch (e) {
      send(res, 500, { error: { message: (e as Error).message } });
    }
  })();
});
server.listen(Number(values.port), "127.0.0.1", () => {
  process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
void stats;
