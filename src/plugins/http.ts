/**
 * Plugins over HTTP: wherever a plugin module path is accepted
 * (custom_rm_path, dynamic_sampling_filter_path, buffer_filter_path,
 * custom_generate_function_path), an `http://` or `https://` URL names an
 * endpoint that speaks the same contract as JSON (docs/plugins.md), so
 * reward, filter and agent code can stay in Python or any other language.
 *
 * Every call is one `POST url` with `{"kind": ..., "args": <run config>, ...}`
 * and answers `{"result": <what the module function would return>}`. The
 * result goes through the very same validation as a module's return value
 * (plugin-contract.ts, filters, custom-generate.ts): the functions here
 * return it unvalidated, with the module function's signature, so call sites
 * do not change. Transport failures retry like remote_rm (backoff
 * `min(2^a, 30) + U(0,1)` s, 10 tries) and then throw a retriable
 * `plugin_http_failed` naming the URL, the status and the body; an answer
 * without `result` or with `{"error": ...}` is a non-retriable
 * `plugin_bad_return` / `plugin_threw`.
 */

import { z } from "zod";
import { RlqError } from "../lib/errors.ts";
import { postJsonWithRetry, type HttpRetryOptions } from "../lib/http-client.ts";
import type { CustomGenerateFunction, CustomGenerateHelpers, CustomGenerateSample, Turn } from "../rollout/custom-generate.ts";
import { loadPluginFunction, parsePluginPath } from "./load.ts";
import { isPythonSidecarPath, resolvePythonPlugin } from "./python.ts";

export type HttpPluginKind = "reward" | "reward_group" | "dynamic_filter" | "buffer_filter" | "generate";

/** The module exports each kind looks for (the conventional names, as src/runtime uses them). */
export const DEFAULT_EXPORTS: Readonly<Record<HttpPluginKind, readonly string[]>> = {
  reward: ["reward"],
  reward_group: ["rewardGroup", "batched_reward"],
  dynamic_filter: ["filter", "dynamicFilter"],
  buffer_filter: ["bufferFilter", "filter"],
  generate: ["generate", "customGenerate"],
};

export function isHttpPluginPath(path: string | null | undefined): path is string {
  return typeof path === "string" && /^https?:\/\//i.test(path.trim());
}

/** The answer envelope. `error` (a string) is the plugin saying it failed: not retried. */
const envelopeSchema = z.union([z.looseObject({ result: z.unknown() }).refine((o) => "result" in o), z.looseObject({ error: z.string() })]);

export interface HttpPluginOptions extends HttpRetryOptions {
  /** The run-config key that named the plugin, for messages. */
  option?: string;
}

/** POST one plugin call and unwrap `{result}`. */
export async function callHttpPlugin(url: string, kind: HttpPluginKind, body: Record<string, unknown>, options: HttpPluginOptions = {}): Promise<unknown> {
  const what = `${options.option ?? kind} ${url}`;
  const raw = await postJsonWithRetry(url, { kind, ...body }, { ...options, what: `${what}: POST`, code: "plugin_http_failed" });
  const parsed = envelopeSchema.safeParse(raw);
  if (!parsed.success) {
    throw new RlqError("plugin_bad_return", `${what} answered ${JSON.stringify(raw)?.slice(0, 200)}; expected {"result": ...} or {"error": "..."}`);
  }
  if ("error" in parsed.data && !("result" in parsed.data)) {
    throw new RlqError("plugin_threw", `${what} (${kind}) failed: ${String(parsed.data.error).slice(0, 500)}`);
  }
  return (parsed.data as { result: unknown }).result;
}

/** `reward(args, sample)` over HTTP: `{"kind":"reward","args","sample"}` → `{"result": number | {components}}`. */
export function httpReward(url: string, options: HttpPluginOptions = {}) {
  return (args: unknown, sample: unknown): Promise<unknown> => callHttpPlugin(url, "reward", { args, sample }, options);
}

/** `rewardGroup(args, samples)` over HTTP → `{"result": [one reward per sample]}`. */
export function httpRewardGroup(url: string, options: HttpPluginOptions = {}) {
  return (args: unknown, samples: readonly unknown[]): Promise<unknown> => callHttpPlugin(url, "reward_group", { args, samples }, options);
}

/** Dynamic sampling filter `(args, group)` → `{"result": bool | {keep, reason?, keep_when_insufficient?}}`. */
export function httpDynamicFilter(url: string, options: HttpPluginOptions = {}) {
  return (args: unknown, group: unknown): Promise<unknown> => callHttpPlugin(url, "dynamic_filter", { args, group }, options);
}

/** Buffer filter `(args, rolloutId, buffer, n)` → `{"result": [the chosen buffer entries]}`. */
export function httpBufferFilter(url: string, options: HttpPluginOptions = {}) {
  return (args: unknown, rolloutId: unknown, buffer: readonly unknown[], n: number): Promise<unknown> =>
    callHttpPlugin(url, "buffer_filter", { args, rollout_id: rolloutId ?? null, buffer, n }, options);
}

/** One step of the HTTP generate protocol: what the endpoint asks rlq to do next. */
export const generateStepSchema = z.discriminatedUnion("action", [
  z.strictObject({
    action: z.literal("generate"),
    max_new_tokens: z.number().int().positive().optional(),
    extra_stop_token_ids: z.array(z.number().int().nonnegative()).optional(),
  }),
  z
    .strictObject({
      action: z.literal("tool"),
      text: z.string().optional(),
      tokens: z.array(z.number().int().nonnegative()).optional(),
      /** An image observation: paths (read where rlq runs) or data URIs, one placeholder each (custom-generate.ts `ToolOptions`). */
      images: z.array(z.string().min(1)).optional(),
    })
    .refine((s) => (s.text === undefined) !== (s.tokens === undefined), { message: "a tool step carries exactly one of text or tokens" }),
  z.strictObject({ action: z.literal("finish"), status: z.enum(["completed", "truncated", "failed"]).optional() }),
]);

/**
 * `custom_generate_function_path: http://...`. The engine lives in rlq, so
 * the endpoint drives the sample one step per request: rlq POSTs
 * `{"kind":"generate","args","sample","turns","remaining_tokens"}` and the
 * endpoint answers the next action (`generateStepSchema`): generate (rlq calls
 * the engine and appends its turn), tool (rlq appends text/tokens with loss
 * mask 0, and its images if any), or finish. Stateless: `turns` is the whole
 * round so far. With a vision-language chat template the request also carries
 * `image_placeholder`, the text of one image.
 */
export function httpCustomGenerate(url: string, options: HttpPluginOptions = {}): CustomGenerateFunction {
  const option = options.option ?? "custom_generate_function_path";
  return async (args: unknown, sample: CustomGenerateSample, helpers: CustomGenerateHelpers) => {
    const turns: Turn[] = [];
    const maxSteps = 4 * (helpers.remainingTokens([]) + 2);
    for (let step = 0; step < maxSteps; step++) {
      const body = {
        args,
        sample,
        turns,
        remaining_tokens: helpers.remainingTokens(turns),
        ...(helpers.imagePlaceholder !== null ? { image_placeholder: helpers.imagePlaceholder } : {}),
      };
      const raw = await callHttpPlugin(url, "generate", body, { ...options, option });
      const parsed = generateStepSchema.safeParse(raw);
      if (!parsed.success) {
        const detail = parsed.error.issues.map((i) => `${i.path.join(".") || "(value)"}: ${i.message}`).join("; ");
        throw new RlqError(
          "custom_generate_invalid",
          `${option} ${url} answered ${JSON.stringify(raw)?.slice(0, 200)}; expected {action: "generate" | "tool" | "finish", ...} (${detail})`,
        );
      }
      const s = parsed.data;
      if (s.action === "finish") return s.status ? { turns, status: s.status } : { turns };
      if (s.action === "tool") turns.push(helpers.tool(s.text ?? (s.tokens as number[]), s.images ? { images: s.images } : {}));
      else {
        turns.push(
          await helpers.generate(turns, {
            ...(s.max_new_tokens ? { maxNewTokens: s.max_new_tokens } : {}),
            ...(s.extra_stop_token_ids ? { extraStopTokenIds: s.extra_stop_token_ids } : {}),
          }),
        );
      }
    }
    throw new RlqError("custom_generate_invalid", `${option} ${url} did not finish within ${maxSteps} steps`);
  };
}

/**
 * Resolve a plugin path of any kind: a URL gives the HTTP client above, a
 * module path gives `loadPluginFunction` with the kind's default exports.
 * Either way the result has the module function's signature.
 */
export async function resolvePluginFunction<F extends (...args: never[]) => unknown>(
  path: string,
  baseDir: string,
  kind: HttpPluginKind,
  what: string,
  options: HttpPluginOptions = {},
): Promise<F> {
  if (isPythonSidecarPath(path)) {
    return (await resolvePythonPlugin(path, baseDir, kind, options.option ?? what)) as unknown as F;
  }
  if (!isHttpPluginPath(path)) return loadPluginFunction<F>(parsePluginPath(path, baseDir), DEFAULT_EXPORTS[kind], what);
  const url = path.trim();
  const o = { ...options, option: options.option ?? what };
  switch (kind) {
    case "reward":
      return httpReward(url, o) as unknown as F;
    case "reward_group":
      return httpRewardGroup(url, o) as unknown as F;
    case "dynamic_filter":
      return httpDynamicFilter(url, o) as unknown as F;
    case "buffer_filter":
      return httpBufferFilter(url, o) as unknown as F;
    case "generate":
      return httpCustomGenerate(url, o) as unknown as F;
  }
}
