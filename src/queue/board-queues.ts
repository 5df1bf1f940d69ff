import type { Queue } from "bullmq";
import type { QueueBackend } from "./backend.ts";
import { queueKinds } from "./payloads.ts";
import { queueName } from "./queues.ts";

/**
 * BullMQ Queue objects for Bull Board (dashboard/bull-board.ts), one per rlq
 * queue, on whichever backend the process uses. They are the same classes the
 * workers use (the Postgres backend's Queue too), so the board reads what the
 * workers see. The caller closes them.
 */
export function openBoardQueues(backend: QueueBackend): { queues: Queue[]; close(): Promise<void> } {
  const queues = queueKinds.map((kind) => {
    const q = new backend.Queue(queueName(kind), { connection: backend.connection, ...backend.baseOptions });
    q.on("error", () => undefined);
    return q;
  });
  return {
    queues,
    async close() {
      await Promise.all(queues.map((q) => q.close().catch(() => undefined)));
    },
  };
}
