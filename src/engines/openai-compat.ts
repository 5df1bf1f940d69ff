import { randomUUID } from "node:crypto";
import { z } from "zod";
import { generateRequestSchema, type GenerateRequest, type GenerateResult } from "./engine.ts";
import { bearer, callJson, EngineHttpError, isLocalCancel, postStream } from "./http.ts";
import { classifyProbe, type LogprobProbe } from "./logprob-check.ts";
import { abortedResult, EngineRequestError, emptyPartial, type GenerateHooks, type PartialOutput, type RemoteEngine } from "./remote.ts";
import { RlqError } from "../lib/errors.ts";
import { requestText } from "../lib/http-client.ts";

/**
 * An OpenAI-compatible completions server (vLLM), generation only.
 *
 * POST /v1/completions with the prompt as token ids, `logprobs: 1`,
 * `return_tokens_as_token_ids` (each logprobs.tokens entry reads
 * "token_id:<id>", so ids survive detokenisation) and `return_token_ids`
 * (newer vLLM also lists `token_ids` per choice), `include_stop_str_in_output`
 * (the stop text stays, like SGLang's no_stop_trim), streamed so that tokens
 * received before a failure are kept.
 *
 * vLLM's default server has no abort-by-id endpoint: closing the connection
 * aborts the request server-side (vllm/v1/engine/output_processor.py
 * abort_requests), so the pool cancels locally and keeps the streamed tokens.
 *
 * Refusals (test/integration/real-vllm.test.ts shows each on the real server):
 * vLLM checks a request before it generates and answers 400 with
 * `{"error": {"message", "type", "param", "code"}}`: a prompt longer than
 * --max-model-len (param input_tokens), max_tokens over it, a token id outside
 * the vocabulary, a sampling value out of range. That is the request's fault,
 * not the engine's: EngineRequestError, never retried, the sample fails with
 * vLLM's message. A prompt that fits but leaves less room than max_tokens is
 * not refused: vLLM generates what fits and finishes with "length". An error
 * once the stream began (a generation error) comes as a `data: {"error": ...}`
 * event in the 200 stream, then [DONE]; its `code` says whose fault it is.
 *
 * Versions are fenced by rlq: the server does not know rlq's weight versions.
 * Weights are loaded by the trainer or an operator, who reports the version;
 * `versionSource` reads the version of record (the lead wires it to the run's
 * synced version in Postgres), and `setVersion` records it in-process.
 *
 * Log-probs: vLLM's --logprobs-mode decides what `logprobs` are. raw_logprobs
 * (the default) is log softmax(z) before temperature: exact for rlq only at
 * temperature 1. processed_logprobs is after temperature AND top-k/top-p:
 * exact only with top_p = 1 and top_k disabled. The declared mode fills in
 * what the probe cannot tell; logprob-check.ts refuses incompatible sampling.
 */
const completionChoiceSchema = z
  .object({
    text: z.string().optional(),
    finish_reason: z.string().nullable().optional(),
    token_ids: z.array(z.number().int().nonnegative()).nullable().optional(),
    logprobs: z
      .object({
        tokens: z.array(z.string()).optional(),
        token_logprobs: z.array(z.number().nullable()).optional(),
      })
      .passthrough()
      .nullable()
      .optional(),
  })
  .passthrough();
export const completionChunkSchema = z.object({ choices: z.array(completionChoiceSchema) }).passthrough();
export type CompletionChoice = z.infer<typeof completionChoiceSchema>;

/** vllm/entrypoints/serve/engine/protocol.py ErrorResponse, as a stream event or a body. */
const errorEventSchema = z.object({ error: z.object({ message: z.string(), code: z.number().int().optional() }).passthrough() });

/** An error vLLM sent inside a 200 stream: 4xx the request's fault, else the server's (retriable, from scratch). */
function streamedError(event: z.infer<typeof errorEventSchema>, where: string): RlqError {
  const status = event.error.code ?? 500;
  const message = `${where}: the server failed the request with status ${status}: ${event.error.message}`;
  if (status >= 400 && status < 500) return new EngineRequestError(message);
  return new RlqError("engine_server_abort", message, { isRetriable: true });
}

/** A refusal before generation (HTTP 400/413/422) is the request's fault; other statuses keep their own meaning. */
function refusal(e: unknown, where: string): unknown {
  if (e instanceof EngineHttpError && (e.status === 400 || e.status === 413 || e.status === 422)) {
    return new EngineRequestError(`${where}: the server refused the request: ${e.message}`, { cause: e });
  }
  return e;
}

export type VllmLogprobsMode = "raw_logprobs" | "processed_logprobs";

/** Fold one choice (a streamed delta, or the whole answer) into `partial`; returns its finish reason, if any. */
export function applyCompletionChoice(partial: PartialOutput, choice: CompletionChoice, where: string): "stop" | "length" | "abort" | null {
  const lps = choice.logprobs?.token_logprobs ?? [];
  let ids = choice.token_ids ?? null;
  if (ids === null) {
    ids = (choice.logprobs?.tokens ?? []).map((t) => {
      const m = /^token_id:(\d+)$/.exec(t);
      if (!m)
        throw new RlqError(
          "engine_bad_response",
          `${where}: token ${JSON.stringify(t)} is not "token_id:<id>"; the server must honour return_tokens_as_token_ids`,
          { isRetriable: false },
        );
      return Number(m[1]);
    });
  }
  if (ids.length !== lps.length) {
    throw new RlqError("engine_bad_response", `${where}: ${ids.length} token id(s) but ${lps.length} log-prob(s)`, { isRetriable: true });
  }
  for (let i = 0; i < ids.length; i++) {
    const lp = lps[i];
    if (lp === null || lp === undefined) throw new RlqError("engine_bad_response", `${where}: a generated token has no log-prob`, { isRetriable: true });
    partial.tokenIds.push(ids[i] as number);
    partial.logProbs.push(Math.min(0, lp));
  }
  const fr = choice.finish_reason ?? null;
  if (fr === null) return null;
  if (fr === "stop" || fr === "length" || fr === "abort") return fr;
  throw new RlqError("engine_bad_response", `${where}: unknown finish_reason ${JSON.stringify(fr)}`, { isRetriable: true });
}

export interface OpenAiCompatOptions {
  /** Server root, e.g. http://host:8000 (the adapter adds /v1/...). */
  url: string;
  /** The served model name (vLLM --served-model-name). */
  model: string;
  requestTimeoutMs: number;
  /** vLLM --logprobs-mode the server was launched with. Default raw_logprobs (vLLM's default). */
  logprobsMode?: VllmLogprobsMode;
  /** Reads the version of record for the weights this server holds. Default: the in-process value. */
  versionSource?: () => Promise<number>;
  initialVersion?: number;
  adminTimeoutMs?: number;
  /** The server's --api-key: `Authorization: Bearer` on every call (vLLM checks every /v1 route). */
  apiKey?: string;
}

export interface OpenAiCompatEngine extends RemoteEngine {
  /** Record that the operator/trainer loaded `version` into this server. */
  setVersion(version: number): void;
}

export function createOpenAiCompatEngine(options: OpenAiCompatOptions): OpenAiCompatEngine {
  const url = options.url.replace(/\/+$/, "").replace(/\/v1$/, "");
  const adminMs = options.adminTimeoutMs ?? 10_000;
  const mode = options.logprobsMode ?? "raw_logprobs";
  let version = options.initialVersion ?? 0;
  const readVersion = async () => (options.versionSource ? await options.versionSource() : version);

  function body(req: GenerateRequest, isStream: boolean, overrides: Record<string, unknown> = {}) {
    const s = req.sampling;
    return {
      model: options.model,
      prompt: req.inputIds,
      max_tokens: s.maxNewTokens,
      temperature: s.temperature,
      top_p: s.topP,
      top_k: s.topK,
      ...(s.seed === undefined ? {} : { seed: s.seed }),
      ...(s.stop && s.stop.length > 0 ? { stop: s.stop } : {}),
      stop_token_ids: s.stopTokenIds,
      include_stop_str_in_output: true,
      skip_special_tokens: s.skipSpecialTokens ?? false,
      spaces_between_special_tokens: false,
      logprobs: 1,
      return_tokens_as_token_ids: true,
      return_token_ids: true,
      request_id: req.requestId,
      n: 1,
      stream: isStream,
      ...overrides,
    };
  }

  async function generateWith(request: GenerateRequest, hooks: GenerateHooks): Promise<GenerateResult> {
    const req = generateRequestSchema.parse(request);
    const where = `${url}/v1/completions (request ${req.requestId})`;
    // The version is read before generating: the fence guarantees it does not change under a request.
    const v = await readVersion();
    hooks.partial.weightVersion = v;
    let finish: "stop" | "length" | "abort" | null = null;
    try {
      await postStream(
        `${url}/v1/completions`,
        body(req, true),
        { timeoutMs: options.requestTimeoutMs, signal: hooks.signal, headers: bearer(options.apiKey) },
        (payload) => {
          if (typeof payload === "object" && payload !== null && "error" in payload) {
            const failed = errorEventSchema.safeParse(payload);
            if (failed.success) throw streamedError(failed.data, where);
          }
          const parsed = completionChunkSchema.safeParse(payload);
          if (!parsed.success)
            throw new RlqError("engine_bad_response", `${where}: unexpected answer: ${parsed.error.issues[0]?.message}`, { isRetriable: true });
          const choice = parsed.data.choices[0];
          if (choice) finish = applyCompletionChoice(hooks.partial, choice, where) ?? finish;
        },
      );
    } catch (e) {
      if (isLocalCancel(e, hooks.signal)) return abortedResult(hooks.partial, url, v);
      throw refusal(e, where);
    }
    if (finish === null) {
      if (hooks.signal?.aborted) return abortedResult(hooks.partial, url, v);
      throw new RlqError("engine_unreachable", `${where}: the stream ended without a finish_reason after ${hooks.partial.tokenIds.length} token(s)`, {
        isRetriable: true,
      });
    }
    return { tokenIds: [...hooks.partial.tokenIds], logProbs: [...hooks.partial.logProbs], finishReason: finish, weightVersion: v, engineId: url };
  }

  return {
    kind: "openai",
    id: url,
    url,
    canAbortById: false,
    canLoadWeights: false,
    generate: (request) => generateWith(request, { partial: emptyPartial() }),
    generateWith,
    // Closing the connection is vLLM's abort; the pool does that (canAbortById = false).
    async abort() {},
    async health(timeoutMs = adminMs) {
      try {
        const res = await requestText("GET", `${url}/health`, undefined, { timeoutMs, headers: bearer(options.apiKey) });
        return res.status >= 200 && res.status < 300;
      } catch {
        return false;
      }
    },
    weightVersion: readVersion,
    setVersion(v) {
      version = v;
    },
    async loadWeights(v) {
      throw new RlqError(
        "engine_cannot_load",
        `${url} is an OpenAI-compatible server: rlq does not load weights into it (version ${v}); use weight_sync: trainer_push and report the version`,
        { isRetriable: false },
      );
    },
    async checkServer() {
      const res = (await callJson("GET", `${url}/v1/models`, undefined, { timeoutMs: adminMs, headers: bearer(options.apiKey) })) as {
        data?: Array<{ id?: string }>;
      };
      const ids = (res.data ?? []).map((m) => m.id);
      if (!ids.includes(options.model)) {
        throw new RlqError("engine_model_missing", `${url} serves ${JSON.stringify(ids)}, not the configured model ${JSON.stringify(options.model)}`, {
          isRetriable: false,
        });
      }
    },
    async probeLogProbs(inputIds): Promise<LogprobProbe> {
      const run = async (temperature: number) => {
        const p = emptyPartial();
        const req: GenerateRequest = {
          requestId: `rlq-probe-${randomUUID()}`,
          inputIds: [...inputIds],
          sampling: { temperature, topP: 1, topK: 1, maxNewTokens: 8, stopTokenIds: [] },
        };
        const res = await callJson("POST", `${url}/v1/completions`, body(req, false, { ignore_eos: true }), {
          timeoutMs: options.requestTimeoutMs,
          headers: bearer(options.apiKey),
        });
        const choice = completionChunkSchema.parse(res).choices[0];
        if (choice) applyCompletionChoice(p, choice, `${url} probe`);
        return p;
      };
      const seen = classifyProbe(await run(1), await run(0.5));
      // What the probe cannot see, the declared --logprobs-mode says.
      return {
        isTemperatureScaled: seen.isTemperatureScaled ?? mode === "processed_logprobs",
        isBeforeTruncation: seen.isBeforeTruncation ?? mode === "raw_logprobs",
        detail: `${seen.detail}; declared --logprobs-mode ${mode}`,
      };
    },
    async close() {},
  };
}
