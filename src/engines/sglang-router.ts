/**
 * An SGLang router (sgl-router / sgl-model-gateway) in front of several
 * workers: rlq reads its worker list and talks to each worker directly, as
 * slime does for aborts (slime/rollout/sglang_rollout.py at 624b824). Direct routing is what lets
 * the pool abort a request by id on the worker that holds it, health-check
 * each worker, load weights into each, and keep per-worker metrics.
 *
 * GET {router}/workers → {workers: [{id, url, worker_type, …}], total, stats}
 * (sgl-model-gateway src/server.rs, core/worker_service.rs); older routers
 * answer GET /list_workers → {urls: [...]}. A router started with --api-key
 * wants `Authorization: Bearer` on /workers too.
 *
 * The list is read as a router lists it, not as rlq needs it:
 * - data-parallel-aware workers appear once per rank as `http://h:p@rank`
 *   (one server): the `@rank` suffix is stripped and the URLs deduplicated;
 * - prefill and decode workers (PD disaggregation) and gRPC workers are
 *   listed too: rlq talks HTTP /generate to regular workers only;
 * - the gateway (smg) fronts other engines too and says which in each worker's
 *   `runtime_type` (sglang | vllm | trtllm | external; lightseekorg/smg
 *   crates/protocols/src/worker.rs at 73da68ca): only SGLang workers (or a
 *   worker without the field, from a router older than it) are driven with
 *   SGLang's native API; the others are left out, each reported to `onSkipped`.
 *
 * Keys: the gateway opens /workers to its shared --api-key only (the control
 * plane's admin auth); started with per-tenant keys and no shared key it denies
 * /workers to every caller (lightseekorg/smg model_gateway/src/server.rs
 * `apply_control_plane_auth`: deny_all_middleware; middleware/auth.rs at
 * c5573dda answers an empty 401). Either 401
 * becomes engine_unauthorized naming engine.router_api_key.
 */

import { z } from "zod";
import { bearer, callJson, EngineHttpError } from "./http.ts";
import { RlqError } from "../lib/errors.ts";

const workerSchema = z
  .object({ url: z.string().min(1), worker_type: z.string().optional(), connection_mode: z.string().optional(), runtime_type: z.string().optional() })
  .passthrough();
const workersSchema = z.object({ workers: z.array(workerSchema) }).passthrough();
const listWorkersSchema = z.object({ urls: z.array(z.string().min(1)) }).passthrough();

/** One worker URL as rlq addresses it: a scheme, no `@rank`, no trailing slash. */
export function normaliseWorkerUrl(u: string): string {
  const withScheme = /^https?:\/\//.test(u) ? u : `http://${u}`;
  return withScheme.replace(/@\d+$/, "").replace(/\/+$/, "");
}

/** Why rlq leaves a listed worker out, or null when it drives it. */
function whySkipped(w: z.infer<typeof workerSchema>): string | null {
  const runtime = (w.runtime_type ?? "sglang").toLowerCase();
  if (runtime !== "sglang") return `runtime_type ${w.runtime_type}: not an SGLang server (configure it as its own engine, e.g. engine.kind openai for vLLM)`;
  const type = (w.worker_type ?? "regular").toLowerCase();
  const mode = (w.connection_mode ?? "http").toLowerCase();
  if (type !== "regular") return `worker_type ${w.worker_type}: rlq drives regular workers only`;
  if (mode !== "http" || /^grpc:\/\//.test(w.url)) return `connection_mode ${w.connection_mode ?? "grpc"}: rlq speaks HTTP only`;
  return null;
}

export interface ListWorkersOptions {
  timeoutMs?: number;
  apiKey?: string;
  /** Told about each listed worker rlq leaves out, with the reason (from-config.ts logs it). */
  onSkipped?: (url: string, reason: string) => void;
}

export async function listRouterWorkers(routerUrl: string, options: ListWorkersOptions = {}): Promise<string[]> {
  const root = routerUrl.replace(/\/+$/, "");
  const call = { timeoutMs: options.timeoutMs ?? 10_000, headers: bearer(options.apiKey) };
  let raw: unknown;
  try {
    raw = await callJson("GET", `${root}/workers`, undefined, call);
  } catch (e) {
    if (e instanceof EngineHttpError && e.code === "engine_unauthorized") throw routerUnauthorized(root, e, options.apiKey !== undefined);
    if (!(e instanceof EngineHttpError && e.status === 404)) throw e;
    raw = await callJson("GET", `${root}/list_workers`, undefined, call);
  }
  const a = workersSchema.safeParse(raw);
  const urls = a.success ? a.data.workers.filter((w) => isDriven(w, options.onSkipped)).map((w) => w.url) : listWorkersSchema.safeParse(raw).data?.urls;
  if (!urls) {
    throw new RlqError("engine_bad_response", `SGLang router ${root}: /workers answered ${JSON.stringify(raw).slice(0, 200)}, expected {workers: [{url}]}`, {
      isRetriable: true,
    });
  }
  return [...new Set(urls.map(normaliseWorkerUrl))];
}

function isDriven(w: z.infer<typeof workerSchema>, onSkipped: ListWorkersOptions["onSkipped"]): boolean {
  const why = whySkipped(w);
  if (why !== null) onSkipped?.(w.url, why);
  return why === null;
}

function routerUnauthorized(root: string, e: EngineHttpError, hasKey: boolean): EngineHttpError {
  const fix = hasKey
    ? "the key sent (engine.router_api_key, else engine.api_key) is not one the gateway opens its worker list to: /workers takes only the gateway's shared --api-key, never a per-tenant key, and a gateway started with per-tenant keys alone refuses it to everyone"
    : "the gateway wants its shared --api-key on /workers";
  return new EngineHttpError(
    "engine_unauthorized",
    `SGLang router ${root}/workers: HTTP ${e.status}: ${fix}: set engine.router_api_key to the gateway's shared --api-key ({env: NAME} or {file: PATH}), or list the workers in engine.urls`,
    { cause: e, isRetriable: false, status: e.status },
  );
}
