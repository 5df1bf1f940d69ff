#!/usr/bin/env node
import { parseArgs } from "node:util";
import { exitAfterFlush } from "./exit.ts";
import { readEnv } from "../config/env.ts";
import { createServices, type Services } from "../runtime/services.ts";
import { queueKinds, type QueueKind } from "../queue/payloads.ts";
import { ConfigError } from "../config/run-config.ts";
import { RlqError } from "../lib/errors.ts";
import { helpOrVersion, unknownSubcommand } from "./help.ts";

// Every command's modules load when it runs (`rlq --version` and `rlq help` load none of them), and
// `rlq up --workers ''` (a controller host) loads no job processor: a restart from spawn is mostly
// module loading (bench/recovery.ts).

const usage = `rlq — durable RL post-training on a queue

  rlq migrate
  rlq run start --config FILE [--set key=value]... [--name NAME]
  rlq run status ID [--json]
  rlq run pause|resume|cancel ID
  rlq run amend ID --set key=value...
  rlq worker QUEUE... [--concurrency N]        QUEUE: rollout reward train eval
  rlq up [--run ID] [--exit-when-done] [--workers rollout,reward,train,eval] [--dashboard [--dashboard-port 8420] [--dashboard-host H]]
                                                controller(s) and workers in one process
  rlq dashboard [--port 8420] [--host H]        live web page per run, Bull Board at /queues, /metrics
  rlq sql "QUERY" [--json] [--limit N]          one read-only statement as rlq_reader, rows streamed
  rlq replay ID [--check]
  rlq retrain ID --step S [--out DIR]           replay step S's batch into the trainer, compare with its commit
  rlq export ID --format jsonl
  rlq db url [--role reader|runtime|owner]      the reader's URL unless asked for another
  rlq db admin-sql                              the one-time role setup for a managed Postgres
  rlq demo
  rlq config import-slime SCRIPT.sh|--flag value... [-o run.yaml]
  rlq config check FILE [--set key=value]...
  rlq help [CMD]    rlq CMD --help    rlq --version

Environment: DATABASE_URL (else an embedded Postgres under RLQ_HOME), REDIS_URL (else BullMQ's Postgres backend),
RLQ_METRICS_PORT (Prometheus /metrics of up, worker and dashboard), RLQ_DASHBOARD_TOKEN or RLQ_DASHBOARD_TOKEN_FILE (allows pause/resume from the dashboard;
required for every request when it listens beyond loopback), RLQ_DASHBOARD_HOST (where the dashboard and /metrics listen).`;

async function withServices<T>(name: string, fn: (s: Services) => Promise<T>, options: { migrate?: boolean } = {}): Promise<T> {
  const services = await createServices(readEnv(), { applicationName: name, ...options });
  try {
    return await fn(services);
  } finally {
    await services.close();
  }
}

function waitForSignal(): { signal: AbortSignal } {
  const ac = new AbortController();
  const stop = () => ac.abort("signal");
  process.once("SIGTERM", stop);
  process.once("SIGINT", stop);
  return { signal: ac.signal };
}

export async function main(argv: string[]): Promise<number> {
  const early = helpOrVersion(argv, usage);
  if (early !== null) {
    if (early.stdout !== undefined) process.stdout.write(early.stdout);
    if (early.stderr !== undefined) process.stderr.write(early.stderr);
    return early.code;
  }
  const [cmd, ...rest] = argv;
  // slime's flags pass through `config import-slime` untouched: it parses its own arguments.
  if (cmd === "config") return (await import("./config-cmd.ts")).configCommand(rest);
  const { values, positionals } = parseArgs({
    args: rest,
    allowPositionals: true,
    options: {
      config: { type: "string" },
      set: { type: "string", multiple: true },
      name: { type: "string" },
      json: { type: "boolean" },
      check: { type: "boolean" },
      format: { type: "string" },
      run: { type: "string" },
      concurrency: { type: "string" },
      "exit-when-done": { type: "boolean" },
      workers: { type: "string" },
      limit: { type: "string" },
      role: { type: "string" },
      step: { type: "string" },
      out: { type: "string" },
      port: { type: "string" },
      dashboard: { type: "boolean" },
      "dashboard-port": { type: "string" },
      "dashboard-host": { type: "string" },
      host: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  switch (cmd) {
    case "migrate":
      await withServices("rlq-migrate", async () => undefined, { migrate: true });
      process.stderr.write("migrations applied\n");
      return 0;
    case "db":
      if (positionals[0] === "admin-sql") {
        const url = readEnv().DATABASE_URL;
        const { adminSql } = await import("../store/roles.ts");
        process.stdout.write(adminSql(url ? decodeURIComponent(new URL(url).pathname.slice(1)) || "postgres" : "postgres"));
        return 0;
      }
      if (positionals[0] !== "url")
        throw new ConfigError(`rlq db ${positionals[0] ?? ""}: expected 'rlq db url [--role reader|runtime|owner]' or 'rlq db admin-sql'`);
      return withServices("rlq-db", async (s) => {
        const role = values.role ?? "reader";
        const url = role === "reader" ? s.urls.reader : role === "runtime" ? s.urls.runtime : role === "owner" ? s.urls.owner : undefined;
        if (role !== "reader" && role !== "runtime" && role !== "owner") throw new ConfigError(`--role ${role}: expected reader, runtime or owner`);
        if (url === null || url === undefined) throw new ConfigError("rlq db url --role owner: no owner URL is known; set RLQ_OWNER_DATABASE_URL");
        process.stdout.write(url + "\n");
        return 0;
      });
    case "run":
      return runCommand(positionals, values);
    case "worker": {
      const kinds = positionals.length > 0 ? positionals : [...queueKinds];
      const bad = kinds.filter((k) => !(queueKinds as readonly string[]).includes(k));
      if (bad.length > 0) throw new ConfigError(`rlq worker: unknown queue(s) ${bad.join(", ")}; expected ${queueKinds.join(", ")}`);
      const concurrency = values.concurrency === undefined ? undefined : Number(values.concurrency);
      if (concurrency !== undefined && (!Number.isInteger(concurrency) || concurrency <= 0))
        throw new ConfigError(`--concurrency ${values.concurrency}: expected a positive integer`);
      const { signal } = waitForSignal();
      const [{ startProcessExtras }, { defaultConcurrency, startWorkers }] = await Promise.all([import("./dashboard.ts"), import("../jobs/workers.ts")]);
      return withServices(`rlq-worker-${kinds.join("-")}`, async (s) => {
        const extras = await startProcessExtras(s, { dashboardPort: null });
        signal.addEventListener("abort", () => void extras.close(), { once: true });
        const conc = Object.fromEntries(kinds.map((k) => [k, concurrency ?? defaultConcurrency[k as QueueKind]]));
        const workers = await startWorkers(s, kinds as QueueKind[], { concurrency: conc });
        s.log.info({ kinds, concurrency: conc }, "workers started");
        await new Promise<void>((r) => signal.addEventListener("abort", () => r(), { once: true }));
        s.log.info("shutting down: finishing active jobs");
        await workers.close();
        return 0;
      });
    }
    case "up": {
      const { signal } = waitForSignal();
      const workerKinds =
        values.workers === undefined
          ? [...queueKinds]
          : values.workers
              .split(",")
              .map((k) => k.trim())
              .filter(Boolean);
      const badKinds = workerKinds.filter((k) => !(queueKinds as readonly string[]).includes(k));
      if (badKinds.length > 0)
        throw new ConfigError(
          `--workers ${values.workers}: unknown queue(s) ${badKinds.join(", ")}; expected a comma-separated subset of ${queueKinds.join(",")}`,
        );
      const [{ runUp }, { startProcessExtras }, { createProgressDisplay }] = await Promise.all([
        import("./up.ts"),
        import("./dashboard.ts"),
        import("../observability/progress.ts"),
      ]);
      return withServices("rlq-up", async (s) => {
        const extras = await startProcessExtras(s, {
          dashboardPort: values.dashboard ? (values["dashboard-port"] ?? "8420") : null,
          host: values["dashboard-host"],
        });
        const progress = createProgressDisplay({ stream: process.stdout, isTty: process.stdout.isTTY === true, columns: process.stdout.columns });
        try {
          return await runUp(s, {
            runId: values.run ?? null,
            exitWhenDone: values["exit-when-done"] ?? false,
            signal,
            workers: workerKinds as QueueKind[],
            progress,
          });
        } finally {
          await extras.close();
        }
      });
    }
    case "sql": {
      const query = positionals[0];
      if (!query) throw new ConfigError('rlq sql: expected a query, e.g. rlq sql "SELECT * FROM runs"');
      const limit = values.limit === undefined ? 1000 : Number(values.limit);
      if (!Number.isInteger(limit) || limit <= 0) throw new ConfigError(`--limit ${values.limit}: expected a positive number of rows, e.g. --limit 5000`);
      if (positionals.length > 1)
        throw new ConfigError(`rlq sql: expected one quoted statement, got ${positionals.length} arguments; quote the whole query: rlq sql "SELECT ..."`);
      const { runSql } = await import("./sql.ts");
      return withServices("rlq-sql", (s) => runSql(s.urls.reader, query, { asJson: values.json ?? false, limit }));
    }
    case "replay": {
      const id = positionals[0];
      if (!id) throw new ConfigError("rlq replay: expected a run id");
      const { replayRun } = await import("../controller/replay.ts");
      return withServices("rlq-replay", async (s) => {
        const res = await replayRun(s.db, await s.contexts.get(id), { check: values.check ?? false });
        if (values.check) {
          for (const d of res.differences.slice(0, 50)) process.stdout.write(d + "\n");
          process.stdout.write(`replay ${id}: ${res.decisions} decisions, ${res.historyRows} history rows, ${res.differences.length} difference(s)\n`);
          return res.differences.length === 0 ? 0 : 1;
        }
        process.stdout.write(`replay ${id}: rebuilt ${res.historyRows} history rows from ${res.decisions} decisions\n`);
        return 0;
      });
    }
    case "retrain": {
      const { retrainCommand } = await import("./retrain-cmd.ts");
      const { signal } = waitForSignal();
      return withServices("rlq-retrain", (s) => retrainCommand(s, positionals[0], values.step, values.out, signal));
    }
    case "export": {
      const id = positionals[0];
      if (!id) throw new ConfigError("rlq export: expected a run id");
      if ((values.format ?? "jsonl") !== "jsonl") throw new ConfigError(`--format ${values.format}: only jsonl is supported`);
      const { exportRun } = await import("./export.ts");
      return withServices("rlq-export", (s) => exportRun(s.db, id, process.stdout));
    }
    case "demo":
      return (await import("./demo.ts")).runDemo(values.set ?? []);
    case "dashboard": {
      const { runDashboardCommand } = await import("./dashboard.ts");
      const { signal } = waitForSignal();
      return withServices("rlq-dashboard", (s) => runDashboardCommand(s, values.port ?? "8420", values.host, signal));
    }
    default:
      process.stderr.write(`rlq: unknown command '${cmd}'\n\n${usage}\n`);
      return 2;
  }
}

async function runCommand(positionals: string[], values: Record<string, unknown>): Promise<number> {
  const [sub, id] = positionals;
  const sets = (values.set as string[] | undefined) ?? [];
  const { startRun, runStatus, requestRunChange } = await import("../api.ts");
  switch (sub) {
    case "start": {
      if (typeof values.config !== "string") throw new ConfigError("rlq run start: --config FILE is required");
      const config = values.config;
      return withServices("rlq-run-start", async (s) => {
        const res = await startRun(s.db, { config, set: sets, ...(typeof values.name === "string" ? { name: values.name } : {}) });
        for (const e of res.datasetErrors) process.stderr.write(`warning: skipped bad row ${e}\n`);
        for (const w of res.configWarnings) process.stderr.write(`warning: ${w}\n`);
        process.stdout.write(res.runId + "\n");
        return 0;
      });
    }
    case "status":
      if (!id) throw new ConfigError("rlq run status: expected a run id");
      return withServices("rlq-status", async (s) => {
        const report = await runStatus(s.db, id, s.queues);
        const { formatStatus } = await import("./format-status.ts");
        process.stdout.write(values.json ? JSON.stringify(report, null, 2) + "\n" : formatStatus(report));
        return 0;
      });
    case "pause":
    case "resume":
    case "cancel":
    case "amend": {
      if (!id) throw new ConfigError(`rlq run ${sub}: expected a run id`);
      const { applyOverrides } = await import("../config/load.ts");
      const payload = sub === "amend" ? { changes: applyOverrides({}, sets) } : {};
      if (sub === "amend" && sets.length === 0) throw new ConfigError("rlq run amend: expected --set key=value");
      return withServices("rlq-run", async (s) => {
        const reqId = await requestRunChange(s.db, id, sub, payload);
        process.stdout.write(`request ${reqId}: ${sub} sent to run ${id}'s controller\n`);
        return 0;
      });
    }
    default:
      throw new ConfigError(unknownSubcommand("run", sub, ["start", "status", "pause", "resume", "cancel", "amend"]));
  }
}

/** Run the CLI and exit with its code (bin/rlq.js and `tsx src/cli/main.ts`). */
export function runCli(argv: string[]): void {
  let isSettled = false;
  // The event loop emptied while the command still awaited something that can no longer settle
  // (every socket and timer gone): say so instead of exiting without a word.
  process.once("beforeExit", (exitCode) => {
    if (!isSettled) process.stderr.write(`rlq: stopped before its clean-up finished (a close that never settled); exit code ${exitCode}\n`);
  });
  main(argv).then(
    (code) => {
      isSettled = true;
      void exitAfterFlush(code);
    },
    (e: unknown) => {
      if (e instanceof ConfigError || e instanceof RlqError) process.stderr.write(`rlq: ${e.message}\n`);
      else process.stderr.write(`rlq: ${(e as Error).stack ?? String(e)}\n`);
      void exitAfterFlush(e instanceof ConfigError ? 2 : 1);
    },
  );
}

if (process.argv[1] && /[\\/]src[\\/]cli[\\/]main\.ts$/.test(process.argv[1])) runCli(process.argv.slice(2));
