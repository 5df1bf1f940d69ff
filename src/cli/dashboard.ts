import type { Services } from "../runtime/services.ts";
import { startMetricsServer, processMetrics } from "../observability/prometheus.ts";
import { ConfigError } from "../config/run-config.ts";
import { createDb } from "../store/db.ts";
import { readDashboardToken } from "../http-access/token.ts";
import { assertTokenForHost } from "../http-access/access.ts";

function parsePort(flag: string, value: string): number {
  const port = Number(value);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ConfigError(`${flag} ${value}: expected a port number 0..65535 (0 picks a free one)`);
  return port;
}

/**
 * What every long-running rlq process may serve besides its work: Prometheus
 * /metrics on RLQ_METRICS_PORT and, for `rlq up --dashboard`, the dashboard, both on `host`
 * (`--host`, else RLQ_DASHBOARD_HOST). Beyond loopback both need the dashboard token, and the
 * check runs before either listens, so a refusal leaves nothing half started.
 * The lines "dashboard listening URL" / "metrics listening PORT" go to stderr
 * so scripts (and tests) can find a port chosen with 0.
 */
export async function startProcessExtras(
  s: Services,
  options: { dashboardPort: string | null; host?: string | undefined },
): Promise<{ close(): Promise<void> }> {
  const closers: Array<() => Promise<void>> = [];
  const host = options.host ?? s.env.RLQ_DASHBOARD_HOST;
  const token = readDashboardToken(s.env);
  if (s.env.RLQ_METRICS_PORT !== undefined || options.dashboardPort !== null) assertTokenForHost(host, token);
  processMetrics().attach({ queues: s.queues, db: s.db });
  try {
    if (s.env.RLQ_METRICS_PORT !== undefined) {
      const m = await startMetricsServer(s.env.RLQ_METRICS_PORT, { host, ...(token === undefined ? {} : { token }) });
      closers.push(() => m.close());
      process.stderr.write(`metrics listening ${m.port}\n`);
    }
    if (options.dashboardPort !== null) {
      // The page reads as rlq_reader: it serves read-only SQL over HTTP (docs/security.md).
      const readerDb = createDb(s.urls.reader, { max: 4, applicationName: "rlq-dashboard" });
      closers.push(() => readerDb.close());
      // Express and Bull Board load only with a dashboard: every `rlq up` and worker would pay for them.
      const { startDashboard } = await import("../dashboard/server.ts");
      const d = await startDashboard({
        db: s.db,
        readerDb,
        queues: s.queues,
        backend: s.backend,
        contexts: s.contexts,
        port: parsePort("--dashboard-port", options.dashboardPort),
        host,
        ...(token === undefined ? {} : { token }),
      });
      closers.push(() => d.close());
      process.stderr.write(`dashboard listening ${d.url}\n`);
    }
  } catch (e) {
    for (const c of closers.reverse()) {
      await c().catch((closeError: unknown) => s.log.warn({ err: (closeError as Error).message }, "closing what had started after a failed start"));
    }
    throw e;
  }
  return {
    async close() {
      for (const c of closers.reverse()) await c().catch((e: unknown) => s.log.warn({ err: (e as Error).message }, "closing the dashboard or /metrics"));
      closers.length = 0;
    },
  };
}

/** `rlq dashboard [--port 8420] [--host 127.0.0.1]`: serve until SIGINT/SIGTERM. */
export async function runDashboardCommand(s: Services, port: string, host: string | undefined, signal: AbortSignal): Promise<number> {
  const extras = await startProcessExtras(s, { dashboardPort: port, host });
  try {
    await new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener("abort", () => r(), { once: true })));
  } finally {
    await extras.close();
  }
  return 0;
}
