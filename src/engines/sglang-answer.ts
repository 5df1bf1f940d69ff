/** What SGLang's /generate answers (meta_info), checked and applied to a partial output. */

import { RlqError } from "../lib/errors.ts";
import { EngineHttpError } from "./http.ts";
import { spansCover } from "./engine.ts";
import { EngineRequestError, parseWeightVersion, type PartialOutput } from "./remote.ts";

export interface SglangMetaInfo {
  id?: string;
  /** [logprob, token_id, (text)] per generated token. */
  output_token_logprobs?: Array<[number, number, ...unknown[]]>;
  finish_reason?: null | ({ type: string } & Record<string, unknown>);
  weight_version?: string | number;
  completion_tokens?: number;
  [key: string]: unknown;
}

/**
 * Check one /generate answer (a stream event, a body, or one output of a
 * batch) and return its meta_info; a bad answer throws `engine_bad_response`
 * naming the field. Hand-written rather than zod: it runs for every answer,
 * streamed ones carry the cumulative token list in every event, and zod's
 * per-tuple checks cost ~10x JSON.parse for short answers and ~1.6x for 4k
 * tokens (bench/control-plane.ts showed it in rlq up's profile).
 *
 * A request-level error comes as `{"error": {...}}` instead of an answer:
 * SGLang streams it as an SSE event of an HTTP 200 response when the request
 * fails after the stream began (python/sglang/srt/entrypoints/http_server.py
 * generate_request's stream_results), e.g. a prompt over the context length
 * (managers/tokenizer_manager.py _validate_one_request). Newest SGLang's event
 * is `{"error": {message, type, code: <HTTP status>, retryable}}` (0.5.x: only
 * `message`); `streamedError` reads it.
 */
export function readSglangAnswer(payload: unknown, where: string): SglangMetaInfo {
  const bad = (what: string, path: string): never => {
    throw new RlqError("engine_bad_response", `${where}: unexpected answer: ${what} at ${path}`, { isRetriable: true });
  };
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
  const isCount = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v) && v >= 0;
  if (!isObject(payload)) return bad("expected an object", "(answer)");
  if (payload.error !== undefined && payload.meta_info === undefined) {
    throw streamedError(payload.error, where);
  }
  if (payload.text !== undefined && typeof payload.text !== "string") bad("expected a string", "text");
  const meta = payload.meta_info;
  if (!isObject(meta)) return bad("expected an object", "meta_info");
  if (meta.id !== undefined && typeof meta.id !== "string") bad("expected a string", "meta_info.id");
  const lps = meta.output_token_logprobs;
  if (lps !== undefined) {
    if (!Array.isArray(lps)) bad("expected an array", "meta_info.output_token_logprobs");
    const list = lps as unknown[];
    for (let i = 0; i < list.length; i++) {
      const t = list[i];
      if (!Array.isArray(t) || t.length < 2) bad("expected [logprob, token_id, ...]", `meta_info.output_token_logprobs.${i}`);
      const pair = t as unknown[];
      if (typeof pair[0] !== "number") bad("expected a number", `meta_info.output_token_logprobs.${i}.0`);
      if (!isCount(pair[1])) bad("expected a non-negative integer token id", `meta_info.output_token_logprobs.${i}.1`);
    }
  }
  const fr = meta.finish_reason;
  if (fr !== undefined && fr !== null && !(isObject(fr) && typeof fr.type === "string")) bad("expected null or {type: string}", "meta_info.finish_reason");
  const wv = meta.weight_version;
  if (wv !== undefined && typeof wv !== "string" && typeof wv !== "number") bad("expected a string or a number", "meta_info.weight_version");
  if (meta.completion_tokens !== undefined && !isCount(meta.completion_tokens)) bad("expected a non-negative integer", "meta_info.completion_tokens");
  if (meta.weight_versions !== undefined && meta.weight_versions !== null && !Array.isArray(meta.weight_versions))
    bad("expected an array", "meta_info.weight_versions");
  return meta; // checked field by field above
}

/**
 * What an `error` event means: `retryable: true`, or a 5xx `code` without `retryable`, is the
 * server's trouble and is retried as an HTTP 5xx answer is (engine_http_error, retriable, with the
 * code as its status); anything else (a 4xx, `retryable: false`, or 0.5.x's bare message) is the
 * request's fault, and the sample fails with the server's message and code (EngineRequestError).
 */
function streamedError(e: unknown, where: string): Error {
  const fields = typeof e === "object" && e !== null ? (e as { code?: unknown; retryable?: unknown }) : {};
  const status = typeof fields.code === "number" && Number.isInteger(fields.code) ? fields.code : null;
  const isRetriable = fields.retryable === true || (fields.retryable === undefined && status !== null && status >= 500);
  const said = `${errorText(e)}${status === null ? "" : ` (code ${status}${typeof fields.retryable === "boolean" ? `, retryable ${fields.retryable}` : ""})`}`;
  if (isRetriable) return new EngineHttpError("engine_http_error", `${where}: the server failed the request: ${said}`, { isRetriable: true, status });
  return new EngineRequestError(`${where}: the server refused the request: ${said}`);
}

/** The message of an `error` member ({message} or a string), for the sample's failure reason. */
function errorText(e: unknown): string {
  if (typeof e === "string") return e;
  if (typeof e === "object" && e !== null && typeof (e as { message?: unknown }).message === "string") return (e as { message: string }).message;
  return JSON.stringify(e)?.slice(0, 300) ?? String(e);
}

/**
 * The versions of a response's tokens from meta_info.weight_versions, where
 * the server gives them: one entry per output token (a version each), or spans
 * `{weight_version, start, end}` / `[weight_version, start, end]` over the
 * output (end exclusive). null: the server gave none (every token is labelled
 * with meta_info.weight_version, the version at the end of the request).
 */
export function tokenVersionSpans(raw: unknown, numTokens: number, where: string): Array<{ version: number; start: number; end: number }> | null {
  if (!Array.isArray(raw) || raw.length === 0) return null;
  const spans: Array<{ version: number; start: number; end: number }> = [];
  const isSpan = (x: unknown) => (Array.isArray(x) && x.length === 3) || (typeof x === "object" && x !== null && !Array.isArray(x));
  if (raw.every(isSpan)) {
    for (const x of raw) {
      const [v, a, b] = Array.isArray(x)
        ? x
        : [
            (x as Record<string, unknown>).weight_version ?? (x as Record<string, unknown>).version,
            (x as Record<string, unknown>).start,
            (x as Record<string, unknown>).end,
          ];
      if (typeof a !== "number" || typeof b !== "number")
        throw new RlqError("engine_bad_response", `${where}: meta_info.weight_versions span ${JSON.stringify(x)} has no numeric start/end`, {
          isRetriable: true,
        });
      spans.push({ version: parseWeightVersion(v, where), start: a, end: b });
    }
  } else {
    if (raw.length !== numTokens) return null; // per-token list of another length: a delta event; the caller keeps the single version
    for (let i = 0; i < raw.length; i++) {
      const v = parseWeightVersion(raw[i], where);
      const last = spans[spans.length - 1];
      if (last && last.version === v) last.end = i + 1;
      else spans.push({ version: v, start: i, end: i + 1 });
    }
  }
  return spans;
}

/**
 * Fold one /generate answer (a stream event or the whole non-streamed body)
 * into `partial`. SGLang sends the cumulative token list in every event
 * unless the server runs --incremental-streaming-output, whose events carry
 * only the new tokens (tokenizer_manager.py _handle_batch_output: with
 * incremental_streaming_output the logprob lists are sliced from the last
 * sent offset; the final abort event stays cumulative); `completion_tokens`
 * (always the running total) tells the two apart. Returns the finish reason
 * once the server gives one.
 *
 * An abort carrying `status_code` is an error the server raised for this
 * request (scheduler.py abort_request with a status: over the context length,
 * invalid input = 400; internal error = 500; overloaded = 503), not a
 * resumable partial: 4xx is the request's fault (EngineRequestError), 5xx the
 * server's (engine_server_abort, retriable from scratch elsewhere).
 *
 * meta_info.weight_versions (where the server gives per-token versions): spans
 * that tile the output with rising versions are kept whole as `versionSpans`,
 * and the rollout records one segment per version (jobs/generate-group-round.ts
 * `splitAtVersions`), so the tokens past a load in place are kept, not
 * generated again. Spans that do not tile it (a server that lists them some
 * other way) cut the answer at the first boundary instead, returned as an
 * abort there: one segment, one version, the one that sampled its tokens
 * (never the newer `weight_version` a delta event carries), and the rollout
 * continues the sample. `isVersionCut` tells the caller that an abort came
 * from such a cut, not from the server.
 */
export function applySglangMeta(partial: PartialOutput, meta: SglangMetaInfo, where: string): "stop" | "length" | "abort" | null {
  const lps = meta.output_token_logprobs ?? [];
  const total = meta.completion_tokens;
  const isDelta = total !== undefined && lps.length !== total && partial.tokenIds.length + lps.length === total;
  if (!isDelta) {
    partial.tokenIds.length = 0;
    partial.logProbs.length = 0;
  }
  for (const t of lps) {
    partial.tokenIds.push(t[1]);
    // log p <= 0; a float rounding of p = 1 can give +1e-8.
    partial.logProbs.push(Math.min(0, t[0]));
  }
  if (meta.weight_version !== undefined) partial.weightVersion = parseWeightVersion(meta.weight_version, where);
  const fr = meta.finish_reason;
  if (fr !== null && fr !== undefined && fr.type === "abort" && fr.status_code !== undefined && fr.status_code !== null) {
    const status = Number(fr.status_code);
    const message = typeof fr.message === "string" ? fr.message : JSON.stringify(fr);
    if (status >= 400 && status < 500) throw new EngineRequestError(`${where}: the server aborted the request with status ${status}: ${message}`);
    throw new RlqError("engine_server_abort", `${where}: the server aborted the request with status ${status}: ${message}`, { isRetriable: true });
  }
  // Spans index the whole output, also in a delta event (newest tokenizer_manager.py slices only the
  // log-prob keys for --incremental-streaming-output, so a delta carries every span so far and the
  // newest weight_version): `partial` holds the whole output by now, so they apply to it alike.
  const spans = tokenVersionSpans(meta.weight_versions, partial.tokenIds.length, where);
  delete partial.versionSpans; // an event's spans describe the whole output so far: only the newest apply
  if (spans !== null && spans.length > 0) {
    const first = spans[0] as { version: number; start: number; end: number };
    partial.weightVersion = first.version;
    if (spans.length > 1 && spansCover(spans, partial.tokenIds.length, first.version)) partial.versionSpans = spans;
    else if (spans.length > 1 && first.end < partial.tokenIds.length) {
      partial.tokenIds.length = first.end;
      partial.logProbs.length = first.end;
      partial.isVersionCut = true;
      return "abort";
    }
  }
  if (fr === null || fr === undefined) return null;
  if (fr.type === "stop" || fr.type === "length" || fr.type === "abort") return fr.type;
  throw new RlqError("engine_bad_response", `${where}: unknown finish_reason ${JSON.stringify(fr)}`, { isRetriable: true });
}
