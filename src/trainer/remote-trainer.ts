import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { z } from "zod";
import { encodeBatch } from "./batch-codec.ts";
import { trainResultSchema, type Trainer, type TrainProgress, type TrainRequest, type TrainResult } from "./trainer.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * Client of rlq's trainer protocol (docs/trainer-protocol.md): a GPU trainer
 * process behind HTTP. The batch is served by this client on an ephemeral
 * port and fetched by the trainer in the RLQB binary format; the client
 * polls status, forwards progress, and cancels the attempt when asked.
 */
const errorSchema = z.object({ code: z.string(), message: z.string(), retryable: z.boolean() });
const statusSchema = z.object({
  run_id: z.string(),
  step: z.number().int(),
  attempt: z.string(),
  state: z.enum(["running", "done", "failed", "cancelled"]),
  progress: z.object({ done: z.number().int(), total: z.number().int().positive(), phase: z.string() }),
  progress_seq: z.number().int(),
  result: z
    .object({
      weight_version_out: z.number().int(),
      checkpoint_uri: z.string(),
      num_samples: z.number().int(),
      num_tokens: z.number().int(),
      metrics: z.record(z.string(), z.number()),
    })
    .nullable()
    .optional(),
  error: errorSchema.nullable().optional(),
});

export interface RemoteTrainerOptions {
  url: string;
  /** Host the trainer can reach this process on, for the batch URL. */
  batchHost?: string;
  pollMs?: number;
}

export function createRemoteTrainer(options: RemoteTrainerOptions): Trainer {
  const base = options.url.replace(/\/$/, "");
  const pollMs = options.pollMs ?? 100;

  async function call(method: string, path: string, body?: unknown): Promise<unknown> {
    let res: Response;
    try {
      res = await fetch(`${base}${path}`, {
        method,
        headers: body === undefined ? {} : { "content-type": "application/json" },
        body: body === undefined ? null : JSON.stringify(body),
        signal: AbortSignal.timeout(30_000),
      });
    } catch (e) {
      throw new RlqError("trainer_unreachable", `trainer ${base}${path}: ${(e as Error).message}`, { cause: e, isRetriable: true });
    }
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      throw new RlqError("trainer_bad_response", `trainer ${base}${path}: HTTP ${res.status}, not JSON: ${text.slice(0, 200)}`, { isRetriable: true });
    }
    if (!res.ok) {
      const err = errorSchema.safeParse((parsed as { error?: unknown } | null)?.error);
      const e = err.success ? err.data : { code: "http_error", message: text.slice(0, 300), retryable: res.status >= 500 };
      throw new RlqError(`trainer_${e.code}`, `trainer ${base}${path}: HTTP ${res.status} ${e.code}: ${e.message}`, { isRetriable: e.retryable });
    }
    return parsed;
  }

  return {
    async trainStep(req: TrainRequest, onProgress: (p: TrainProgress) => void, signal: AbortSignal): Promise<TrainResult> {
      const bytes = encodeBatch(req.batch);
      const server: Server = createServer((_q, res) => {
        res.writeHead(200, { "content-type": "application/octet-stream", "content-length": bytes.byteLength });
        res.end(bytes);
      });
      await new Promise<void>((resolve) => server.listen(0, options.batchHost ?? "127.0.0.1", resolve));
      const port = (server.address() as AddressInfo).port;
      const stepPath = `/v1/steps/${encodeURIComponent(req.runId)}/${req.step}`;
      try {
        await call("POST", "/v1/steps", {
          run_id: req.runId,
          step: req.step,
          attempt: String(req.attempt),
          weight_version_in: req.weightVersionIn,
          checkpoint_uri_in: req.checkpointUriIn,
          output_dir: req.outputDir,
          batch_url: `http://${options.batchHost ?? "127.0.0.1"}:${port}/batch`,
          config: req.config,
        });
        let lastSeq = -1;
        for (;;) {
          if (signal.aborted) {
            await call("POST", `${stepPath}/cancel`, { attempt: String(req.attempt) }).catch(() => undefined);
            throw new RlqError("train_cancelled", `train step ${req.step} attempt ${req.attempt} cancelled: ${String(signal.reason ?? "")}`, { isRetriable: true });
          }
          const raw = await call("GET", stepPath);
          const st = statusSchema.safeParse(raw);
          if (!st.success) throw new RlqError("trainer_bad_response", `trainer ${base}${stepPath}: ${st.error.issues[0]?.message} at ${st.error.issues[0]?.path.join(".")}`, { isRetriable: true });
          const s = st.data;
          if (s.attempt !== String(req.attempt) && s.state === "running") {
            throw new RlqError("trainer_attempt_superseded", `trainer runs attempt ${s.attempt} of step ${req.step}, not ${req.attempt}`, { isRetriable: true });
          }
          // Only a new progress report counts as progress: a live connection alone does not.
          if (s.progress_seq !== lastSeq) {
            lastSeq = s.progress_seq;
            onProgress(s.progress);
          }
          if (s.state === "done" && s.result) {
            return trainResultSchema.parse({
              weightVersionOut: s.result.weight_version_out,
              checkpointUri: s.result.checkpoint_uri,
              numSamples: s.result.num_samples,
              numTokens: s.result.num_tokens,
              metrics: s.result.metrics,
            });
          }
          if (s.state === "failed" || s.state === "cancelled") {
            const e = s.error ?? { code: s.state, message: `attempt ${s.attempt} ${s.state}`, retryable: true };
            throw new RlqError(`trainer_${e.code}`, `trainer step ${req.step}: ${e.code}: ${e.message}`, { isRetriable: e.retryable });
          }
          await new Promise((r) => setTimeout(r, pollMs));
        }
      } finally {
        server.close();
      }
    },
    async health() {
      try {
        const h = (await call("GET", "/v1/health")) as { ok?: boolean };
        return h.ok === true;
      } catch {
        return false;
      }
    },
    async close() {},
  };
}
