import type { Worker } from "node:worker_threads";
import { pathFromUri, resolveModelPath } from "../../model/checkpoint.ts";
import type { ModelConfig } from "../../model/config.ts";
import { siblingModuleUrl, spawnModuleWorker } from "../../model/module-worker.ts";
import { generateRequestSchema, generateResultSchema, type Engine, type GenerateRequest, type GenerateResult } from "../engine.ts";
import type { EngineWorkerData, FromWorker, ToWorker } from "./protocol.ts";
import { RlqError } from "../../lib/errors.ts";

/** Errors of the embedded engine, with a stable code (STYLE.md: errors carry `code` and `cause`). */
export class EmbeddedEngineError extends RlqError {
  declare readonly code:
    "embedded_engine_closed" | "embedded_duplicate_request" | "embedded_invalid_request" | "embedded_load_failed" | "embedded_worker_failed";
  constructor(code: EmbeddedEngineError["code"], message: string, options: { cause?: unknown } = {}) {
    super(code, message, options);
    this.name = "EmbeddedEngineError";
  }
}

export interface EmbeddedEngineOptions {
  /** Initial checkpoint: a checkpoint directory, its weights file, or either's file:// URI. Its metadata gives version and config. */
  checkpointUri: string;
  /** Engine id reported in results; default "embedded-0". */
  id?: string;
  /** Most requests decoded together; more wait for a slot. Default 64. */
  maxBatchSize?: number;
  /** ORT threads per run; default 1 (on 2 cores, one engine per core beats 2 threads: bench/embedded-model.ts). */
  intraOpNumThreads?: number;
  /**
   * Std of Gaussian noise added to the logits before sampling and log-probs: a
   * controlled engine/trainer mismatch so TIS/MIS can be seen working. Default 0.
   */
  logitNoiseStd?: number;
}

export interface EmbeddedEngine extends Engine {
  /** The model config the engine serves (from the initial checkpoint). */
  readonly config: ModelConfig;
}

/** How long close() waits for the worker to exit by itself before terminating it. */
const CLOSE_TIMEOUT_MS = 10_000;

interface Pending {
  resolve: (r: GenerateResult) => void;
  reject: (e: Error) => void;
}

/** Start the engine's worker thread and wait until it serves the initial checkpoint. */
export async function createEmbeddedEngine(options: EmbeddedEngineOptions): Promise<EmbeddedEngine> {
  const workerData: EngineWorkerData = {
    checkpointPath: await resolveModelPath(options.checkpointUri),
    maxBatchSize: options.maxBatchSize ?? 64,
    intraOpNumThreads: options.intraOpNumThreads ?? 1,
    logitNoiseStd: options.logitNoiseStd ?? 0,
  };
  const worker = spawnModuleWorker(siblingModuleUrl(import.meta.url, "engine-worker"), { workerData });
  const ready = await new Promise<{ version: number; config: ModelConfig }>((resolve, reject) => {
    const onMessage = (msg: FromWorker): void => {
      if (msg.type === "ready") resolve(msg);
      if (msg.type === "fatal") reject(new EmbeddedEngineError("embedded_worker_failed", msg.message));
    };
    worker.on("message", onMessage);
    worker.once("error", (err) => reject(new EmbeddedEngineError("embedded_worker_failed", "engine worker failed to start", { cause: err })));
  }).catch(async (err: unknown) => {
    await worker.terminate();
    throw err;
  });
  worker.removeAllListeners("message");
  worker.removeAllListeners("error");
  return new WorkerEngine(options.id ?? "embedded-0", worker, ready.version, ready.config);
}

class WorkerEngine implements EmbeddedEngine {
  private readonly pending = new Map<string, Pending>();
  private readonly tickets = new Map<number, { resolve: () => void; reject: (e: Error) => void }>();
  private nextTicket = 0;
  private failure: Error | null = null;
  private closed = false;
  /** generate() calls of this turn, posted together at its end (protocol.ts). */
  private outbox: GenerateRequest[] = [];

  constructor(
    readonly id: string,
    private readonly worker: Worker,
    private version: number,
    readonly config: ModelConfig,
  ) {
    worker.on("message", (msg: FromWorker) => this.onMessage(msg));
    worker.on("error", (err) => this.fail(new EmbeddedEngineError("embedded_worker_failed", "engine worker crashed", { cause: err })));
    worker.on("exit", (code) => {
      if (!this.closed) this.fail(new EmbeddedEngineError("embedded_worker_failed", `engine worker exited with code ${code}`));
    });
  }

  generate(request: GenerateRequest): Promise<GenerateResult> {
    if (this.closed || this.failure) return Promise.reject(this.failure ?? new EmbeddedEngineError("embedded_engine_closed", `engine ${this.id} is closed`));
    const parsed = generateRequestSchema.safeParse(request);
    if (!parsed.success) return Promise.reject(new EmbeddedEngineError("embedded_invalid_request", parsed.error.message, { cause: parsed.error }));
    const req = parsed.data;
    if (this.pending.has(req.requestId)) {
      return Promise.reject(new EmbeddedEngineError("embedded_duplicate_request", `requestId ${req.requestId} is already in flight on ${this.id}`));
    }
    return new Promise((resolve, reject) => {
      this.pending.set(req.requestId, { resolve, reject });
      if (this.outbox.length === 0) queueMicrotask(() => this.flush());
      this.outbox.push(req);
    });
  }

  abort(requestIds: readonly string[]): Promise<void> {
    if (this.closed || this.failure) return Promise.resolve();
    return this.ticket((ticket) => ({ type: "abort", ids: [...requestIds], ticket }));
  }

  async health(): Promise<boolean> {
    return !this.closed && this.failure === null;
  }

  loadWeights(version: number, uri: string): Promise<void> {
    if (this.closed || this.failure) return Promise.reject(this.failure ?? new EmbeddedEngineError("embedded_engine_closed", `engine ${this.id} is closed`));
    return resolveModelPath(pathFromUri(uri)).then((path) =>
      this.ticket((ticket) => ({ type: "load", version, path, ticket })).then(() => {
        this.version = version;
      }),
    );
  }

  async weightVersion(): Promise<number> {
    return this.version;
  }

  /** Stop the worker; requests still in flight resolve with finishReason "abort". */
  async close(): Promise<void> {
    if (this.closed) return;
    if (!this.failure) await this.abort([...this.pending.keys()]);
    this.closed = true;
    // Let the worker release its ORT sessions and exit on its own: terminating a
    // thread that still holds native ORT objects can abort the whole process
    // ("terminate called after throwing an instance of 'Napi::Error'", seen here).
    const exited = new Promise<void>((resolve) => this.worker.once("exit", () => resolve()));
    this.send({ type: "close" });
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), CLOSE_TIMEOUT_MS)));
    if (await Promise.race([exited.then(() => false), timedOut])) await this.worker.terminate();
    clearTimeout(timer);
  }

  private flush(): void {
    if (this.outbox.length === 0) return;
    const requests = this.outbox;
    this.outbox = [];
    this.worker.postMessage({ type: "generate", requests } satisfies ToWorker);
  }

  /** Queued generates go first, so an abort or a load never overtakes the requests it concerns. */
  private send(msg: ToWorker): void {
    this.flush();
    this.worker.postMessage(msg);
  }

  private ticket(build: (ticket: number) => ToWorker): Promise<void> {
    const ticket = this.nextTicket++;
    return new Promise((resolve, reject) => {
      this.tickets.set(ticket, { resolve, reject });
      this.send(build(ticket));
    });
  }

  private onMessage(msg: FromWorker): void {
    switch (msg.type) {
      case "done":
        for (const { requestId, result } of msg.results) {
          const p = this.pending.get(requestId);
          this.pending.delete(requestId);
          p?.resolve(generateResultSchema.parse({ ...result, engineId: this.id }));
        }
        break;
      case "failed": {
        const p = this.pending.get(msg.requestId);
        this.pending.delete(msg.requestId);
        p?.reject(new EmbeddedEngineError("embedded_invalid_request", msg.message));
        break;
      }
      case "ack": {
        const t = this.tickets.get(msg.ticket);
        this.tickets.delete(msg.ticket);
        if (msg.error) t?.reject(new EmbeddedEngineError("embedded_load_failed", msg.error));
        else t?.resolve();
        break;
      }
      case "fatal":
        this.fail(new EmbeddedEngineError("embedded_worker_failed", msg.message));
        break;
      case "ready":
        break;
    }
  }

  private fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    for (const p of this.pending.values()) p.reject(err);
    for (const t of this.tickets.values()) t.reject(err);
    this.pending.clear();
    this.tickets.clear();
  }
}
