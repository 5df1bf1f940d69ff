import { createServer, type Server } from "node:http";
import { Counter, Gauge, Registry, collectDefaultMetrics } from "prom-client";
import type { Db } from "../store/db.ts";
import { readSelect } from "../store/dashboard-read.ts";
import { tokenMatches } from "../http-access/token.ts";
import { assertTokenForHost } from "../http-access/access.ts";
import { isLoopbackHost } from "../lib/loopback.ts";
import type { Queues } from "../queue/queues.ts";

/** What /metrics reads beyond the process's own counters, through the reader role. */
const metricsSql = {
  leaseEpochs: `SELECT run_id, epoch FROM run_leases`,
  engineSnapshots: `SELECT run_id, worker, snapshot FROM engine_metrics`,
};

/**
 * Prometheus metrics of one rlq process (prom-client). Counters are
 * process-local (jobs this process finished, failed); gauges that describe
 * the run (queue depths, lease epochs, engine counters) are read at scrape
 * time from the queue and from the store, so every process reports the same
 * truth and a restarted process has nothing to rebuild. Jobs/s is
 * `rate(rlq_jobs_completed_total[1m])` in PromQL.
 */
export interface ProcessMetrics {
  readonly registry: Registry;
  jobCompleted(queue: string): void;
  jobFailed(queue: string, isFinal: boolean): void;
  /** Scrape-time gauges from the queue (depth per state) and the store (lease epoch, engines). */
  attach(sources: { queues?: Queues; db?: Db }): void;
}

function create(): ProcessMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "rlq_" });
  const completed = new Counter({ name: "rlq_jobs_completed_total", help: "Jobs this process completed", labelNames: ["queue"], registers: [registry] });
  const failed = new Counter({
    name: "rlq_jobs_failed_total",
    help: "Job attempts that failed in this process (final: no retry left or unrecoverable)",
    labelNames: ["queue", "final"],
    registers: [registry],
  });
  const sources: { queues?: Queues; db?: Db } = {};
  // A source that cannot be read at a scrape (the queue or the database away) leaves its gauge
  // empty for that scrape and counts here, so the gap shows on the same page; the next scrape reads again.
  const sourceErrors = new Counter({
    name: "rlq_metrics_source_errors_total",
    help: "Scrapes at which a gauge's source (queues, leases, engines) could not be read: that gauge is empty in the scrape",
    labelNames: ["source"],
    registers: [registry],
  });
  const unreadable =
    <T>(source: string, fallback: T) =>
    (): T => {
      sourceErrors.inc({ source });
      return fallback;
    };
  new Gauge({
    name: "rlq_queue_jobs",
    help: "Jobs per queue and state (waiting, active, delayed, failed, completed)",
    labelNames: ["queue", "state"],
    registers: [registry],
    async collect() {
      this.reset();
      if (!sources.queues) return;
      const depths = await sources.queues.depths().catch(unreadable("queues", null));
      if (!depths) return;
      for (const [queue, counts] of Object.entries(depths)) for (const [state, n] of Object.entries(counts)) this.set({ queue, state }, n);
    },
  });
  new Gauge({
    name: "rlq_lease_epoch",
    help: "The current controller lease epoch of each run (it grows by one at each takeover)",
    labelNames: ["run"],
    registers: [registry],
    async collect() {
      this.reset();
      if (!sources.db) return;
      const rows = await readSelect<{ run_id: string; epoch: number }>(sources.db, metricsSql.leaseEpochs).catch(unreadable("leases", []));
      for (const r of rows) this.set({ run: r.run_id }, Number(r.epoch));
    },
  });
  const engineFields = {
    requests: "Requests started",
    inFlight: "Requests in flight",
    completed: "Requests completed",
    aborted: "Requests aborted",
    errors: "Requests that failed",
    versionMismatches: "Answers with an unexpected weight version",
    deaths: "Times the engine left the rotation",
    tokensPerSecond: "Tokens generated per second (recent window)",
  } as const;
  const engineGauge = new Gauge({
    name: "rlq_engine",
    help: `Engine pool counters per run, rollout worker and engine (field: ${Object.keys(engineFields).join(", ")}), from engine_metrics`,
    labelNames: ["run", "worker", "engine", "field"],
    registers: [registry],
    async collect() {
      this.reset();
      if (!sources.db) return;
      const rows = await readSelect<{ run_id: string; worker: string; snapshot: unknown }>(sources.db, metricsSql.engineSnapshots).catch(
        unreadable("engines", []),
      );
      for (const r of rows) {
        const engines = (r.snapshot as { engines?: Array<Record<string, unknown>> } | null)?.engines ?? [];
        for (const e of engines) {
          for (const field of Object.keys(engineFields)) {
            const v = e[field];
            if (typeof v === "number") this.set({ run: r.run_id, worker: r.worker, engine: String(e.engineId), field }, v);
          }
        }
      }
    },
  });
  void engineGauge;
  return {
    registry,
    jobCompleted: (queue) => completed.inc({ queue }),
    jobFailed: (queue, isFinal) => failed.inc({ queue, final: String(isFinal) }),
    attach(s) {
      if (s.queues) sources.queues = s.queues;
      if (s.db) sources.db = s.db;
    },
  };
}

let metrics: ProcessMetrics | null = null;

/** The process's metrics (created on first use: a registry holds no connection). */
export function processMetrics(): ProcessMetrics {
  metrics ??= create();
  return metrics;
}

/**
 * Serve GET /metrics on host:port (0: any free port; host default 127.0.0.1). Beyond loopback
 * (lib/loopback.ts) a scrape needs `Authorization: Bearer <token>` (Prometheus sends it from
 * `authorization` / `bearer_token` in a scrape config), and without a token this refuses to start.
 */
export async function startMetricsServer(
  port: number,
  options: { host?: string; token?: string } = {},
): Promise<{ port: number; server: Server; close(): Promise<void> }> {
  const { registry } = processMetrics();
  const host = options.host ?? "127.0.0.1";
  assertTokenForHost(host, options.token);
  const token = isLoopbackHost(host) ? undefined : options.token;
  const server = createServer((req, res) => {
    if (req.url !== "/metrics") {
      res.writeHead(404).end("GET /metrics\n");
      return;
    }
    if (token !== undefined && !tokenMatches(token, req.headers.authorization)) {
      res
        .writeHead(401, { "content-type": "text/plain", "www-authenticate": 'Bearer realm="rlq metrics"' })
        .end("/metrics listens beyond loopback: send the header 'Authorization: Bearer <RLQ_DASHBOARD_TOKEN>'\n");
      return;
    }
    registry.metrics().then(
      (body) => res.writeHead(200, { "content-type": registry.contentType }).end(body),
      (e: unknown) => res.writeHead(500).end(String(e)),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const address = server.address();
  return {
    port: typeof address === "object" && address ? address.port : port,
    server,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}
