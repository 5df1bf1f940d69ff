/**
 * The on-policy-distillation teacher: an inference server asked for prefill only, the log-prob of
 * each given token under the teacher (no token is generated). One sample per call.
 *
 * - sglang: POST /generate {input_ids, sampling_params: {max_new_tokens: 0}, return_logprob: true,
 *   logprob_start_len: 0}, as slime's teacher call (slime/rollout/on_policy_distillation.py
 *   `_build_payload`); `meta_info.input_token_logprobs` is [[logprob, token_id, text], ...] with a
 *   null log-prob at position 0 (sglang srt/managers/scheduler_output_processor_mixin.py
 *   `_process_input_token_logprobs`), and slime keeps its last response_length entries after dropping
 *   the first (`post_process_rewards`).
 * - vllm: POST /v1/completions {prompt: token ids, max_tokens: 1, prompt_logprobs: 0}; vLLM's
 *   `choices[0].prompt_logprobs` is one {token_id: {logprob, rank, decoded_token}} per prompt
 *   position, null at 0, and with 0 extra it holds the prompt's own token
 *   (vllm/entrypoints/openai/completion/serving.py, vllm/v1/engine/logprobs.py
 *   `_update_prompt_logprobs`). max_tokens is 1 because vLLM refuses 0
 *   (vllm/sampling_params.py `_verify_args`: "max_tokens must be at least 1").
 *
 * The temperature is 1: the teacher's log-probs are log softmax(z) over the full vocabulary, the
 * distribution the student's log π (at rollout_temperature 1) is compared with.
 */

import { z } from "zod";
import type { OpdTeacher } from "../config/opd.ts";
import { RlqError, isRetriable } from "../lib/errors.ts";
import { callJson, EngineHttpError } from "./http.ts";

export interface TeacherRequest {
  /** Prompt tokens followed by the response tokens, as the student sampled them. */
  tokens: readonly number[];
  promptLength: number;
}

export interface TeacherEngine {
  readonly url: string;
  /** `[responseLength]` the teacher's log-prob of each response token. */
  logProbs(request: TeacherRequest, signal?: AbortSignal): Promise<Float32Array>;
}

const sglangAnswer = z.object({
  meta_info: z.object({ input_token_logprobs: z.array(z.tuple([z.number().nullable(), z.number().int()]).rest(z.unknown())) }),
});
const vllmAnswer = z.object({
  choices: z.array(z.object({ prompt_logprobs: z.array(z.record(z.string(), z.object({ logprob: z.number() })).nullable()) })).min(1),
});
const vllmModels = z.object({ data: z.array(z.object({ id: z.string() })).min(1) });

function badAnswer(url: string, what: string): EngineHttpError {
  return new EngineHttpError("engine_bad_response", `OPD teacher ${url}: ${what}`, { isRetriable: true });
}

function parseOrThrow<T>(schema: z.ZodType<T>, body: unknown, url: string): T {
  const r = schema.safeParse(body);
  if (!r.success) throw badAnswer(url, `unexpected answer shape: ${r.error.issues[0]?.message ?? "?"} at ${r.error.issues[0]?.path.join(".") ?? "?"}`);
  return r.data;
}

/** The response positions' log-probs from per-position (token id, log-prob) pairs of the whole sequence; checks the ids. */
export function responseLogProbs(
  url: string,
  req: TeacherRequest,
  byPosition: ReadonlyArray<{ tokenId: number; logProb: number | null } | null>,
): Float32Array {
  if (byPosition.length !== req.tokens.length) throw badAnswer(url, `${byPosition.length} positions for ${req.tokens.length} tokens`);
  const n = req.tokens.length - req.promptLength;
  const out = new Float32Array(n);
  for (let t = 0; t < n; t++) {
    const pos = req.promptLength + t;
    const p = byPosition[pos];
    if (p === null || p === undefined || p.logProb === null) throw badAnswer(url, `no log-prob at position ${pos}`);
    if (p.tokenId !== req.tokens[pos]) throw badAnswer(url, `position ${pos} is token ${p.tokenId}, expected ${req.tokens[pos]}`);
    out[t] = p.logProb;
  }
  return out;
}

class SglangTeacher implements TeacherEngine {
  constructor(
    readonly url: string,
    private readonly timeoutMs: number,
  ) {}
  async logProbs(req: TeacherRequest, signal?: AbortSignal): Promise<Float32Array> {
    const body = {
      input_ids: req.tokens,
      sampling_params: { temperature: 1, max_new_tokens: 0, skip_special_tokens: false },
      return_logprob: true,
      logprob_start_len: 0,
    };
    const ans = parseOrThrow(
      sglangAnswer,
      await callJson("POST", `${this.url}/generate`, body, { timeoutMs: this.timeoutMs, ...(signal && { signal }) }),
      this.url,
    );
    return responseLogProbs(
      this.url,
      req,
      ans.meta_info.input_token_logprobs.map(([logProb, tokenId]) => ({ tokenId, logProb })),
    );
  }
}

class VllmTeacher implements TeacherEngine {
  private model: string | null;
  constructor(
    readonly url: string,
    model: string | null,
    private readonly timeoutMs: number,
  ) {
    this.model = model;
  }
  async logProbs(req: TeacherRequest, signal?: AbortSignal): Promise<Float32Array> {
    const opts = { timeoutMs: this.timeoutMs, ...(signal && { signal }) };
    this.model ??= parseOrThrow(vllmModels, await callJson("GET", `${this.url}/v1/models`, undefined, opts), this.url).data[0]?.id ?? null;
    const body = { model: this.model, prompt: req.tokens, max_tokens: 1, temperature: 1, prompt_logprobs: 0 };
    const ans = parseOrThrow(vllmAnswer, await callJson("POST", `${this.url}/v1/completions`, body, opts), this.url);
    const positions = (ans.choices[0]?.prompt_logprobs ?? []).map((entry, i) => {
      if (entry === null) return null;
      const own = entry[String(req.tokens[i])];
      return own === undefined ? null : { tokenId: req.tokens[i] as number, logProb: own.logprob };
    });
    return responseLogProbs(this.url, req, positions);
  }
}

export function createTeacher(config: OpdTeacher): TeacherEngine {
  const url = config.url.replace(/\/+$/, "");
  const timeoutMs = config.request_timeout_s * 1000;
  return config.kind === "sglang" ? new SglangTeacher(url, timeoutMs) : new VllmTeacher(url, config.model, timeoutMs);
}

/**
 * The teacher's log-probs for one sample, waiting out a teacher that is down, restarting or
 * overloaded (every retriable engine error), with backoff capped at `maxBackoffMs`, for at most
 * `waitMs`. The sample is never failed for its teacher: past `waitMs` the error is thrown retriable,
 * so the reward job is retried by its queue and the sample keeps waiting. A non-retriable error (a
 * bad answer that names the fault is retriable; 401 or a 4xx refusal is not) is thrown at once.
 */
export async function teacherLogProbsWaiting(
  teacher: TeacherEngine,
  req: TeacherRequest,
  opts: { waitMs: number; maxBackoffMs?: number; sleep?: (ms: number) => Promise<void>; now?: () => number; onRetry?: (e: unknown, attempt: number) => void },
): Promise<Float32Array> {
  const sleep = opts.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const now = opts.now ?? Date.now;
  const start = now();
  for (let attempt = 0; ; attempt++) {
    try {
      return await teacher.logProbs(req);
    } catch (e) {
      if (!isRetriable(e)) throw e;
      if (now() - start >= opts.waitMs) {
        throw new RlqError("engine_request_failed", `OPD teacher ${teacher.url}: no log-probs after waiting ${Math.round((now() - start) / 1000)} s`, {
          cause: e,
          isRetriable: true,
        });
      }
      opts.onRetry?.(e, attempt);
      await sleep(Math.min(opts.maxBackoffMs ?? 2000, 100 * 2 ** attempt));
    }
  }
}
