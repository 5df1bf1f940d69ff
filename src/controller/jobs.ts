/**
 * The outbox's one mapping (docs/architecture.md "The fact model"): a committed decision → the job it
 * calls for. Every enqueue of the controller (and of the rollout-function
 * driver) goes through `jobFor`, so a job's payload is always what its
 * decision recorded, and reconcile re-adds exactly the job the live path added.
 */

import type { RunConfig } from "../config/run-config.ts";
import type { Decision } from "../core/decisions.ts";
import type { JobData, QueueKind } from "../queue/payloads.ts";
import type { Queues } from "../queue/queues.ts";

export type Job = { [K in QueueKind]: { kind: K; data: JobData<K>; attempts?: number } }[QueueKind];

export function jobFor(runId: string, config: Pick<RunConfig, "train_max_attempts">, d: Decision): Job | null {
  switch (d.kind) {
    case "group.dispatched": {
      const { groupId, round, step, weightVersion } = d.payload;
      return { kind: "rollout", data: { runId, groupId, round, step, weightVersion } };
    }
    case "train.dispatched":
      return { kind: "train", data: { runId, step: d.payload.step }, attempts: config.train_max_attempts };
    case "eval.dispatched":
      return { kind: "eval", data: { runId, step: d.payload.step } };
    default:
      return null;
  }
}

/**
 * The reward job of a dispatched round. The rollout worker enqueues it when
 * its round lands; the controller only re-adds it in reconcile.
 */
export function rewardJobFor(rollout: JobData<"rollout">): Job {
  return { kind: "reward", data: { runId: rollout.runId, groupId: rollout.groupId, round: rollout.round, step: rollout.step } };
}

/** Enqueue the jobs of committed decisions (after their commit): rollout jobs in one round trip, the others one by one. */
export async function enqueueJobsFor(queues: Queues, runId: string, config: Pick<RunConfig, "train_max_attempts">, list: readonly Decision[]): Promise<void> {
  const jobs = list.map((d) => jobFor(runId, config, d)).filter((j): j is Job => j !== null);
  const rollouts = jobs.flatMap((j) => (j.kind === "rollout" ? [j.data] : []));
  if (rollouts.length > 0) await queues.enqueueMany("rollout", rollouts);
  for (const j of jobs) if (j.kind !== "rollout") await enqueueJob(queues, j);
}

export async function enqueueJob(queues: Queues, job: Job): Promise<string> {
  const options = job.attempts === undefined ? {} : { attempts: job.attempts };
  switch (job.kind) {
    case "rollout":
      return queues.enqueue("rollout", job.data, options);
    case "reward":
      return queues.enqueue("reward", job.data, options);
    case "train":
      return queues.enqueue("train", job.data, options);
    case "eval":
      return queues.enqueue("eval", job.data, options);
  }
}
