/**
 * TEST FAKE — a stand-in for vLLM's OpenAI-compatible server (vLLM 0.32.0), run as its own
 * process. test/integration/real-vllm.test.ts sends the same requests to a real vLLM server and to
 * this fake and checks that they answer alike; the tests that need the fake at all are those that
 * need a fault on cue (the server dying mid-stream: /_fault "die"; a generation error inside a
 * stream: /_fault "stream_error"; slow tokens: --token-delay-ms), which the real server cannot be
 * made to show. Paths below are relative to the vllm package; each behaviour names its source.
 *
 * POST /v1/completions with `prompt` as token ids, `logprobs`, `return_tokens_as_token_ids`
 * (tokens read "token_id:<id>"), `return_token_ids` (choices carry `token_ids`), stop_token_ids,
 * ignore_eos, seed, top_k, repetition_detection (finish_reason "repetition"); `stream: true` sends
 * one chunk per token and `data: [DONE]`. A client
 * that disconnects aborts its request (vLLM's default server has no abort-by-id endpoint; dev mode
 * adds POST /abort_requests, not faked). GET /v1/models, /health, /metrics (the gauges and counters
 * of vLLM's that tests wait on), /stats (fake only: requests live now and the fewest tokens any of
 * them has generated). POST /_fault {mode: "die"|"stream_error"|"none", afterTokens}.
 * Tokens come from fake-lm.ts (token ids 0..257, EOS 257); --logprobs-mode
 * raw_logprobs|processed_logprobs picks what `logprobs` means, as vLLM's flag does.
 *
 *   tsx test/fakes/fake-vllm.ts --port 0 [--model fake/model] [--max-model-len 2048]
 *     [--token-delay-ms 0] [--logprobs-mode raw_logprobs] [--legacy-token-strings] [--api-key K]
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { EOS, sampleToken } from "./fake-lm.ts";
import { readJson, sendJson } from "./http-json.ts";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    model: { type: "string", default: "fake/model" },
    /** vLLM --max-model-len (its default is the model's max_position_embeddings). */
    "max-model-len": { type: "string", default: "2048" },
    "token-delay-ms": { type: "string", default: "0" },
    "stop-prob": { type: "string", default: "0.08" },
    "logprobs-mode": { type: "string", default: "raw_logprobs" },
    /** Older vLLM: no `token_ids` in choices, only "token_id:<id>" strings. */
    "legacy-token-strings": { type: "boolean", default: false },
    /** vLLM --api-key (see isAuthorized). */
    "api-key": { type: "string" },
  },
});
const tokenDelayMs = Number(values["token-delay-ms"]);
const stopProb = Number(values["stop-prob"]);
const maxModelLen = Number(values["max-model-len"]);
const mode = values["logprobs-mode"] === "processed_logprobs" ? "truncated" : "original";
const fault = { mode: "none", afterTokens: 0 };
/** Tokens generated so far by each live request (the /stats endpoint). */
const live = new Set<{ tokens: number }>();
/** vllm/v1/metrics/loggers.py PrometheusStatLogger: the series tests read. */
const metrics = { generationTokens: 0, success: { stop: 0, length: 0, abort: 0, error: 0, repetition: 0 } };
let created = 0;

/**
 * vllm/entrypoints/serve/middleware/authenticate.py AuthenticationMiddleware: with --api-key,
 * paths under GUARDED_PREFIX (/v1, /v2, /inference, /cohere) need `Authorization: <scheme> <key>`
 * with the scheme "bearer" in any case; OPTIONS and every other path (/health, /metrics) pass.
 * The refusal is 401 {"error": "Unauthorized"}, not vLLM's usual error shape.
 */
function isAuthorized(req: IncomingMessage, path: string): boolean {
  if (values["api-key"] === undefined || req.method === "OPTIONS") return true;
  if (!["/v1", "/v2", "/inference", "/cohere"].some((p) => path.startsWith(p))) return true;
  const [scheme, ...rest] = (req.headers.authorization ?? "").split(" ");
  return scheme?.toLowerCase() === "bearer" && rest.join(" ") === values["api-key"];
}

/**
 * vllm/entrypoints/openai/completion/protocol.py CompletionLogProbs: top_logprobs holds, per
 * token, the `logprobs` most likely tokens and the sampled one, keyed like `tokens`.
 */
function logprobsOf(ids: number[], lps: number[], tops: Array<Array<[number, number]>>, offset: number) {
  return {
    text_offset: ids.map((_, i) => offset + i),
    token_logprobs: lps,
    tokens: ids.map((t) => `token_id:${t}`),
    top_logprobs: ids.map((t, i) => Object.fromEntries([...(tops[i] ?? []).map(([lp, id]) => [`token_id:${id}`, lp]), [`token_id:${t}`, lps[i]]])),
  };
}

/**
 * vllm/v1/core/sched/utils.py check_sequence_repetition and _has_repeating_pattern: the output
 * ends with a pattern of min..max_pattern_size tokens repeated min_count times in a row.
 */
function isRepeating(ids: number[], p: { max_pattern_size?: unknown; min_pattern_size?: unknown; min_count?: unknown }): boolean {
  const maxSize = Number(p.max_pattern_size ?? 0);
  const minSize = Math.max(1, Number(p.min_pattern_size ?? 0));
  const minCount = Number(p.min_count ?? 0);
  if (maxSize <= 0 || minCount < 2 || minSize > maxSize) return false;
  for (let len = minSize; len <= maxSize; len++) {
    if (len * minCount > ids.length) return false;
    let isMatch = true;
    for (let n = 1; n <= len && isMatch; n++)
      for (let m = 1; m < minCount && isMatch; m++) if (ids[ids.length - (len * m + n)] !== ids[ids.length - n]) isMatch = false;
    if (isMatch) return true;
  }
  return false;
}

interface Turn {
  ids: number[];
  lps: number[];
  tops: Array<Array<[number, number]>>;
}

/** An error answer as vLLM gives it: vllm/entrypoints/serve/engine/protocol.py ErrorResponse. */
interface VllmError {
  status: number;
  type: string;
  message: string;
  param: string | null;
}

/**
 * vllm/exceptions.py VLLMValidationError.__str__: the message ends "(parameter=P, value=V)";
 * vllm/entrypoints/serve/exception_handling/error_response.py create_error_response makes it a
 * 400 BadRequestError with `param` = P.
 */
function validationError(message: string, param: string, value: unknown): VllmError {
  return { status: 400, type: "BadRequestError", message: `${message} (parameter=${param}, value=${String(value)})`, param };
}
/** A plain ValueError: create_error_response's fallback, 400 BadRequestError, param null. */
function valueError(message: string): VllmError {
  return { status: 400, type: "BadRequestError", message, param: null };
}

/** Token ids the fake's model knows: the byte tokenizer's 0..255, BOS 256, EOS 257. */
const VOCAB_SIZE = EOS + 1;
/** vllm/config/model.py ModelConfig.max_logprobs default. */
const MAX_LOGPROBS = 20;

/**
 * The checks vLLM makes before it generates, in its order
 * (vllm/entrypoints/openai/completion/serving.py _create_completion):
 * 1. serve/engine/serving.py _check_model: an unknown model is 404 NotFoundError, param "model".
 * 2. renderers/params.py TokenizeParams.__post_init__: max_tokens > max_model_len is 400.
 * 3. renderers/base.py render_prompts: no prompt is 400; validate_token_ids: an id outside the
 *    vocabulary is 400; renderers/params.py _token_len_check: a prompt longer than max_model_len
 *    is 400 (param input_tokens).
 * 4. serve/utils/api_utils.py get_max_tokens: max_tokens is CLAMPED to max_model_len - prompt
 *    length, with no error: a request that asks for more than fits gets fewer tokens, finish
 *    "length". A prompt of exactly max_model_len leaves 0, refused by step 5.
 * 5. sampling_params.py SamplingParams._verify_args and _validate_logprobs: temperature in [0, 2],
 *    top_p in (0, 1], top_k >= -1, max_tokens >= 1, logprobs <= max_logprobs (20).
 * The fake also refuses what rlq never sends (a text prompt, no `logprobs`), which vLLM accepts.
 */
function checkRequest(b: Record<string, unknown>): VllmError | { prompt: number[]; maxTokens: number } {
  if (b.model !== undefined && b.model !== values.model)
    return {
      status: 404,
      type: "NotFoundError",
      message: `The model \`${typeof b.model === "string" ? b.model : JSON.stringify(b.model)}\` does not exist. Valid aliases: ${values.model}.`,
      param: "model",
    };
  const requested = b.max_tokens === undefined || b.max_tokens === null ? 16 : Number(b.max_tokens);
  if (requested > maxModelLen)
    return validationError(
      `max_tokens=${requested} cannot be greater than max_model_len=${maxModelLen}. Please request fewer output tokens.`,
      "max_tokens",
      requested,
    );
  const prompt = b.prompt;
  if (Array.isArray(prompt) && prompt.length === 0) return valueError("You must pass at least one prompt");
  if (!Array.isArray(prompt) || !prompt.every((t) => Number.isInteger(t))) return valueError("fake-vllm: rlq sends the prompt as token ids");
  const ids = prompt as number[];
  if (Math.min(...ids) < 0) return valueError(`Token id ${Math.min(...ids)} is out of vocabulary`);
  if (Math.max(...ids) >= VOCAB_SIZE) return valueError(`Token id ${Math.max(...ids)} is out of vocabulary`);
  if (ids.length > maxModelLen)
    return validationError(
      `This model's maximum context length is ${maxModelLen} tokens. However, your prompt contains ${ids.length} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.`,
      "input_tokens",
      ids.length,
    );
  const maxTokens = Math.min(requested, maxModelLen - ids.length);
  const temperature = Number(b.temperature ?? 1);
  const topP = Number(b.top_p ?? 1);
  const topK = Number(b.top_k ?? 0);
  if (temperature < 0 || temperature > 2) return validationError(`temperature must be in [0, 2], got ${temperature}.`, "temperature", temperature);
  if (!(topP > 0 && topP <= 1)) return validationError(`top_p must be in (0, 1], got ${topP}.`, "top_p", topP);
  if (topK < -1) return valueError(`top_k must be 0 (disable), or at least 1, got ${topK}.`);
  if (maxTokens < 1) return validationError(`max_tokens must be at least 1, got ${maxTokens}.`, "max_tokens", maxTokens);
  if (typeof b.logprobs !== "number") return valueError("fake-vllm: rlq always asks for logprobs");
  if (b.logprobs > MAX_LOGPROBS)
    return validationError(`Requested sample logprobs of ${b.logprobs}, which is greater than max allowed: ${MAX_LOGPROBS}`, "logprobs", b.logprobs);
  return { prompt: ids, maxTokens };
}

function sendError(res: ServerResponse, e: VllmError): void {
  sendJson(res, e.status, { error: { message: e.message, type: e.type, param: e.param, code: e.status } });
}

async function completions(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const checked = checkRequest(b);
  if ("status" in checked) return sendError(res, checked);
  const { prompt, maxTokens } = checked;
  const withIds = b.return_token_ids === true && !values["legacy-token-strings"];
  const isStream = b.stream === true;
  const seed = Number(b.seed ?? 0);
  const temperature = Number(b.temperature ?? 1);
  const topP = Number(b.top_p ?? 1);
  const topK = Number(b.top_k ?? -1);
  const nLogprobs = Number(b.logprobs);
  const ignoreEos = b.ignore_eos === true;
  const stopIds = new Set((b.stop_token_ids as number[] | undefined) ?? []);
  // vllm/entrypoints/serve/engine/serving.py _base_request_id: the request's id, else a random one.
  const id = `cmpl-${typeof b.request_id === "string" ? b.request_id : `fake${(created++).toString(16)}`}`;
  let isGone = false;
  const entry = { tokens: 0 };
  live.add(entry);
  res.on("close", () => {
    live.delete(entry);
    // vllm/v1/engine/output_processor.py abort_requests drops an aborted request without the
    // finished-request stats; the real server was also seen counting one under
    // finished_reason="abort" (real-vllm.test.ts counts only stop and length). The fake counts none.
    if (!res.writableFinished) isGone = true;
  });
  const out: Turn = { ids: [], lps: [], tops: [] };
  let finish = "length";
  let stopReason: number | string | null = null;
  const repetition = typeof b.repetition_detection === "object" && b.repetition_detection !== null ? (b.repetition_detection as Record<string, unknown>) : null;
  let prev = prompt[prompt.length - 1] ?? 0;
  let sent = 0;
  if (isStream) res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8" });
  // vllm/entrypoints/openai/completion/serving.py completion_stream_generator: one chunk per
  // engine step, dumped with exclude_unset (the fields below); prompt_token_ids on the first chunk
  // only; system_fingerprint on the last.
  const chunk = (finishReason: string | null) => {
    const n = out.ids.length;
    const choice = {
      index: 0,
      text: "",
      logprobs: logprobsOf(out.ids.slice(sent, n), out.lps.slice(sent, n), out.tops.slice(sent, n), sent),
      finish_reason: finishReason,
      stop_reason: finishReason === null ? null : stopReason,
      prompt_token_ids: sent === 0 && withIds ? prompt : null,
      ...(values["legacy-token-strings"] ? {} : { token_ids: withIds ? out.ids.slice(sent, n) : null }),
    };
    sent = n;
    const body = { id, object: "text_completion", created: 0, model: values.model, choices: [choice] };
    return `data: ${JSON.stringify(finishReason === null ? body : { ...body, system_fingerprint: "fake-vllm" })}\n\n`;
  };
  for (let i = 0; i < maxTokens; i++) {
    if (tokenDelayMs > 0) await new Promise((r) => setTimeout(r, tokenDelayMs));
    if (isGone) return;
    const { token, logProb, top } = sampleToken({
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
      topN: nLogprobs,
    });
    out.ids.push(token);
    out.lps.push(logProb);
    out.tops.push(top);
    entry.tokens = out.ids.length;
    metrics.generationTokens++;
    prev = token;
    if (fault.mode === "die" && out.ids.length >= fault.afterTokens) process.exit(1);
    if (fault.mode === "stream_error" && isStream && out.ids.length >= fault.afterTokens) {
      // completion_stream_generator: a GenerationError (finish_reason "error" from the engine) is
      // sent as an error event in the 200 stream, then [DONE] (generate/base/serving.py
      // _convert_generation_error_to_streaming_response).
      metrics.success.error++;
      res.write(`data: ${JSON.stringify({ error: { message: "Internal server error", type: "InternalServerError", param: null, code: 500 } })}\n\n`);
      res.end("data: [DONE]\n\n");
      return;
    }
    // vllm/v1/core/sched/utils.py check_stop: EOS (unless ignore_eos) stops with stop_reason null,
    // a stop_token_ids entry with stop_reason = that id; the stop token is kept in token_ids.
    if (token === EOS && !ignoreEos) {
      finish = "stop";
      break;
    }
    if (stopIds.has(token)) {
      finish = "stop";
      stopReason = token;
      break;
    }
    // check_stop, after the stop and length checks: a detected repetition ends the request with
    // finish_reason "repetition" and stop_reason "repetition_detected".
    if (repetition !== null && i + 1 < maxTokens && isRepeating(out.ids, repetition)) {
      finish = "repetition";
      stopReason = "repetition_detected";
      break;
    }
    if (isStream && i + 1 < maxTokens) res.write(chunk(null));
  }
  metrics.success[finish as "stop" | "length" | "repetition"]++;
  if (isStream) {
    res.write(chunk(finish));
    res.end("data: [DONE]\n\n");
    return;
  }
  // completion/serving.py request_output_to_completion_response: CompletionResponse.model_dump().
  sendJson(res, 200, {
    id,
    object: "text_completion",
    created: 0,
    model: values.model,
    choices: [
      {
        index: 0,
        text: "",
        logprobs: logprobsOf(out.ids, out.lps, out.tops, 0),
        finish_reason: finish,
        stop_reason: stopReason,
        ...(values["legacy-token-strings"] ? {} : { token_ids: withIds ? out.ids : null }),
        prompt_logprobs: null,
        prompt_token_ids: withIds ? prompt : null,
        routed_experts: null,
      },
    ],
    service_tier: null,
    system_fingerprint: "fake-vllm",
    usage: {
      prompt_tokens: prompt.length,
      total_tokens: prompt.length + out.ids.length,
      completion_tokens: out.ids.length,
      prompt_tokens_details: null,
      completion_tokens_details: null,
    },
    kv_transfer_params: null,
    ec_transfer_params: null,
    metrics: null,
  });
}

/** vllm/v1/metrics/loggers.py PrometheusStatLogger, the series tests wait on, in Prometheus text. */
function prometheusText(): string {
  const labels = `engine="0",model_name="${values.model}"`;
  const lines = [
    `vllm:num_requests_running{${labels}} ${live.size}.0`,
    `vllm:num_requests_waiting{${labels}} 0.0`,
    `vllm:generation_tokens_total{${labels}} ${metrics.generationTokens}.0`,
    ...Object.entries(metrics.success).map(
      ([reason, n]) => `vllm:request_success_total{engine="0",finished_reason="${reason}",model_name="${values.model}"} ${n}.0`,
    ),
  ];
  return `${lines.join("\n")}\n`;
}

const server = createServer((req, res) => {
  void (async () => {
    try {
      const url = (req.url ?? "/").split("?")[0] ?? "/";
      if (!isAuthorized(req, url)) return sendJson(res, 401, { error: "Unauthorized" });
      if (req.method === "POST" && url === "/v1/completions") return await completions(await readJson(req), res);
      // vllm/entrypoints/openai/models/protocol.py ModelCard (the fields rlq reads and max_model_len).
      if (url === "/v1/models")
        return sendJson(res, 200, { object: "list", data: [{ id: values.model, object: "model", owned_by: "vllm", max_model_len: maxModelLen }] });
      // vllm/entrypoints/serve/instrumentator/health.py health: 200 with an empty body.
      if (url === "/health") return void res.writeHead(200, { "content-length": 0 }).end();
      if (url === "/metrics") return void res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" }).end(prometheusText());
      if (url === "/stats") return sendJson(res, 200, { live: live.size, liveMinTokens: Math.min(...[...live].map((x) => x.tokens)) });
      if (req.method === "POST" && url === "/_fault") {
        const b = await readJson(req);
        fault.mode = typeof b.mode === "string" ? b.mode : "none";
        fault.afterTokens = Number(b.afterTokens ?? 0);
        sendJson(res, 200, { ok: true });
        if (fault.mode === "die" && fault.afterTokens === 0) setTimeout(() => process.exit(1), 10);
        return;
      }
      // FastAPI's own 404 for a route that does not exist.
      sendJson(res, 404, { detail: "Not Found" });
    } catch (e) {
      if (!res.headersSent) sendJson(res, 500, { error: { message: (e as Error).message, type: "InternalServerError", param: null, code: 500 } });
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
