import { readEnv } from "./config/env.ts";
import { runController, type ControllerExit } from "./controller/controller.ts";
import { queueKinds } from "./queue/payloads.ts";
import { createServices, type Services } from "./runtime/services.ts";
import { loadRunRow } from "./store/run-facts.ts";
import { pendingRunRequests } from "./store/run-requests.ts";
import { runStatus, startRun, type RunStatusReport, type StartRunOptions } from "./api.ts";
import { closePythonHosts } from "./plugins/python.ts";
import { sleep } from "./lib/sleep.ts";

/** The reason an operator's pause records (controller.ts): such a pause waits for a resume. */
const OPERATOR_PAUSE = "paused by operator";

export interface RunUntilDoneOptions extends Omit<StartRunOptions, "config"> {
  /** Resume this run instead of starting one (config is then ignored and may be null). */
  runId?: string;
  /** Services to use (left open); default: built from `env` and closed at the end. */
  services?: Services;
  /** The environment the services are built from (DATABASE_URL, REDIS_URL, ...); default process.env. */
  env?: NodeJS.ProcessEnv;
  /** Stops the controller and workers; the promise then resolves with the run's status at that moment. */
  signal?: AbortSignal;
  /** Called with the run's status every `progressEveryMs` (default 1000) while it runs. */
  onProgress?: (status: RunStatusReport) => void;
  progressEveryMs?: number;
}

export interface RunUntilDoneResult {
  runId: string;
  /** completed / cancelled; paused when the run paused for a fault (its reason in status.lastError); stopped when `signal` aborted. */
  outcome: "completed" | "cancelled" | "paused" | "stopped";
  status: RunStatusReport;
}

/**
 * Start a run (or resume `runId`) and drive it in this process, as
 * `rlq up --run ID --exit-when-done` does: every worker kind and the run's
 * controller. Resolves when the run completes or is cancelled, when it pauses
 * for a fault (an operator's pause keeps waiting for the resume), or when
 * `signal` aborts. Other `rlq up`/`rlq worker` processes on the same
 * database and queue may share the work.
 */
export async function runUntilDone(config: StartRunOptions["config"] | null, options: RunUntilDoneOptions = {}): Promise<RunUntilDoneResult> {
  const ownsServices = options.services === undefined;
  const s = options.services ?? (await createServices(readEnv(options.env ?? process.env), { applicationName: "rlq-api" }));
  try {
    let runId = options.runId;
    if (runId === undefined) {
      if (config === null) throw new TypeError("runUntilDone: give a config, or options.runId to resume a run");
      runId = (await startRun(s.db, { ...options, config })).runId;
    }
    const { startWorkers } = await import("./jobs/workers.ts");
    const workers = await startWorkers(s, queueKinds);
    const stop = new AbortController();
    const onAbort = () => stop.abort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    let exit: ControllerExit | null = null;
    const controller = runController(
      {
        db: s.db,
        queues: s.queues,
        contexts: s.contexts,
        log: s.log,
        holder: s.holder,
        crashPoint: (n) => s.crashPoint(n),
        pollMs: s.env.RLQ_CONTROLLER_POLL_MS,
      },
      runId,
      stop.signal,
    ).then((e) => {
      exit = e;
      stop.abort();
    });
    let outcome: RunUntilDoneResult["outcome"] = "stopped";
    try {
      let lastProgress = 0;
      while (!stop.signal.aborted) {
        const row = await loadRunRow(s.db, runId);
        if (row?.status === "paused" && row.lastError !== OPERATOR_PAUSE && (await pendingRunRequests(s.db, runId)).length === 0) {
          outcome = "paused";
          break;
        }
        if (options.onProgress && Date.now() - lastProgress >= (options.progressEveryMs ?? 1000)) {
          lastProgress = Date.now();
          options.onProgress(await runStatus(s.db, runId, s.queues));
        }
        await sleep(200, stop.signal);
      }
    } finally {
      stop.abort();
      options.signal?.removeEventListener("abort", onAbort);
      await controller;
      await workers.close();
    }
    const status = await runStatus(s.db, runId, s.queues);
    if (outcome !== "paused" && (exit === "completed" || exit === "cancelled")) outcome = exit;
    return { runId, outcome, status };
  } finally {
    if (ownsServices) {
      closePythonHosts();
      await s.close();
    }
  }
}
