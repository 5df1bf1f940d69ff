import { z } from "zod";
import { generateRequestSchema, type Engine, type GenerateRequest, type GenerateResult } from "./engine.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * SGLang's native API (slime-semantics.md §1b): POST /generate with
 * input_ids and return_logprob; abort by request id through /abort_request
 * (never abort_all: other runs share the server); weights through
 * /update_weights_from_disk carrying the new weight_version.
 * Several URLs: least-outstanding-requests routing.
 */
const generateResponseSchema = z.object({
  text: z.string().optional(),
  meta_info: z.object({
    // [logprob, token_id, (text)] per generated token
    output_token_logprobs: z.array(z.tuple([z.number(), z.number().int()]).rest(z.unknown())),
    finish_reason: z.object({ type: z.enum(["stop", "length", "abort"]) }).passthrough(),
    weight_version: z.union([z.string(), z.number()]).optional(),
  }).passthrough(),
});

export interface SglangEngineOptions {
  urls: readonly string[];
  requestTimeoutMs: number;
}

export function createSglangEngine(options: SglangEngineOptions): Engine {
  const outstanding = new Map<string, number>(options.urls.map((u) => [u, 0]));
  const owner = new Map<string, string>();
  const pick = (): string => {
    let best = options.urls[0] as string;
    for (const u of options.urls) if ((outstanding.get(u) ?? 0) < (outstanding.get(best) ?? 0)) best = u;
    return best;
  };

  async function post(url: string, path: string, body: unknown, timeoutMs: number): Promise<unknown> {
    let res: Response;
    try {
      res = await fetch(`${url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
    } catch (e) {
      throw new RlqError("engine_unreachable", `SGLang ${url}${path}: ${(e as Error).message}`, { cause: e, isRetriable: true });
    }
    const text = await res.text();
    if (!res.ok) {
      throw new RlqError("engine_http_error", `SGLang ${url}${path}: HTTP ${res.status}: ${text.slice(0, 300)}`, {
        isRetriable: res.status >= 500 || res.status === 429,
      });
    }
    try {
      return text.length > 0 ? JSON.parse(text) : {};
    } catch (e) {
      throw new RlqError("engine_bad_response", `SGLang ${url}${path}: response is not JSON: ${text.slice(0, 200)}`, { cause: e, isRetriable: true });
    }
  }

  return {
    id: `sglang:${options.urls.join(",")}`,
    async generate(request: GenerateRequest): Promise<GenerateResult> {
      const req = generateRequestSchema.parse(request);
      const url = pick();
      outstanding.set(url, (outstanding.get(url) ?? 0) + 1);
      owner.set(req.requestId, url);
      try {
        const s = req.sampling;
        const raw = await post(
          url,
          "/generate",
          {
            rid: req.requestId,
            input_ids: req.inputIds,
            return_logprob: true,
            sampling_params: {
              temperature: s.temperature,
              top_p: s.topP,
              top_k: s.topK,
              max_new_tokens: s.maxNewTokens,
              stop_token_ids: s.stopTokenIds,
              no_stop_trim: true,
              skip_special_tokens: false,
              spaces_between_special_tokens: false,
              ...(s.seed === undefined ? {} : { sampling_seed: s.seed }),
            },
          },
          options.requestTimeoutMs,
        );
        const parsed = generateResponseSchema.safeParse(raw);
        if (!parsed.success) {
          throw new RlqError("engine_bad_response", `SGLang ${url}/generate: unexpected response: ${parsed.error.issues[0]?.message} at ${parsed.error.issues[0]?.path.join(".")}`, { isRetriable: true });
        }
        const meta = parsed.data.meta_info;
        const version = meta.weight_version === undefined ? NaN : Number(meta.weight_version);
        if (!Number.isInteger(version)) {
          throw new RlqError("engine_bad_response", `SGLang ${url}: weight_version ${JSON.stringify(meta.weight_version)} is not an integer version`, { isRetriable: false });
        }
        return {
          tokenIds: meta.output_token_logprobs.map((t) => t[1]),
          logProbs: meta.output_token_logprobs.map((t) => t[0]),
          finishReason: meta.finish_reason.type,
          weightVersion: version,
          engineId: url,
        };
      } finally {
        outstanding.set(url, (outstanding.get(url) ?? 1) - 1);
        owner.delete(req.requestId);
      }
    },
    async abort(requestIds) {
      await Promise.all(
        requestIds.map(async (rid) => {
          const url = owner.get(rid);
          const targets = url ? [url] : options.urls;
          await Promise.all(targets.map((u) => post(u, "/abort_request", { rid }, 10_000).catch(() => undefined)));
        }),
      );
    },
    async health() {
      const results = await Promise.all(
        options.urls.map(async (u) => {
          try {
            const res = await fetch(`${u}/health_generate`, { signal: AbortSignal.timeout(10_000) });
            return res.ok;
          } catch {
            return false;
          }
        }),
      );
      return results.every(Boolean);
    },
    async loadWeights(version, uri) {
      await Promise.all(
        options.urls.map((u) =>
          post(u, "/update_weights_from_disk", { model_path: uri.replace(/^file:\/\//, ""), weight_version: String(version) }, 600_000),
        ),
      );
    },
    async weightVersion() {
      const res = await fetch(`${options.urls[0]}/get_weight_version`);
      const body = (await res.json()) as { weight_version?: string | number };
      return Number(body.weight_version);
    },
    async close() {},
  };
}
