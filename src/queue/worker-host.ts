import { DelayedError, UnrecoverableError, type Job, type Worker } from "bullmq";
import type { QueueBackend } from "./backend.ts";
import { jobSchemas, UNRECOVERABLE_PREFIX, type JobData, type QueueKind } from "./payloads.ts";
import { queueName } from "./queues.ts";
import { isRetriable, errorMessage, RlqError } from "../lib/errors.ts";
import { processMetrics } from "../observability/prometheus.ts";

/**
 * Runs a processor for one queue. Decides once, here, whether an error is
 * retried (transient) or not (bad payload, bad config, bad plugin →
 * UnrecoverableError, reason prefixed so the controller can tell), from
 * `isRetriable`: an RlqError's code row in ERROR_CODES (lib/errors.ts,
 * docs/errors.md) unless its throw site decided; any other error is retried.
 * Stall settings: a killed worker's job is picked up again within seconds,
 * not BullMQ's default minute. Heavy compute never runs on this event loop
 * (engine sessions and trainer steps live in worker threads), so the lock is
 * always renewed in time.
 */
export interface JobContext {
  jobId: string;
  attemptsMade: number;
  updateProgress(p: object): Promise<void>;
  /**
   * Aborted when the worker starts closing. A job that is only waiting (for
   * an unreachable trainer, say) stops and throws `worker_shutdown`: the job
   * goes back to the queue without using an attempt.
   */
  shutdown: AbortSignal;
}

export type Processor<K extends QueueKind> = (data: JobData<K>, job: JobContext) => Promise<void>;

export interface WorkerHandle {
  kind: QueueKind;
  close(): Promise<void>;
}

export const stallSettings = { lockDuration: 5_000, stalledInterval: 2_000, maxStalledCount: 20 } as const;

export function startWorker<K extends QueueKind>(
  backend: QueueBackend,
  kind: K,
  processor: Processor<K>,
  options: { concurrency: number; onError?: (e: unknown, jobId: string | undefined) => void },
): WorkerHandle {
  const schema = jobSchemas[kind];
  const closing = new AbortController();
  const worker: Worker = new backend.Worker(
    queueName(kind),
    async (job: Job, token?: string) => {
      const parsed = schema.safeParse(job.data);
      if (!parsed.success) {
        throw new UnrecoverableError(
          `${UNRECOVERABLE_PREFIX}job ${job.id}: bad payload: ${parsed.error.issues[0]?.message} at ${parsed.error.issues[0]?.path.join(".")}`,
        );
      }
      try {
        await processor(parsed.data as JobData<K>, {
          jobId: job.id as string,
          attemptsMade: job.attemptsMade,
          updateProgress: (p) => job.updateProgress(p),
          shutdown: closing.signal,
        });
      } catch (e) {
        if (closing.signal.aborted && e instanceof RlqError && e.code === "worker_shutdown") {
          // Back to the queue as delayed: BullMQ counts no attempt for a DelayedError.
          await job.moveToDelayed(Date.now() + 1000, token);
          throw new DelayedError(errorMessage(e));
        }
        options.onError?.(e, job.id);
        if (!isRetriable(e)) throw new UnrecoverableError(`${UNRECOVERABLE_PREFIX}${errorMessage(e)}`);
        throw e;
      }
    },
    { connection: backend.connection, concurrency: options.concurrency, ...stallSettings, ...backend.baseOptions },
  );
  worker.on("error", () => undefined);
  // Prometheus counters (observability/prometheus.ts): jobs/s is their rate.
  worker.on("completed", () => processMetrics().jobCompleted(kind));
  worker.on("failed", (job: Job | undefined, err: Error) => {
    if (err instanceof DelayedError) return;
    processMetrics().jobFailed(kind, err instanceof UnrecoverableError || (job !== undefined && job.attemptsMade >= (job.opts.attempts ?? 1)));
  });
  return {
    kind,
    async close() {
      closing.abort();
      await worker.close();
    },
  };
}
