import type { Services } from "../runtime/services.ts";
import { runController, type ControllerExit } from "../controller/controller.ts";
import { listRuns } from "../store/run-facts.ts";
import { pendingRunRequests } from "../store/run-requests.ts";
import { queueKinds, type QueueKind } from "../queue/payloads.ts";
import { createOutageClock, createServiceProbe, isOutageError, OUTAGE_EXIT_CODE } from "./outage.ts";
import { exitAfterFlush } from "./exit.ts";
import { secretSource } from "../config/env.ts";
import { runMetricSinks } from "../observability/metrics-export/metric-sinks.ts";
import { processMetrics } from "../observability/prometheus.ts";
import type { ProgressDisplay } from "../observability/progress.ts";
import { readSelect } from "../store/dashboard-read.ts";

/** This process's workers; a controller-only `rlq up --workers ''` does not load the job processors. */
async function startUpWorkers(s: Services, kinds: readonly QueueKind[]): Promise<{ close(): Promise<void> }> {
  if (kinds.length === 0) return { close: async () => undefined };
  const { startWorkers } = await import("../jobs/workers.ts");
  return startWorkers(s, kinds);
}

/** How long rlq up closes its workers and controllers before an outage exit (75) is forced. */
const OUTAGE_EXIT_GRACE_MS = 15_000;

/** The reason `rlq run pause` records (controller.ts). */
const OPERATOR_PAUSE = "paused by operator";

/**
 * `rlq up`: every worker and the controllers of the active runs (or of one
 * run) in one process. A run whose lease another process holds waits here
 * as standby. SIGTERM finishes active jobs and exits. A controller that
 * fails is started again; failures back to back for longer than
 * RLQ_OUTAGE_TIMEOUT_S, or a queue store that answers no probe for that long,
 * exit with code 75 (cli/outage.ts) and the reason on stderr.
 */
export async function runUp(
  s: Services,
  options: { runId: string | null; exitWhenDone: boolean; signal: AbortSignal; workers?: readonly QueueKind[]; progress?: ProgressDisplay },
): Promise<number> {
  processMetrics().attach({ queues: s.queues, db: s.db });
  const workers = await startUpWorkers(s, options.workers ?? queueKinds);
  const active = new Map<string, Promise<ControllerExit | "failed">>();
  const sinks = new Map<string, Promise<void>>();
  const finished = new Set<string>();
  /** Why --exit-when-done must exit non-zero: a controller that died, a run paused for a fault. */
  const failures: string[] = [];
  const stopAll = new AbortController();
  const outage = createOutageClock(s.env.RLQ_OUTAGE_TIMEOUT_S * 1000);
  // Redis commands wait for a reconnect instead of failing: a Redis outage shows only here.
  const queueProbe = createServiceProbe(() => s.queues.depths());
  /** When each run's controller (the one in `active`) was started. */
  const launchedAt = new Map<string, number>();
  /** A failed controller's run: not started again before this time. */
  const retryAt = new Map<string, number>();
  options.signal.addEventListener("abort", () => stopAll.abort(), { once: true });
  const launch = (runId: string) => {
    if (active.has(runId) || finished.has(runId) || (retryAt.get(runId) ?? 0) > Date.now()) return;
    const startedAt = Date.now();
    launchedAt.set(runId, startedAt);
    const p = runController(
      {
        db: s.db,
        queues: s.queues,
        contexts: s.contexts,
        log: s.log,
        holder: s.holder,
        crashPoint: (name) => s.crashPoint(name),
        pollMs: s.env.RLQ_CONTROLLER_POLL_MS,
      },
      runId,
      stopAll.signal,
    )
      .then(
        (exit) => {
          outage.ok(runId);
          return exit;
        },
        (e: unknown) => {
          if (!isOutageError(e)) {
            s.log.error({ runId, err: (e as Error).message }, "controller stopped with an error");
            failures.push(`run ${runId}: the controller stopped with an error: ${(e as Error).message}`);
            return "stopped" as const;
          }
          const delayMs = outage.failed(runId, startedAt, (e as Error).message);
          retryAt.set(runId, Date.now() + delayMs);
          s.log.error({ runId, err: (e as Error).message, retryInMs: delayMs }, "controller stopped with an error; starting it again");
          return "failed" as const;
        },
      )
      .then((exit) => {
        active.delete(runId);
        if (exit === "completed" || exit === "cancelled" || exit === "stopped") finished.add(runId);
        s.log.info({ runId, exit }, "controller exited");
        return exit;
      });
    active.set(runId, p);
    // TensorBoard / W&B export of the run's committed metrics (one writer per run: an advisory lock).
    if (!sinks.has(runId)) {
      sinks.set(
        runId,
        runMetricSinks({ db: s.db, home: s.env.RLQ_HOME, secrets: secretSource(), log: s.log }, runId, stopAll.signal).catch((e: unknown) => {
          s.log.warn({ runId, err: (e as Error).message }, "metric sinks stopped");
        }),
      );
    }
  };
  const showProgress = async () => {
    if (!options.progress) return;
    const rows = await readSelect<{ id: string; name: string; step: number; num_rollout: number | null }>(
      s.db,
      "SELECT id, name, step, (config->>'num_rollout')::int AS num_rollout FROM runs WHERE id = ANY($1::text[])",
      [[...active.keys()]],
    );
    for (const r of rows)
      options.progress.set(r.id, { label: `${r.name === r.id ? r.id : `${r.name} (${r.id})`} step`, done: Number(r.step), total: Number(r.num_rollout ?? 0) });
  };
  let code = 0;
  try {
    while (!stopAll.signal.aborted) {
      // The run list is read through an outage too: a failed read counts toward RLQ_OUTAGE_TIMEOUT_S.
      const listedAt = Date.now();
      const all = await listRuns(s.db).then(
        (rs) => {
          outage.ok("(run list)");
          // A controller that ran through a read Postgres answered is past its outage: its clock
          // stops here, not when it exits (a run that outlives the bound after one outage, or
          // meets a second outage seconds after the first, is not one long outage).
          for (const [runId, at] of launchedAt) if (at <= listedAt && active.has(runId)) outage.ok(runId);
          // Postgres answers: a controller backing off from an outage starts again within a second,
          // not after a back-off that could outlast the bound while nothing is down.
          for (const [runId, at] of retryAt) retryAt.set(runId, Math.min(at, Date.now() + 1000));
          return rs;
        },
        (e: unknown) => {
          outage.failed("(run list)", listedAt, (e as Error).message);
          return [];
        },
      );
      if (options.runId) launch(options.runId);
      for (const r of options.runId ? [] : all) if (r.status === "running" || r.status === "paused") launch(r.id);
      const probed = queueProbe.poll();
      if (probed === "ok") outage.ok("(queue store)");
      else if (probed) outage.failed("(queue store)", Date.now(), `the queue store (${s.queues.backend.kind}): ${probed.error}`);
      const expired = outage.expired();
      if (expired) {
        s.log.error(
          { run: expired.key, outageS: Math.round(expired.forMs / 1000), limitS: s.env.RLQ_OUTAGE_TIMEOUT_S, err: expired.error },
          `rlq up exits with code ${OUTAGE_EXIT_CODE}: ${expired.key} has failed for ${Math.round(expired.forMs / 1000)} s (RLQ_OUTAGE_TIMEOUT_S=${s.env.RLQ_OUTAGE_TIMEOUT_S}): ${expired.error}; a supervisor should start it again`,
        );
        process.stderr.write(
          `rlq up: exits with code ${OUTAGE_EXIT_CODE} (EX_TEMPFAIL): ${expired.key} has failed for ${Math.round(expired.forMs / 1000)} s, longer than RLQ_OUTAGE_TIMEOUT_S=${s.env.RLQ_OUTAGE_TIMEOUT_S}: ${expired.error}. Start rlq up again once Postgres and Redis answer: the run continues where it stopped\n`,
        );
        code = OUTAGE_EXIT_CODE;
        break;
      }
      await showProgress().catch((e: unknown) => s.log.debug({ err: (e as Error).message }, "progress display: reading the runs' steps failed"));
      if (options.exitWhenDone) {
        // A run paused for a fault waits for an operator: --exit-when-done says so and exits non-zero
        // (an operator's own pause keeps waiting for the resume).
        for (const r of all) {
          if (r.status !== "paused" || !(active.has(r.id) || r.id === options.runId)) continue;
          if (r.lastError === OPERATOR_PAUSE) continue;
          // A resume (or cancel) the controller has not handled yet: the pause is about to end.
          // (An unreadable request list during an outage counts as pending: the outage bound decides.)
          if ((await pendingRunRequests(s.db, r.id).catch(() => [null])).length > 0) continue;
          failures.push(`run ${r.id} is paused: ${r.lastError ?? "no reason recorded"}`);
        }
        if (failures.length > 0) break;
        if (active.size === 0 && finished.size > 0) break;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  } finally {
    // The exit code is known before the clean-up: if a close never settles and the event loop
    // empties (a Postgres still down), Node exits with it instead of a silent 0.
    if (code !== 0) process.exitCode = code;
    else if (failures.length > 0) process.exitCode = 1;
    // With the service still down, closing can wait on it for ever (a queue close on a Redis that
    // reconnects, a controller blocked on a command): the supervisor gets the exit code regardless.
    if (code === OUTAGE_EXIT_CODE) setTimeout(() => void exitAfterFlush(code), OUTAGE_EXIT_GRACE_MS).unref();
    stopAll.abort();
    await Promise.all(active.values());
    await Promise.all(sinks.values());
    options.progress?.close();
    await workers.close();
  }
  if (code !== 0) return code;
  if (failures.length > 0) {
    for (const f of failures) s.log.error({ reason: f }, "rlq up --exit-when-done: a run did not complete");
    process.stderr.write(`rlq up: ${failures.join("; ")}\n`);
    return 1;
  }
  return 0;
}
