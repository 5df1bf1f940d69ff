#!/usr/bin/env node
import { parseArgs } from "node:util";
import { readEnv } from "../config/env.ts";
import { createServices, type Services } from "../runtime/services.ts";
import { startRun, runStatus, requestRunChange } from "../api.ts";
import { runSql } from "./sql.ts";
import { runUp } from "./up.ts";
import { exportRun } from "./export.ts";
import { replayRun } from "../controller/replay.ts";
import { applyOverrides } from "../config/load.ts";
import { queueKinds, type QueueKind } from "../queue/payloads.ts";
import { defaultConcurrency, startWorkers } from "../runtime/workers.ts";
import { loadEmbedded } from "../runtime/embedded.ts";
import { formatStatus } from "./format-status.ts";
import { runDemo } from "./demo.ts";
import { ConfigError } from "../config/run-config.ts";
import { RlqError } from "../lib/errors.ts";

const usage = `rlq — durable RL post-training on a queue

  rlq migrate
  rlq run start --config FILE [--set key=value]... [--name NAME]
  rlq run status ID [--json]
  rlq run pause|resume|cancel ID
  rlq run amend ID --set key=value...
  rlq worker QUEUE... [--concurrency N]        QUEUE: rollout reward train eval
  rlq up [--run ID] [--exit-when-done] [--workers rollout,reward,train,eval]
                                                controller(s) and workers in one process
  rlq sql "QUERY" [--json]                      read-only, with a statement timeout
  rlq replay ID [--check]
  rlq export ID --format jsonl
  rlq db url
  rlq demo

Environment: DATABASE_URL (else an embedded Postgres under RLQ_HOME), REDIS_URL (else BullMQ's Postgres backend).`;

async function withServices<T>(name: string, fn: (s: Services) => Promise<T>): Promise<T> {
  const services = await createServices(readEnv(), { applicationName: name });
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
  const [cmd, ...rest] = argv;
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
      help: { type: "boolean", short: "h" },
    },
  });
  if (!cmd || values.help || cmd === "help") {
    process.stdout.write(usage + "\n");
    return cmd ? 0 : 1;
  }
  switch (cmd) {
    case "migrate":
      await withServices("rlq-migrate", async () => undefined);
      process.stderr.write("migrations applied\n");
      return 0;
    case "db":
      if (positionals[0] !== "url") throw new ConfigError(`rlq db ${positionals[0] ?? ""}: expected 'rlq db url'`);
      return withServices("rlq-db", async (s) => {
        process.stdout.write(s.db.url + "\n");
        return 0;
      });
    case "run":
      return runCommand(positionals, values);
    case "worker": {
      const kinds = positionals.length > 0 ? positionals : [...queueKinds];
      const bad = kinds.filter((k) => !(queueKinds as readonly string[]).includes(k));
      if (bad.length > 0) throw new ConfigError(`rlq worker: unknown queue(s) ${bad.join(", ")}; expected ${queueKinds.join(", ")}`);
      const concurrency = values.concurrency === undefined ? undefined : Number(values.concurrency);
      if (concurrency !== undefined && (!Number.isInteger(concurrency) || concurrency <= 0)) throw new ConfigError(`--concurrency ${values.concurrency}: expected a positive integer`);
      const { signal } = waitForSignal();
      return withServices(`rlq-worker-${kinds.join("-")}`, async (s) => {
        const conc = Object.fromEntries(kinds.map((k) => [k, concurrency ?? defaultConcurrency[k as QueueKind]]));
        const workers = await startWorkers(s, kinds as QueueKind[], { concurrency: conc, embedded: await loadEmbedded() });
        s.log.info({ kinds, concurrency: conc }, "workers started");
        await new Promise<void>((r) => signal.addEventListener("abort", () => r(), { once: true }));
        s.log.info("shutting down: finishing active jobs");
        await workers.close();
        return 0;
      });
    }
    case "up": {
      const { signal } = waitForSignal();
      const workerKinds = values.workers === undefined ? [...queueKinds] : values.workers.split(",").map((k) => k.trim()).filter(Boolean);
      const badKinds = workerKinds.filter((k) => !(queueKinds as readonly string[]).includes(k));
      if (badKinds.length > 0) throw new ConfigError(`--workers ${values.workers}: unknown queue(s) ${badKinds.join(", ")}; expected a comma-separated subset of ${queueKinds.join(",")}`);
      return withServices("rlq-up", (s) => runUp(s, { runId: values.run ?? null, exitWhenDone: values["exit-when-done"] ?? false, signal, workers: workerKinds as QueueKind[] }));
    }
    case "sql": {
      const query = positionals[0];
      if (!query) throw new ConfigError('rlq sql: expected a query, e.g. rlq sql "SELECT * FROM runs"');
      return withServices("rlq-sql", (s) => runSql(s.db, query, values.json ?? false));
    }
    case "replay": {
      const id = positionals[0];
      if (!id) throw new ConfigError("rlq replay: expected a run id");
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
    case "export": {
      const id = positionals[0];
      if (!id) throw new ConfigError("rlq export: expected a run id");
      if ((values.format ?? "jsonl") !== "jsonl") throw new ConfigError(`--format ${values.format}: only jsonl is supported`);
      return withServices("rlq-export", (s) => exportRun(s.db, id, process.stdout));
    }
    case "demo":
      return runDemo(values.set ?? []);
    default:
      process.stderr.write(`rlq: unknown command '${cmd}'\n\n${usage}\n`);
      return 2;
  }
}

async function runCommand(positionals: string[], values: Record<string, unknown>): Promise<number> {
  const [sub, id] = positionals;
  const sets = (values.set as string[] | undefined) ?? [];
  switch (sub) {
    case "start": {
      if (typeof values.config !== "string") throw new ConfigError("rlq run start: --config FILE is required");
      const config = values.config;
      return withServices("rlq-run-start", async (s) => {
        const res = await startRun(s.db, { config, set: sets, ...(typeof values.name === "string" ? { name: values.name } : {}) });
        for (const e of res.datasetErrors) process.stderr.write(`warning: skipped bad row ${e}\n`);
        process.stdout.write(res.runId + "\n");
        return 0;
      });
    }
    case "status":
      if (!id) throw new ConfigError("rlq run status: expected a run id");
      return withServices("rlq-status", async (s) => {
        const report = await runStatus(s.db, id, s.queues);
        process.stdout.write(values.json ? JSON.stringify(report, null, 2) + "\n" : formatStatus(report));
        return 0;
      });
    case "pause":
    case "resume":
    case "cancel":
    case "amend": {
      if (!id) throw new ConfigError(`rlq run ${sub}: expected a run id`);
      const payload = sub === "amend" ? { changes: applyOverrides({}, sets) } : {};
      if (sub === "amend" && sets.length === 0) throw new ConfigError("rlq run amend: expected --set key=value");
      return withServices("rlq-run", async (s) => {
        const reqId = await requestRunChange(s.db, id, sub, payload);
        process.stdout.write(`request ${reqId}: ${sub} sent to run ${id}'s controller\n`);
        return 0;
      });
    }
    default:
      throw new ConfigError(`rlq run ${sub ?? ""}: expected start, status, pause, resume, cancel or amend`);
  }
}

/** Run the CLI and exit with its code (bin/rlq.js and `tsx src/cli/main.ts`). */
export function runCli(argv: string[]): void {
  main(argv).then(
    (code) => process.exit(code),
    (e: unknown) => {
      if (e instanceof ConfigError || e instanceof RlqError) process.stderr.write(`rlq: ${e.message}\n`);
      else process.stderr.write(`rlq: ${(e as Error).stack ?? String(e)}\n`);
      process.exit(e instanceof ConfigError ? 2 : 1);
    },
  );
}

if (process.argv[1] && /[\\/]src[\\/]cli[\\/]main\.ts$/.test(process.argv[1])) runCli(process.argv.slice(2));
