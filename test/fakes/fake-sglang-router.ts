/**
 * TEST FAKE — the part of an SGLang router (sgl-router / sgl-model-gateway)
 * rlq uses: GET /workers → {workers: [{id, url, …}]} and DELETE /workers/:id.
 * rlq routes to the workers itself, so this fake does not proxy /generate.
 *
 *   tsx test/fakes/fake-sglang-router.ts --port 0 --workers http://127.0.0.1:1,127.0.0.1:2
 * prints "listening <port>" on stdout.
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { sendJson } from "./http-json.ts";

const { values } = parseArgs({ options: { port: { type: "string", default: "0" }, workers: { type: "string", default: "" } } });
const workers = values.workers
  .split(",")
  .filter((u) => u.length > 0)
  .map((url, i) => ({ id: `worker-${i}`, url, model_id: "fake/model", worker_type: "regular", is_healthy: true, load: 0 }));

const server = createServer((req, res) => {
  const url = req.url ?? "/";
  if (req.method === "GET" && url === "/workers") return sendJson(res, 200, { workers, total: workers.length });
  const del = /^\/workers\/([^/]+)$/.exec(url);
  if (req.method === "DELETE" && del) {
    const i = workers.findIndex((w) => w.id === del[1]);
    if (i < 0) return sendJson(res, 404, { error: "no such worker" });
    workers.splice(i, 1);
    return sendJson(res, 200, { success: true });
  }
  sendJson(res, 404, { error: { message: `no route ${req.method} ${url}` } });
});
server.listen(Number(values.port), "127.0.0.1", () => {
  process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
