/**
 * Runs a processor for one queue. Decides once, here, whether an error is
 * retried (transient) or not (bad payload, bad config, bad plugin →
 * UnrecoverableError, reason prefixed so the controller can tell), from
 * `isRetriable`: an RlqError's code row in ERROR_CODES (lib/errors.ts,
 * docs/errors.md) unless its throw site decided. Any other error is a bug
 * unless `isRetriable` names it (a Postgres transaction that lost a race): not
 * retried, its name in the reason the run pauses with, its stack in the job's
 * record (BullMQ keeps the thrown error's stack in the job's stacktrace) and
 * in the caller's log (`onError`).
 * Stall settings: a killed worker's job is picked up again within seconds,
 * not BullMQ's default minute. Heavy compute never runs on this event loop
 * (engine sessions and trainer steps live in worker threads), so the lock is
 * always renewed in time.
 *
 * Infrastructure errors never spend an attempt: a processor that fails because
 * Postgres or Redis is out of reach (lib/infra-outage.ts says which errors
 * those are) is run again from the start after a backoff, inside the same
 * attempt, for up to `outageTimeoutMs` (RLQ_OUTAGE_TIMEOUT_S). The processor's
 * promise stays pending meanwhile, so BullMQ's lock manager keeps extending the
 * job's lock (on Redis; on the Postgres backend the lock lapses with the
 * database and the stall check hands the job on, which idempotent jobs allow).
 * Attempts, and BullMQ's backoff, count only failures of the work itself.
 */

import { DelayedError, UnrecoverableError, type Job, type Worker } from "bullmq";
import type { QueueBackend } from "./backend.ts";
import { jobSchemas, UNRECOVERABLE_PREFIX, type JobData, type QueueKind } from "./payloads.ts";
import { queueName } from "./queues.ts";
import { errorMessage, isBug, isRetriable, RlqError } from "../lib/errors.ts";
import { retryThroughOutages } from "../lib/infra-outage.ts";

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

/**
 * Jobs one BullMQ Worker runs at once, at most, on Redis: a larger concurrency runs as several
 * Workers on the same queue (fetch lanes), each with its share. BullMQ's Worker fetches waiting
 * jobs one Redis round trip after another until it holds `concurrency` of them, and only then
 * starts the first (bullmq 6.7 src/classes/worker.ts `mainLoop`: the inner loop awaits each
 * fetch). A burst of ~600 jobs on one Worker of concurrency 648 (a weight sync's resumed rounds at
 * 64 engines, bench/cluster-sim.ts) started its first job ~300 ms after the burst was queued. The
 * Postgres backend keeps one Worker: each Worker there opens its own pool of connections.
 */
export const FETCH_LANE_CONCURRENCY = 64;

/** How `concurrency` splits into fetch lanes: each lane's concurrency, summing to `concurrency`. */
export function fetchLanes(concurrency: number, backendKind: QueueBackend["kind"]): number[] {
  const n = backendKind === "redis" ? Math.max(1, Math.ceil(concurrency / FETCH_LANE_CONCURRENCY)) : 1;
  return Array.from({ length: n }, (_, i) => Math.floor(concurrency / n) + (i < concurrency % n ? 1 : 0));
}

/** A BullMQ Worker error with the same message as the last one is told at most this often. */
export const WORKER_ERROR_REPEAT_MS = 30_000;

/**
 * A job's failure that is a bug (not an RlqError): failed for good, the error's name in the
 * reason, and its stack as the stack BullMQ records for the job.
 */
function bugFailure(e: unknown): UnrecoverableError {
  const name = e instanceof Error ? e.name : typeof e;
  const failure = new UnrecoverableError(`${UNRECOVERABLE_PREFIX}a bug in rlq (${name}, not an RlqError): ${errorMessage(e)}`);
  if (e instanceof Error && e.stack) failure.stack = `${failure.name}: ${failure.message}\ncaused by ${e.stack}`;
  return failure;
}

export function startWorker<K extends QueueKind>(
  backend: QueueBackend,
  kind: K,
  processor: Processor<K>,
  options: {
    concurrency: number;
    /** Each failure of a job's attempt; `isBug(e)`: an error that is not an RlqError, to be told with its stack. */
    onError?: (e: unknown, jobId: string | undefined) => void;
    /** An error of the BullMQ Worker itself (its connection), with how many of the same were not told since the last. */
    onWorkerError?: (e: Error, repeats: number) => void;
    /** How long a job waits out a Postgres or Redis outage before it spends an attempt (default 300 s). */
    outageTimeoutMs?: number;
    /** Each wait for an outage, with how long it has lasted (a log line: the job is alive, not stuck). */
    onOutageWait?: (info: { jobId: string | undefined; waitedMs: number; retryInMs: number; error: unknown }) => void;
    /** Each job that completed, and each attempt that failed (`final`: no attempt left): the caller's counters. */
    onJobCompleted?: () => void;
    onJobFailed?: (final: boolean) => void;
  },
): WorkerHandle {
  const schema = jobSchemas[kind];
  const closing = new AbortController();
  const run = async (job: Job, token?: string) => {
    const parsed = schema.safeParse(job.data);
    if (!parsed.success) {
      throw new UnrecoverableError(
        `${UNRECOVERABLE_PREFIX}job ${job.id}: bad payload: ${parsed.error.issues[0]?.message} at ${parsed.error.issues[0]?.path.join(".")}`,
      );
    }
    try {
      await retryThroughOutages(
        () =>
          processor(parsed.data as JobData<K>, {
            jobId: job.id as string,
            attemptsMade: job.attemptsMade,
            updateProgress: (p) => job.updateProgress(p),
            shutdown: closing.signal,
          }),
        {
          timeoutMs: options.outageTimeoutMs ?? 300_000,
          signal: closing.signal,
          onWait: (waitedMs, error, retryInMs) => options.onOutageWait?.({ jobId: job.id, waitedMs, retryInMs, error }),
        },
      );
    } catch (e) {
      if (closing.signal.aborted && e instanceof RlqError && e.code === "worker_shutdown") {
        // Back to the queue as delayed: BullMQ counts no attempt for a DelayedError.
        await job.moveToDelayed(Date.now() + 1000, token);
        throw new DelayedError(errorMessage(e));
      }
      options.onError?.(e, job.id);
      if (isBug(e)) throw bugFailure(e);
      if (!isRetriable(e)) throw new UnrecoverableError(`${UNRECOVERABLE_PREFIX}${errorMessage(e)}`);
      throw e;
    }
  };
  const lastWorkerError = { message: "", atMs: 0, repeats: 0 };
  const workers: Worker[] = fetchLanes(options.concurrency, backend.kind).map((concurrency) => {
    const worker: Worker = new backend.Worker(queueName(kind), run, {
      connection: backend.connection,
      concurrency,
      ...stallSettings,
      ...backend.baseOptions,
    });
    // BullMQ emits its own connection's failures here, again at each reconnect while Redis or
    // Postgres is out of reach: the same message is told once per WORKER_ERROR_REPEAT_MS, with a count.
    worker.on("error", (e: Error) => {
      const now = Date.now();
      if (e.message === lastWorkerError.message && now - lastWorkerError.atMs < WORKER_ERROR_REPEAT_MS) {
        lastWorkerError.repeats++;
        return;
      }
      options.onWorkerError?.(e, lastWorkerError.message === e.message ? lastWorkerError.repeats : 0);
      Object.assign(lastWorkerError, { message: e.message, atMs: now, repeats: 0 });
    });
    worker.on("completed", () => options.onJobCompleted?.());
    worker.on("failed", (job: Job | undefined, err: Error) => {
      if (err instanceof DelayedError) return;
      options.onJobFailed?.(err instanceof UnrecoverableError || (job !== undefined && job.attemptsMade >= (job.opts.attempts ?? 1)));
    });
    return worker;
  });
  return {
    kind,
    async close() {
      closing.abort();
      await Promise.all(workers.map((w) => w.close()));
    },
  };
}
