import type { Services } from "../runtime/services.ts";
import { runController, type ControllerExit } from "../controller/controller.ts";
import { listRuns } from "../store/run-facts.ts";
import { pendingRunRequests } from "../store/run-requests.ts";
import { queueKinds, type QueueKind } from "../queue/payloads.ts";
import { createOutageClock, createServiceProbe, isOutageError, OUTAGE_EXIT_CODE, type OutageClock, type ServiceProbe } from "./outage.ts";
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

/** What one pass of the loop decided: go on, or stop (and, for an outage, with which code). */
type Verdict = { kind: "continue" } | { kind: "stop"; code: number };

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
  const up = new UpControllers(s);
  options.signal.addEventListener("abort", () => up.stopAll.abort(), { once: true });
  let code = 0;
  try {
    while (!up.stopAll.signal.aborted) {
      const verdict = await up.tick(options);
      if (verdict.kind === "stop") {
        code = verdict.code;
        break;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  } finally {
    // The exit code is known before the clean-up: if a close never settles and the event loop
    // empties (a Postgres still down), Node exits with it instead of a silent 0.
    if (code !== 0) process.exitCode = code;
    else if (up.failures.length > 0) process.exitCode = 1;
    // With the service still down, closing can wait on it for ever (a queue close on a Redis that
    // reconnects, a controller blocked on a command): the supervisor gets the exit code regardless.
    if (code === OUTAGE_EXIT_CODE) setTimeout(() => void exitAfterFlush(code), OUTAGE_EXIT_GRACE_MS).unref();
    await up.stop();
    options.progress?.close();
    await workers.close();
  }
  if (code !== 0) return code;
  if (up.failures.length > 0) {
    for (const f of up.failures) s.log.error({ reason: f }, "rlq up --exit-when-done: a run did not complete");
    process.stderr.write(`rlq up: ${up.failures.join("; ")}\n`);
    return 1;
  }
  return 0;
}

/**
 * The controllers (and metric sinks) of this `rlq up`, and the outage clock over them. A run is
 * running (in `active`, started at `launchedAt`), backing off after an outage failure (not started
 * again before `retryAt`), or finished (in `finished`: never started again). `launch` and the
 * controller's own exit are the only writers of those.
 */
class UpControllers {
  readonly stopAll = new AbortController();
  /** Why --exit-when-done must exit non-zero: a controller that died, a run paused for a fault. */
  readonly failures: string[] = [];
  private readonly active = new Map<string, Promise<ControllerExit | "failed">>();
  private readonly sinks = new Map<string, Promise<void>>();
  private readonly finished = new Set<string>();
  /** When each run's controller (the one in `active`) was started. */
  private readonly launchedAt = new Map<string, number>();
  /** A failed controller's run: not started again before this time. */
  private readonly retryAt = new Map<string, number>();
  private readonly outage: OutageClock;
  /** Redis commands wait for a reconnect instead of failing: a Redis outage shows only here. */
  private readonly queueProbe: ServiceProbe;

  constructor(private readonly s: Services) {
    this.outage = createOutageClock(s.env.RLQ_OUTAGE_TIMEOUT_S * 1000);
    this.queueProbe = createServiceProbe(() => s.queues.depths());
  }

  /** One pass: read the runs, start their controllers, check the outage bound, show progress, and (--exit-when-done) whether to stop. */
  async tick(options: { runId: string | null; exitWhenDone: boolean; progress?: ProgressDisplay }): Promise<Verdict> {
    const all = await this.listRuns();
    if (options.runId) this.launch(options.runId);
    for (const r of options.runId ? [] : all) if (r.status === "running" || r.status === "paused") this.launch(r.id);
    this.probeQueueStore();
    if (this.exitForOutage()) return { kind: "stop", code: OUTAGE_EXIT_CODE };
    await this.showProgress(options.progress).catch((e: unknown) =>
      this.s.log.debug({ err: (e as Error).message }, "progress display: reading the runs' steps failed"),
    );
    if (options.exitWhenDone) {
      await this.recordFaultPauses(all, options.runId);
      if (this.failures.length > 0) return { kind: "stop", code: 0 };
      if (this.active.size === 0 && this.finished.size > 0) return { kind: "stop", code: 0 };
    }
    return { kind: "continue" };
  }

  /** Stop every controller and metric sink and wait for them. */
  async stop(): Promise<void> {
    this.stopAll.abort();
    await Promise.all(this.active.values());
    await Promise.all(this.sinks.values());
  }

  /** The run list, read through an outage too: a failed read counts toward RLQ_OUTAGE_TIMEOUT_S (and lists nothing). */
  private async listRuns(): Promise<Awaited<ReturnType<typeof listRuns>>> {
    const listedAt = Date.now();
    return listRuns(this.s.db).then(
      (rs) => {
        this.outage.ok("(run list)");
        // A controller that ran through a read Postgres answered is past its outage: its clock
        // stops here, not when it exits (a run that outlives the bound after one outage, or
        // meets a second outage seconds after the first, is not one long outage).
        for (const [runId, at] of this.launchedAt) if (at <= listedAt && this.active.has(runId)) this.outage.ok(runId);
        // Postgres answers: a controller backing off from an outage starts again within a second,
        // not after a back-off that could outlast the bound while nothing is down.
        for (const [runId, at] of this.retryAt) this.retryAt.set(runId, Math.min(at, Date.now() + 1000));
        return rs;
      },
      (e: unknown) => {
        this.outage.failed("(run list)", listedAt, (e as Error).message);
        return [];
      },
    );
  }

  /** Start the run's controller (and its metric sinks) unless it runs, has finished, or is backing off. */
  private launch(runId: string): void {
    if (this.active.has(runId) || this.finished.has(runId) || (this.retryAt.get(runId) ?? 0) > Date.now()) return;
    const { s } = this;
    const startedAt = Date.now();
    this.launchedAt.set(runId, startedAt);
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
      this.stopAll.signal,
    )
      .then(
        (exit) => {
          this.outage.ok(runId);
          return exit;
        },
        (e: unknown) => this.controllerFailed(runId, startedAt, e),
      )
      .then((exit) => {
        this.active.delete(runId);
        if (exit === "completed" || exit === "cancelled" || exit === "stopped") this.finished.add(runId);
        s.log.info({ runId, exit }, "controller exited");
        return exit;
      });
    this.active.set(runId, p);
    // TensorBoard / W&B export of the run's committed metrics (one writer per run: an advisory lock).
    if (!this.sinks.has(runId)) {
      this.sinks.set(
        runId,
        runMetricSinks({ db: s.db, home: s.env.RLQ_HOME, secrets: secretSource(), log: s.log }, runId, this.stopAll.signal).catch((e: unknown) => {
          s.log.warn({ runId, err: (e as Error).message }, "metric sinks stopped");
        }),
      );
    }
  }

  /** An outage error: back off and start it again (the outage clock runs); any other: the run stops here, a failure. */
  private controllerFailed(runId: string, startedAt: number, e: unknown): "stopped" | "failed" {
    const { log } = this.s;
    if (!isOutageError(e)) {
      log.error({ runId, err: (e as Error).message }, "controller stopped with an error");
      this.failures.push(`run ${runId}: the controller stopped with an error: ${(e as Error).message}`);
      return "stopped";
    }
    const delayMs = this.outage.failed(runId, startedAt, (e as Error).message);
    this.retryAt.set(runId, Date.now() + delayMs);
    log.error({ runId, err: (e as Error).message, retryInMs: delayMs }, "controller stopped with an error; starting it again");
    return "failed";
  }

  private probeQueueStore(): void {
    const probed = this.queueProbe.poll();
    if (probed === "ok") this.outage.ok("(queue store)");
    else if (probed) this.outage.failed("(queue store)", Date.now(), `the queue store (${this.s.queues.backend.kind}): ${probed.error}`);
  }

  /** Whether something has failed longer than RLQ_OUTAGE_TIMEOUT_S; if so, says why in the log and on stderr. */
  private exitForOutage(): boolean {
    const expired = this.outage.expired();
    if (!expired) return false;
    const limitS = this.s.env.RLQ_OUTAGE_TIMEOUT_S;
    const forS = Math.round(expired.forMs / 1000);
    this.s.log.error(
      { run: expired.key, outageS: forS, limitS, err: expired.error },
      `rlq up exits with code ${OUTAGE_EXIT_CODE}: ${expired.key} has failed for ${forS} s (RLQ_OUTAGE_TIMEOUT_S=${limitS}): ${expired.error}; a supervisor should start it again`,
    );
    process.stderr.write(
      `rlq up: exits with code ${OUTAGE_EXIT_CODE} (EX_TEMPFAIL): ${expired.key} has failed for ${forS} s, longer than RLQ_OUTAGE_TIMEOUT_S=${limitS}: ${expired.error}. Start rlq up again once Postgres and Redis answer: the run continues where it stopped\n`,
    );
    return true;
  }

  private async showProgress(progress: ProgressDisplay | undefined): Promise<void> {
    if (!progress) return;
    const rows = await readSelect<{ id: string; name: string; step: number; num_rollout: number | null }>(
      this.s.db,
      "SELECT id, name, step, (config->>'num_rollout')::int AS num_rollout FROM runs WHERE id = ANY($1::text[])",
      [[...this.active.keys()]],
    );
    for (const r of rows)
      progress.set(r.id, { label: `${r.name === r.id ? r.id : `${r.name} (${r.id})`} step`, done: Number(r.step), total: Number(r.num_rollout ?? 0) });
  }

  /**
   * --exit-when-done: a run paused for a fault waits for an operator, so it is a failure (an
   * operator's own pause keeps waiting for the resume).
   */
  private async recordFaultPauses(all: Awaited<ReturnType<typeof listRuns>>, runId: string | null): Promise<void> {
    for (const r of all) {
      if (r.status !== "paused" || !(this.active.has(r.id) || r.id === runId)) continue;
      if (r.lastError === OPERATOR_PAUSE) continue;
      // A resume (or cancel) the controller has not handled yet: the pause is about to end.
      // (An unreadable request list during an outage counts as pending: the outage bound decides.)
      if ((await pendingRunRequests(this.s.db, r.id).catch(() => [null])).length > 0) continue;
      this.failures.push(`run ${r.id} is paused: ${r.lastError ?? "no reason recorded"}`);
    }
  }
}
