/**
 * TEST FAKE — the part of an SGLang router (sgl-model-gateway) rlq uses, as the
 * real one answers it (sgl-model-gateway src/core/worker_service.rs, read in the router's source):
 *   GET /workers → {workers: [{id, url, model_id, worker_type, connection_mode, is_healthy, load}], total,
 *     stats: {prefill_count, decode_count, regular_count}} (WorkerService::list_workers, ListWorkersResult)
 *   POST /workers {url, worker_type?, dp_size?} → 202 {status: "accepted", worker_id, url, location, message}
 *     (create_worker: queued as a job); DELETE /workers/:id (a UUID; anything else 400 BAD_REQUEST,
 *     unknown 404 WORKER_NOT_FOUND) → 202 {status: "accepted", worker_id, message} (delete_worker).
 * Not re-read in the source (kept from the earlier reading): the `url@rank` form of dp-aware workers
 * and which routes the auth middleware leaves open.
 * Each worker carries runtime_type (sglang | vllm | trtllm | external; lightseekorg/smg
 * crates/protocols/src/worker.rs at 73da68ca): --vllm-workers lists vLLM servers behind the gateway.
 * Keys (lightseekorg/smg model_gateway/src/server.rs `apply_control_plane_auth`, middleware/auth.rs at
 * c5573dda): /workers is a control-plane route that takes the shared --api-key only; with
 * --tenant-keys and no --api-key it is denied to every caller (deny_all_middleware); a refusal is
 * an empty 401. Tenant keys open only the data plane, which this fake does not serve.
 * Like the real router it lists what it knows, not what a client can use:
 * - a data-parallel-aware worker (dp_size > 1) is listed once per rank as `url@rank`;
 * - prefill/decode workers (worker_type prefill | decode) and gRPC workers are listed too;
 * - with --api-key, /workers wants `Authorization: Bearer <key>` (server.rs auth middleware
 *   covers every route but /health, /liveness, /readiness).
 * rlq routes to the workers itself, so this fake does not proxy /generate.
 *
 *   tsx test/fakes/fake-sglang-router.ts --port 0 --workers http://127.0.0.1:1,127.0.0.1:2
 *     [--dp-workers URL,...] [--prefill-workers URL,...] [--vllm-workers URL,...] [--api-key KEY] [--tenant-keys K,...]
 * prints "listening <port>" on stdout.
 */
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { readJson, sendJson } from "./http-json.ts";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    workers: { type: "string", default: "" },
    "dp-workers": { type: "string", default: "" },
    "prefill-workers": { type: "string", default: "" },
    "api-key": { type: "string" },
    "vllm-workers": { type: "string", default: "" },
    "tenant-keys": { type: "string", default: "" },
  },
});
interface Worker {
  id: string;
  url: string;
  model_id: string;
  worker_type: string;
  connection_mode: string;
  is_healthy: boolean;
  load: number;
  runtime_type: string;
}
const workers: Worker[] = [];
function add(url: string, type = "regular", dpSize = 1, runtime = "sglang"): void {
  const urls = dpSize > 1 ? Array.from({ length: dpSize }, (_, r) => `${url}@${r}`) : [url];
  for (const u of urls)
    workers.push({
      id: randomUUID(),
      url: u,
      model_id: "fake/model",
      worker_type: type,
      connection_mode: "http",
      is_healthy: true,
      load: 0,
      runtime_type: runtime,
    });
}
const list = (s: string) => s.split(",").filter((u) => u.length > 0);
for (const u of list(values.workers)) add(u);
for (const u of list(values["dp-workers"])) add(u, "regular", 2);
for (const u of list(values["prefill-workers"])) add(u, "prefill");
for (const u of list(values["vllm-workers"])) add(u, "regular", 1, "vllm");
const hasTenantKeys = list(values["tenant-keys"]).length > 0;

const server = createServer((req, res) => {
  void (async () => {
    const url = req.url ?? "/";
    if (url !== "/health" && values["api-key"] === undefined && hasTenantKeys) return void res.writeHead(401).end();
    if (url !== "/health" && values["api-key"] !== undefined && req.headers.authorization !== `Bearer ${values["api-key"]}`) {
      return void res.writeHead(401).end();
    }
    const count = (type: string) => workers.filter((w) => w.worker_type === type).length;
    if (req.method === "GET" && url === "/workers")
      return sendJson(res, 200, {
        workers,
        total: workers.length,
        stats: { prefill_count: count("prefill"), decode_count: count("decode"), regular_count: count("regular") },
      });
    if (req.method === "POST" && url === "/workers") {
      const b = await readJson(req);
      const workerUrl = typeof b.url === "string" ? b.url : "";
      add(
        workerUrl,
        typeof b.worker_type === "string" ? b.worker_type : "regular",
        Number(b.dp_size ?? 1),
        typeof b.runtime_type === "string" ? b.runtime_type : "sglang",
      );
      const id = workers[workers.length - 1]?.id ?? "";
      res.setHeader("location", `/workers/${id}`);
      return sendJson(res, 202, {
        status: "accepted",
        worker_id: id,
        url: workerUrl,
        location: `/workers/${id}`,
        message: "Worker addition queued for background processing",
      });
    }
    const del = /^\/workers\/([^/]+)$/.exec(url);
    if (req.method === "DELETE" && del) {
      const raw = decodeURIComponent(del[1] as string);
      if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(raw))
        return sendJson(res, 400, { error: `Invalid worker_id '${raw}' (expected UUID).`, code: "BAD_REQUEST" });
      const i = workers.findIndex((w) => w.id === raw);
      if (i < 0) return sendJson(res, 404, { error: `Worker ${raw} not found`, code: "WORKER_NOT_FOUND" });
      workers.splice(i, 1);
      return sendJson(res, 202, { status: "accepted", worker_id: raw, message: "Worker removal queued for background processing" });
    }
    sendJson(res, 404, { error: { message: `no route ${req.method} ${url}` } });
  })();
});
server.listen(Number(values.port), "127.0.0.1", () => {
  process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
