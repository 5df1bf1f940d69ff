/**
 * Jobs per queue one process runs at once. Rollout and reward jobs mostly
 * wait (on the engine, on Postgres) and their statements are coalesced
 * (store/job-batch.ts), so more of them at once means larger batches, not more
 * CPU; a train job holds a trainer.
 */

import type { Services } from "../runtime/services.ts";
import { startWorker, type Processor, type WorkerHandle } from "../queue/worker-host.ts";
import type { QueueKind } from "../queue/payloads.ts";
import { generateGroupRound } from "./generate-group-round.ts";
import { scoreGroupRound } from "./worker-score-group.ts";
import { runTrainStep } from "./run-train-step.ts";
import { createBatchStager, type BatchStager } from "./batch-stager.ts";
import { runEval } from "./run-eval.ts";
import { upsertEngineMetrics } from "../store/engine-metrics.ts";
import { createJobStore, type JobStore } from "../store/job-batch.ts";
import { coalesce } from "../lib/coalesce.ts";
import { errorMessage, isBug } from "../lib/errors.ts";
import type { RewardJob } from "../queue/payloads.ts";
import { createEngineProvider, createTrainerProvider, type EmbeddedFactories, type EngineProvider } from "../runtime/engines.ts";
import { loadEmbedded } from "../runtime/embedded.ts";
import { processMetrics } from "../observability/prometheus.ts";

export const defaultConcurrency: Record<QueueKind, number> = { rollout: 64, reward: 32, train: 1, eval: 2 };

/** Start the workers for the given queues in this process. */
export async function startWorkers(
  services: Services,
  kinds: readonly QueueKind[],
  options: { concurrency?: Partial<Record<QueueKind, number>>; embedded?: EmbeddedFactories | null } = {},
): Promise<{ close(): Promise<void> }> {
  const { db, queues, log } = services;
  // The embedded engine and trainer factories (their modules load only when a run uses them).
  const embedded = options.embedded === undefined ? await loadEmbedded() : options.embedded;
  const shared: SharedJobDeps = {
    services,
    engines: createEngineProvider(db, embedded, log),
    trainers: createTrainerProvider(embedded),
    stager: kinds.includes("train") ? createBatchStager(db, log) : null,
    // Concurrent jobs share statements and queue round trips (store/job-batch.ts).
    store: createJobStore(db),
    enqueueReward: coalesce<RewardJob, string>((jobs) => queues.enqueueMany("reward", jobs), { maxBatch: 256, maxInFlight: 2 }),
  };
  const processors = jobProcessors(shared);
  const start = <K extends QueueKind>(kind: K): WorkerHandle =>
    startWorker(services.backend, kind, processors[kind], hostOptions(services, kind, options.concurrency?.[kind] ?? defaultConcurrency[kind]));
  const handles = kinds.map((kind) => start(kind));
  const telemetry = startEngineTelemetry(services, shared.engines, kinds.includes("rollout"));
  return {
    async close() {
      await telemetry.close();
      await Promise.all(handles.map((h) => h.close()));
      await shared.engines.close();
      await shared.trainers.close();
      shared.stager?.close();
    },
  };
}

/** What the jobs of one process share: coalesced statements and reward enqueues, engines, trainers, the batch stager. */
interface SharedJobDeps {
  services: Services;
  store: JobStore;
  engines: EngineProvider;
  trainers: ReturnType<typeof createTrainerProvider>;
  stager: BatchStager | null;
  enqueueReward: (job: RewardJob) => Promise<string>;
}

/** Each queue's processor: the job's run context, then the job's own module. */
function jobProcessors(shared: SharedJobDeps): { [K in QueueKind]: Processor<K> } {
  const { services, store, engines, trainers, stager, enqueueReward } = shared;
  const { db, contexts, log } = services;
  return {
    rollout: async (data, job) =>
      generateGroupRound(
        {
          store,
          engineFor: (c, v) => engines.engineFor(c, v),
          abortHints: (runId, wake) => db.notifications.subscribe("rlq_abort", runId, wake),
          log,
          onRoundComplete: async (j) => {
            services.crashPoint("rollout.before_reward_enqueue");
            await enqueueReward({ runId: j.runId, groupId: j.groupId, round: j.round, step: j.step });
          },
        },
        await contexts.get(data.runId),
        data,
        job.jobId,
      ),
    reward: async (data, job) => scoreGroupRound(store, await contexts.get(data.runId), data, job.jobId, log),
    train: async (data, job) =>
      runTrainStep(
        {
          db,
          checkpointRoot: services.checkpointRoot,
          trainerFor: (c) => trainers.trainerFor(c),
          reportProgress: (p) => job.updateProgress(p),
          crashPoint: (name) => services.crashPoint(name),
          shutdown: job.shutdown,
          ...(stager ? { stager } : {}),
          log,
        },
        await contexts.get(data.runId),
        data,
        job.attemptsMade,
      ),
    eval: async (data, job) => runEval({ db, engineFor: (c, v) => engines.engineFor(c, v) }, await contexts.get(data.runId), data, job.jobId),
  };
}

/** A queue's worker options: its concurrency, how its failures and outage waits are logged, its Prometheus counters. */
function hostOptions(services: Services, kind: QueueKind, concurrency: number) {
  const { log } = services;
  return {
    concurrency,
    onError: (e: unknown, jobId: string | undefined) => {
      if (isBug(e)) log.error({ kind, jobId, err: e }, "job failed with an error that is not an RlqError (a bug in rlq): not retried");
      else log.warn({ kind, jobId, err: errorMessage(e) }, "job failed");
    },
    onWorkerError: (e: Error, repeats: number) => log.warn({ kind, err: e.message, repeats }, "queue worker error (BullMQ reconnects by itself)"),
    outageTimeoutMs: services.env.RLQ_OUTAGE_TIMEOUT_S * 1000,
    onOutageWait: (w: { jobId: string | undefined; waitedMs: number; retryInMs: number; error: unknown }) =>
      log.warn(
        {
          kind,
          jobId: w.jobId,
          outageS: Math.round(w.waitedMs / 1000),
          retryInMs: w.retryInMs,
          limitS: services.env.RLQ_OUTAGE_TIMEOUT_S,
          err: errorMessage(w.error),
        },
        "job waiting out a Postgres or Redis outage (no attempt spent)",
      ),
    // Prometheus counters (observability/prometheus.ts): jobs/s is their rate.
    onJobCompleted: () => processMetrics().jobCompleted(kind),
    onJobFailed: (final: boolean) => processMetrics().jobFailed(kind, final),
  };
}

/** Engine-pool telemetry for `rlq run status`: every 5 s when `isPeriodic` (a rollout worker), and a last snapshot at `close`. */
function startEngineTelemetry(services: Services, engines: EngineProvider, isPeriodic: boolean): { close(): Promise<void> } {
  const { db, log } = services;
  const publish = async () => {
    for (const m of engines.metrics()) await upsertEngineMetrics(db, m.runId, services.holder, m.snapshot);
  };
  // A missed publish leaves the last snapshot in place until the next one, 5 s later.
  const publishLogged = () => publish().catch((e: unknown) => log.warn({ err: errorMessage(e) }, "engine telemetry not published (kept: the last snapshot)"));
  const timer = isPeriodic ? setInterval(() => void publishLogged(), 5000) : null;
  return {
    async close() {
      if (timer) clearInterval(timer);
      await publishLogged();
    },
  };
}
