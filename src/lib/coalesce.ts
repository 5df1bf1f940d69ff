/**
 * Group commit for concurrent callers: calls made while a batch is running
 * queue up and go together as the next batch, so N concurrent jobs cost one
 * statement (or one HTTP call) instead of N. Nothing waits on a timer: a call
 * into an idle coalescer starts at the end of the current event-loop turn
 * (collecting the calls of that turn), so a lone job pays no latency.
 *
 * Each caller gets its own result or its own error. `run` returns one entry
 * per key, in order; an `Error` entry rejects only that caller. If `run`
 * throws for a batch of several keys (one bad row fails a multi-row
 * statement), each key is retried alone, so one caller's bad input cannot
 * fail the others' work. A batch runner must therefore be safe to run again
 * for keys whose batch failed: idempotent writes, as every rlq fact write is.
 */

import { RlqError } from "./errors.ts";
export interface CoalesceOptions {
  /** Most keys per batch. */
  maxBatch: number;
  /** Batches running at once (the next batch fills while these run). Default 1. */
  maxInFlight?: number;
}

export type BatchRunner<K, R> = (keys: K[]) => Promise<Array<R | Error>>;

export function coalesce<K, R>(run: BatchRunner<K, R>, options: CoalesceOptions): (key: K) => Promise<R> {
  if (!Number.isInteger(options.maxBatch) || options.maxBatch < 1)
    throw new RlqError("invariant_violated", `coalesce: maxBatch must be a positive integer, got ${options.maxBatch}`);
  const maxInFlight = options.maxInFlight ?? 1;
  if (!Number.isInteger(maxInFlight) || maxInFlight < 1)
    throw new RlqError("invariant_violated", `coalesce: maxInFlight must be a positive integer, got ${options.maxInFlight}`);
  type Waiter = { key: K; resolve(r: R): void; reject(e: unknown): void };
  const queue: Waiter[] = [];
  let inFlight = 0;
  let isScheduled = false;

  const settle = (w: Waiter, r: R | Error | undefined): void => {
    if (r instanceof Error) w.reject(r);
    else if (r === undefined) w.reject(new RlqError("invariant_violated", "coalesce: the batch runner returned fewer results than keys"));
    else w.resolve(r);
  };

  const runBatch = async (batch: Waiter[]): Promise<void> => {
    try {
      const results = await run(batch.map((w) => w.key));
      batch.forEach((w, i) => settle(w, results[i]));
    } catch (e) {
      if (batch.length === 1) {
        (batch[0] as Waiter).reject(e);
        return;
      }
      // Isolate the failure: each key alone, one after another (a burst of
      // single calls would compete with the other batches for connections).
      for (const w of batch) {
        try {
          settle(w, (await run([w.key]))[0]);
        } catch (e1) {
          w.reject(e1);
        }
      }
    }
  };

  const pump = (): void => {
    isScheduled = false;
    while (inFlight < maxInFlight && queue.length > 0) {
      const batch = queue.splice(0, options.maxBatch);
      inFlight++;
      void runBatch(batch).finally(() => {
        inFlight--;
        pump();
      });
    }
  };

  return (key: K) =>
    new Promise<R>((resolve, reject) => {
      queue.push({ key, resolve, reject });
      if (!isScheduled && inFlight < maxInFlight) {
        isScheduled = true;
        setImmediate(pump);
      }
    });
}
