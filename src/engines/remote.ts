/**
 * What the pool needs from one remote inference server beyond the Engine
 * interface: a generate that reports tokens as they stream in (so a server
 * that dies mid-generation still leaves its tokens), a version read, the
 * log-prob probe, and whether it can load weights itself.
 */

import type { Engine, GenerateRequest, GenerateResult, VersionSpan } from "./engine.ts";
import type { LogprobProbe } from "./logprob-check.ts";
import { RlqError } from "../lib/errors.ts";

/** Tokens received so far for one request; the adapter fills it while streaming. */
export interface PartialOutput {
  tokenIds: number[];
  logProbs: number[];
  /** The version the server reported for this request, once it has said. */
  weightVersion: number | null;
  /** The versions of the output's tokens where more than one sampled them (a load in place under the request). */
  versionSpans?: VersionSpan[];
  /**
   * Set when the output was cut at a weight-version boundary (SGLang's weight_versions spans that do
   * not tile it): the tokens kept are the first version's, and a stream must stop there (the request is aborted).
   */
  isVersionCut?: boolean;
}

export function emptyPartial(): PartialOutput {
  return { tokenIds: [], logProbs: [], weightVersion: null };
}

export interface GenerateHooks {
  /** Filled in place as tokens arrive. */
  partial: PartialOutput;
  /**
   * Local cancellation (pool abort, engine declared dead). The adapter then
   * resolves with finishReason "abort" and the tokens in `partial`.
   */
  signal?: AbortSignal;
}

export interface RemoteEngine extends Engine {
  readonly kind: "sglang" | "openai";
  readonly url: string;
  /** False where the server has no abort-by-id (vLLM): closing the connection is the abort. */
  readonly canAbortById: boolean;
  /** False for OpenAI-compatible servers: rlq does not push weights to them. */
  readonly canLoadWeights: boolean;
  /** End every request on the server, whoever sent it (SGLang `/abort_request {abort_all: true}`). Absent: the server cannot. */
  abortAll?(): Promise<void>;
  /** The pool's entry point; `request` has been validated by the pool (generateRequestSchema). */
  generateWith(request: GenerateRequest, hooks: GenerateHooks): Promise<GenerateResult>;
  /** Two short greedy requests that reveal what the server's log-probs are (logprob-check.ts). */
  probeLogProbs(inputIds: readonly number[]): Promise<LogprobProbe>;
  /** Fenced engines only (they do not know rlq versions): record the version the trainer/operator reported. */
  setVersion?(version: number): void;
  /** The version the server serves now; throws when it cannot be reached. */
  weightVersion(): Promise<number>;
  /** Refuse a server that cannot serve rlq at all (not a generation model, unknown model name). */
  checkServer(): Promise<void>;
  /** /health_generate (or /health) answered 2xx within `timeoutMs`. */
  health(timeoutMs?: number): Promise<boolean>;
  /**
   * Why the last failed health check failed: "busy" when /health_generate answered 503 (SGLang does
   * while it loads weights or is paused; http_server.py health_generate) and the version endpoint
   * still answers, "down" otherwise. Absent: every failure is "down".
   */
  lastHealthFailure?(): "busy" | "down";
  /** Whether the server honours per-request seeds (SGLang: --enable-deterministic-inference); null: unknown. */
  readonly seedHonoured?: boolean | null;
}

/**
 * A request the server refused for itself, not for the engine: a prompt over the context length
 * (SGLang: HTTP 200 with an SSE `data: {"error": ...}` event, or HTTP 400 without streaming;
 * tokenizer_manager.py _validate_one_request), an invalid sampling parameter, or an abort carrying
 * a 4xx status_code. Never retried, never counted against the engine's health; the rollout records
 * the sample as failed with `message` as its reason.
 */
export class EngineRequestError extends RlqError {
  readonly isRequestError = true;
  constructor(message: string, options: { cause?: unknown } = {}) {
    super("engine_request_rejected", message, { cause: options.cause, isRetriable: false });
  }
}

export function isRequestError(e: unknown): e is EngineRequestError {
  return e instanceof RlqError && (e as { isRequestError?: boolean }).isRequestError === true;
}

/** SGLang keeps sampling_seed in an int32 tensor (sampling_batch_info.py): rlq sends seeds masked to 31 bits. */
export function seed31(seed: number): number {
  return seed % 0x80000000;
}

/**
 * SGLang reports weight_version as a string; it is "default" until the first
 * update unless the server was launched with --weight-version. rlq versions are
 * integers, and a server launched from the initial checkpoint serves version 0.
 */
export function parseWeightVersion(raw: unknown, where: string): number {
  if (raw === "default" || raw === undefined || raw === null) return 0;
  const n = typeof raw === "number" ? raw : typeof raw === "string" && /^\d+$/.test(raw.trim()) ? Number(raw) : NaN;
  if (!Number.isInteger(n) || n < 0) {
    throw new RlqError(
      "engine_bad_version",
      `${where}: weight_version ${JSON.stringify(raw)} is not an rlq version (a non-negative integer); launch the server with --weight-version <int>`,
      { isRetriable: false },
    );
  }
  return n;
}

/** The result a cancelled or broken request resolves with: everything received, marked aborted. */
export function abortedResult(partial: PartialOutput, engineId: string, fallbackVersion: number): GenerateResult {
  return {
    tokenIds: [...partial.tokenIds],
    logProbs: [...partial.logProbs],
    finishReason: "abort",
    weightVersion: partial.weightVersion ?? fallbackVersion,
    engineId,
    ...(partial.versionSpans ? { versionSpans: partial.versionSpans.map((x) => ({ ...x })) } : {}),
  };
}
