/**
 * @file One choice of a vLLM completion answer (a streamed delta, or the whole answer) folded into
 * a request's partial output: the parsing /v1/completions and /inference/v1/generate share
 * (openai-compat.ts, vllm-generate-tokens.ts).
 */

import { z } from "zod";
import { EngineHttpError } from "./http.ts";
import { EngineRequestError, type PartialOutput } from "./remote.ts";
import { RlqError } from "../lib/errors.ts";

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
export const errorEventSchema = z.object({ error: z.object({ message: z.string(), code: z.number().int().optional() }).passthrough() });

/**
 * An error vLLM sent inside a 200 stream. 4xx: the request's fault. 5xx: the server's, and
 * retryable as vLLM means it: a generation whose engine output says finish_reason "error" (a
 * request-level internal error such as a failed KV load, v1/engine/__init__.py FinishReason.ERROR,
 * "always converted to 500") becomes GenerationError, 500 (generate/base/serving.py
 * _raise_if_error), and RetryableRequestError is 503 (vllm/exceptions.py); either is sent as this
 * event (completion/serving.py completion_stream_generator). An HTTP 5xx answer is what the pool
 * treats it as: the tokens streamed before it are kept as a resumable partial, else the request is
 * retried, on another engine first.
 */
export function streamedError(event: z.infer<typeof errorEventSchema>, where: string): RlqError {
  const status = event.error.code ?? 500;
  const message = `${where}: the server failed the request with status ${status}: ${event.error.message}`;
  if (status >= 400 && status < 500) return new EngineRequestError(message);
  return new EngineHttpError("engine_http_error", message, { isRetriable: true, status });
}

/** What a choice's finish_reason says, in rlq's terms; "repetition" is a stop whose reason is recorded. */
export type CompletionFinish = "stop" | "length" | "abort" | "repetition";

/**
 * Fold one choice (a streamed delta, or the whole answer) into `partial`; returns its finish reason,
 * if any. vLLM's reasons are v1/engine/__init__.py FINISH_REASON_STRINGS: "repetition" ends a sample
 * whose output repeats itself (the request's repetition_detection, v1/core/sched/utils.py
 * check_stop): the sample is complete, as at a stop. "error" never reaches a completions client
 * from vLLM (it is turned into a 500 error event first); from another server it is read as vLLM
 * means it, a retryable server error after the tokens so far.
 */
export function applyCompletionChoice(partial: PartialOutput, choice: CompletionChoice, where: string): CompletionFinish | null {
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
  if (fr === "stop" || fr === "length" || fr === "abort" || fr === "repetition") return fr;
  if (fr === "error")
    throw new EngineHttpError("engine_http_error", `${where}: finish_reason "error" (a request-level server error) after ${partial.tokenIds.length} token(s)`, {
      isRetriable: true,
      status: 500,
    });
  throw new RlqError("engine_bad_response", `${where}: unknown finish_reason ${JSON.stringify(fr)}`, { isRetriable: true });
}
