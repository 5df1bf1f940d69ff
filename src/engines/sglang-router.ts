import { z } from "zod";
import { bearer, callJson, EngineHttpError } from "./http.ts";
import { RlqError } from "../lib/errors.ts";

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
 *   listed too: rlq talks HTTP /generate to regular workers only.
 */
const workerSchema = z.object({ url: z.string().min(1), worker_type: z.string().optional(), connection_mode: z.string().optional() }).passthrough();
const workersSchema = z.object({ workers: z.array(workerSchema) }).passthrough();
const listWorkersSchema = z.object({ urls: z.array(z.string().min(1)) }).passthrough();

/** One worker URL as rlq addresses it: a scheme, no `@rank`, no trailing slash. */
export function normaliseWorkerUrl(u: string): string {
  const withScheme = /^https?:\/\//.test(u) ? u : `http://${u}`;
  return withScheme.replace(/@\d+$/, "").replace(/\/+$/, "");
}

function isRegular(w: z.infer<typeof workerSchema>): boolean {
  const type = (w.worker_type ?? "regular").toLowerCase();
  const mode = (w.connection_mode ?? "http").toLowerCase();
  return type === "regular" && mode === "http" && !/^grpc:\/\//.test(w.url);
}

export async function listRouterWorkers(routerUrl: string, options: { timeoutMs?: number; apiKey?: string } = {}): Promise<string[]> {
  const root = routerUrl.replace(/\/+$/, "");
  const call = { timeoutMs: options.timeoutMs ?? 10_000, headers: bearer(options.apiKey) };
  let raw: unknown;
  try {
    raw = await callJson("GET", `${root}/workers`, undefined, call);
  } catch (e) {
    if (!(e instanceof EngineHttpError && e.status === 404)) throw e;
    raw = await callJson("GET", `${root}/list_workers`, undefined, call);
  }
  const a = workersSchema.safeParse(raw);
  const urls = a.success ? a.data.workers.filter(isRegular).map((w) => w.url) : listWorkersSchema.safeParse(raw).data?.urls;
  if (!urls) {
    throw new RlqError("engine_bad_response", `SGLang router ${root}: /workers answered ${JSON.stringify(raw).slice(0, 200)}, expected {workers: [{url}]}`, {
      isRetriable: true,
    });
  }
  return [...new Set(urls.map(normaliseWorkerUrl))];
}
