/**
 * BullMQ Queue objects for Bull Board (dashboard/bull-board.ts), one per rlq
 * queue, on whichever backend the process uses. They are the same classes the
 * workers use (the Postgres backend's Queue too), so the board reads what the
 * workers see; opened as rlq opens every queue (queues.ts openQueue: only the
 * queue watch writes a queue's meta). `watch` reads and records over them what
 * the queue watch saw and what operators changed through the board. The caller
 * closes them.
 */

import type { Queue } from "bullmq";
import type { QueueBackend } from "./backend.ts";
import { queueKinds } from "./payloads.ts";
import { openQueue, queueName } from "./queues.ts";
import { QueueWatch, WATCH_QUEUE } from "./queue-watch.ts";
import { RlqError } from "../lib/errors.ts";

export function openBoardQueues(backend: QueueBackend): { queues: Queue[]; watch: QueueWatch; close(): Promise<void> } {
  const queues = queueKinds.map((kind) => openQueue(backend, queueName(kind)));
  let watchQueue: Queue | null = null;
  const byName = (name: string): Queue => {
    const q = queues.find((x) => x.name === name);
    if (q) return q;
    if (name !== WATCH_QUEUE) throw new RlqError("invariant_violated", `the queue watch asked Bull Board's queues for ${name}, which the board does not open`);
    return (watchQueue ??= openQueue(backend, WATCH_QUEUE));
  };
  return {
    queues,
    watch: new QueueWatch(backend, byName),
    async close() {
      // A Queue whose connection is already gone has nothing left to close: nothing is lost.
      await Promise.all([...queues, ...(watchQueue ? [watchQueue] : [])].map((q) => q.close().catch(() => undefined)));
    },
  };
}
