import type { Services } from "../runtime/services.ts";
import { startWorker, type WorkerHandle } from "../queue/worker-host.ts";
import type { QueueKind } from "../queue/payloads.ts";
import { generateGroupRound } from "./generate-group-round.ts";
import { scoreGroupRound } from "./worker-score-group.ts";
import { runTrainStep } from "./run-train-step.ts";
import { createBatchStager } from "./batch-stager.ts";
import { runEval } from "./run-eval.ts";
import { upsertEngineMetrics } from "../store/engine-metrics.ts";
import { createJobStore } from "../store/job-batch.ts";
import { coalesce } from "../lib/coalesce.ts";
import { errorMessage, isBug } from "../lib/errors.ts";
import type { RewardJob } from "../queue/payloads.ts";
import { createEngineProvider, createTrainerProvider, type EmbeddedFactories } from "../runtime/engines.ts";
import { loadEmbedded } from "../runtime/embedded.ts";
import { processMetrics } from "../observability/prometheus.ts";

/**
 * Jobs per queue one process runs at once. Rollout and reward jobs mostly
 * wait (on the engine, on Postgres) and their statements are coalesced
 * (store/job-batch.ts), so more of them at once means larger batches, not more
 * CPU; a train job holds a trainer.
 */
export const defaultConcurrency: Record<QueueKind, number> = { rollout: 64, reward: 32, train: 1, eval: 2 };

/** Start the workers for the given queues in this process. */
export async function startWorkers(
  services: Services,
  kinds: readonly QueueKind[],
  options: { concurrency?: Partial<Record<QueueKind, number>>; embedded?: EmbeddedFactories | null } = {},
): Promise<{ close(): Promise<void> }> {
  const { db, queues, contexts, log } = services;
  // The embedded engine and trainer factories (their modules load only when a run uses them).
  const embedded = options.embedded === undefined ? await loadEmbedded() : options.embedded;
  const engines = createEngineProvider(db, embedded, log);
  const trainers = createTrainerProvider(embedded);
  const stager = kinds.includes("train") ? createBatchStager(db, log) : null;
  const handles: WorkerHandle[] = [];
  // Concurrent jobs share statements and queue round trips (store/job-batch.ts).
  const store = createJobStore(db);
  const enqueueReward = coalesce<RewardJob, string>((jobs) => queues.enqueueMany("reward", jobs), { maxBatch: 256, maxInFlight: 2 });
  const onError = (kind: QueueKind) => (e: unknown, jobId: string | undefined) => {
    if (isBug(e)) log.error({ kind, jobId, err: e }, "job failed with an error that is not an RlqError (a bug in rlq): not retried");
    else log.warn({ kind, jobId, err: errorMessage(e) }, "job failed");
  };
  const onWorkerError = (kind: QueueKind) => (e: Error, repeats: number) =>
    log.warn({ kind, err: e.message, repeats }, "queue worker error (BullMQ reconnects by itself)");
  const outageTimeoutMs = services.env.RLQ_OUTAGE_TIMEOUT_S * 1000;
  const onOutageWait = (kind: QueueKind) => (w: { jobId: string | undefined; waitedMs: number; retryInMs: number; error: unknown }) =>
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
    );
  const hostOptions = (kind: QueueKind, concurrency: number) => ({
    concurrency,
    onError: onError(kind),
    onWorkerError: onWorkerError(kind),
    outageTimeoutMs,
    onOutageWait: onOutageWait(kind),
    // Prometheus counters (observability/prometheus.ts): jobs/s is their rate.
    onJobCompleted: () => processMetrics().jobCompleted(kind),
    onJobFailed: (final: boolean) => processMetrics().jobFailed(kind, final),
  });
  for (const kind of kinds) {
    const concurrency = options.concurrency?.[kind] ?? defaultConcurrency[kind];
    if (kind === "rollout") {
      handles.push(
        startWorker(
          services.backend,
          "rollout",
          async (data, job) => {
            const ctx = await contexts.get(data.runId);
            await generateGroupRound(
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
              ctx,
              data,
              job.jobId,
            );
          },
          hostOptions(kind, concurrency),
        ),
      );
    } else if (kind === "reward") {
      handles.push(
        startWorker(
          services.backend,
          "reward",
          async (data, job) => {
            const ctx = await contexts.get(data.runId);
            await scoreGroupRound(store, ctx, data, job.jobId);
          },
          hostOptions(kind, concurrency),
        ),
      );
    } else if (kind === "train") {
      handles.push(
        startWorker(
          services.backend,
          "train",
          async (data, job) => {
            const ctx = await contexts.get(data.runId);
            await runTrainStep(
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
              ctx,
              data,
              job.attemptsMade,
            );
          },
          hostOptions(kind, concurrency),
        ),
      );
    } else {
      handles.push(
        startWorker(
          services.backend,
          "eval",
          async (data, job) => {
            const ctx = await contexts.get(data.runId);
            await runEval({ db, engineFor: (c, v) => engines.engineFor(c, v) }, ctx, data, job.jobId);
          },
          hostOptions(kind, concurrency),
        ),
      );
    }
  }
  // Engine-pool telemetry for `rlq run status`, every 5 s.
  const publish = async () => {
    for (const m of engines.metrics()) await upsertEngineMetrics(db, m.runId, services.holder, m.snapshot);
  };
  // A missed publish leaves the last snapshot in place until the next one, 5 s later.
  const publishLogged = () => publish().catch((e: unknown) => log.warn({ err: errorMessage(e) }, "engine telemetry not published (kept: the last snapshot)"));
  const telemetry = kinds.includes("rollout") ? setInterval(() => void publishLogged(), 5000) : null;
  return {
    async close() {
      if (telemetry) clearInterval(telemetry);
      await publishLogged();
      await Promise.all(handles.map((h) => h.close()));
      await engines.close();
      await trainers.close();
      stager?.close();
    },
  };
}
