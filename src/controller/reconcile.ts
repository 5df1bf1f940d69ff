/**
 * Make the queues match the state (docs/architecture.md "The fact model"): for each job the state expects
 * and whose fact is missing, missing jobs are added, failed ones retried (or
 * the run paused). Runs at start, every few seconds, whenever the queue's
 * sentinel vanished, and on resume (`isResume`: failures are retried).
 * The jobs are the ones their decisions call for (`jobFor`).
 *
 * It first lets the queue watch look at the queues (queue/queue-watch.ts: a queue paused behind
 * rlq's back is resumed, an emptied one noticed), and it reports the jobs it added back because
 * they were not in their queue, so that `rlq run status` and the dashboard say what was lost.
 */

import { RlqError } from "../lib/errors.ts";
import { loadRoundStatuses } from "../store/rollout-facts.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { loadEvalResults } from "../store/eval-facts.ts";
import { queueName, type JobInfo } from "../queue/queues.ts";
import { jobIds, UNRECOVERABLE_PREFIX, type JobData, type QueueKind } from "../queue/payloads.ts";
import { isAsync } from "../core/run-state.ts";
import type { ControllerHost } from "./host.ts";
import { inflightRounds, unlandedDispatchVersion, liveRounds } from "./groups.ts";
import { enqueueJob, jobFor, rewardJobFor, type Job } from "./jobs.ts";
import { isSftRun } from "../config/sft-keys.ts";
import { isReplayRun } from "../config/debug-keys.ts";

export async function reconcile(h: ControllerHost, isResume: boolean): Promise<void> {
  const s = h.state;
  if (s.status !== "running") return;
  await h.deps.queues.watch.check(h.deps.log);
  const readded = new Map<QueueKind, string[]>();
  const ensure = async (job: Job, hasFact: () => Promise<boolean>, known?: JobInfo) => {
    if (await ensureJob(h, job, isResume, hasFact, known)) readded.set(job.kind, [...(readded.get(job.kind) ?? []), jobIdOf(job)]);
  };
  await reconcileJobs(h, ensure);
  for (const [kind, ids] of readded) await h.deps.queues.watch.recordJobsMissing(h.deps.log, s.runId, queueName(kind), ids);
}

type Ensure = (job: Job, hasFact: () => Promise<boolean>, known?: JobInfo) => Promise<void>;

async function reconcileJobs(h: ControllerHost, ensure: Ensure): Promise<void> {
  const s = h.state;
  const { db } = h.deps;
  const n = s.config.n_samples_per_prompt;
  const async = isAsync(s);
  // Sync mode drains the sealed step's aborted rounds while it trains (sync-step.ts): their jobs too.
  // An SFT run's rounds are written by the controller itself (sft-collect.ts), as are a train-only
  // run's (recorded-collect.ts): no rollout or reward job.
  if (!isSftRun(s.config) && !isReplayRun(s.config) && (s.phase === "collect" || s.draining.size > 0)) {
    const keys = async ? liveRounds(h) : s.phase === "collect" ? inflightRounds(h) : [...s.draining].map(([groupId, round]) => ({ groupId, round }));
    const statuses = await loadRoundStatuses(db, s.runId, keys);
    const expected: Array<{ job: Job; hasFact: () => Promise<boolean> }> = [];
    for (const k of keys) {
      const st = statuses.get(k.groupId);
      // The round's dispatch as recorded: its step, and for a round to generate its version (a
      // reward job does not read it).
      const weightVersion = st ? s.weightVersion : unlandedDispatchVersion(h, k.groupId);
      const dispatch = {
        kind: "group.dispatched" as const,
        payload: { groupId: k.groupId, round: k.round, step: s.groups.get(k.groupId)?.step ?? s.step, weightVersion },
      };
      const rollout = jobFor(s.runId, s.config, dispatch);
      if (rollout?.kind !== "rollout") throw new RlqError("invariant_violated", "unreachable: a dispatch calls for a rollout job");
      const roundStatus = async () => (await loadRoundStatuses(db, s.runId, [k])).get(k.groupId);
      if (!st) expected.push({ job: rollout, hasFact: async () => (await roundStatus()) !== undefined });
      else if (s.phase === "collect" && st.isComplete && st.rewardCount < n) {
        expected.push({ job: rewardJobFor(rollout.data), hasFact: async () => ((await roundStatus())?.rewardCount ?? 0) >= n });
      }
    }
    // The queue lookups go out together (hundreds of in-flight rounds at 64 engines: one after
    // another, they held the controller's loop for every Redis round trip); the actions, rare,
    // one at a time.
    for (let i = 0; i < expected.length; i += INFO_LOOKUPS_AT_ONCE) {
      const chunk = expected.slice(i, i + INFO_LOOKUPS_AT_ONCE);
      const infos = await Promise.all(chunk.map((e) => h.deps.queues.info(e.job.kind, jobIdOf(e.job))));
      for (const [j, e] of chunk.entries()) await ensure(e.job, e.hasFact, infos[j]);
    }
  }
  const pendingEval = s.pendingEval;
  const hasEval = async () => pendingEval !== null && (await loadEvalResults(db, s.runId, pendingEval.step)).length > 0;
  if (pendingEval && !(await hasEval())) {
    const job = jobFor(s.runId, s.config, { kind: "eval.dispatched", payload: pendingEval });
    if (job) await ensure(job, hasEval);
  }
  const training = async ? s.training : s.phase === "train" ? s.step : null;
  const hasTrained = async () => training !== null && (await loadTrainStep(db, s.runId, training)) !== null;
  if (training !== null && !(await hasTrained())) {
    const job = jobFor(s.runId, s.config, { kind: "train.dispatched", payload: { step: training, weightVersionIn: s.trainedVersion } });
    if (job) await ensure(job, hasTrained);
  }
}

/** Queue lookups reconcile sends at once (each is two Redis commands). */
const INFO_LOOKUPS_AT_ONCE = 256;

const jobIdOf = (job: Job): string => (jobIds[job.kind] as (d: JobData<QueueKind>) => string)(job.data);

/**
 * Make one expected job exist (`reconcileAction` decides from the job's
 * state, `known` when the caller looked it up already). `hasFact` is read
 * again before a job is added or re-run: a job that finished between the
 * caller's fact check and this look at the queue is done, not lost.
 * True when the job was not in its queue (or in no list of it) and was added back.
 */
async function ensureJob(h: ControllerHost, job: Job, isResume: boolean, hasFact: () => Promise<boolean>, known?: JobInfo): Promise<boolean> {
  const q = h.deps.queues;
  const id = jobIdOf(job);
  const info = known ?? (await q.info(job.kind, id));
  const action = reconcileAction(job.kind, info, isResume);
  if (action === "add" || action === "replace") {
    if (await hasFact()) return false;
    if (action === "replace") {
      h.deps.log.warn(
        { runId: job.data.runId, kind: job.kind, jobId: id, state: info.state },
        `${job.kind} job ${info.state === "unknown" ? "in no queue list" : "completed"} without its fact: adding it again`,
      );
      await q.remove(job.kind, id);
    }
    await enqueueJob(q, job);
    return true;
  } else if (action === "pause") {
    await h.pause(`${job.kind} job ${id} failed after ${info.attemptsMade} attempt(s): ${info.failedReason ?? "unknown error"}`);
  } else if (action === "retry") {
    await q.retry(job.kind, id);
  }
  return false;
}

/**
 * What reconcile does with an expected job whose fact is missing, from the
 * job's queue state:
 * - missing: add it;
 * - completed without its fact (cannot normally happen), or a job record in
 *   no list at all (state "unknown": a partial loss of the queue state, e.g.
 *   keys lost in a failover or a non-atomic flush, leaves the record but not
 *   its list entry; BullMQ would ignore a plain add of its id): remove and
 *   add again;
 * - failed: retry; an unrecoverable failure or a train job that used up its
 *   attempts pauses the run instead, except while resuming (a resume retries);
 * - waiting, active, delayed: nothing (BullMQ's stall check covers a dead worker).
 */
export function reconcileAction(kind: QueueKind, info: JobInfo, isResume: boolean): "none" | "add" | "replace" | "retry" | "pause" {
  switch (info.state) {
    case "missing":
      return "add";
    case "completed":
    case "unknown":
      return "replace";
    case "failed": {
      const isFatal = (info.failedReason ?? "").startsWith(UNRECOVERABLE_PREFIX) || kind === "train";
      return isFatal && !isResume ? "pause" : "retry";
    }
    default:
      return "none";
  }
}
