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
 * --host H: the address to listen on (default 127.0.0.1; a cluster test's namespace address).
 * --token-env NAME: every request needs `Authorization: Bearer $NAME` (server.py's --token-file / RLQ_TRAINER_TOKEN).
 * --checkpoint-dir D: with `checkpoint_transfer: fetch` in a request, checkpoints live under D (this
 *   host's disk), not at rlq's output_dir; served at /v1/checkpoint-files/RUN/STEP/ATTEMPT/NAME
 *   (workers/trainer-torch/server.py does the same).
 * --weights-bytes N: weights.safetensors is a safetensors file whose header names the run and whose
 *   tensor data is N bytes, the trained weights then zeros (a sparse file: no disk): a checkpoint as
 *   large as a real model's. Such a checkpoint is never read back, so use it for a run's last step.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { createReadStream, existsSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir, readFile, truncate, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { decodeBatch, encodeBatch } from "../../src/trainer/batch-codec.ts";
import { readJson, sendJson } from "./http-json.ts";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "step-ms": { type: "string", default: "20" },
    "hang-step": { type: "string", default: "-1" },
    "fail-step": { type: "string", default: "-1" },
    host: { type: "string", default: "127.0.0.1" },
    "token-env": { type: "string" },
    "checkpoint-dir": { type: "string" },
    "weights-bytes": { type: "string" },
  },
});
const stepMs = Number(values["step-ms"]);
const hangStep = Number(values["hang-step"]);
let failStep = Number(values["fail-step"]);
const hungOnce = new Set<number>();
const token = values["token-env"] ? process.env[values["token-env"]] : undefined;
if (values["token-env"] && !token) throw new Error(`--token-env ${values["token-env"]}: the variable is not set`);
const checkpointDir = values["checkpoint-dir"] ?? null;
const weightsBytes = values["weights-bytes"] === undefined ? null : Number(values["weights-bytes"]);

/** rlq's `.../RUN/step-S/attempt-X` → this host's directory for it (fetch mode). */
function localDir(rlqDir: string): string {
  if (!checkpointDir) throw Object.assign(new Error("checkpoint_transfer fetch needs --checkpoint-dir"), { code: "bad_request" });
  return join(checkpointDir, basename(dirname(dirname(rlqDir))), basename(dirname(rlqDir)), basename(rlqDir));
}

function sha256(b: Buffer): string {
  return createHash("sha256").update(b).digest("hex");
}

/**
 * --weights-bytes: `w` as the first tensor of a safetensors file padded with zeros to `dataBytes` of
 * tensor data. The padding is a truncate past the end of the file, so it is a hole, not written zeros.
 */
async function writeLargeWeights(path: string, w: Buffer, runId: string, dataBytes: number): Promise<void> {
  const header = Buffer.from(
    JSON.stringify({
      __metadata__: { run: runId },
      w: { dtype: "F64", shape: [w.length / 8], data_offsets: [0, w.length] },
      pad: { dtype: "U8", shape: [dataBytes - w.length], data_offsets: [w.length, dataBytes] },
    }),
  );
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(header.length));
  await writeFile(path, Buffer.concat([len, header, w]));
  await truncate(path, 8 + header.length + dataBytes);
}

/** GET with the attempt's batch token, retried on connection errors like server.py's fetch_batch. */
async function getBytes(url: string, bearer: unknown): Promise<Buffer> {
  const headers: Record<string, string> = typeof bearer === "string" ? { authorization: `Bearer ${bearer}` } : {};
  for (let k = 0; ; k++) {
    try {
      const r = await fetch(url, { headers });
      if (!r.ok) throw Object.assign(new Error(`GET ${url}: HTTP ${r.status}`), { code: "batch_fetch_failed", http: true });
      return Buffer.from(await r.arrayBuffer());
    } catch (e) {
      if ((e as { http?: boolean }).http || k >= 4) throw Object.assign(e as Error, { code: "batch_fetch_failed" });
      await new Promise((r) => setTimeout(r, 200 * 2 ** k));
    }
  }
}

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
    const fetchMode = req.checkpoint_transfer === "fetch";
    const batch = decodeBatch(new Uint8Array(await getBytes(String(req.batch_url), req.batch_token)));
    let weights = new Float64Array(WEIGHTS);
    const inUri = req.checkpoint_uri_in as string | null;
    if (inUri && !fetchMode) weights = new Float64Array((await readFile(join(fileURLToPath(inUri), "weights.safetensors"))).buffer.slice(0));
    if (inUri && fetchMode) {
      // Our own output of an earlier step, else the copy the worker serves (verified by sha256).
      const mine = join(localDir(fileURLToPath(inUri)), "weights.safetensors");
      const files = (req.checkpoint_in_files ?? {}) as Record<string, string>;
      let bytes: Buffer;
      if (existsSync(mine)) bytes = await readFile(mine);
      else if (typeof req.checkpoint_in_url === "string" && files["weights.safetensors"]) {
        bytes = await getBytes(`${req.checkpoint_in_url}/weights.safetensors`, req.batch_token);
        if (sha256(bytes) !== files["weights.safetensors"]) throw Object.assign(new Error("checkpoint_in sha256 mismatch"), { code: "version_unavailable" });
      } else throw Object.assign(new Error(`checkpoint_uri_in ${inUri}: not on this host and not served by the worker`), { code: "version_unavailable" });
      weights =
        bytes.byteLength === WEIGHTS * 8
          ? new Float64Array(Uint8Array.from(bytes).buffer)
          : new Float64Array(WEIGHTS).map((_, i) => (bytes[i % bytes.length] as number) / 255);
    }
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
    const rlqOut = String(req.output_dir);
    const out = fetchMode ? localDir(rlqOut) : rlqOut;
    await mkdir(out, { recursive: true });
    const w = Buffer.from(weights.buffer);
    const o = Buffer.from(digest);
    if (weightsBytes !== null && fetchMode)
      throw Object.assign(new Error("--weights-bytes does not support checkpoint_transfer fetch"), { code: "bad_request" });
    if (weightsBytes !== null) await writeLargeWeights(join(out, "weights.safetensors"), w, st.run_id, weightsBytes);
    else await writeFile(join(out, "weights.safetensors"), w);
    await writeFile(join(out, "optimizer.safetensors"), o);
    st.result = {
      weight_version_out: Number(req.weight_version_in) + 1,
      checkpoint_uri: `file://${rlqOut}`,
      ...(fetchMode ? { checkpoint_files: { "weights.safetensors": sha256(w), "optimizer.safetensors": sha256(o) } } : {}),
      num_samples: batch.samples.length,
      num_tokens: tokens,
      // The batch's content as served (the first 48 bits of the sha256 of its encoding without the run
      // id): tests compare it with a batch built afresh, and across runs.
      metrics: {
        pg_loss: (weights[0] as number) / 10,
        mean_reward: rewardSum / Math.max(1, batch.samples.length),
        batch_digest48: Number.parseInt(sha256(Buffer.from(encodeBatch({ ...batch, runId: "" }))).slice(0, 12), 16),
      },
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
    if (token !== undefined) {
      const want = Buffer.from(`Bearer ${token}`);
      const got = Buffer.from(req.headers.authorization ?? "");
      if (got.length !== want.length || !timingSafeEqual(got, want))
        return sendJson(res, 401, { error: { code: "unauthorized", message: "missing or wrong bearer token", retryable: false } });
    }
    const f = /^\/v1\/checkpoint-files\/([^/]+)\/([^/]+)\/([^/]+)\/([^/]+)$/.exec(url);
    if (req.method === "GET" && f && checkpointDir) {
      const parts = f.slice(1).map((x) => decodeURIComponent(x));
      if (parts.some((x) => x === ".." || x.includes("/")))
        return sendJson(res, 400, { error: { code: "bad_request", message: "bad path", retryable: false } });
      const path = join(checkpointDir, ...parts);
      if (!existsSync(path)) return sendJson(res, 404, { error: { code: "not_found", message: `no checkpoint file ${parts.join("/")}`, retryable: false } });
      res.writeHead(200, { "content-type": "application/octet-stream" });
      createReadStream(path).pipe(res);
      return;
    }
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
      const st: StepState = {
        run_id: String(b.run_id),
        step: Number(b.step),
        attempt: String(b.attempt),
        state: "running",
        progress: { done: 0, total: 4, phase: "queued" },
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
server.listen(Number(values.port), values.host, () => process.stdout.write(`listening ${(server.address() as AddressInfo).port}\n`));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
