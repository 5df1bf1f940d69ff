/**
 * @file vLLM's token-in, token-out route, `POST /inference/v1/generate` (paths under vllm/:
 * entrypoints/scale_out/token_in_token_out/, served with `--enable-scale-out`). rlq generates
 * there where /v1/completions cannot serve a request as rlq means it:
 * - weight_update_mode in_place: the route's last chunk of a choice lists each token's weight
 *   version (protocol.py `GenerateStreamChoiceBase.weight_versions`; vllm-in-place.ts).
 * - images (multimodal_keys): /v1/completions takes token ids or text but no images
 *   (openai/completion/protocol.py CompletionRequest has no multimodal field), and the chat route
 *   renders the prompt again from messages instead of taking rlq's token ids. This route takes
 *   rlq's token ids with the images beside them as `content_parts` (protocol.py GenerateRequest:
 *   "Raw multimodal input; server resolves media"): serving.py `serve_tokens` loads each
 *   `{type: "image_url", url}` part (a `data:` URI is decoded in place), builds
 *   `TokensPrompt(prompt_token_ids, multi_modal_data)` and renders it with the model's own
 *   multimodal processor, which replaces each image placeholder token by one token per merged
 *   patch of that image (Qwen2-VL: model_executor/models/qwen2_vl.py `_get_prompt_updates`, a
 *   PromptReplacement of `<|image_pad|>`; multimodal/processing/processor.py
 *   `_maybe_apply_prompt_updates`). So the server expands rlq's placeholders exactly as SGLang
 *   does and as the trainer's processor does (workers/trainer-torch/rlq_torch/vlm.py), and the
 *   generated ids and log-probs are the response's, which rlq keeps as they come.
 */

import { z } from "zod";
import type { GenerateRequest, VersionSpan } from "./engine.ts";
import { callJson, EngineHttpError, postStream } from "./http.ts";
import { applyCompletionChoice, errorEventSchema, streamedError, type CompletionFinish } from "./openai-compat-choice.ts";
import { parseWeightVersion, type PartialOutput } from "./remote.ts";
import { RlqError } from "../lib/errors.ts";

/** One choice of a /inference/v1/generate stream chunk (token_in_token_out/protocol.py GenerateTokensStreamChoice). */
const generateChoiceSchema = z
  .object({
    finish_reason: z.string().nullable().optional(),
    token_ids: z.array(z.number().int().nonnegative()).nullable().optional(),
    logprobs: z
      .object({
        content: z
          .array(z.object({ token_id: z.number().int(), logprob: z.number() }).passthrough())
          .nullable()
          .optional(),
      })
      .nullable()
      .optional(),
    weight_versions: z
      .array(z.object({ version: z.union([z.string(), z.number()]), start: z.number().int().nonnegative(), end: z.number().int().nonnegative() }))
      .nullable()
      .optional(),
  })
  .passthrough();
const generateChunkSchema = z.object({ choices: z.array(generateChoiceSchema) }).passthrough();

/** The request id vLLM's engine knows a /inference/v1/generate request by (serving.py `serve_tokens` prefixes it). */
export function generateTokensRequestId(requestId: string): string {
  return `generate-tokens-${requestId}`;
}

/** The completions body's sampling keys that vllm/sampling_params.py SamplingParams takes under the same names. */
const SAMPLING_KEYS = [
  "max_tokens",
  "temperature",
  "top_p",
  "top_k",
  "seed",
  "stop",
  "stop_token_ids",
  "include_stop_str_in_output",
  "skip_special_tokens",
  "spaces_between_special_tokens",
  "ignore_eos",
  "repetition_detection",
  "logprobs",
] as const;

/**
 * The /inference/v1/generate body for `req` (protocol.py GenerateRequest), from the /v1/completions
 * body the adapter builds (its sampling keys move under `sampling_params`). The images go as
 * `content_parts`, in the order of their placeholders in `token_ids` (the processor pairs the k-th
 * placeholder with the k-th image).
 */
export function generateTokensBody(req: GenerateRequest, completion: Record<string, unknown>): Record<string, unknown> {
  const sampling: Record<string, unknown> = {};
  for (const k of SAMPLING_KEYS) if (completion[k] !== undefined) sampling[k] = completion[k];
  return {
    request_id: req.requestId,
    token_ids: req.inputIds,
    model: completion.model,
    sampling_params: sampling,
    ...(req.imageData?.length ? { content_parts: req.imageData.map((url) => ({ type: "image_url", url })) } : {}),
    stream: true,
    output_mode: "tokens",
  };
}

export interface GenerateTokensOutcome {
  /** The finish reason of the last chunk; null when the stream ended without one. */
  finish: CompletionFinish | null;
  /** The weight-version spans of the choice's last chunk, or null when it sent none. */
  spans: VersionSpan[] | null;
}

/**
 * Stream one /inference/v1/generate request into `partial`. An error event in the stream is read as
 * on /v1/completions (openai-compat-choice.ts streamedError); HTTP errors, local cancels and broken
 * connections are thrown as they come, for the caller to judge.
 */
export async function streamGenerateTokens(
  url: string,
  body: Record<string, unknown>,
  options: { timeoutMs: number; signal?: AbortSignal | undefined; headers?: Record<string, string> | undefined },
  partial: PartialOutput,
  where: string,
): Promise<GenerateTokensOutcome> {
  const out: GenerateTokensOutcome = { finish: null, spans: null };
  await postStream(`${url}/inference/v1/generate`, body, options, (payload) => {
    if (typeof payload === "object" && payload !== null && "error" in payload) {
      const failed = errorEventSchema.safeParse(payload);
      if (failed.success) throw streamedError(failed.data, where);
    }
    const parsed = generateChunkSchema.safeParse(payload);
    if (!parsed.success) throw new RlqError("engine_bad_response", `${where}: unexpected answer: ${parsed.error.issues[0]?.message}`, { isRetriable: true });
    const choice = parsed.data.choices[0];
    if (!choice) return;
    const content = choice.logprobs?.content ?? [];
    const asCompletion = {
      token_ids: choice.token_ids ?? content.map((c) => c.token_id),
      logprobs: { token_logprobs: content.map((c) => c.logprob) },
      finish_reason: choice.finish_reason ?? null,
    };
    out.finish = applyCompletionChoice(partial, asCompletion, where) ?? out.finish;
    if (choice.weight_versions) out.spans = choice.weight_versions.map((s) => ({ version: parseWeightVersion(s.version, where), start: s.start, end: s.end }));
  });
  return out;
}

/**
 * Refuse a server that does not serve /inference/v1/generate, saying `why` the engine needs it. An
 * empty body is answered 422 (validation) where the route is served, 403 where vLLM runs without
 * --enable-scale-out, and FastAPI's 404 where the version has no such route.
 */
export async function checkTokensRoute(url: string, options: { timeoutMs: number; headers?: Record<string, string> | undefined }, why: string): Promise<void> {
  try {
    await callJson("POST", `${url}/inference/v1/generate`, {}, options);
  } catch (e) {
    if (!(e instanceof EngineHttpError) || e.status === null) throw e;
    if (e.status === 403 || e.status === 404)
      throw new RlqError(
        "engine_cannot_load",
        `vLLM ${url}: ${why}; POST /inference/v1/generate ` +
          (e.status === 403
            ? "is served only when started with --enable-scale-out"
            : "is not served by this vLLM (0.32 or newer has it, with --enable-scale-out)") +
          ": start vLLM with --enable-scale-out",
        { cause: e, isRetriable: false },
      );
    if (e.status !== 400 && e.status !== 422) throw e;
  }
}
