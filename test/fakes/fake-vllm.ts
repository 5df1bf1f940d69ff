/**
 * TEST FAKE — a stand-in for vLLM's OpenAI-compatible server, run as its own
 * process. POST /v1/completions with `prompt` as token ids, `logprobs`,
 * `return_tokens_as_token_ids` (tokens read "token_id:<id>"), `return_token_ids`
 * (choices carry `token_ids`), stop_token_ids, seed, top_k; `stream: true`
 * sends delta chunks (vLLM's DELTA output kind) and `data: [DONE]`. A client
 * that disconnects aborts its request (vLLM has no abort endpoint).
 * GET /v1/models, /health, /stats (fake only: requests live now and the fewest
 * tokens any of them has generated, so tests wait for tokens instead of time).
 * POST /_fault {mode: "die"|"none"}.
 * Tokens come from fake-lm.ts; --logprobs-mode raw_logprobs|processed_logprobs
 * picks what `logprobs` means, as vLLM's flag does.
 *
 *   tsx test/fakes/fake-vllm.ts --port 0 [--model fake/model] [--token-delay-ms 0]
 *     [--logprobs-mode raw_logprobs] [--legacy-token-strings]
 */
import { createServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { EOS, sampleToken } from "./fake-lm.ts";
import { readJson, sendJson } from "./http-json.ts";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    model: { type: "string", default: "fake/model" },
    "token-delay-ms": { type: "string", default: "0" },
    "stop-prob": { type: "string", default: "0.08" },
    "logprobs-mode": { type: "string", default: "raw_logprobs" },
    /** Older vLLM: no `token_ids` in choices, only "token_id:<id>" strings. */
    "legacy-token-strings": { type: "boolean", default: false },
    /**
     * vLLM --api-key: every /v1 route answers 401 without `Authorization: Bearer <key>`
     * (vllm/entrypoints/openai/server_utils.py in newer vLLM, api_server.py before:
     * AuthenticationMiddleware lets OPTIONS and every path not under /v1 through, so /health and
     * /metrics are not checked; seen quoted, not re-read at a commit).
     */
    "api-key": { type: "string" },
  },
});
const tokenDelayMs = Number(values["token-delay-ms"]);
const stopProb = Number(values["stop-prob"]);
const mode = values["logprobs-mode"] === "processed_logprobs" ? "truncated" : "original";
let dieAfterTokens = -1;
/** Tokens generated so far by each live request (the /stats endpoint). */
const live = new Set<{ tokens: number }>();

function choice(ids: number[], lps: number[], finish: string | null, withIds: boolean) {
  return {
    index: 0,
    text: "",
    logprobs: { tokens: ids.map((t) => `token_id:${t}`), token_logprobs: lps, top_logprobs: ids.map(() => null), text_offset: ids.map(() => 0) },
    finish_reason: finish,
    stop_reason: null,
    ...(withIds ? { token_ids: ids } : {}),
  };
}

async function completions(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (b.model !== values.model) return sendJson(res, 404, { error: { message: `The model \`${String(b.model)}\` does not exist.` } });
  const prompt = b.prompt as number[];
  if (!Array.isArray(prompt) || prompt.length === 0 || typeof prompt[0] !== "number")
    return sendJson(res, 400, { error: { message: "prompt must be token ids" } });
  if (typeof b.logprobs !== "number") return sendJson(res, 400, { error: { message: "rlq always asks for logprobs" } });
  const withIds = b.return_token_ids === true && !values["legacy-token-strings"];
  const isStream = b.stream === true;
  const maxNew = Number(b.max_tokens ?? 16);
  const seed = Number(b.seed ?? 0);
  const temperature = Number(b.temperature ?? 1);
  const topP = Number(b.top_p ?? 1);
  const topK = Number(b.top_k ?? -1);
  const ignoreEos = b.ignore_eos === true;
  const stopIds = new Set((b.stop_token_ids as number[] | undefined) ?? []);
  if (!ignoreEos) stopIds.add(EOS);
  let isGone = false;
  const entry = { tokens: 0 };
  live.add(entry);
  res.on("close", () => {
    live.delete(entry);
    if (!res.writableFinished) isGone = true;
  });
  const ids: number[] = [];
  const lps: number[] = [];
  let finish = "length";
  let prev = prompt[prompt.length - 1] ?? 0;
  let sent = 0;
  if (isStream) res.writeHead(200, { "content-type": "text/event-stream" });
  const chunk = (finishReason: string | null) => {
    const out = {
      id: `cmpl-${typeof b.request_id === "string" ? b.request_id : "x"}`,
      object: "text_completion",
      created: 0,
      model: values.model,
      choices: [choice(ids.slice(sent), lps.slice(sent), finishReason, withIds)],
    };
    sent = ids.length;
    return `data: ${JSON.stringify(out)}\n\n`;
  };
  for (let i = 0; i < maxNew; i++) {
    if (tokenDelayMs > 0) await new Promise((r) => setTimeout(r, tokenDelayMs));
    if (isGone) return;
    const { token, logProb } = sampleToken({
      seed,
      version: 0,
      position: prompt.length + i,
      prev,
      temperature,
      topP,
      topK,
      stopProb,
      isEosAllowed: i > 0 && !ignoreEos,
      mode,
    });
    ids.push(token);
    lps.push(logProb);
    entry.tokens = ids.length;
    prev = token;
    if (dieAfterTokens >= 0 && ids.length >= dieAfterTokens) process.exit(1);
    if (stopIds.has(token)) {
      finish = "stop";
      break;
    }
    if (isStream && i + 1 < maxNew) res.write(chunk(null));
  }
  if (isStream) {
    res.write(chunk(finish));
    res.end("data: [DONE]\n\n");
    return;
  }
  sendJson(res, 200, {
    id: "cmpl-x",
    object: "text_completion",
    created: 0,
    model: values.model,
    choices: [choice(ids, lps, finish, withIds)],
    usage: { prompt_tokens: prompt.length, completion_tokens: ids.length, total_tokens: prompt.length + ids.length },
  });
}

const server = createServer((req, res) => {
  void (async () => {
    try {
      const url = (req.url ?? "/").split("?")[0];
      if (values["api-key"] !== undefined && (url ?? "").startsWith("/v1") && req.headers.authorization !== `Bearer ${values["api-key"]}`) {
        return sendJson(res, 401, { error: "Unauthorized" });
      }
      if (req.method === "POST" && url === "/v1/completions") return await completions(await readJson(req), res);
      if (url === "/v1/models") return sendJson(res, 200, { object: "list", data: [{ id: values.model, object: "model" }] });
      if (url === "/health") return sendJson(res, 200, {});
      if (url === "/stats") return sendJson(res, 200, { live: live.size, liveMinTokens: Math.min(...[...live].map((x) => x.tokens)) });
      if (req.method === "POST" && url === "/_fault") {
        const b = await readJson(req);
        dieAfterTokens = b.mode === "die" ? Number(b.afterTokens ?? 0) : -1;
        sendJson(res, 200, { ok: true });
        if (dieAfterTokens === 0) setTimeout(() => process.exit(1), 10);
        return;
      }
      sendJson(res, 404, { error: { message: `no route ${req.method} ${url}` } });
    } catch (e) {
      if (!res.headersSent) sendJson(res, 500, { error: { message: (e as Error).message } });
      else res.destroy();
    }
  })();
});
server.listen(Number(values.port), "127.0.0.1", () => {
  process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`);
});
process.on("SIGTERM", () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
