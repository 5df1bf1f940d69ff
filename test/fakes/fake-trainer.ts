/**
 * TEST FAKE — a stand-in for a GPU trainer speaking rlq's trainer protocol
 * (docs/trainer-protocol.md), run as its own process. It fetches the RLQB
 * batch, "trains" deterministically (new weights = a function of the input
 * weights and the batch), reports progress, and writes weights and optimizer
 * state into the attempt's output_dir. Never used by `npm run demo`.
 *
 *   tsx test/fakes/fake-trainer.ts --port 0 [--step-ms 50] [--hang-step N]
 * --hang-step N: the first attempt of step N stops reporting progress (a hung GPU).
 * --fail-step N: every attempt of step N fails with a retryable error.
 */
import { createHash } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { decodeBatch } from "../../src/trainer/batch-codec.ts";
import { readJson, sendJson } from "./http-json.ts";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "step-ms": { type: "string", default: "20" },
    "hang-step": { type: "string", default: "-1" },
    "fail-step": { type: "string", default: "-1" },
  },
});
const stepMs = Number(values["step-ms"]);
const hangStep = Number(values["hang-step"]);
let failStep = Number(values["fail-step"]);
const hungOnce = new Set<number>();

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
const WEIGHTS = 64;

async function train(st: StepState, req: Record<string, unknown>): Promise<void> {
  const total = 4;
  const bump = (done: number, phase: string) => {
    st.progress = { done, total, phase };
    st.progress_seq++;
  };
  try {
    const batchRes = await fetch(String(req.batch_url));
    if (!batchRes.ok) throw Object.assign(new Error(`batch fetch: HTTP ${batchRes.status}`), { code: "batch_fetch_failed" });
    const batch = decodeBatch(new Uint8Array(await batchRes.arrayBuffer()));
    let weights = new Float64Array(WEIGHTS);
    const inUri = req.checkpoint_uri_in as string | null;
    if (inUri) weights = new Float64Array((await readFile(join(fileURLToPath(inUri), "weights.safetensors"))).buffer.slice(0));
    bump(0, "loaded");
    if (st.step === failStep) throw Object.assign(new Error("injected failure"), { code: "internal" });
    if (st.step === hangStep && !hungOnce.has(st.step)) {
      hungOnce.add(st.step);
      await new Promise(() => undefined); // never progresses again
    }
    const h = createHash("sha256");
    let tokens = 0;
    let rewardSum = 0;
    for (const s of batch.samples) {
      h.update(Buffer.from(s.tokens.buffer, s.tokens.byteOffset, s.tokens.byteLength));
      h.update(Buffer.from(s.lossMask));
      h.update(String(s.reward));
      tokens += s.lossMask.reduce((a, b) => a + b, 0);
      rewardSum += s.reward;
    }
    const digest = h.digest();
    for (let k = 1; k <= total; k++) {
      await new Promise((r) => setTimeout(r, stepMs));
      if (st.cancelled) return;
      for (let i = 0; i < WEIGHTS; i++) weights[i] = (weights[i] as number) * 0.99 + ((digest[(i + k) % digest.length] as number) - 128) / 1280;
      bump(k, "optimizer");
    }
    const out = String(req.output_dir);
    await mkdir(out, { recursive: true });
    await writeFile(join(out, "weights.safetensors"), Buffer.from(weights.buffer));
    await writeFile(join(out, "optimizer.safetensors"), Buffer.from(digest));
    st.result = {
      weight_version_out: Number(req.weight_version_in) + 1,
      checkpoint_uri: `file://${out}`,
      num_samples: batch.samples.length,
      num_tokens: tokens,
      metrics: { pg_loss: (weights[0] as number) / 10, mean_reward: rewardSum / Math.max(1, batch.samples.length) },
    };
    st.state = "done";
    bump(total, "done");
  } catch (e) {
    st.state = "failed";
    st.error = { code: (e as { code?: string }).code ?? "internal", message: (e as Error).message, retryable: true };
    st.progress_seq++;
  }
}

const server = createServer((req, res) => {
  void (async () => {
    const url = req.url ?? "/";
    if (req.method === "POST" && url === "/_fault") {
      // Test control: change the injected failure at run time.
      const b = await readJson(req);
      if (typeof b.fail_step === "number") failStep = b.fail_step;
      return sendJson(res, 200, { fail_step: failStep });
    }
    if (url === "/v1/health") return sendJson(res, 200, { ok: true, weight_version: null, busy: [...steps.values()].some((s) => s.state === "running") });
    if (req.method === "POST" && url === "/v1/steps") {
      const b = await readJson(req);
      const key = `${String(b.run_id)}/${Number(b.step)}`;
      const cur = steps.get(key);
      if (cur && (cur.state === "done" || (cur.state === "running" && cur.attempt === b.attempt))) return sendJson(res, 200, cur);
      if (cur && cur.state === "running") cur.cancelled = true; // a new attempt supersedes the old one
      const st: StepState = { run_id: String(b.run_id), step: Number(b.step), attempt: String(b.attempt), state: "running", progress: { done: 0, total: 4, phase: "queued" }, progress_seq: 0, result: null, error: null, cancelled: false };
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
