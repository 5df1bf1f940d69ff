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

/** One train attempt's wait for an unreachable trainer. */
interface OutageWait {
  /** When the current outage began (null: the trainer answers). */
  since: number | null;
  timeoutMs: number;
  /** The attempt's cancel signal; `stop` is it or the worker's shutdown. */
  cancel: AbortSignal;
  stop: AbortSignal;
  onWaiting(waitedMs: number): void;
}

/** Sleeps `ms`; true if `stop` fired first (or already had). */
function sleepUnless(ms: number, stop: AbortSignal): Promise<boolean> {
  if (stop.aborted) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = (stopped: boolean) => {
      clearTimeout(timer);
      stop.removeEventListener("abort", onStop);
      resolve(stopped);
    };
    const onStop = () => done(true);
    const timer = setTimeout(() => done(false), ms);
    stop.addEventListener("abort", onStop, { once: true });
  });
}

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

  /**
   * Runs `fn`, waiting out a trainer it cannot connect to (a restart, a model
   * reload): retried with backoff up to `trainer_unreachable_timeout_s` from
   * the outage's start, reported as progress so the stall watchdog (which
   * measures the trainer's progress, not the network) leaves the wait to its
   * own bound. After the bound: a non-retriable error, so the run pauses
   * with it. On `shutdown`: `worker_shutdown`, so the job is put back.
   */
  async function reachable<T>(fn: () => Promise<T>, w: OutageWait): Promise<T> {
    for (let delayMs = 250; ; delayMs = Math.min(delayMs * 2, 5000)) {
      try {
        const v = await fn();
        w.since = null;
        return v;
      } catch (e) {
        if (!(e instanceof RlqError && e.code === "trainer_unreachable")) throw e;
        w.since ??= Date.now();
        const waited = Date.now() - w.since;
        if (waited >= w.timeoutMs) {
          throw new RlqError("trainer_unreachable", `trainer ${base} unreachable for ${Math.round(waited / 1000)} s (trainer_unreachable_timeout_s ${w.timeoutMs / 1000}): ${e.message}`, { cause: e, isRetriable: false });
        }
        w.onWaiting(waited);
        if (await sleepUnless(Math.min(delayMs, w.timeoutMs - waited), w.stop)) {
          if (w.cancel.aborted) throw new RlqError("train_cancelled", `train step cancelled while waiting for trainer ${base}: ${String(w.cancel.reason ?? "")}`, { cause: e, isRetriable: true });
          throw new RlqError("worker_shutdown", `train step stopped waiting for trainer ${base}: the worker is shutting down`, { cause: e, isRetriable: true });
        }
      }
    }
  }

  return {
    async trainStep(req: TrainRequest, onProgress: (p: TrainProgress) => void, signal: AbortSignal, shutdown?: AbortSignal): Promise<TrainResult> {
      const timeoutS = typeof req.config.trainer_unreachable_timeout_s === "number" ? req.config.trainer_unreachable_timeout_s : 300;
      const wait: OutageWait = {
        since: null,
        timeoutMs: timeoutS * 1000,
        cancel: signal,
        stop: shutdown ? AbortSignal.any([signal, shutdown]) : signal,
        onWaiting: (ms) => onProgress({ done: 0, total: 1, phase: `waiting for the trainer: unreachable for ${Math.round(ms / 1000)} s` }),
      };
      const bytes = encodeBatch(req.batch);
      const server: Server = createServer((_q, res) => {
        res.writeHead(200, { "content-type": "application/octet-stream", "content-length": bytes.byteLength });
        res.end(bytes);
      });
      await new Promise<void>((resolve) => server.listen(0, options.batchHost ?? "127.0.0.1", resolve));
      const port = (server.address() as AddressInfo).port;
      const stepPath = `/v1/steps/${encodeURIComponent(req.runId)}/${req.step}`;
      try {
        // Re-sending the start is safe: the trainer joins a running attempt with the same number.
        await reachable(
          () =>
            call("POST", "/v1/steps", {
              run_id: req.runId,
              step: req.step,
              attempt: String(req.attempt),
              weight_version_in: req.weightVersionIn,
              checkpoint_uri_in: req.checkpointUriIn,
              output_dir: req.outputDir,
              batch_url: `http://${options.batchHost ?? "127.0.0.1"}:${port}/batch`,
              config: req.config,
            }),
          wait,
        );
        let lastSeq = -1;
        for (;;) {
          if (signal.aborted) {
            await call("POST", `${stepPath}/cancel`, { attempt: String(req.attempt) }).catch(() => undefined);
            throw new RlqError("train_cancelled", `train step ${req.step} attempt ${req.attempt} cancelled: ${String(signal.reason ?? "")}`, { isRetriable: true });
          }
          let raw: unknown;
          try {
            raw = await reachable(() => call("GET", stepPath), wait);
          } catch (e) {
            // The trainer answers again but no longer knows the step: it restarted and lost this attempt.
            if (e instanceof RlqError && e.code === "trainer_not_found") {
              throw new RlqError("trainer_lost_attempt", `trainer ${base} no longer knows step ${req.step} attempt ${req.attempt} (it restarted): ${e.message}`, { cause: e, isRetriable: true });
            }
            throw e;
          }
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
