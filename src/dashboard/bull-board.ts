/**
 * Bull Board (@bull-board/api + its Express adapter) at `basePath`, over rlq's
 * four queues. Works on both backends: on Redis it shows Redis's INFO; on
 * BullMQ's Postgres backend it shows the Postgres server's stats instead
 * (bull-board's BullMQAdapter.getDatastoreStats), and jobs, counts, retry and
 * remove work the same. Rollout and reward jobs are removed on completion
 * (docs/architecture.md, "The queue"), so their "completed" lists stay empty:
 * the facts in Postgres are their record.
 *
 * Read-only unless the request carries the dashboard's token. Two boards share
 * the Queue objects and the base path: a read-only one (BullMQAdapter
 * `readOnlyMode`: its page hides the buttons, its handlers refuse changes)
 * serves requests without the token, a writable one serves requests with it.
 * Every Bull Board route that changes a queue is a PUT, POST or PATCH
 * (@bull-board/api dist/routes.js), and such a request without the token is
 * refused here, before either board, with a message naming the header to send:
 * the read-only board alone answers 405 per queue, and 200 for "pause all" /
 * "resume all" (they skip read-only queues), which reads as accepted. Behind
 * the method check the read-only board is a second guard: a route that changed
 * a queue on GET in a later bull-board would still meet its refusal.
 *
 * A change made with the token is recorded for the queue watch (queue/queue-watch.ts): a pause
 * made here is an operator's and stays (flagged), where a pause from anywhere else is resumed.
 * `GET <basePath>/api/rlq-watch` answers the watch's report (queues paused now, recent events)
 * for the dashboard's banner; like every read here, it needs no token on loopback.
 */

import type { NextFunction, Request, Response, Router } from "express";
import { createBullBoard } from "@bull-board/api";
import { BullMQAdapter } from "@bull-board/api/bullMQAdapter";
import { ExpressAdapter } from "@bull-board/express";
import type { QueueBackend } from "../queue/backend.ts";
import { openBoardQueues } from "../queue/board-queues.ts";
import { queueKinds } from "../queue/payloads.ts";
import type { QueueWatch } from "../queue/queue-watch.ts";
import { queueName } from "../queue/queues.ts";
import { tokenMatches } from "../http-access/token.ts";

export function mountBullBoard(
  backend: QueueBackend,
  basePath: string,
  options: { token?: string },
): { router: (req: Request, res: Response, next: NextFunction) => void; close(): Promise<void> } {
  const board = openBoardQueues(backend);
  const readOnly = boardRouter(board.queues, backend, basePath, true);
  const writable = options.token === undefined ? null : boardRouter(board.queues, backend, basePath, false);
  const token = options.token;
  return {
    router(req, res, next) {
      if (req.method === "GET" && req.path === "/api/rlq-watch") {
        board.watch.report({ limit: 20 }).then((queueWatch) => res.json({ queueWatch }), next);
        return;
      }
      if (writable && token !== undefined && tokenMatches(token, req.header("authorization"))) {
        if (req.method !== "GET" && req.method !== "HEAD") recordWhenDone(board.watch, req, res);
        return writable(req, res, next);
      }
      if (req.method === "GET" || req.method === "HEAD") return readOnly(req, res, next);
      if (!writable) {
        res.status(403).json({
          error: {
            code: "dashboard_read_only",
            message: "this dashboard has no token: start it with RLQ_DASHBOARD_TOKEN set to allow queue changes in Bull Board",
          },
        });
        return;
      }
      res.status(401).json({
        error: {
          code: "bad_token",
          message: `Bull Board is read-only without the dashboard's token: send the header 'Authorization: Bearer <RLQ_DASHBOARD_TOKEN>' to ${req.method} ${req.originalUrl}`,
        },
      });
    },
    close: () => board.close(),
  };
}

/**
 * Record a change an operator made with the token once Bull Board answered it with success: a
 * pause or resume (one queue, or all) by queue, any other change by its route.
 */
function recordWhenDone(watch: QueueWatch, req: Request, res: Response): void {
  const path = req.path;
  res.on("finish", () => {
    if (res.statusCode >= 300) return;
    const m = /^\/api\/queues(?:\/([^/]+))?\/(pause|resume)$/.exec(path);
    const records: Array<[string, "operator_pause" | "operator_resume" | "operator_change", string]> = [];
    if (m) {
      const kind = m[2] === "pause" ? "operator_pause" : "operator_resume";
      for (const queue of m[1] === undefined ? queueKinds.map(queueName) : [decodeURIComponent(m[1])]) {
        records.push([queue, kind, `${queue} ${m[2] === "pause" ? "paused" : "resumed"} by an operator in Bull Board (with the dashboard token)`]);
      }
    } else {
      const queue = /^\/api\/queues\/([^/]+)/.exec(path)?.[1];
      records.push([
        queue === undefined ? "*" : decodeURIComponent(queue),
        "operator_change",
        `${req.method} ${path} by an operator in Bull Board (with the dashboard token)`,
      ]);
    }
    for (const [queue, kind, detail] of records) {
      watch.recordOperatorChange(queue, kind, detail).catch((e: unknown) => {
        process.stderr.write(`rlq dashboard: could not record the Bull Board change '${detail}' for the queue watch: ${(e as Error).message}\n`);
      });
    }
  });
}

function boardRouter(queues: ReturnType<typeof openBoardQueues>["queues"], backend: QueueBackend, basePath: string, isReadOnly: boolean): Router {
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(basePath);
  createBullBoard({
    queues: queues.map((q) => new BullMQAdapter(q, { readOnlyMode: isReadOnly, description: `rlq ${q.name} (${backend.kind})` })),
    serverAdapter,
    options: { uiConfig: { boardTitle: isReadOnly ? "rlq queues (read-only: changes need the dashboard token)" : "rlq queues" } },
  });
  return serverAdapter.getRouter() as Router;
}
