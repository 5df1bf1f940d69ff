/**
 * `rlq dashboard` (and `rlq up --dashboard`): one HTTP server with
 * - `/`            the page (static/index.html + app.js, charts by uPlot served from node_modules);
 * - `/api/...`     JSON read from the store by single SELECTs (dashboard/queries.ts);
 * - `/queues`      Bull Board, read-only without the token (dashboard/bull-board.ts);
 * - `/metrics`     this process's Prometheus metrics.
 * It listens on `host` (127.0.0.1 by default); beyond loopback every request needs the token
 * (dashboard/access.ts), and without one it refuses to start.
 * It holds no state of its own: every request reads Postgres (and the queue for
 * the train job's state), so a dashboard keeps working while `rlq up` is
 * SIGKILLed and restarted, and any number of dashboards can run.
 */

import { createServer, type Server } from "node:http";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import express, { type Express, type NextFunction, type Request, type Response } from "express";
import { z } from "zod";
import type { Db } from "../store/db.ts";
import type { Queues } from "../queue/queues.ts";
import type { QueueBackend } from "../queue/backend.ts";
import type { RunContextCache } from "../runtime/run-context.ts";
import { jobIds } from "../queue/payloads.ts";
import { listRunsForDashboard, listSamples, loadRunOverview, loadSample } from "./queries.ts";
import { mountBullBoard } from "./bull-board.ts";
import { mountViewer } from "./viewer.ts";
import { tokenMatches } from "../http-access/token.ts";
import { assertTokenForHost, requireToken } from "../http-access/access.ts";
import { isLoopbackHost } from "../lib/loopback.ts";
import { processMetrics } from "../observability/prometheus.ts";
import { requestRunChange } from "../api.ts";
import { registerSecret } from "../lib/redact.ts";
import { RlqError } from "../lib/errors.ts";

export interface DashboardOptions {
  /** rlq's runtime pool: pause/resume requests only. */
  db: Db;
  /** Every read: a pool logged in as rlq_reader (docs/security.md), so the page cannot write even if a query could. */
  readerDb: Db;
  queues: Queues;
  backend: QueueBackend;
  contexts: RunContextCache;
  port: number;
  /** Listen address; default 127.0.0.1. Beyond loopback (lib/loopback.ts) `token` is required and guards every request. */
  host?: string;
  /** Bearer token for pause/resume and Bull Board's queue changes; undefined: the dashboard is read-only. */
  token?: string;
}

export interface DashboardHandle {
  port: number;
  url: string;
  server: Server;
  close(): Promise<void>;
}

const staticDir = join(dirname(fileURLToPath(import.meta.url)), "static");
const requireFromHere = createRequire(import.meta.url);
const uplotDir = dirname(requireFromHere.resolve("uplot/dist/uPlot.iife.min.js"));

const sampleParams = z.object({ runId: z.string().min(1), groupId: z.coerce.number().int().nonnegative(), sampleIndex: z.coerce.number().int().nonnegative() });
const stepQuery = z.object({ step: z.coerce.number().int().nonnegative().optional() });

export async function startDashboard(options: DashboardOptions): Promise<DashboardHandle> {
  const host = options.host ?? "127.0.0.1";
  assertTokenForHost(host, options.token);
  if (options.token) registerSecret(options.token);
  processMetrics().attach({ queues: options.queues, db: options.db });
  const app = express();
  app.disable("x-powered-by");
  if (!isLoopbackHost(host) && options.token !== undefined) app.use(requireToken(options.token));
  mountPage(app);
  mountApi(app, options);
  const board = mountBullBoard(options.backend, "/queues", options.token ? { token: options.token } : {});
  app.use("/queues", board.router);
  app.get("/metrics", (_req, res, next) => {
    const { registry } = processMetrics();
    registry.metrics().then((body) => res.type(registry.contentType).send(body), next);
  });
  app.get("/healthz", (_req, res) => res.json({ ok: true }));
  app.use(sendError);

  const server = createServer(app);
  await listen(server, options.port, host);
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : options.port;
  return {
    port,
    url: `http://${host.includes(":") ? `[${host}]` : host}:${port}`,
    server,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      await board.close();
    },
  };
}

/** An async handler whose result is the JSON body, unless it answered itself; its errors go to `sendError`. */
function wrap(fn: (req: Request, res: Response) => Promise<unknown>) {
  return (req: Request, res: Response, next: NextFunction) => {
    fn(req, res).then((body) => {
      if (!res.headersSent) res.json(body);
    }, next);
  };
}

/** The page and its static files. */
function mountPage(app: Express): void {
  app.get("/", (_req, res) => res.sendFile(join(staticDir, "index.html")));
  app.get("/app.js", (_req, res) => res.type("application/javascript").sendFile(join(staticDir, "app.mjs")));
  app.get("/app.css", (_req, res) => res.type("text/css").sendFile(join(staticDir, "app.css")));
  // uPlot from the installed package, never from a CDN: CI has no network.
  app.get("/vendor/uPlot.iife.min.js", (_req, res) => res.type("application/javascript").sendFile(join(uplotDir, "uPlot.iife.min.js")));
  app.get("/vendor/uPlot.min.css", (_req, res) => res.type("text/css").sendFile(join(uplotDir, "uPlot.min.css")));
}

/** The JSON API: every route in this one table, each handler a named function below. */
function mountApi(app: Express, options: DashboardOptions): void {
  const { readerDb } = options;
  app.get(
    "/api/runs",
    wrap(async () => ({ runs: await listRunsForDashboard(readerDb), canControl: options.token !== undefined })),
  );
  app.get(
    "/api/runs/:runId",
    wrap(async (req) => runWithTrainJob(options, String(req.params.runId))),
  );
  app.get(
    "/api/runs/:runId/samples",
    wrap(async (req) => {
      const q = stepQuery.parse(req.query);
      return { samples: await listSamples(readerDb, String(req.params.runId), q.step ?? null) };
    }),
  );
  app.get(
    "/api/runs/:runId/samples/:groupId/:sampleIndex",
    wrap(async (req) => sampleWithPieces(options, sampleParams.parse(req.params))),
  );
  mountViewer(app, { readerDb, contexts: options.contexts });
  app.post(
    "/api/runs/:runId/:action",
    wrap(async (req, res) => changeRun(options, req, res)),
  );
}

/** A run's overview, with its current train job's state and phase (null when there is none, or the queue cannot be read). */
async function runWithTrainJob(options: DashboardOptions, runId: string): Promise<unknown> {
  const overview = await loadRunOverview(options.readerDb, runId);
  if (!overview.run) throw new RlqError("run_not_found", `run ${runId} does not exist`);
  const step = Number(overview.run.step ?? 0);
  // The train job's phase is a label on the page: a queue that cannot be read shows the run without it.
  const info = await options.queues.info("train", jobIds.train({ runId, step })).catch(() => null);
  const phase = (info?.progress as { phase?: unknown } | null)?.phase;
  return {
    ...overview,
    trainJob:
      info && info.state !== "missing" ? { step, state: info.state, attemptsMade: info.attemptsMade, phase: typeof phase === "string" ? phase : null } : null,
  };
}

/** A sample, with its response's token pieces for the colouring (null when the run's tokenizer cannot be loaded). */
async function sampleWithPieces(options: DashboardOptions, p: z.infer<typeof sampleParams>): Promise<unknown> {
  const sample = await loadSample(options.readerDb, p.runId, p.groupId, p.sampleIndex);
  if (!sample) throw new RlqError("sample_not_found", `run ${p.runId} has no sample ${p.groupId}/${p.sampleIndex} in rollout_history`);
  // Token pieces for the colouring: the run's own tokenizer, one response token at a time.
  const tokens = (sample.tokens as number[] | null) ?? [];
  const promptLength = Number(sample.prompt_length ?? 0);
  let pieces: string[] | null;
  try {
    const ctx = await options.contexts.get(p.runId);
    pieces = tokens.slice(promptLength).map((t) => ctx.tokenizer.decode([t]));
  } catch {
    pieces = null;
  }
  return { sample: { ...sample, response_pieces: pieces } };
}

/** POST pause or resume: needs the dashboard's token; answers the request id the controller handles. */
async function changeRun(options: DashboardOptions, req: Request, res: Response): Promise<unknown> {
  const action = String(req.params.action);
  if (action !== "pause" && action !== "resume") {
    res.status(404).json({ error: { code: "unknown_action", message: `POST /api/runs/ID/${action}: expected pause or resume` } });
    return null;
  }
  if (!options.token) {
    res.status(403).json({
      error: { code: "dashboard_read_only", message: "this dashboard has no token: start it with RLQ_DASHBOARD_TOKEN set to allow pause/resume" },
    });
    return null;
  }
  if (!tokenMatches(options.token, req.header("authorization"))) {
    res.status(401).json({ error: { code: "bad_token", message: "pause/resume needs the header 'Authorization: Bearer <RLQ_DASHBOARD_TOKEN>'" } });
    return null;
  }
  const reqId = await requestRunChange(options.db, String(req.params.runId), action);
  return { request: reqId, action };
}

/** Errors as JSON: a bad request 400, a missing run or sample 404, anything else 500. */
function sendError(err: unknown, _req: Request, res: Response, _next: NextFunction): void {
  void _next;
  if (err instanceof z.ZodError) {
    res.status(400).json({ error: { code: "bad_request", message: err.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ") } });
  } else if (err instanceof RlqError) {
    res.status(err.code.endsWith("not_found") ? 404 : 400).json({ error: { code: err.code, message: err.message } });
  } else {
    res.status(500).json({ error: { code: "dashboard_error", message: (err as Error).message ?? String(err) } });
  }
}

async function listen(server: Server, port: number, host: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    server.once("error", (e: NodeJS.ErrnoException) =>
      reject(
        e.code === "EADDRINUSE"
          ? new RlqError("dashboard_port_in_use", `dashboard port ${port} is in use: pass --dashboard-port with a free port (0 picks one)`, {
              cause: e,
            })
          : e,
      ),
    );
    server.listen(port, host, () => resolve());
  });
}
