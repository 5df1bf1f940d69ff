/**
 * Worker-thread entry of the embedded trainer: a jit-compiled step blocks its
 * thread for hundreds of milliseconds, which must not be the thread renewing
 * BullMQ job locks (docs/architecture.md "The queue"). One step at a time; the main thread cancels a
 * step by terminating this worker.
 */

import { parentPort, workerData } from "node:worker_threads";
import { ZodError } from "zod";
import { readCheckpoint } from "../../model/checkpoint.ts";
import type { ModelConfig } from "../../model/config.ts";
import type { Weights } from "../../model/weights.ts";
import { RlqError, type ErrorCode } from "../../lib/errors.ts";
import type { TrainRequest, TrainResult, TrainProgress } from "../trainer.ts";
import { createJaxModel, type JaxModel } from "./jax-model.ts";
import { runEmbeddedTrainStep } from "./train-step.ts";

export interface TrainerWorkerData {
  modelConfig: ModelConfig | null;
}

export type ToTrainerWorker = { type: "train"; id: number; request: TrainRequest };
export type FromTrainerWorker =
  | { type: "progress"; id: number; progress: TrainProgress }
  | { type: "result"; id: number; result: TrainResult }
  | { type: "error"; id: number; code: ErrorCode; message: string; isRetriable: boolean };

if (!parentPort) throw new RlqError("invariant_violated", "trainer-worker must run in a worker thread");
const port = parentPort;
const { modelConfig } = workerData as TrainerWorkerData;
const models = new Map<string, Promise<JaxModel>>();
const references = new Map<string, Promise<Weights>>();

function modelFor(config: ModelConfig): Promise<JaxModel> {
  const key = JSON.stringify(config);
  let m = models.get(key);
  if (!m) models.set(key, (m = createJaxModel(config)));
  return m;
}

function train(request: TrainRequest, id: number): Promise<TrainResult> {
  return runEmbeddedTrainStep(
    request,
    {
      modelFor,
      initConfig: modelConfig,
      loadReference: (uri) => {
        let r = references.get(uri);
        if (!r) references.set(uri, (r = readCheckpoint(uri).then((c) => c.weights)));
        return r;
      },
    },
    (progress) => port.postMessage({ type: "progress", id, progress } satisfies FromTrainerWorker),
  );
}

port.on("message", (msg: ToTrainerWorker) => {
  train(msg.request, msg.id).then(
    (result) => port.postMessage({ type: "result", id: msg.id, result } satisfies FromTrainerWorker),
    (err: unknown) => {
      const code = err instanceof RlqError ? err.code : err instanceof ZodError ? "trainer_config" : "trainer_internal";
      const isRetriable = err instanceof RlqError ? err.isRetriable : false;
      const message = err instanceof ZodError ? `invalid trainer config: ${err.message}` : err instanceof Error ? (err.stack ?? err.message) : String(err);
      port.postMessage({ type: "error", id: msg.id, code, message, isRetriable } satisfies FromTrainerWorker);
    },
  );
});
