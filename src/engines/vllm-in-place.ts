/**
 * @file vLLM loaded in place (weight_update_mode in_place, weight_sync disk): the requests running
 * when a load starts are kept, and go on at the new weights; each request's tokens are labelled
 * with the version that sampled them, split at the load.
 *
 * What vLLM 0.32.0 guarantees, and where (paths under vllm/):
 * - `POST /pause?mode=keep` (entrypoints/rl/online/api_router.py) sets the scheduler to PAUSED_ALL:
 *   no step runs, new requests queue, running ones stay (v1/engine/core.py `pause_scheduler`); it
 *   answers once the engine has no work left in flight (`_pause_complete`, `_idle_state_callbacks`).
 * - Every step's outputs carry the engine's weight version at that step (core.py
 *   `_attach_weight_version`: "Weight versions change only while generation is paused"), and the
 *   output processor starts a span for a request whenever the version of its new tokens changes
 *   (v1/engine/output_processor.py `track_weight_version`, `_weight_version_spans`). The final
 *   answer of a request lists those spans, `weight_versions: [{version, start, end}]` over its
 *   output tokens (outputs.py `WeightVersionSpan`).
 * - /v1/completions does not send those spans; `POST /inference/v1/generate` (token in, token
 *   out: entrypoints/scale_out/token_in_token_out/, served with `--enable-scale-out`) sends them on
 *   each choice's last stream chunk (protocol.py `GenerateStreamChoiceBase.weight_versions`). So
 *   this adapter generates there, and the cut comes from vLLM's own record of which step made
 *   which token, not from when the client happened to read the stream: tokens still in the HTTP
 *   buffer when /pause answers are labelled with the version of the step that sampled them.
 * - The load between pause and resume is `reload_weights` and `/update_weight_version` as for
 *   weight_sync disk (openai-compat.ts), without vLLM's own `pause?mode=wait`, which would let the
 *   running requests drain at the old weights first.
 * - `clear_cache=true` with mode=keep (core.py `_finish_pause` → scheduler.py
 *   `reset_prefix_cache(reset_running_requests=True)`): the kept requests are preempted back to the
 *   waiting queue with their tokens, and their KV is recomputed at resume by the new weights. A KV
 *   cache kept from the old weights would make the tokens after the load a mix that no version's
 *   forward pass reproduces; recomputed, they are exactly the new version's, as recorded.
 *
 * A request whose last chunk never came (the connection broke, a local cancel) has no spans: if the
 * server's version moved while it ran, its tokens' versions are unknown and they are dropped (the
 * request comes back aborted and empty, the rollout continues the sample), as openai-compat.ts does.
 */

import { generateRequestSchema, spansCover, type GenerateRequest, type GenerateResult, type VersionSpan } from "./engine.ts";
import { EngineHttpError, isLocalCancel } from "./http.ts";
import { OpenAiCompatServer, type OpenAiCompatOptions } from "./openai-compat.ts";
import { generateTokensBody, streamGenerateTokens, type GenerateTokensOutcome } from "./vllm-generate-tokens.ts";
import type { InPlacePause } from "./pool-types.ts";
import { abortedResult, EngineRequestError, type GenerateHooks, type PartialOutput } from "./remote.ts";
import { RlqError } from "../lib/errors.ts";

export function createVllmInPlaceEngine(options: OpenAiCompatOptions): VllmInPlaceServer {
  return new VllmInPlaceServer({ ...options, loadsWeights: true });
}

/**
 * One vLLM server loaded in place. `isPausedInPlace` has two writers only, `pauseInPlace` and
 * `resumeInPlace`, which the pool calls around each load (pool-versions.ts `loadInPlace`).
 */
export class VllmInPlaceServer extends OpenAiCompatServer implements InPlacePause {
  private isPausedInPlace = false;

  async pauseInPlace(): Promise<void> {
    // Answers once nothing is in flight in the engine (see the file header).
    await this.admin("/pause?mode=keep&clear_cache=true", undefined, this.options.loadTimeoutMs ?? 600_000);
    this.isPausedInPlace = true;
  }

  async resumeInPlace(): Promise<void> {
    await this.admin("/resume", undefined);
    this.isPausedInPlace = false;
  }

  /** Paused in place: reload and set the version, leaving the pause to `resumeInPlace`. Otherwise as openai-compat.ts. */
  override async loadWeights(v: number, uri: string): Promise<void> {
    if (!this.isPausedInPlace) return super.loadWeights(v, uri);
    const path = this.checkpointPath(v, uri);
    await this.reload(v, path);
    await this.expectVersion(v, path);
  }

  protected override get isTokensRoute(): boolean {
    return true;
  }

  protected override tokensRouteReason(): string {
    return "weight_update_mode in_place reads each token's weight version from /inference/v1/generate (or use weight_update_mode abort or drain)";
  }

  override async generateWith(request: GenerateRequest, hooks: GenerateHooks): Promise<GenerateResult> {
    const req = generateRequestSchema.parse(request);
    const where = `${this.url}/inference/v1/generate (request ${req.requestId})`;
    const maxTokens = this.maxTokensFor(req, where);
    const v = await this.serverVersion();
    hooks.partial.weightVersion = v;
    let outcome: GenerateTokensOutcome;
    try {
      const body = generateTokensBody(req, this.body(req, true, { max_tokens: maxTokens }));
      const opts = { timeoutMs: this.options.requestTimeoutMs, signal: hooks.signal, headers: this.headers };
      outcome = await streamGenerateTokens(this.url, body, opts, hooks.partial, where);
    } catch (e) {
      if (isLocalCancel(e, hooks.signal)) return this.unlabelled(hooks.partial, v);
      if (e instanceof EngineHttpError && (e.status === 400 || e.status === 413 || e.status === 422))
        throw new EngineRequestError(`${where}: the server refused the request: ${e.message}`, { cause: e });
      await this.dropIfVersionMoved(hooks.partial, v);
      throw e;
    }
    const { finish, spans } = outcome;
    if (finish === null) {
      if (hooks.signal?.aborted) return this.unlabelled(hooks.partial, v);
      await this.dropIfVersionMoved(hooks.partial, v);
      throw new RlqError("engine_unreachable", `${where}: the stream ended without a finish_reason after ${hooks.partial.tokenIds.length} token(s)`, {
        isRetriable: true,
      });
    }
    const ended = finish;
    const labelled = this.labelled(hooks.partial, spans, where);
    if (labelled === null) return this.unlabelled(hooks.partial, v);
    return {
      tokenIds: [...hooks.partial.tokenIds],
      logProbs: [...hooks.partial.logProbs],
      finishReason: ended === "repetition" ? "stop" : ended,
      ...(ended === "repetition" ? { stopReason: "repetition" as const } : {}),
      weightVersion: labelled.weightVersion,
      ...(labelled.spans.length > 1 ? { versionSpans: labelled.spans } : {}),
      engineId: this.url,
    };
  }

  /**
   * The versions of `partial`'s tokens from the spans vLLM sent. No token yet: the version read
   * before. null: no spans though tokens came (the server labelled none of them): unknown.
   */
  private labelled(partial: PartialOutput, spans: VersionSpan[] | null, where: string): { weightVersion: number; spans: VersionSpan[] } | null {
    const n = partial.tokenIds.length;
    if (n === 0) return { weightVersion: partial.weightVersion ?? 0, spans: [] };
    if (spans === null || spans.length === 0) return null;
    const first = spans[0] as VersionSpan;
    if (!spansCover(spans, n, first.version))
      throw new RlqError("engine_bad_response", `${where}: weight_versions ${JSON.stringify(spans)} do not cover the ${n} token(s) in order`, {
        isRetriable: true,
      });
    partial.weightVersion = first.version;
    return { weightVersion: first.version, spans };
  }

  /** A request cut before its last chunk: its tokens stand at `v` if the server still serves `v`, else they are dropped. */
  private async unlabelled(partial: PartialOutput, v: number): Promise<GenerateResult> {
    await this.dropIfVersionMoved(partial, v);
    return abortedResult(partial, this.url, v);
  }

  private async dropIfVersionMoved(partial: PartialOutput, v: number): Promise<void> {
    if (partial.tokenIds.length === 0) return;
    const now = await this.serverVersion().catch(() => null); // unreadable: the versions are unknown, the tokens go
    if (now === v) return;
    partial.tokenIds.length = 0;
    partial.logProbs.length = 0;
  }
}
