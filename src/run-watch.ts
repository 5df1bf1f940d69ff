/**
 * Following a run from a script: `watchRun` yields the run's progress each
 * time a step commits, the weights move or its status changes, and
 * `changeOutcome` / `waitForChange` read what the controller did with a
 * request made by `requestRunChange` (controller/requests.ts marks each
 * request with the seq it was handled at, or with the reason it was refused).
 *
 * Both read Postgres; NOTIFY hints (store/notify.ts: `rlq_facts` on a step
 * commit, `rlq_weights` on a weight sync) only make them look sooner, and a
 * poll every `pollMs` covers what sends no hint (a status decision, a
 * request marked handled) and any hint lost.
 */

import type { Db } from "./store/db.ts";
import { createWaker, type Channel } from "./store/notify.ts";
import { loadRunProgress, type RunProgressRow } from "./store/run-progress.ts";
import { loadRunRequest, type RunRequestKind } from "./store/run-requests.ts";
import { RlqError } from "./lib/errors.ts";

export interface RunProgress extends RunProgressRow {
  runId: string;
}

export interface WatchOptions {
  /** Ends the watch (watchRun returns; waitForChange rejects with the signal's reason). */
  signal?: AbortSignal;
  /** How often the run is read when no hint comes; default 1000 for watchRun, 250 for waitForChange. */
  pollMs?: number;
}

const TERMINAL = new Set(["completed", "cancelled"]);
const HINTS: readonly Channel[] = ["rlq_facts", "rlq_weights"];

/** Hints for one run, waking `wake`; returns the unsubscribe. */
function subscribeHints(db: Db, runId: string, wake: () => void): () => void {
  const offs = HINTS.map((ch) => db.notifications.subscribe(ch, runId, wake));
  return () => offs.forEach((off) => off());
}

/**
 * The run's progress: the current value first, then one each time its
 * status, committed train steps, weight version, last error or num_rollout
 * changes. Ends after yielding a completed or cancelled run, or when
 * `signal` aborts. A paused run is yielded and watched on (a resume goes on).
 *
 * @throws RlqError `run_not_found`
 */
export async function* watchRun(db: Db, runId: string, options: WatchOptions = {}): AsyncGenerator<RunProgress, void, undefined> {
  const waker = createWaker();
  const unsubscribe = subscribeHints(db, runId, waker.wake);
  try {
    let last = "";
    while (!options.signal?.aborted) {
      waker.clear();
      const row = await loadRunProgress(db, runId);
      if (!row) throw new RlqError("run_not_found", `run ${runId} does not exist`);
      const key = JSON.stringify([row.status, row.trainSteps, row.weightVersion, row.lastError, row.numRollout]);
      if (key !== last) {
        last = key;
        yield { runId, ...row };
      }
      if (TERMINAL.has(row.status)) return;
      await waker.wait(options.pollMs ?? 1000, options.signal);
    }
  } finally {
    unsubscribe();
  }
}

interface ChangeBase {
  id: number;
  runId: string;
  kind: RunRequestKind;
}

/**
 * A change request's outcome: pending (no controller has handled it yet),
 * applied at decision `seq` (a pause of a run not running, or a resume of a
 * run not paused, is applied as nothing to do), or refused with the reason.
 */
export type ChangeOutcome =
  (ChangeBase & { state: "pending" }) | (ChangeBase & { state: "applied"; seq: number }) | (ChangeBase & { state: "refused"; seq: number; reason: string });

/** @throws RlqError `run_request_not_found` */
export async function changeOutcome(db: Db, id: number): Promise<ChangeOutcome> {
  const r = await loadRunRequest(db, id);
  if (!r) throw new RlqError("run_request_not_found", `run change request ${id} does not exist (requestRunChange returns the id of the request it records)`);
  const base: ChangeBase = { id: r.id, runId: r.runId, kind: r.kind as RunRequestKind };
  if (r.handledSeq === null) return { ...base, state: "pending" };
  if (r.error !== null) return { ...base, state: "refused", seq: r.handledSeq, reason: r.error };
  return { ...base, state: "applied", seq: r.handledSeq };
}

/**
 * Wait until the run's controller has handled request `id`: applied or
 * refused. A request stays pending while no controller drives the run
 * (`rlq up`, runUntilDone): pass a `signal` to give up.
 *
 * @throws RlqError `run_request_not_found`; the signal's reason when it aborts
 */
export async function waitForChange(db: Db, id: number, options: WatchOptions = {}): Promise<Exclude<ChangeOutcome, { state: "pending" }>> {
  let out = await changeOutcome(db, id);
  const waker = createWaker();
  const unsubscribe = subscribeHints(db, out.runId, waker.wake);
  try {
    while (out.state === "pending") {
      options.signal?.throwIfAborted();
      await waker.wait(options.pollMs ?? 250, options.signal);
      waker.clear();
      out = await changeOutcome(db, id);
    }
    return out;
  } finally {
    unsubscribe();
  }
}
