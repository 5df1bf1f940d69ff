import { z } from "zod";
import { callJson, EngineHttpError } from "./http.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * An SGLang router (sgl-router / sgl-model-gateway) in front of several
 * workers: rlq reads its worker list and talks to each worker directly, as
 * slime does for aborts (slime-semantics.md §1b). Direct routing is what lets
 * the pool abort a request by id on the worker that holds it, health-check
 * each worker, load weights into each, and keep per-worker metrics.
 *
 * GET {router}/workers → {workers: [{id, url, …}]} (current routers);
 * older routers answer GET /list_workers → {urls: [...]}.
 */
const workersSchema = z.object({ workers: z.array(z.object({ url: z.string().min(1) }).passthrough()) }).passthrough();
const listWorkersSchema = z.object({ urls: z.array(z.string().min(1)) }).passthrough();

export async function listRouterWorkers(routerUrl: string, timeoutMs = 10_000): Promise<string[]> {
  const root = routerUrl.replace(/\/+$/, "");
  let raw: unknown;
  try {
    raw = await callJson("GET", `${root}/workers`, undefined, { timeoutMs });
  } catch (e) {
    if (!(e instanceof EngineHttpError && e.status === 404)) throw e;
    raw = await callJson("GET", `${root}/list_workers`, undefined, { timeoutMs });
  }
  const a = workersSchema.safeParse(raw);
  const urls = a.success ? a.data.workers.map((w) => w.url) : listWorkersSchema.safeParse(raw).data?.urls;
  if (!urls) {
    throw new RlqError("engine_bad_response", `SGLang router ${root}: /workers answered ${JSON.stringify(raw).slice(0, 200)}, expected {workers: [{url}]}`, { isRetriable: true });
  }
  // Workers register as host:port or with a scheme; rlq needs a URL.
  return urls.map((u) => (/^https?:\/\//.test(u) ? u : `http://${u}`).replace(/\/+$/, ""));
}
