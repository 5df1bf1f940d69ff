/**
 * @file The queue watch: rlq notices what was done to its queues that it did not do,
 * says so (`rlq run status`, the dashboard's banner), and repairs what it can.
 *
 * What it sees, and what it does:
 * - A paused queue. Nothing in rlq pauses a BullMQ queue (a run is paused as a run: `rlq run
 *   pause`, a decision in its log), so a paused queue only stalls every run that shares it, without
 *   a word. It is resumed: every job reads its facts first and may run again, so running the jobs
 *   is never wrong. The exception is a pause an operator made through rlq's own Bull Board with the
 *   dashboard's token (dashboard/bull-board.ts records it here): that one is deliberate, and it is
 *   left paused and flagged until it is resumed.
 * - An emptied queue: its meta hash (BullMQ's `version`) is gone, which an obliteration (or a
 *   flush of the queue store) does and nothing else. The meta is written again; the jobs the runs
 *   still need are added back by the controllers' reconcile (controller/reconcile.ts), which
 *   reports them here as missing jobs.
 * - Missing jobs (drained, removed, cleaned, obliterated): reported by reconcile, per run.
 *
 * Each queue's mode in this process (QueueWatch.check is its one writer):
 *   unknown  first look. A queue without meta gets it written, silently: a fresh prefix, or a
 *            queue no rlq process opened yet, is not a loss.                         → watched
 *   watched  meta written by rlq; a later look that finds it gone is an emptied queue (event, meta
 *            written again). A pause not recorded as an operator's is resumed (event).
 * Every rlq Queue object is opened with skipMetasUpdate (queues.ts, board-queues.ts), so only this
 * watch writes the meta, and a process that opens the queues cannot hide an obliteration by
 * writing it back.
 *
 * What it saw is kept in the queue store itself, next to what it describes: one job per event in
 * the `rlq-watch` queue, which no worker consumes (as the sentinel's queue), read by any process.
 * Two processes may both see one pause before either resumes it: then both record it.
 */

import type { Queue } from "bullmq";
import { hostname } from "node:os";
import { z } from "zod";
import type { QueueBackend } from "./backend.ts";
import { queueKinds, type QueueKind } from "./payloads.ts";

export const queueEventSchema = z.object({
  /** When the watch saw it (ISO 8601). */
  at: z.string(),
  /** The BullMQ queue, e.g. rlq-rollout. */
  queue: z.string(),
  kind: z.enum(["paused", "emptied", "jobs_missing", "operator_pause", "operator_resume", "operator_change"]),
  /** What rlq did about it. */
  action: z.enum(["resumed", "meta_restored", "re_added", "recorded", "repair_failed"]),
  /** The run whose jobs were missing; null for what happened to a queue. */
  runId: z.string().nullable(),
  detail: z.string(),
  /** The process that saw it (host:pid). */
  by: z.string(),
});
export type QueueEvent = z.infer<typeof queueEventSchema>;

export interface QueueWatchReport {
  /** Queues paused right now, with whether an operator paused them through rlq's Bull Board. */
  pausedNow: Array<{ queue: string; byOperator: boolean }>;
  /** What the watch saw, newest first. */
  events: QueueEvent[];
}

/** Where the watch reports repairs: the caller's logger (pino's object-first signature). */
export interface WatchLog {
  warn(obj: object, msg: string): void;
}

/** A process checks its queues at most this often, however many controllers call. */
const CHECK_EVERY_MS = 1000;
/** Events older than this are dropped when a new one is recorded. */
const KEEP_EVENTS_MS = 7 * 24 * 3600 * 1000;
export const WATCH_QUEUE = "rlq-watch";

export class QueueWatch {
  private readonly modes = new Map<QueueKind, "unknown" | "watched">();
  private running: Promise<void> | null = null;
  private lastCheckAt = 0;
  private readonly by = `${hostname()}:${process.pid}`;

  /** `queueFor(name)`: the process's Queue object for a queue name, opened with skipMetasUpdate. */
  constructor(
    private readonly backend: QueueBackend,
    private readonly queueFor: (name: string) => Queue,
  ) {}

  /** Look at every queue once (shared by concurrent callers, at most once per second) and repair what it finds. */
  async check(log: WatchLog): Promise<void> {
    if (this.running) return this.running;
    if (Date.now() - this.lastCheckAt < CHECK_EVERY_MS) return;
    this.running = this.checkAll(log).finally(() => {
      this.lastCheckAt = Date.now();
      this.running = null;
    });
    return this.running;
  }

  private async checkAll(log: WatchLog): Promise<void> {
    for (const kind of queueKinds) {
      const q = this.queueFor(`rlq-${kind}`);
      const hasMeta = (await q.getVersion()) !== null;
      if (!hasMeta) {
        await this.writeMeta(q.name);
        if (this.modes.get(kind) === "watched") {
          await this.recordAndLog(log, {
            queue: q.name,
            kind: "emptied",
            action: "meta_restored",
            runId: null,
            detail: `${q.name} lost its state (obliterated, or the queue store was emptied): its meta is written again, and each running run's reconcile adds back the jobs it still needs`,
          });
        }
      }
      this.modes.set(kind, "watched");
      if (await q.isPaused()) await this.handlePaused(log, q);
    }
  }

  private async handlePaused(log: WatchLog, q: Queue): Promise<void> {
    const last = (await this.events()).find(
      (e) => e.queue === q.name && e.runId === null && (e.kind === "operator_pause" || e.kind === "operator_resume" || e.kind === "paused"),
    );
    if (last?.kind === "operator_pause") return; // an operator's deliberate pause: status and the banner flag it
    try {
      await q.resume();
      await this.recordAndLog(log, {
        queue: q.name,
        kind: "paused",
        action: "resumed",
        runId: null,
        detail: `${q.name} was paused outside rlq (its jobs of every run waited): resumed. To stop a run, pause the run (rlq run pause ID)`,
      });
    } catch (e) {
      await this.recordAndLog(log, {
        queue: q.name,
        kind: "paused",
        action: "repair_failed",
        runId: null,
        detail: `${q.name} was paused outside rlq and could not be resumed: ${(e as Error).message}`,
      });
    }
  }

  /** Reconcile found jobs of `runId` missing from `queue` and added them back. */
  async recordJobsMissing(log: WatchLog, runId: string, queue: string, jobIds: readonly string[]): Promise<void> {
    if (jobIds.length === 0) return;
    const shown = jobIds.slice(0, 5).join(", ") + (jobIds.length > 5 ? `, ... (${jobIds.length} in all)` : "");
    await this.recordAndLog(log, {
      queue,
      kind: "jobs_missing",
      action: "re_added",
      runId,
      detail: `${jobIds.length} job(s) of run ${runId} the run still needs were not in ${queue} (removed, drained or obliterated outside rlq, or lost with the queue store): added back: ${shown}`,
    });
  }

  /** An operator changed a queue through rlq's Bull Board with the dashboard's token. */
  async recordOperatorChange(queue: string, kind: "operator_pause" | "operator_resume" | "operator_change", detail: string): Promise<void> {
    await this.record({ queue, kind, action: "recorded", runId: null, detail });
  }

  private async recordAndLog(log: WatchLog, e: Omit<QueueEvent, "at" | "by">): Promise<void> {
    log.warn({ queue: e.queue, kind: e.kind, action: e.action, runId: e.runId }, e.detail);
    await this.record(e);
  }

  private async record(e: Omit<QueueEvent, "at" | "by">): Promise<void> {
    const event: QueueEvent = { ...e, at: new Date().toISOString(), by: this.by };
    const q = this.queueFor(WATCH_QUEUE);
    await q.add(e.kind, event, { removeOnComplete: true, removeOnFail: true });
    await q.clean(KEEP_EVENTS_MS, 1000, "wait");
  }

  /** What the watch saw, newest first (at most `limit`). */
  async events(limit = 200): Promise<QueueEvent[]> {
    const jobs = await this.queueFor(WATCH_QUEUE).getJobs(["waiting"], 0, limit - 1);
    return jobs
      .map((j) => queueEventSchema.safeParse(j.data))
      .flatMap((r) => (r.success ? [r.data] : []))
      .sort((a, b) => b.at.localeCompare(a.at));
  }

  /** Paused queues now and the events that concern `runId` (or all, without one), since `since`. */
  async report(options: { runId?: string; since?: Date; limit?: number } = {}): Promise<QueueWatchReport> {
    const events = await this.events();
    const pausedNow: QueueWatchReport["pausedNow"] = [];
    for (const kind of queueKinds) {
      const q = this.queueFor(`rlq-${kind}`);
      if (!(await q.isPaused())) continue;
      const last = events.find((e) => e.queue === q.name && (e.kind === "operator_pause" || e.kind === "operator_resume" || e.kind === "paused"));
      pausedNow.push({ queue: q.name, byOperator: last?.kind === "operator_pause" });
    }
    const since = options.since?.toISOString() ?? "";
    const mine = events.filter((e) => e.at >= since && (options.runId === undefined || e.runId === null || e.runId === options.runId));
    return { pausedNow, events: mine.slice(0, options.limit ?? 20) };
  }

  /** BullMQ writes a queue's meta when a Queue object without skipMetasUpdate is ready. */
  private async writeMeta(name: string): Promise<void> {
    const q = new this.backend.Queue(name, { connection: this.backend.connection, ...this.backend.baseOptions });
    try {
      await q.getVersion();
    } finally {
      await q.close();
    }
  }
}

/** One line per event, for `rlq run status` and logs: `HH:MM:SS queue what (what rlq did)`. */
export function describeQueueEvent(e: QueueEvent): string {
  const action = {
    resumed: "resumed by rlq",
    meta_restored: "meta restored",
    re_added: "jobs added back",
    recorded: "recorded",
    repair_failed: "NOT repaired",
  }[e.action];
  return `${e.at.slice(11, 19)} ${e.kind.replace(/_/g, " ")} (${action}): ${e.detail}`;
}
