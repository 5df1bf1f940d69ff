import { randomBytes } from "node:crypto";
import { createReadStream } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { basename, dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { z } from "zod";
import { encodeBatch } from "./batch-codec.ts";
import { checkTrainerCapabilities, requiredCapabilities } from "./capabilities.ts";
import { trainResultSchema, type Trainer, type TrainHooks, type TrainProgress, type TrainRequest, type TrainResult } from "./trainer.ts";
import { errorMessage, RlqError, trainerErrorCode } from "../lib/errors.ts";
import { sleep } from "../lib/sleep.ts";
import { backoffDelayMs, HttpNetworkError, isRetriableStatus, requestText, type HttpMethod, type TextAnswer } from "../lib/http-client.ts";
import { advertisedAddress, bearerHeader, bearerMatches, downloadCheckpointFile, localCheckpointFiles } from "./checkpoint-transfer.ts";

/** What went wrong with a call that got no answer: the socket's own message (it names the errno and address). */
function describe(e: unknown): string {
  const cause = (e as { cause?: unknown }).cause;
  return cause instanceof Error ? cause.message : (e as Error).message;
}

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
      /** [num_samples, in the request's order][response length] the old log-probs (TrainResult.oldLogProbs). */
      old_log_probs: z.array(z.array(z.number())).optional(),
      /** `checkpoints: fetch`: name → sha256 of the files the trainer serves for this checkpoint. */
      checkpoint_files: z.record(z.string(), z.string().regex(/^[0-9a-f]{64}$/)).optional(),
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
  /** The attempt's cancel signal (the stall watchdog). */
  cancel: AbortSignal;
  /** The worker's shutdown, if any. */
  shutdown: AbortSignal | null;
  onOutage(waitedMs: number | null): void;
}

/**
 * Errors that mean "no trainer there right now": nothing listens, the
 * connection was reset or closed mid-answer (the process died), the host or
 * its name cannot be reached (a machine or pod restarting). A request that
 * connected and got no answer in time is not one of them: that trainer is
 * there and hung, which the stall watchdog handles.
 */
const outageCodes = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EHOSTDOWN",
  "ENOTFOUND",
  "EAI_AGAIN",
  // lib/http-client.ts: no connection within connectTimeoutMs (a host that drops packets).
  "ETIMEDOUT",
]);

/** Waiting out an outage: 0.25 s doubling to 5 s between tries. */
const OUTAGE_BACKOFF = { firstMs: 250, maxMs: 5000 };

export function isTrainerOutage(e: unknown): boolean {
  for (let c: unknown = e, depth = 0; c instanceof Error && depth < 5; c = c.cause, depth++) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string" && outageCodes.has(code)) return true;
  }
  return false;
}

export interface RemoteTrainerOptions {
  url: string;
  /** Host the trainer can reach this process on, for the batch URL (default: this host's address on the route to the trainer). */
  batchHost?: string | null;
  /** Bearer token for every request to the trainer. */
  apiKey?: string | null;
  /** `fetch`: no shared filesystem; checkpoints travel over HTTP and are verified by sha256. Default `shared`. */
  checkpoints?: "shared" | "fetch";
  pollMs?: number;
  /** A request that connected but got no answer in this long fails (`trainer_timeout`). Default 30 s. */
  requestTimeoutMs?: number;
}

export function createRemoteTrainer(options: RemoteTrainerOptions): Trainer {
  return new RemoteTrainer(options);
}

type TrainerStatus = z.infer<typeof statusSchema>;

/** What one attempt serves the trainer, behind a random token that lives as long as the attempt. */
interface AttemptFiles {
  /** The RLQB-encoded batch. */
  bytes: Uint8Array;
  token: string;
  /** checkpoints: fetch: the input checkpoint's directory, when this host has it. */
  inDir: string | null;
  /** Its files (name → sha256), served under /checkpoint/NAME; empty when not served. */
  inFiles: Record<string, string>;
}

/** The attempt's HTTP server: GET /batch, and GET /checkpoint/NAME for the input checkpoint's files. */
function createAttemptServer(files: AttemptFiles): Server {
  return createServer((q, res) => {
    if (!bearerMatches(q.headers.authorization, files.token)) {
      res.writeHead(401, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          error: { code: "unauthorized", message: "GET batch_url needs Authorization: Bearer <batch_token from the request>", retryable: false },
        }),
      );
      return;
    }
    const path = (q.url ?? "/").split("?")[0] ?? "/";
    if (path === "/batch") {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": files.bytes.byteLength });
      res.end(files.bytes);
      return;
    }
    const name = path.startsWith("/checkpoint/") ? decodeURIComponent(path.slice("/checkpoint/".length)) : null;
    if (name !== null && files.inDir && Object.hasOwn(files.inFiles, name)) {
      const stream = createReadStream(join(files.inDir, name));
      stream.once("error", () => res.destroy());
      res.writeHead(200, { "content-type": "application/octet-stream" });
      stream.pipe(res);
      return;
    }
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { code: "not_found", message: `no ${path} here`, retryable: false } }));
  });
}

/**
 * The client of one trainer (`options.url`). A train step is: serve the attempt's files
 * (`serveAttempt`), check the capabilities the config needs, start the attempt (`startAttempt`),
 * then poll its status until it ends (`awaitAttempt`). Every request to the trainer goes through
 * `call`; `reachable` waits out an outage around it.
 */
class RemoteTrainer implements Trainer {
  private readonly base: string;
  private readonly pollMs: number;
  private readonly requestTimeoutMs: number;

  constructor(private readonly options: RemoteTrainerOptions) {
    this.base = options.url.replace(/\/$/, "");
    this.pollMs = options.pollMs ?? 100;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 30_000;
  }

  async trainStep(req: TrainRequest, onProgress: (p: TrainProgress) => void, signal: AbortSignal, hooks: TrainHooks = {}): Promise<TrainResult> {
    const timeoutS = typeof req.config.trainer_unreachable_timeout_s === "number" ? req.config.trainer_unreachable_timeout_s : 300;
    const wait: OutageWait = {
      since: null,
      timeoutMs: timeoutS * 1000,
      cancel: signal,
      shutdown: hooks.shutdown ?? null,
      onOutage: (ms) => hooks.onOutage?.(ms),
    };
    const isFetch = this.options.checkpoints === "fetch";
    const inDir = req.checkpointUriIn?.startsWith("file:") ? fileURLToPath(req.checkpointUriIn) : null;
    const files: AttemptFiles = {
      bytes: encodeBatch(req.batch),
      token: randomBytes(24).toString("base64url"),
      inDir,
      inFiles: isFetch && inDir ? await localCheckpointFiles(inDir) : {},
    };
    const served = await this.serveAttempt(files, wait);
    try {
      // A config needing an optional capability (ppo: a critic) is refused unless the trainer declares it.
      if (requiredCapabilities(req.config).length > 0) {
        checkTrainerCapabilities(await this.reachable((stop) => this.call("GET", "/v1/health", undefined, stop), wait), req.config, this.base);
      }
      await this.startAttempt(req, files, served.base, wait);
      return await this.awaitAttempt(req, onProgress, signal, wait);
    } finally {
      served.server.close();
    }
  }

  async health(): Promise<boolean> {
    try {
      const h = (await this.call("GET", "/v1/health")) as { ok?: boolean };
      return h.ok === true;
    } catch {
      // health() answers whether the trainer answers: any failure to ask is "no"; trainStep reports the reason.
      return false;
    }
  }

  async close(): Promise<void> {}

  /** The attempt's server, listening on the address the trainer reaches this host by. */
  private async serveAttempt(files: AttemptFiles, wait: OutageWait): Promise<{ server: Server; base: string }> {
    const server = createAttemptServer(files);
    // No route to the trainer (its link is down) is an outage like a refused connection.
    const addr = await this.reachable(() => advertisedAddress(this.base, this.options.batchHost), wait);
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, addr.listen, resolve);
    });
    const port = (server.address() as AddressInfo).port;
    return { server, base: `http://${addr.host}:${port}` };
  }

  /** POST /v1/steps. Re-sending the start is safe: the trainer joins a running attempt with the same number. */
  private async startAttempt(req: TrainRequest, files: AttemptFiles, servedBase: string, wait: OutageWait): Promise<void> {
    const body = {
      run_id: req.runId,
      step: req.step,
      attempt: String(req.attempt),
      weight_version_in: req.weightVersionIn,
      checkpoint_uri_in: req.checkpointUriIn,
      output_dir: req.outputDir,
      batch_url: `${servedBase}/batch`,
      batch_token: files.token,
      ...(this.options.checkpoints === "fetch"
        ? {
            checkpoint_transfer: "fetch",
            checkpoint_in_url: Object.keys(files.inFiles).length > 0 ? `${servedBase}/checkpoint` : null,
            checkpoint_in_files: files.inFiles,
          }
        : {}),
      config: req.config,
    };
    await this.reachable((stop) => this.call("POST", "/v1/steps", body, stop), wait);
  }

  /** Poll the attempt until it ends: its result, or the error it ended with. Progress goes to `onProgress` as it moves. */
  private async awaitAttempt(req: TrainRequest, onProgress: (p: TrainProgress) => void, signal: AbortSignal, wait: OutageWait): Promise<TrainResult> {
    const stepPath = `/v1/steps/${encodeURIComponent(req.runId)}/${req.step}`;
    let lastSeq = -1;
    for (;;) {
      if (signal.aborted) throw await this.cancelAttempt(req, stepPath, signal);
      const s = await this.readStatus(req, stepPath, wait);
      if (s.attempt !== String(req.attempt) && s.state === "running") {
        throw new RlqError("trainer_attempt_superseded", `trainer runs attempt ${s.attempt} of step ${req.step}, not ${req.attempt}`, {
          isRetriable: true,
        });
      }
      // Only a new progress report counts as progress: a live connection alone does not.
      if (s.progress_seq !== lastSeq) {
        lastSeq = s.progress_seq;
        onProgress(s.progress);
      }
      if (s.state === "done" && s.result) return this.resultOf(req, s.result);
      if (s.state === "failed" || s.state === "cancelled") throw attemptFailure(req, s);
      await new Promise((r) => setTimeout(r, this.pollMs));
    }
  }

  /**
   * Tell the trainer the attempt is cancelled; the error the step ends with. A trainer not told of
   * the cancel keeps the attempt running until the next attempt's start supersedes it there
   * (docs/trainer-protocol.md): the failure goes into the error.
   */
  private async cancelAttempt(req: TrainRequest, stepPath: string, signal: AbortSignal): Promise<RlqError> {
    const untold = await this.call("POST", `${stepPath}/cancel`, { attempt: String(req.attempt) }).then(
      () => null,
      (e: unknown) => e,
    );
    const note = untold === null ? "" : `; the trainer was not told (${errorMessage(untold)}), the next attempt supersedes it there`;
    return new RlqError("train_cancelled", `train step ${req.step} attempt ${req.attempt} cancelled: ${String(signal.reason ?? "")}${note}`, {
      ...(untold === null ? {} : { cause: untold }),
      isRetriable: true,
    });
  }

  /** GET the step's status, through outages, validated. */
  private async readStatus(req: TrainRequest, stepPath: string, wait: OutageWait): Promise<TrainerStatus> {
    let raw: unknown;
    try {
      raw = await this.reachable((stop) => this.call("GET", stepPath, undefined, stop), wait);
    } catch (e) {
      // The trainer answers again but no longer knows the step: it restarted and lost this attempt.
      if (e instanceof RlqError && e.code === "trainer_not_found") {
        throw new RlqError(
          "trainer_lost_attempt",
          `trainer ${this.base} no longer knows step ${req.step} attempt ${req.attempt} (it restarted): ${e.message}`,
          {
            cause: e,
            isRetriable: true,
          },
        );
      }
      throw e;
    }
    const st = statusSchema.safeParse(raw);
    if (!st.success)
      throw new RlqError("trainer_bad_response", `trainer ${this.base}${stepPath}: ${st.error.issues[0]?.message} at ${st.error.issues[0]?.path.join(".")}`, {
        isRetriable: true,
      });
    return st.data;
  }

  /** A done attempt's result; with checkpoints: fetch, its checkpoint downloaded to this host first. */
  private async resultOf(req: TrainRequest, result: NonNullable<TrainerStatus["result"]>): Promise<TrainResult> {
    const checkpointUri =
      this.options.checkpoints === "fetch"
        ? await this.fetchOutput(result.checkpoint_uri, result.checkpoint_files, req.outputDir, req.runId, req.step)
        : result.checkpoint_uri;
    return trainResultSchema.parse({
      weightVersionOut: result.weight_version_out,
      checkpointUri,
      numSamples: result.num_samples,
      numTokens: result.num_tokens,
      metrics: result.metrics,
      ...(result.old_log_probs && { oldLogProbs: result.old_log_probs }),
    });
  }

  /** One request. `stop` (only during an outage) ends it early when the attempt is cancelled or the worker closes. */
  private async call(method: HttpMethod, path: string, body?: unknown, stop: AbortSignal[] = []): Promise<unknown> {
    const base = this.base;
    let res: TextAnswer;
    try {
      res = await requestText(method, `${base}${path}`, body, {
        timeoutMs: this.requestTimeoutMs,
        headers: bearerHeader(this.options.apiKey),
        ...(stop.length === 0 ? {} : { signal: AbortSignal.any(stop) }),
      }); // a trainer that dies mid-answer fails here, as an outage
    } catch (e) {
      if (isTrainerOutage(e)) throw new RlqError("trainer_unreachable", `trainer ${base}${path}: ${describe(e)}`, { cause: e, isRetriable: true });
      if (e instanceof HttpNetworkError && e.kind === "timeout")
        throw new RlqError("trainer_timeout", `trainer ${base}${path}: no answer within ${this.requestTimeoutMs / 1000} s`, { cause: e, isRetriable: true });
      throw new RlqError("trainer_request_failed", `trainer ${base}${path}: ${describe(e)}`, { cause: e, isRetriable: true });
    }
    const text = res.text;
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      throw new RlqError("trainer_bad_response", `trainer ${base}${path}: HTTP ${res.status}, not JSON: ${text.slice(0, 200)}`, { isRetriable: true });
    }
    if (res.status < 200 || res.status >= 300) {
      const err = errorSchema.safeParse((parsed as { error?: unknown } | null)?.error);
      if (!err.success)
        throw new RlqError("trainer_http_error", `trainer ${base}${path}: HTTP ${res.status} without the protocol's error body: ${text.slice(0, 300)}`, {
          isRetriable: isRetriableStatus(res.status),
        });
      const e = err.data;
      throw new RlqError(trainerErrorCode(e.code), `trainer ${base}${path}: HTTP ${res.status} ${e.code}: ${e.message}`, { isRetriable: e.retryable });
    }
    return parsed;
  }

  /**
   * Runs `fn`, waiting out a trainer it cannot connect to (a restart, a model
   * reload): retried with backoff (0.25 s doubling to 5 s) up to
   * `trainer_unreachable_timeout_s` from the outage's start, told to
   * `onOutage` so the stall watchdog pauses for it. After the bound: a
   * non-retriable error, so the run pauses with it. A cancel or a shutdown
   * ends the wait (`train_cancelled`, `worker_shutdown`).
   */
  private async reachable<T>(fn: (stop: AbortSignal[]) => Promise<T>, w: OutageWait): Promise<T> {
    const stops = [w.cancel, ...(w.shutdown ? [w.shutdown] : [])];
    for (let tries = 0; ; tries++) {
      try {
        const v = await fn(w.since === null ? [] : stops);
        if (w.since !== null) {
          w.since = null;
          w.onOutage(null);
        }
        return v;
      } catch (e) {
        if (w.since !== null && stops.some((x) => x.aborted)) throw this.stopped(w, e);
        if (!(e instanceof RlqError && e.code === "trainer_unreachable")) throw e;
        w.since ??= Date.now();
        const waited = Date.now() - w.since;
        if (waited >= w.timeoutMs) {
          throw new RlqError(
            "trainer_unreachable",
            `trainer ${this.base} unreachable for ${Math.round(waited / 1000)} s (trainer_unreachable_timeout_s ${w.timeoutMs / 1000}): ${e.message}`,
            { cause: e, isRetriable: false },
          );
        }
        w.onOutage(waited);
        if (await sleep(Math.min(backoffDelayMs(tries, OUTAGE_BACKOFF), w.timeoutMs - waited), ...stops)) throw this.stopped(w, e);
      }
    }
  }

  private stopped(w: OutageWait, cause: unknown): RlqError {
    if (w.cancel.aborted)
      return new RlqError("train_cancelled", `train step cancelled while waiting for trainer ${this.base}: ${String(w.cancel.reason ?? "")}`, {
        cause,
        isRetriable: true,
      });
    return new RlqError("worker_shutdown", `train step stopped waiting for trainer ${this.base}: the worker is shutting down`, { cause, isRetriable: true });
  }

  /**
   * checkpoints: fetch: download the finished checkpoint's files into this host's directory for
   * the step, each verified against the sha256 the trainer reported, and answer that local URI.
   * The trainer names a checkpoint by rlq's path `.../RUN/step-S/attempt-X`; an earlier attempt
   * may have been started by a worker on another host, whose RLQ_HOME differs, so only the
   * last three components count (they must be this run and step).
   */
  private async fetchOutput(uri: string, files: Record<string, string> | undefined, outputDir: string, runId: string, step: number): Promise<string> {
    const base = this.base;
    if (!files || !files["weights.safetensors"]) {
      throw new RlqError(
        "trainer_bad_response",
        `trainer ${base}: checkpoints: fetch, but the result lists no checkpoint_files with weights.safetensors (does the trainer support checkpoint_transfer: fetch?)`,
        { isRetriable: false },
      );
    }
    const theirs = uri.startsWith("file:") ? fileURLToPath(uri) : uri;
    if (basename(dirname(theirs)) !== `step-${step}` || basename(dirname(dirname(theirs))) !== runId || !basename(theirs).startsWith("attempt-")) {
      throw new RlqError("trainer_bad_response", `trainer ${base}: checkpoint ${uri} is not an attempt of run ${runId} step ${step}`, { isRetriable: false });
    }
    const dir = join(dirname(outputDir), basename(theirs));
    for (const [name, sha] of Object.entries(files)) {
      if (!/^[A-Za-z0-9._-]+$/.test(name))
        throw new RlqError("trainer_bad_response", `trainer ${base}: checkpoint file name ${JSON.stringify(name)} is not a plain file name`, {
          isRetriable: false,
        });
      await downloadCheckpointFile(base, this.options.apiKey ?? null, dir, name, sha);
    }
    return pathToFileURL(dir).href;
  }
}

/** The error a failed or cancelled attempt ends the step with. */
function attemptFailure(req: TrainRequest, s: TrainerStatus): RlqError {
  // A cancel on the trainer's side (its own, or another client's) gives no error: the attempt is tried again.
  if (!s.error && s.state === "cancelled")
    return new RlqError("train_cancelled", `trainer step ${req.step}: attempt ${s.attempt} cancelled on the trainer`, { isRetriable: true });
  const e = s.error ?? { code: "none", message: `attempt ${s.attempt} failed with no error`, retryable: true };
  return new RlqError(trainerErrorCode(e.code), `trainer step ${req.step}: ${e.code}: ${e.message}`, { isRetriable: e.retryable });
}
