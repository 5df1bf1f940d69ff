/**
 * Worker-thread entry of the embedded engine: owns the ORT sessions, the KV
 * cache and the scheduler, so `session.run` (synchronous inside) never blocks
 * the main event loop. Messages are handled between scheduler ticks: the loop
 * yields with setImmediate after every tick so they can arrive.
 */

import { parentPort, receiveMessageOnPort, workerData } from "node:worker_threads";
import { readCheckpoint } from "../../model/checkpoint.ts";
import { ModelRunner } from "./model-runner.ts";
import type { EngineWorkerData, FromWorker, ToWorker } from "./protocol.ts";
import { DecodeScheduler, type SchedulerResult } from "./scheduler.ts";
import { RlqError } from "../../lib/errors.ts";

if (!parentPort) throw new RlqError("invariant_violated", "engine-worker must run in a worker thread");
const port = parentPort;
/** Finished requests of the current tick, sent as one "done" message. */
let finished: Array<{ requestId: string; result: SchedulerResult }> = [];
const flushDone = (): void => {
  if (finished.length === 0) return;
  port.postMessage({ type: "done", results: finished } satisfies FromWorker);
  finished = [];
};
// Any other message goes after the results before it (an abort's ack after its aborted results).
const post = (msg: FromWorker): void => {
  flushDone();
  port.postMessage(msg);
};

async function main(): Promise<void> {
  const data = workerData as EngineWorkerData;
  const ckpt = await readCheckpoint(data.checkpointPath);
  const runner = await ModelRunner.create(ckpt.config, ckpt.weights, { intraOpNumThreads: data.intraOpNumThreads });
  const scheduler = new DecodeScheduler(
    runner,
    ckpt.version,
    {
      done: (requestId, result) => finished.push({ requestId, result }),
      failed: (requestId, message) => post({ type: "failed", requestId, message }),
    },
    { maxBatchSize: data.maxBatchSize, logitNoiseStd: data.logitNoiseStd },
  );

  let closed = false;
  let wake: (() => void) | null = null;
  const handle = (msg: ToWorker): void => {
    switch (msg.type) {
      case "generate":
        for (const r of msg.requests) scheduler.submit(r);
        break;
      case "abort":
        scheduler.abort(msg.ids);
        post({ type: "ack", ticket: msg.ticket });
        break;
      case "load":
        // Read and validate off the tick; the swap itself happens between ticks.
        readCheckpoint(msg.path)
          .then((next) => {
            if (JSON.stringify(next.config) !== JSON.stringify(ckpt.config)) {
              throw new RlqError(
                "model_invalid",
                `checkpoint ${msg.path} has model config ${JSON.stringify(next.config)}, the engine serves ${JSON.stringify(ckpt.config)}`,
              );
            }
            if (next.version !== msg.version)
              throw new RlqError("model_invalid", `checkpoint ${msg.path} holds version ${next.version}, expected ${msg.version}`);
            const swapped = scheduler.swapWeights(msg.version, next.weights);
            wake?.();
            return swapped;
          })
          .then(
            () => post({ type: "ack", ticket: msg.ticket }),
            (err: unknown) => post({ type: "ack", ticket: msg.ticket, error: err instanceof Error ? err.message : String(err) }),
          );
        break;
      case "close":
        closed = true;
        break;
    }
    wake?.();
  };
  // Events only queue: submit/abort must not run while a tick is suspended in an
  // ORT call (they would change the batch under it). The loop applies them between ticks.
  const inbox: ToWorker[] = [];
  port.on("message", (msg: ToWorker) => {
    inbox.push(msg);
    wake?.();
  });
  const drain = (): void => {
    for (let m = inbox.shift(); m !== undefined; m = inbox.shift()) handle(m);
    // While the loop is busy, 'message' events can lag many ticks behind (measured:
    // an abort posted right after its generate arrived after all 250 tokens were done).
    for (let m = receiveMessageOnPort(port); m !== undefined; m = receiveMessageOnPort(port)) handle(m.message as ToWorker);
  };

  post({ type: "ready", version: ckpt.version, config: ckpt.config });
  while (!closed) {
    drain();
    flushDone();
    if (closed) break;
    if (scheduler.isIdle) {
      await new Promise<void>((resolve) => (wake = resolve));
      wake = null;
      continue;
    }
    await scheduler.step();
    flushDone();
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
  await runner.release();
  port.close();
}

main().catch((err: unknown) => {
  post({ type: "fatal", message: err instanceof Error ? (err.stack ?? err.message) : String(err) });
});
