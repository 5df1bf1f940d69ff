/**
 * BENCH FAKE: a trainer speaking rlq's trainer protocol (docs/trainer-protocol.md; the same shape
 * as test/fakes/fake-trainer.ts) whose step is a timer: train0Ms + real tokens / trainTokensPerS,
 * in sim ms (bench/sim/model.ts), run timeScale times faster. It fetches and decodes the RLQB batch
 * (rlq's real cost of shipping it), reports progress every 250 wall ms, and writes a small weights
 * file into the attempt's output_dir. GET /_stats: each step's start and end (epoch ms) and tokens.
 *
 *   tsx bench/sim/trainer.ts --port 0 --params JSON   (prints "listening PORT")
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { decodeBatch } from "../../src/trainer/batch-codec.ts";
import { readJson, sendJson } from "../../test/fakes/http-json.ts";
import type { SimParams } from "./model.ts";

const { values } = parseArgs({ options: { port: { type: "string", default: "0" }, params: { type: "string" } } });
if (!values.params) throw new Error("--params: the SimParams JSON is required");
const p = JSON.parse(values.params) as SimParams;

interface StepState {
  run_id: string;
  step: number;
  attempt: string;
  state: "running" | "done" | "failed" | "cancelled";
  progress: { done: number; total: number; phase: string };
  progress_seq: number;
  result: unknown;
  error: unknown;
  cancelled: boolean;
}
const steps = new Map<string, StepState>();
const log: Array<{ step: number; receivedAt: number; startAt: number; endAt: number; samples: number; realTokens: number; trainMs: number }> = [];

async function train(st: StepState, req: Record<string, unknown>): Promise<void> {
  const receivedAt = Date.now();
  try {
    // The batch URL takes the step's bearer token (trainer protocol: batch_token).
    const r = await fetch(String(req.batch_url), typeof req.batch_token === "string" ? { headers: { authorization: `Bearer ${req.batch_token}` } } : {});
    if (!r.ok) throw Object.assign(new Error(`batch fetch: HTTP ${r.status}`), { code: "batch_fetch_failed" });
    const batch = decodeBatch(new Uint8Array(await r.arrayBuffer()));
    let tokens = 0;
    for (const s of batch.samples) tokens += s.lossMask.length;
    const realTokens = tokens * p.tokenScale;
    const startAt = Date.now();
    const wallMs = (p.train0Ms + (1000 * realTokens) / p.trainTokensPerS) / p.timeScale;
    const total = Math.max(1, Math.ceil(wallMs / 250));
    for (let k = 1; k <= total; k++) {
      await new Promise((res) => setTimeout(res, Math.max(0, startAt + (wallMs * k) / total - Date.now())));
      if (st.cancelled) return;
      st.progress = { done: k, total, phase: "optimizer" };
      st.progress_seq++;
    }
    const out = String(req.output_dir);
    await mkdir(out, { recursive: true });
    await writeFile(join(out, "weights.safetensors"), Buffer.alloc(64));
    await writeFile(join(out, "optimizer.safetensors"), Buffer.alloc(64));
    log.push({ step: st.step, receivedAt, startAt, endAt: Date.now(), samples: batch.samples.length, realTokens, trainMs: wallMs });
    st.result = {
      weight_version_out: Number(req.weight_version_in) + 1,
      checkpoint_uri: `file://${out}`,
      num_samples: batch.samples.length,
      num_tokens: tokens,
      metrics: { pg_loss: 0 },
    };
    st.state = "done";
    st.progress_seq++;
  } catch (e) {
    st.state = "failed";
    st.error = { code: (e as { code?: string }).code ?? "internal", message: (e as Error).message, retryable: true };
    st.progress_seq++;
  }
}

const server = createServer((req, res) => {
  void (async () => {
    const url = req.url ?? "/";
    if (url === "/_stats") return sendJson(res, 200, { steps: log });
    if (url === "/v1/health") return sendJson(res, 200, { ok: true, weight_version: null, busy: [...steps.values()].some((s) => s.state === "running") });
    if (req.method === "POST" && url === "/v1/steps") {
      const b = await readJson(req);
      const key = `${String(b.run_id)}/${Number(b.step)}`;
      const cur = steps.get(key);
      if (cur && (cur.state === "done" || (cur.state === "running" && cur.attempt === b.attempt))) return sendJson(res, 200, cur);
      if (cur && cur.state === "running") cur.cancelled = true;
      const st: StepState = {
        run_id: String(b.run_id),
        step: Number(b.step),
        attempt: String(b.attempt),
        state: "running",
        progress: { done: 0, total: 1, phase: "queued" },
        progress_seq: 0,
        result: null,
        error: null,
        cancelled: false,
      };
      steps.set(key, st);
      void train(st, b);
      return sendJson(res, 202, st);
    }
    const m = /^\/v1\/steps\/([^/]+)\/(\d+)(\/cancel)?$/.exec(url);
    if (m) {
      const st = steps.get(`${decodeURIComponent(m[1] as string)}/${m[2]}`);
      if (!st) return sendJson(res, 404, { error: { code: "not_found", message: "no such step", retryable: false } });
      if (m[3]) {
        st.cancelled = true;
        if (st.state === "running") st.state = "cancelled";
      }
      return sendJson(res, 200, st);
    }
    sendJson(res, 404, { error: { code: "not_found", message: url, retryable: false } });
  })().catch((e: unknown) => sendJson(res, 500, { error: { code: "internal", message: String(e), retryable: true } }));
});
server.listen(Number(values.port), "127.0.0.1", () => process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
