import type { Router } from "express";
import { createBullBoard } from "@bull-board/api";
import { BullMQAdapter } from "@bull-board/api/bullMQAdapter";
import { ExpressAdapter } from "@bull-board/express";
import type { QueueBackend } from "../queue/backend.ts";
import { openBoardQueues } from "../queue/board-queues.ts";

/**
 * Bull Board (@bull-board/api + its Express adapter) at `basePath`, over rlq's
 * four queues. Works on both backends: on Redis it shows Redis's INFO; on
 * BullMQ's Postgres backend it shows the Postgres server's stats instead
 * (bull-board's BullMQAdapter.getDatastoreStats), and jobs, counts, retry and
 * remove work the same. Rollout and reward jobs are removed on completion
 * (docs/architecture.md, "The queue"), so their "completed" lists stay empty:
 * the facts in Postgres are their record.
 */
export function mountBullBoard(backend: QueueBackend, basePath: string): { router: Router; close(): Promise<void> } {
  const board = openBoardQueues(backend);
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(basePath);
  createBullBoard({
    queues: board.queues.map((q) => new BullMQAdapter(q, { readOnlyMode: false, description: `rlq ${q.name} (${backend.kind})` })),
    serverAdapter,
    options: { uiConfig: { boardTitle: "rlq queues" } },
  });
  return { router: serverAdapter.getRouter() as Router, close: () => board.close() };
}
