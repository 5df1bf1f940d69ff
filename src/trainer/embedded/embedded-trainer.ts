/**
 * The embedded trainer (docs/architecture.md "Embedded defaults"): the model in jax-js, trained in a worker
 * thread so the caller's event loop stays free. Steps run one at a time.
 * Cancelling (the AbortSignal) terminates the worker mid-computation; the next
 * step starts a fresh one (its jit compilations cost ~1 s). Errors carry the
 * worker's code; config errors are not retriable, a crashed worker is.
 */

import type { Worker } from "node:worker_threads";
import type { ModelConfig } from "../../model/config.ts";
import { siblingModuleUrl, spawnModuleWorker } from "../../model/module-worker.ts";
import { RlqError } from "../../lib/errors.ts";
import { trainResultSchema, type Trainer, type TrainProgress, type TrainRequest, type TrainResult } from "../trainer.ts";
import type { FromTrainerWorker, ToTrainerWorker, TrainerWorkerData } from "./trainer-worker.ts";

export interface EmbeddedTrainerOptions {
  /** Model to initialise from `seed` when a step has neither checkpointUriIn nor ref_load. */
  modelConfig?: ModelConfig;
}

export type EmbeddedTrainer = Trainer;

export async function createEmbeddedTrainer(options: EmbeddedTrainerOptions = {}): Promise<EmbeddedTrainer> {
  return new WorkerTrainer({ modelConfig: options.modelConfig ?? null });
}

class WorkerTrainer implements EmbeddedTrainer {
  private worker: Worker | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private nextId = 0;
  private closed = false;

  constructor(private readonly data: TrainerWorkerData) {}

  trainStep(request: TrainRequest, onProgress: (p: TrainProgress) => void, signal: AbortSignal): Promise<TrainResult> {
    const run = this.queue.then(() => this.runOne(request, onProgress, signal));
    // The queue only orders the steps: a step's failure reaches its caller through `run`, and the next step starts either way.
    this.queue = run.catch(() => undefined);
    return run;
  }

  async health(): Promise<boolean> {
    return !this.closed;
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.worker?.terminate();
    this.worker = null;
  }

  private ensureWorker(): Worker {
    this.worker ??= spawnModuleWorker(siblingModuleUrl(import.meta.url, "trainer-worker"), { workerData: this.data });
    return this.worker;
  }

  private runOne(request: TrainRequest, onProgress: (p: TrainProgress) => void, signal: AbortSignal): Promise<TrainResult> {
    if (this.closed) return Promise.reject(new RlqError("trainer_closed", "the embedded trainer is closed"));
    if (signal.aborted)
      return Promise.reject(new RlqError("train_aborted", `train step ${request.step} aborted before it started`, { cause: signal.reason, isRetriable: true }));
    const worker = this.ensureWorker();
    const id = this.nextId++;
    return new Promise<TrainResult>((resolve, reject) => {
      const cleanup = (): void => {
        worker.off("message", onMessage);
        worker.off("error", onError);
        worker.off("exit", onExit);
        signal.removeEventListener("abort", onAbort);
      };
      const onMessage = (msg: FromTrainerWorker): void => {
        if (msg.id !== id) return;
        if (msg.type === "progress") {
          onProgress(msg.progress);
          return;
        }
        cleanup();
        if (msg.type === "result") resolve(trainResultSchema.parse(msg.result));
        // The worker thread sends the code of an RlqError it caught (or its own), with its retriability.
        else reject(new RlqError(msg.code, msg.message, { isRetriable: msg.isRetriable }));
      };
      const onError = (err: Error): void => {
        cleanup();
        this.worker = null;
        reject(new RlqError("trainer_worker_failed", `trainer worker crashed during step ${request.step}`, { cause: err, isRetriable: true }));
      };
      const onExit = (code: number): void => {
        cleanup();
        this.worker = null;
        reject(new RlqError("trainer_worker_failed", `trainer worker exited with code ${code} during step ${request.step}`, { isRetriable: true }));
      };
      const onAbort = (): void => {
        cleanup();
        this.worker = null;
        void worker.terminate();
        reject(new RlqError("train_aborted", `train step ${request.step} aborted`, { cause: signal.reason, isRetriable: true }));
      };
      worker.on("message", onMessage);
      worker.on("error", onError);
      worker.on("exit", onExit);
      signal.addEventListener("abort", onAbort, { once: true });
      worker.postMessage({ type: "train", id, request } satisfies ToTrainerWorker);
    });
  }
}
