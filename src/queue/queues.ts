/**
 * Producers and inspectors for rlq's queues. `enqueue` is idempotent: a job
 * id that already exists is left alone (BullMQ keeps the first), so the
 * controller can re-send after a crash or during reconcile without doubling
 * work.
 */

import type { Queue } from "bullmq";
import type { QueueBackend } from "./backend.ts";
import { jobIds, queueKinds, type JobData, type QueueKind } from "./payloads.ts";
import { QueueWatch } from "./queue-watch.ts";

export type JobState = "missing" | "waiting" | "active" | "delayed" | "completed" | "failed" | "prioritized" | "waiting-children" | "unknown";

export interface JobInfo {
  state: JobState;
  failedReason: string | null;
  attemptsMade: number;
  /** What the job last reported (a train job: `{done, total, phase}`); null if nothing. */
  progress: unknown;
}

export interface Queues {
  readonly backend: QueueBackend;
  enqueue<K extends QueueKind>(kind: K, data: JobData<K>, options?: { attempts?: number }): Promise<string>;
  /** `enqueue` for many jobs of one kind in one round trip (BullMQ addBulk; ids already there are left alone). */
  enqueueMany<K extends QueueKind>(kind: K, data: ReadonlyArray<JobData<K>>, options?: { attempts?: number }): Promise<string[]>;
  info(kind: QueueKind, jobId: string): Promise<JobInfo>;
  /** Move a failed job back to waiting (keeps its id). */
  retry(kind: QueueKind, jobId: string): Promise<void>;
  /** Remove a job so it can be added again under the same id. */
  remove(kind: QueueKind, jobId: string): Promise<void>;
  depths(): Promise<Record<QueueKind, Record<string, number>>>;
  /** A job the controller plants and checks: if it vanishes, the queue state was lost. */
  ensureSentinel(name: string): Promise<boolean>;
  /** What was done to the queues behind rlq's back, and its repair (queue-watch.ts). */
  readonly watch: QueueWatch;
  close(): Promise<void>;
}

export function queueName(kind: QueueKind | "sentinel"): string {
  return `rlq-${kind}`;
}

/**
 * A Queue object for `name` as rlq opens them: skipMetasUpdate, as only the queue watch writes a
 * queue's meta (queue-watch.ts: a meta that vanishes is how it tells an obliteration). Its "error"
 * events are connection errors that also reject the call that met them, where the caller handles
 * them: the event would only repeat it.
 */
export function openQueue(backend: QueueBackend, name: string): Queue {
  const q = new backend.Queue(name, { connection: backend.connection, ...backend.baseOptions, skipMetasUpdate: true });
  // A connection error also rejects the call that met it, whose caller handles it.
  q.on("error", () => undefined);
  return q;
}

const defaultAttempts: Record<QueueKind, number> = { rollout: 8, reward: 8, train: 3, eval: 5 };

export function createQueues(backend: QueueBackend): Queues {
  const queues = new Map<string, Queue>();
  const byName = (name: string): Queue => {
    let q = queues.get(name);
    if (!q) {
      q = openQueue(backend, name);
      queues.set(name, q);
    }
    return q;
  };
  const get = (kind: QueueKind | "sentinel"): Queue => byName(queueName(kind));
  const watch = new QueueWatch(backend, byName);
  const idFor = <K extends QueueKind>(kind: K, data: JobData<K>): string => (jobIds[kind] as (d: JobData<K>) => string)(data);

  const jobOptions = (kind: QueueKind, id: string, options: { attempts?: number }) => ({
    jobId: id,
    attempts: options.attempts ?? defaultAttempts[kind],
    backoff: { type: "exponential" as const, delay: 500 },
    // A completed rollout or reward job's record is its facts in Postgres: keeping the job
    // too cost ~10% of the control plane's throughput on Redis and ~20% on the Postgres
    // backend (bench/control-plane.ts). Train and eval jobs (few) stay an hour for inspection.
    // A re-added id then runs again, which every job tolerates: it reads its facts first.
    removeOnComplete: kind === "rollout" || kind === "reward" ? true : { age: 3600, count: 10_000 },
    removeOnFail: false,
  });

  return {
    backend,
    async enqueue(kind, data, options = {}) {
      const id = idFor(kind, data);
      await get(kind).add(kind, data, jobOptions(kind, id, options));
      return id;
    },
    async enqueueMany(kind, data, options = {}) {
      if (data.length === 0) return [];
      const ids = data.map((d) => idFor(kind, d));
      await get(kind).addBulk(data.map((d, i) => ({ name: kind, data: d, opts: jobOptions(kind, ids[i] as string, options) })));
      return ids;
    },
    async info(kind, jobId) {
      const job = await get(kind).getJob(jobId);
      if (!job) return { state: "missing", failedReason: null, attemptsMade: 0, progress: null };
      const state = (await job.getState()) as JobState;
      const progress = typeof job.progress === "object" && job.progress !== null ? job.progress : null;
      return { state, failedReason: job.failedReason ?? null, attemptsMade: job.attemptsMade, progress };
    },
    async retry(kind, jobId) {
      const job = await get(kind).getJob(jobId);
      if (job && (await job.getState()) === "failed") await job.retry("failed", { resetAttemptsMade: true });
    },
    async remove(kind, jobId) {
      const job = await get(kind).getJob(jobId);
      if (!job) return;
      try {
        await job.remove();
      } catch (e) {
        // A job a worker holds (active, locked) cannot be removed: the caller's add is then a
        // no-op, and its next reconcile looks again once the worker let go.
        if (!/locked/i.test((e as Error).message)) throw e;
      }
    },
    async depths() {
      const out = {} as Record<QueueKind, Record<string, number>>;
      for (const kind of queueKinds) {
        out[kind] = await get(kind).getJobCounts("waiting", "active", "delayed", "failed", "completed");
      }
      return out;
    },
    async ensureSentinel(name) {
      const q = get("sentinel");
      const id = `sentinel-${name}`;
      const existing = await q.getJob(id);
      if (existing) return true;
      await q.add("sentinel", {}, { jobId: id, delay: 10 * 365 * 24 * 3600 * 1000 });
      return false;
    },
    watch,
    async close() {
      // A Queue whose connection is already gone (Redis down at shutdown) has nothing left to
      // close, and the process lets go of it either way: nothing is lost.
      await Promise.all([...queues.values()].map((q) => q.close().catch(() => undefined)));
      queues.clear();
    },
  };
}
